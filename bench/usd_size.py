"""Size of the trained Gaussians in USD (issue 48): the splat layer ``splats.usd`` that
``scene.usda`` sublayers, written by chord.export.usd.write_usd as the export stage writes it,
then with every dynamic object's splats time-sampled (positions and orientations per frame)
or rigid (rest values under its posed Xform), each as text (usda) and as USD's crate (usdc).

    python bench/usd_size.py [--gaussians 100000] [--cp-num 60] [--frames 41]

Rows: the demo scenes with their geometry and Gaussians prepared by the demo config (preset
cpu_demo) and a trained-like motion (bench/glb_size.py's: seeded N(0, 0.01²) table values),
then one UV sphere as the only, dynamic object with ``--gaussians`` Gaussians initialised on
it (SH degree 0, as the demo's), ``--cp-num`` control points, ``--frames`` frames. Prints
bytes, numbers written and write seconds. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trimesh

if __package__:
    from bench import glb_size
else:
    import glb_size

from chord.export import usd, usd_splats
from chord.gaussians import gaussian_set
from chord.motion import control_points
from chord.motion.model import DynamicObject, MotionScene
from chord.render.rasterizer import splat_tensors
from chord.scene import ingestion

VARIANTS = {  # name: (motion kind forced on every dynamic object or None, TEXT_NUMBERS)
    "as written": (None, usd_splats.TEXT_NUMBERS),
    "sampled, usda": ("points", 10**15),
    "sampled, usdc": ("points", -1),
    "rigid, usda": ("rigid", 10**15),
    "rigid, usdc": ("rigid", -1),
}


def layer_sizes(folder: Path, **kw) -> dict:
    """Bytes, numbers, format and write seconds of splats.usd for every variant."""
    row = {}
    kind, limit = usd.motion_kind, usd_splats.TEXT_NUMBERS
    try:
        for name, (forced, text_numbers) in VARIANTS.items():
            usd.motion_kind = kind if forced is None else (lambda *a, k=forced: k)
            usd_splats.TEXT_NUMBERS = text_numbers
            out = folder / name.replace(", ", "_").replace(" ", "_")
            start = time.perf_counter()
            summary = usd.write_usd(out / "scene.usda", out_splats=out / "splats.usd", **kw)
            row[name] = {
                "bytes": (out / "splats.usd").stat().st_size,
                "s": time.perf_counter() - start,
                **summary["splats"],
                "kinds": sorted(set(summary["objects"].values()) - {"static"}),
            }
            for p in out.iterdir():  # the sampled text of 100k Gaussians is hundreds of MB
                p.unlink()
    finally:
        usd.motion_kind, usd_splats.TEXT_NUMBERS = kind, limit
    return row


def demo_row(name: str, folder: Path) -> dict:
    method, doc, gsets, scene, sources = glb_size.demo_scene(name, folder)
    sizes = layer_sizes(
        folder, doc=doc, scene=scene, sources=sources, gaussians=gsets,
        frames=method.frame_num, fps=method.save_fps,
    )  # fmt: skip
    n = sum(len(g) for g in gsets.values())
    return {"scene": name, "gaussians": n, "frames": method.frame_num, **sizes}


def sphere_row(folder: Path, *, gaussians: int, cp_num: int, frames: int) -> dict:
    mesh = trimesh.creation.uv_sphere(radius=0.4, count=[100, 100])
    src = folder / "obj_0.glb"
    trimesh.Scene(mesh).export(src, file_type="glb")
    c, s = ingestion.normalisation(ingestion.bounds_of([mesh]))
    normalised = ingestion.normalise_parts([mesh], c, s)
    rest = normalised[0].vertices
    centres = control_points.place_control_points(rest, cp_num)
    gset = gaussian_set.init_from_mesh(normalised, gaussians, seed=0)
    splats = splat_tensors(gset)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    obj = DynamicObject(
        "obj_0", splats["means"], splats["quats"], t(centres), t(rest[::10]), frame_num=frames
    )
    scene = MotionScene(["obj_0"], [splats], {"obj_0": obj})
    glb_size.shake(scene)
    doc = {
        "scene": "sphere",
        "normalisation": {"centre": c.tolist(), "scale": float(s)},
        "objects": [{"name": "obj_0", "role": "dynamic", "source": str(src),
                     "bounds": normalised[0].bounds.tolist()}],
    }  # fmt: skip
    sizes = layer_sizes(
        folder, doc=doc, scene=scene, sources={"obj_0": src}, gaussians={"obj_0": gset},
        frames=frames, fps=10,
    )  # fmt: skip
    return {"scene": "UV sphere", "gaussians": len(gset), "frames": frames, **sizes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gaussians", type=int, default=100_000)
    p.add_argument("--cp-num", type=int, default=60)
    p.add_argument("--frames", type=int, default=41)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("hop", "sway", "slide"):
            (Path(tmp) / name).mkdir()
            rows.append(demo_row(name, Path(tmp) / name))
        (Path(tmp) / "sphere").mkdir()
        rows.append(sphere_row(Path(tmp) / "sphere", gaussians=args.gaussians,
                               cp_num=args.cp_num, frames=args.frames))  # fmt: skip
    print(f"splats.usd is text up to TEXT_NUMBERS = {usd_splats.TEXT_NUMBERS:,} numbers\n")
    head = " | ".join(VARIANTS)
    print(f"| scene | Gaussians | frames | {head} |")
    print("|---|---|---|" + "---|" * len(VARIANTS))
    for r in rows:
        cells = []
        for name in VARIANTS:
            v = r[name]
            extra = f" ({v['format']}, {'/'.join(v['kinds'])})" if name == "as written" else ""
            cells.append(f"{v['bytes']:,} B{extra}")
        print(f"| {r['scene']} | {r['gaussians']:,} | {r['frames']} | " + " | ".join(cells) + " |")
    print()
    print(f"| scene | numbers (sampled / rigid) | write s ({', '.join(VARIANTS)}) |")
    print("|---|---|---|")
    for r in rows:
        secs = " / ".join(f"{r[n]['s']:.2f}" for n in VARIANTS)
        print(f"| {r['scene']} | {r['sampled, usda']['numbers']:,} / "
              f"{r['rigid, usda']['numbers']:,} | {secs} |")  # fmt: skip


if __name__ == "__main__":
    main()
