"""What each thing a glTF asks for by count costs the reader and the scene-graph load (issue 47):
the constants of :mod:`chord.gltf.memory_budget` (``NODE_BYTES``, ``PIXEL_BYTES``, ...).

    python bench/gltf_costs.py [kind ...] [--small N] [--large N]

For each kind, a GLB of N items of a one-triangle mesh is read as ingest reads it
(:func:`chord.gltf.reader.read`, trimesh's scene, :func:`chord.scene.ingestion.load_mesh_parts`
and, for ``png``, the parts' GLB export) in a fresh process at two sizes; the peak RSS (above
the loaded modules) and the time are printed per item as the slope between the two. Kinds:
``nodes`` (mesh nodes under one root), ``empty`` (nodes without a mesh), ``instances``
(EXT_mesh_gpu_instancing from an accessor without a bufferView), ``primitives`` (one mesh of
N primitives), ``joints`` (one skin of N joints), ``targets`` (N morph targets) and ``png``
(one RGBA texture of N x N pixels; sizes 4000 and 11000 by default, 1.5 GB at the peak).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KINDS = ("nodes", "empty", "instances", "primitives", "joints", "targets", "png")


def _triangle():
    from chord.gltf.container import UNSIGNED_INT, GltfBuilder

    b = GltfBuilder()
    pos = b.add_accessor(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32), "VEC3")
    idx = b.add_accessor(np.arange(3), "SCALAR", component=UNSIGNED_INT, bounds=False)
    b.add("meshes", {"primitives": [{"attributes": {"POSITION": pos}, "indices": idx}]})
    return b


def build(kind: str, n: int, path: Path) -> None:
    """A GLB asking for ``n`` of ``kind``."""
    b = _triangle()
    prim = b.doc["meshes"][0]["primitives"][0]
    root: dict = {"mesh": 0}
    if kind in ("nodes", "empty"):
        root["children"] = [
            b.add("nodes", {"mesh": 0} if kind == "nodes" else {}) for _ in range(n)
        ]
    elif kind == "instances":
        b.add_accessor(np.zeros((n, 1), np.uint8), "SCALAR", component=5121, bounds=False)
        tr = b.add("accessors", {"componentType": 5126, "count": n, "type": "VEC3"})
        root["extensions"] = {"EXT_mesh_gpu_instancing": {"attributes": {"TRANSLATION": tr}}}
        b.doc["extensionsUsed"] = ["EXT_mesh_gpu_instancing"]
    elif kind == "primitives":
        b.doc["meshes"][0]["primitives"] = [prim] * n
    elif kind == "joints":
        joint = b.add("nodes", {})
        ibm = b.add_accessor(np.tile(np.eye(4).reshape(1, 16), (n, 1)), "MAT4")
        b.add("skins", {"joints": [joint] * n, "inverseBindMatrices": ibm})
        root.update(skin=0, children=[joint])
    elif kind == "targets":
        delta = b.add_accessor(np.zeros((3, 3), np.float32), "VEC3")
        prim["targets"] = [{"POSITION": delta}] * n
        b.doc["meshes"][0]["weights"] = [0.0] * n
    elif kind == "png":
        from PIL import Image

        png = io.BytesIO()
        Image.new("RGBA", (n, n)).save(png, "PNG")
        uv = b.add_accessor(np.array([[0, 0], [1, 0], [0, 1]], np.float32), "VEC2")
        prim["attributes"]["TEXCOORD_0"], prim["material"] = uv, 0
        b.add("images", {"bufferView": b.add_view(png.getvalue()), "mimeType": "image/png"})
        b.add("textures", {"source": 0})
        b.add("materials", {"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}})
    b.add("scenes", {"nodes": [b.add("nodes", root)]})
    b.doc["scene"] = 0
    b.to_glb(path)


def measure(path: Path, export: bool) -> dict:
    """Read ``path`` as ingest does (in this process): peak RSS above the loaded modules, s."""
    import trimesh

    from chord.gltf import reader
    from chord.scene import ingestion

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    source = reader.read(path, mem_mb=10**7)
    scene = trimesh.load(io.BytesIO(source.glb_bytes()), file_type="glb", force="scene",
                         process=False)  # fmt: skip
    parts = ingestion.load_mesh_parts(scene)
    if export:
        trimesh.Scene(parts).export(file_type="glb")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"bytes": (peak - before) * 1024, "s": time.perf_counter() - start}


def _child(kind: str, n: int, folder: Path) -> dict:
    path = folder / f"{kind}_{n}.glb"
    build(kind, n, path)
    code = (
        "import json, sys; from pathlib import Path; sys.path[:0] = [sys.argv[1]]; "
        "from bench.gltf_costs import measure; "
        "print(json.dumps(measure(Path(sys.argv[2]), sys.argv[3] == 'png')))"
    )
    caps = {f"CHORD_MAX_{k}": str(10**9) for k in ("NODES", "PRIMITIVES", "PARTS", "JOINTS",
                                                    "TARGETS")}  # fmt: skip
    env = {**__import__("os").environ, **caps}
    out = subprocess.run([sys.executable, "-c", code, str(REPO), str(path), kind], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kinds", nargs="*", metavar="kind", help=f"of {', '.join(KINDS)} (all)")
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=20_000)
    args = ap.parse_args(argv)
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kind {unknown[0]!r}; the kinds are {', '.join(KINDS)}")
    print("| kind | small | large | bytes per item | ms per item |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds or KINDS:
            small, large = (4000, 11000) if kind == "png" else (args.small, args.large)
            a, b = _child(kind, small, Path(tmp)), _child(kind, large, Path(tmp))
            items = (large**2 - small**2) if kind == "png" else (large - small)
            per_b = (b["bytes"] - a["bytes"]) / items
            per_ms = (b["s"] - a["s"]) * 1000 / items
            print(f"| {kind} | {small} | {large} | {per_b:.1f} | {per_ms:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
