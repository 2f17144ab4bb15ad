"""Wall time of the geometry stages (ingest, gaussians, voxelize) on the demo scenes and on
a scene built from the third-party Duck model (Duck dynamic on BoxTextured, static).

    python bench/geometry.py [--gs-init-num 100000] [--repeat 3]

Runs each stage's run() in-process, as the Snakemake rules do, and prints a table of the
best wall time over the repeats per scene and stage. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path

from chord.config import settings
from chord.plan import results_layout
from chord.scene import demo, ingestion
from chord.stages import gaussians, ingest, voxelize

if __package__:
    from bench import fixtures
else:
    import fixtures

# The vendored Khronos models (tests/data/khronos/README.md: sources and licences).
KHRONOS = fixtures.ROOT / "tests" / "data" / "khronos"


def timed(fn, **kw) -> float:
    start = time.perf_counter()
    fn(**kw)
    return time.perf_counter() - start


def run_scene(data: Path, results: Path, scene: str, method) -> dict[str, float]:
    sj = results_layout.scene_json(results, scene)
    t = {
        "ingest": timed(
            ingest.run,
            data=data,
            out_json=sj,
            out_meshes=results_layout.meshes_dir(results, scene),
            method=method,
            scene=scene,
        )
    }
    doc = ingestion.read_scene_json(sj)
    t["gaussians"] = t["voxelize"] = 0.0
    for o in doc["objects"]:
        if o["role"] == "avoided":
            continue
        ply = results_layout.gaussians_ply(results, scene, o["name"])
        t["gaussians"] += timed(gaussians.run, scene_json=sj, obj=o["name"], out=ply, method=method)
        if o["role"] == "dynamic":
            t["voxelize"] += timed(
                voxelize.run,
                scene_json=sj,
                obj=o["name"],
                gaussians=ply,
                out=results_layout.voxels_npz(results, scene, o["name"]),
                method=method,
            )
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gs-init-num", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    method = settings.method_from_mapping({"gs_init_num": args.gs_init_num})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scenes = {name: demo.write_demo_scene(name, tmp / "data") for name in demo.DEMO_SCENES}
        duck = tmp / "data" / "duck"
        duck.mkdir()
        shutil.copy(KHRONOS / "Duck.glb", duck / "obj_0.glb")
        shutil.copy(KHRONOS / "BoxTextured.glb", duck / "obj_1.glb")
        shutil.copy(KHRONOS / "Duck.glb", duck / "scene.glb")
        scenes["duck"] = duck
        print(f"gs_init_num {args.gs_init_num}, best of {args.repeat}")
        header = ("scene", "ingest s", "gaussians s", "voxelize s", "total s")
        print("{:8s} {:>9s} {:>12s} {:>11s} {:>8s}".format(*header))
        for name, data in scenes.items():
            runs = [run_scene(data, tmp / f"results{i}", name, method) for i in range(args.repeat)]
            best = {k: min(r[k] for r in runs) for k in runs[0]}
            print(
                f"{name:8s} {best['ingest']:9.3f} {best['gaussians']:12.3f} "
                f"{best['voxelize']:11.3f} {sum(best.values()):8.3f}"
            )


if __name__ == "__main__":
    main()
