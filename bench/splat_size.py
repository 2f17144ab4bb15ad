"""Size of ``dynamic_splats.glb`` (the Gaussians once, skinned: canonical data plus per-joint
keys) against the per-frame 3DGS PLY sequence ``export/ply`` of the same scene.

    python bench/splat_size.py [--results RESULTS] [--gaussians 200000] [--frames 41]
                               [--cp-num 60] [--sh-degree 0]

Rows: each scene exported under ``--results`` (a workflow's results folder, e.g. a demo run:
the files as written), then one synthetic dynamic object of ``--gaussians`` Gaussians with
``--cp-num`` control points over ``--frames`` frames, whose GLB is written by
chord.export.trained_scene.write_splats_glb (random trained-like motion) and whose PLY sequence is
computed from the format (a PLY header plus 4 bytes per property per Gaussian, per frame; the
formula is checked against a written file first). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

if __package__:
    from bench import fixtures  # noqa: F401  (the bench/ import convention)
else:
    import fixtures  # noqa: F401


def ply_sequence_bytes(gaussians: int, frames: int, sh_degree: int) -> int:
    """Bytes of a PLY sequence (chord.gaussians.ply.write_ply's layout): per frame a header and
    (17 + 3·((d+1)² − 1)) float32 properties per Gaussian."""
    from chord.gaussians import gaussian_set as gs
    from chord.gaussians import ply

    k = (sh_degree + 1) ** 2
    one = gs.GaussianSet(np.zeros((1, 3)), np.zeros((1, 3)), [[1.0, 0, 0, 0]], [0.0],
                         np.zeros((1, k, 3)))  # fmt: skip
    per_gaussian = 4 * (17 + 3 * (k - 1))
    with tempfile.TemporaryDirectory() as tmp:
        ply.write_ply(Path(tmp) / "one.ply", one)
        header = (Path(tmp) / "one.ply").stat().st_size - per_gaussian
    header += len(str(gaussians)) - 1  # "element vertex <N>"
    return frames * (header + gaussians * per_gaussian)


def exported_rows(results: Path) -> list[dict]:
    """The workflow's own files: dynamic_splats.glb against export/ply of every scene."""
    from chord.gltf import container

    rows = []
    for glb in sorted(results.glob("*/export/dynamic_splats.glb")):
        plys = sorted((glb.parent / "ply").glob("frame_*.ply"))
        doc, _ = container.read_glb(glb)
        count = sum(
            doc["accessors"][m["primitives"][0]["attributes"]["POSITION"]]["count"]
            for m in doc["meshes"]
        )
        rows.append(
            {
                "scene": glb.parents[1].name,
                "gaussians": count,
                "frames": len(plys),
                "joints": sum(len(skin["joints"]) for skin in doc.get("skins", [])),
                "glb": glb.stat().st_size,
                "ply": sum(p.stat().st_size for p in plys),
                "how": "measured",
            }
        )
    return rows


def synthetic_row(gaussians: int, frames: int, cp_num: int, sh_degree: int) -> dict:
    """One dynamic object of random Gaussians in a ball with ``cp_num`` control points and a
    trained-like motion (the table ~ N(0, 0.01²)); the GLB written, the PLYs computed."""
    import torch

    from chord.export import trained_scene
    from chord.gaussians import gaussian_set as gs
    from chord.motion.model import DynamicObject, MotionScene
    from chord.render.rasterizer import splat_tensors

    rng = np.random.default_rng(0)
    means = rng.normal(size=(gaussians, 3))
    means *= (
        0.5 * rng.uniform(size=(gaussians, 1)) ** (1 / 3) / np.linalg.norm(means, axis=1)[:, None]
    )
    g = gs.GaussianSet(
        means=means,
        log_scales=np.full((gaussians, 3), -5.0),
        quats=rng.normal(size=(gaussians, 4)),
        opacity_logits=rng.normal(size=gaussians),
        sh=rng.normal(0, 0.3, (gaussians, (sh_degree + 1) ** 2, 3)),
    )
    sp = splat_tensors(g)
    centres = sp["means"][rng.choice(gaussians, cp_num, replace=False)]
    obj = DynamicObject(
        "obj_0", sp["means"], sp["quats"], centres, sp["means"][::50], frame_num=frames
    )
    with torch.no_grad():
        obj.layer1.cp_deform.normal_(0, 0.01, generator=torch.Generator().manual_seed(0))
    scene = MotionScene(["obj_0"], [sp], {"obj_0": obj})
    doc = {
        "scene": "synthetic",
        "normalisation": {"centre": [0.0, 0.0, 0.0], "scale": 1.0},
        "objects": [{"name": "obj_0", "role": "dynamic"}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dynamic_splats.glb"
        trained_scene.write_splats_glb(
            out, doc=doc, scene=scene, gaussians={"obj_0": g}, frames=frames, fps=12
        )
        size = out.stat().st_size
    return {
        "scene": "synthetic",
        "gaussians": gaussians,
        "frames": frames,
        "joints": cp_num,
        "glb": size,
        "ply": ply_sequence_bytes(gaussians, frames, sh_degree),
        "how": "GLB written, PLY from the format",
    }


def check_formula(tmp: Path) -> None:
    """The PLY formula equals a written sequence (3 frames of 1,234 Gaussians, degree 1)."""
    from chord.export import sequences
    from chord.gaussians import gaussian_set as gs

    n, T = 1234, 3
    g = gs.GaussianSet(np.zeros((n, 3)), np.zeros((n, 3)), np.tile([1.0, 0, 0, 0], (n, 1)),
                       np.zeros(n), np.zeros((n, 4, 3)))  # fmt: skip
    files = sequences.write_ply_sequence(
        tmp / "ply", g, np.repeat(g.means[None], T, 0), np.repeat(g.quats[None], T, 0)
    )
    written = sum(f.stat().st_size for f in files)
    if written != ply_sequence_bytes(n, T, 1):
        raise AssertionError(f"PLY formula {ply_sequence_bytes(n, T, 1)} != written {written}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, help="a workflow's results folder to measure")
    p.add_argument("--gaussians", type=int, default=200_000)
    p.add_argument("--frames", type=int, default=41)
    p.add_argument("--cp-num", type=int, default=60)
    p.add_argument("--sh-degree", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        check_formula(Path(tmp))
    rows = exported_rows(args.results) if args.results else []
    rows.append(synthetic_row(args.gaussians, args.frames, args.cp_num, args.sh_degree))
    print(
        "| scene | Gaussians | frames | joints | PLY sequence | dynamic_splats.glb | ratio | how |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scene']} | {r['gaussians']:,} | {r['frames']} | {r['joints']} "
            f"| {r['ply']:,} B | {r['glb']:,} B | {r['ply'] / r['glb']:.1f}x | {r['how']} |"
        )


if __name__ == "__main__":
    main()
