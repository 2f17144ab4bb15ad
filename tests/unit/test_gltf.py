"""The animated glTF writer (chord.gltf): morph targets reproduce the deformation, the file
loads back and passes the Khronos validator."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

from chord import gltf
from tests.conftest import box

VALIDATOR_CACHE = Path.home() / ".cache" / "chord-gltf-validator"
VALIDATE_JS = """
const fs = require('fs');
const validator = require(process.argv[2]);
validator.validateBytes(new Uint8Array(fs.readFileSync(process.argv[3])), {maxIssues: 100})
  .then((r) => console.log(JSON.stringify(r.issues)),
        (e) => { console.error(String(e)); process.exit(2); });
"""


@pytest.fixture(scope="session")
def gltf_validator() -> Path:
    """The Khronos glTF validator (npm package gltf-validator): $CHORD_GLTF_VALIDATOR, else
    installed once into ~/.cache/chord-gltf-validator with npm; skipped without Node."""
    if shutil.which("node") is None:
        pytest.skip(
            "Node.js is not installed: the Khronos glTF validator (npm gltf-validator) needs it"
        )
    found = os.environ.get("CHORD_GLTF_VALIDATOR")
    module = Path(found) if found else VALIDATOR_CACHE / "node_modules" / "gltf-validator"
    if not (module / "package.json").is_file() and not found:
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: cannot install the npm package gltf-validator")
        try:
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(VALIDATOR_CACHE),
                 "gltf-validator"],
                check=True, capture_output=True, timeout=180,
            )  # fmt: skip
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"could not install the npm package gltf-validator ({exc})")
    if not (module / "package.json").is_file():
        pytest.skip(f"gltf-validator not found at {module}")
    return module


def validate_glb(module: Path, path: Path, tmp_path: Path) -> dict:
    """The validator's issue report of a GLB: numErrors, numWarnings, messages, ..."""
    script = tmp_path / "validate.js"
    script.write_text(VALIDATE_JS)
    proc = subprocess.run(
        ["node", str(script), str(module), str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --- a source GLB with a node hierarchy and one mesh placed twice ------------------------------


def _quat_xyzw(axis, angle) -> list[float]:
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return [*(axis * math.sin(angle / 2)).tolist(), math.cos(angle / 2)]


def instanced_glb(path: Path) -> None:
    """A parent node (translated, scaled) with two children (rotated) sharing one box mesh."""
    b = gltf.GltfBuilder("test")
    mesh = trimesh.creation.box(extents=(0.2, 0.4, 0.2))
    pos = b.add_accessor(mesh.vertices, "VEC3", target=gltf.ARRAY_BUFFER)
    idx = b.add_view(mesh.faces.astype(np.uint32).tobytes(), target=gltf.ELEMENT_ARRAY_BUFFER)
    ind = b.add(
        "accessors",
        {"bufferView": idx, "componentType": 5125, "count": mesh.faces.size, "type": "SCALAR"},
    )
    m = b.add("meshes", {"primitives": [{"attributes": {"POSITION": pos}, "indices": ind}]})
    a = b.add(
        "nodes", {"mesh": m, "rotation": _quat_xyzw([0, 1, 0], 0.7), "translation": [0.3, 0, 0]}
    )
    c = b.add("nodes", {"mesh": m, "matrix": np.eye(4).ravel().tolist()})
    root = b.add(
        "nodes", {"children": [a, c], "translation": [0, 0.2, 0.1], "scale": [1.5, 1.5, 1.5]}
    )
    b.doc["scenes"] = [{"nodes": [root]}]
    b.doc["scene"] = 0
    b.to_glb(path)


def bend(frames: int):
    """A known non-rigid deformer: x shifts by 0.05·t·y² + 0.01·t (normalised units)."""

    def apply(p: np.ndarray) -> np.ndarray:
        t = np.arange(frames, dtype=np.float64)[:, None]
        out = np.repeat(p[None], frames, 0)
        out[..., 0] += 0.05 * t * p[None, :, 1] ** 2 + 0.01 * t
        return out

    return apply


@pytest.fixture
def glb_scene(tmp_path):
    instanced_glb(tmp_path / "obj_0.glb")
    slab = box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))
    trimesh.Scene(slab).export(tmp_path / "obj_1.glb", file_type="glb")
    F, fps = 6, 5.0
    centre, scale = np.array([0.1, -0.2, 0.05]), 0.8
    out = tmp_path / "dynamic_scene.glb"
    summary = gltf.dynamic_scene_glb(
        out,
        [("obj_0", tmp_path / "obj_0.glb", bend(F)), ("obj_1", tmp_path / "obj_1.glb", None)],
        centre=centre,
        scale=scale,
        frames=F,
        fps=fps,
    )
    return out, summary, F, fps, centre, scale


def test_glb_morph_targets_reproduce_the_deformation(glb_scene):
    out, summary, F, fps, centre, scale = glb_scene
    assert summary == {"nodes": 2, "targets": F - 1, "frames": F}
    doc, blob = gltf.read_glb(out)
    assert [doc["nodes"][r]["name"] for r in doc["scenes"][0]["nodes"]] == ["obj_0", "obj_1"]
    world = gltf.world_matrices(doc, doc["scenes"][0]["nodes"])
    (anim,) = doc["animations"]
    animated = sorted(ch["target"]["node"] for ch in anim["channels"])
    assert all(ch["target"]["path"] == "weights" for ch in anim["channels"])
    meshes = [doc["nodes"][n]["mesh"] for n in animated]
    assert len(set(meshes)) == 2  # the shared mesh was duplicated per node
    for n in animated:
        mesh = doc["meshes"][doc["nodes"][n]["mesh"]]
        assert mesh["weights"] == [0.0] * (F - 1)
        (prim,) = mesh["primitives"]
        assert len(prim["targets"]) == F - 1
        base = gltf.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        M = world[n]
        to_n = lambda v, M=M: ((v @ M[:3, :3].T + M[:3, 3]) - centre) * scale  # noqa: E731
        expected = bend(F)(to_n(base))
        np.testing.assert_allclose(to_n(base), expected[0], atol=1e-12)  # frame 0 = the base
        for k, target in enumerate(prim["targets"], start=1):
            acc = doc["accessors"][target["POSITION"]]
            assert "min" in acc and "max" in acc
            moved = base + gltf.read_accessor(doc, blob, target["POSITION"])
            np.testing.assert_allclose(to_n(moved), expected[k], atol=1e-5)
    # the static slab is copied unanimated
    static = [n for n in world if "mesh" in doc["nodes"][n] and n not in animated]
    assert len(static) == 1 and "targets" not in doc["meshes"][doc["nodes"][static[0]]["mesh"]]
    # one STEP key per frame at k/fps, one-hot weights on target k (all zero at k = 0)
    for s in anim["samplers"]:
        assert s["interpolation"] == "STEP"
        times = gltf.read_accessor(doc, blob, s["input"])[:, 0]
        np.testing.assert_allclose(times, np.arange(F) / fps, rtol=1e-6)
        w = gltf.read_accessor(doc, blob, s["output"]).reshape(F, F - 1)
        np.testing.assert_array_equal(w, np.eye(F, F - 1, k=-1))


def test_glb_loads_back_with_trimesh(glb_scene, tmp_path):
    out, *_ = glb_scene
    scene = trimesh.load(out, force="scene")
    assert len(scene.graph.nodes_geometry) == 3  # two placements of the box, one slab
    # the base pose is the source meshes in their placements
    rows = lambda a: a[np.lexsort(np.round(a, 6).T)]  # noqa: E731
    src = [trimesh.load(tmp_path / f"obj_{i}.glb", force="scene").to_mesh() for i in (0, 1)]
    np.testing.assert_allclose(
        rows(scene.to_mesh().vertices), rows(np.concatenate([m.vertices for m in src])), atol=1e-6
    )


def test_glb_passes_the_khronos_validator(glb_scene, gltf_validator, tmp_path):
    out, *_ = glb_scene
    report = validate_glb(gltf_validator, out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_glb_copies_textures_and_rejects_compressed_sources(tmp_path):
    textured = trimesh.creation.box(extents=(0.3, 0.3, 0.3))
    uv = np.random.default_rng(0).random((len(textured.vertices), 2))
    image = Image.fromarray(np.full((8, 8, 3), (200, 30, 30), np.uint8))
    textured.visual = trimesh.visual.TextureVisuals(uv=uv, image=image)
    trimesh.Scene(textured).export(tmp_path / "obj_0.glb", file_type="glb")
    out = tmp_path / "out.glb"
    gltf.dynamic_scene_glb(
        out, [("obj_0", tmp_path / "obj_0.glb", bend(3))], centre=[0, 0, 0], scale=1.0, frames=3,
        fps=10,
    )  # fmt: skip
    doc, _ = gltf.read_glb(out)
    assert len(doc["images"]) == 1 and len(doc["textures"]) == 1
    mat = doc["materials"][doc["meshes"][0]["primitives"][0]["material"]]
    assert mat["pbrMetallicRoughness"]["baseColorTexture"]["index"] == 0
    loaded = trimesh.load(out, force="scene")
    (geom,) = loaded.geometry.values()
    assert geom.visual.material.baseColorTexture.size == (8, 8)
    src_doc, blob = gltf.read_glb(tmp_path / "obj_0.glb")
    src_doc["extensionsUsed"] = ["KHR_draco_mesh_compression"]
    gltf.write_glb(tmp_path / "draco.glb", src_doc, blob)
    with pytest.raises(ValueError, match="draco.glb: uses .*KHR_draco_mesh_compression"):
        gltf.dynamic_scene_glb(
            tmp_path / "x.glb", [("obj_0", tmp_path / "draco.glb", None)], centre=[0, 0, 0],
            scale=1.0, frames=3, fps=10,
        )  # fmt: skip
    (tmp_path / "bad.glb").write_bytes(b"not a glb at all, clearly")
    with pytest.raises(ValueError, match="bad.glb: not a GLB file"):
        gltf.read_glb(tmp_path / "bad.glb")


def test_read_accessor_honours_stride_and_sparse():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    inter = np.zeros((4, 5), np.float32)  # 3 used + 2 padding floats per row: stride 20
    inter[:, :3] = rows
    sparse_idx = np.array([1, 3], np.uint16).tobytes() + b"\0" * 0
    sparse_val = np.array([[-1, -2, -3], [-4, -5, -6]], np.float32).tobytes()
    blob = inter.tobytes() + sparse_idx + sparse_val
    doc = {
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": 80, "byteStride": 20},
            {"buffer": 0, "byteOffset": 80, "byteLength": 4},
            {"buffer": 0, "byteOffset": 84, "byteLength": 24},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3"},
            {
                "bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3",
                "sparse": {"count": 2, "indices": {"bufferView": 1, "componentType": 5123},
                           "values": {"bufferView": 2}},
            },
        ],
    }  # fmt: skip
    np.testing.assert_array_equal(gltf.read_accessor(doc, blob, 0), rows)
    expect = rows.astype(np.float64)
    expect[[1, 3]] = [[-1, -2, -3], [-4, -5, -6]]
    np.testing.assert_array_equal(gltf.read_accessor(doc, blob, 1), expect)


def test_node_matrix_is_translation_rotation_scale():
    node = {"translation": [1, 2, 3], "rotation": _quat_xyzw([1, 2, 0.5], 0.9), "scale": [2, 3, 4]}
    x, y, z, w = node["rotation"]
    R = trimesh.transformations.quaternion_matrix([w, x, y, z])
    expect = trimesh.transformations.translation_matrix([1, 2, 3]) @ R @ np.diag([2, 3, 4, 1])
    np.testing.assert_allclose(gltf.node_matrix(node), expect, atol=1e-12)
    flat = np.arange(16.0)
    np.testing.assert_array_equal(gltf.node_matrix({"matrix": flat.tolist()}), flat.reshape(4, 4).T)
