"""File sizes of the two animated GLBs of the export stage: ``dynamic_scene.glb`` (one
morph target per frame) against ``dynamic_scene_skinned.glb`` (one joint per control point);
and of ``scene.usda`` (as the stage writes it, and with every dynamic object's points
time-sampled instead, the alternative to UsdSkel; its own bytes, without the splat layer
``splats.usd``: bench/usd_size.py) and ``trajectories.npz`` + ``.json``.

    python bench/glb_size.py [--vertices 100000] [--cp-num 60] [--frames 41]

Rows: the demo scenes (hop, sway) with their geometry prepared by the demo config (preset
cpu_demo: 21 frames), and one UV sphere of about ``--vertices`` vertices as the only (dynamic)
object with ``--cp-num`` control points and ``--frames`` frames. The motion is trained-like:
seeded random small values (σ 0.01) in every first-layer Fenwick table. Both files are
written by chord.export.trained_scene.write_glb, as the export stage writes them, the USD by
chord.export.usd.write_usd and the trajectories by chord.export.trajectories; prints bytes and
write seconds. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trimesh

from chord.cli import upstream_train
from chord.export import trained_scene, trajectories, usd
from chord.gaussians import gaussian_set, ply
from chord.gltf import container
from chord.motion import control_points
from chord.motion.model import DynamicObject, MotionScene, build_scene
from chord.render.rasterizer import splat_tensors
from chord.scene import demo, ingestion

if __package__:
    from bench import fixtures
else:
    import fixtures

SIGMA = 0.01  # standard deviation of the random table values (normalised units)


def shake(scene, seed: int = 0) -> None:
    """A trained-like motion: every dynamic object's first-layer table ~ N(0, σ²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for obj in scene.dynamic.values():
            obj.layer1.cp_deform.normal_(0, SIGMA, generator=g)


def both_glbs(
    folder: Path, *, doc, scene, sources, gaussians: dict, frames: int, fps: float
) -> dict:
    """Bytes and write seconds of the morph-target and the skinned GLB."""
    row = {"vertices": 0, "sources": sum(p.stat().st_size for p in sources.values())}
    for o in doc["objects"]:
        if o["role"] == "dynamic":  # POSITION rows of its GLB's primitives
            src, _ = container.read_glb(sources[o["name"]])
            pos = {p["attributes"]["POSITION"] for m in src["meshes"] for p in m["primitives"]}
            row["vertices"] += sum(src["accessors"][a]["count"] for a in pos)
    for key, skinned in (("morph", False), ("skinned", True)):
        out = folder / f"{key}.glb"
        start = time.perf_counter()
        trained_scene.write_glb(
            out, doc=doc, scene=scene, sources=sources, frames=frames, fps=fps, skinned=skinned
        )
        row[f"{key} s"] = time.perf_counter() - start
        row[key] = out.stat().st_size
    kw = {"doc": doc, "scene": scene, "frames": frames, "fps": fps}
    usd_kw = {"sources": sources, "gaussians": gaussians, "out_splats": folder / "splats.usd"}
    start = time.perf_counter()
    summary = usd.write_usd(folder / "scene.usda", **usd_kw, **kw)
    row["usd s"] = time.perf_counter() - start
    row["usd"] = (folder / "scene.usda").stat().st_size
    row["usd kinds"] = "/".join(sorted(set(summary["objects"].values()) - {"static"}))
    kind = usd.motion_kind
    usd.motion_kind = lambda *a: "points"  # the alternative: every dynamic object's points
    try:
        usd.write_usd(folder / "points.usda", **usd_kw, **kw)
    finally:
        usd.motion_kind = kind
    row["usd points"] = (folder / "points.usda").stat().st_size
    trajectories.write_trajectories(folder / "t.npz", folder / "t.json", **kw)
    row["npz"] = (folder / "t.npz").stat().st_size
    row["json"] = (folder / "t.json").stat().st_size
    return row


def demo_scene(name: str, folder: Path):
    """(method, scene.json doc, Gaussian sets, the motion scene with a trained-like motion,
    {object: source GLB}) of the demo scene ``name``, its stages run under ``folder``."""
    method, _ = fixtures.scene_config(name)
    data = demo.write_demo_scene(name, folder / "data", frame_num=method.frame_num)
    out = upstream_train.prepare_geometry(
        data=data, results=folder / "results", scene=name, method=method
    )
    doc = out["doc"]
    gsets = {n: ply.read_ply(p, sh_degree_cap=method.sh_degree) for n, p in out["plys"].items()}
    vox = {}
    for n, p in out["voxels"].items():
        with np.load(p) as z:
            vox[n] = {k: z[k] for k in ("control_points", "surface")}
    scene = build_scene(doc, gsets, vox, method)
    shake(scene)
    sources = {o["name"]: data / f"{o['name']}.glb" for o in doc["objects"]}
    return method, doc, gsets, scene, sources


def demo_row(name: str, folder: Path) -> dict:
    method, doc, gsets, scene, sources = demo_scene(name, folder)
    cps = sum(len(o.layer1.centres) for o in scene.dynamic.values())
    row = both_glbs(
        folder, doc=doc, scene=scene, sources=sources, gaussians=gsets,
        frames=method.frame_num, fps=method.save_fps,
    )  # fmt: skip
    return {"scene": name, "frames": method.frame_num, "control points": cps, **row}


def sphere_row(folder: Path, *, vertices: int, cp_num: int, frames: int) -> dict:
    n = max(8, round(np.sqrt(vertices / 2)))  # a count [n, n] UV sphere has about 2n² vertices
    mesh = trimesh.creation.uv_sphere(radius=0.4, count=[n, n])
    src = folder / "obj_0.glb"
    trimesh.Scene(mesh).export(src, file_type="glb")
    c, s = ingestion.normalisation(ingestion.bounds_of([mesh]))
    normalised = ingestion.normalise_parts([mesh], c, s)
    rest = normalised[0].vertices
    sample = rest[:: max(1, len(rest) // 20_000)]
    centres = control_points.place_control_points(sample, cp_num)
    gset = gaussian_set.init_from_mesh(normalised, 2000, seed=0)
    splats = splat_tensors(gset)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    obj = DynamicObject(
        "obj_0", splats["means"], splats["quats"], t(centres), t(sample[::10]), frame_num=frames
    )
    scene = MotionScene(["obj_0"], [splats], {"obj_0": obj})
    shake(scene)
    b = normalised[0].bounds.tolist()
    doc = {
        "scene": "sphere",
        "normalisation": {"centre": c.tolist(), "scale": float(s)},
        "objects": [{"name": "obj_0", "role": "dynamic", "source": str(src), "bounds": b}],
    }
    row = both_glbs(folder, doc=doc, scene=scene, sources={"obj_0": src},
                    gaussians={"obj_0": gset}, frames=frames, fps=10)  # fmt: skip
    return {"scene": "UV sphere", "frames": frames, "control points": cp_num, **row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--cp-num", type=int, default=60)
    p.add_argument("--frames", type=int, default=41)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("hop", "sway"):
            (Path(tmp) / name).mkdir()
            rows.append(demo_row(name, Path(tmp) / name))
        (Path(tmp) / "sphere").mkdir()
        rows.append(
            sphere_row(
                Path(tmp) / "sphere", vertices=args.vertices, cp_num=args.cp_num, frames=args.frames
            )
        )
    print("| scene | dynamic vertices | frames | control points | source GLBs | morph-target "
          "GLB | skinned GLB | ratio | write s (morph / skinned) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scene']} | {r['vertices']:,} | {r['frames']} | {r['control points']} "
            f"| {r['sources']:,} B | {r['morph']:,} B | {r['skinned']:,} B "
            f"| {r['morph'] / r['skinned']:.1f}x | {r['morph s']:.2f} / {r['skinned s']:.2f} |"
        )
    print()
    print("| scene | dynamic vertices | frames | skinned GLB | scene.usda (dynamic as) | "
          "scene.usda, points sampled | trajectories.npz + .json | USD write s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scene']} | {r['vertices']:,} | {r['frames']} | {r['skinned']:,} B "
            f"| {r['usd']:,} B ({r['usd kinds']}) | {r['usd points']:,} B "
            f"| {r['npz']:,} + {r['json']:,} B | {r['usd s']:.2f} |"
        )


if __name__ == "__main__":
    main()
