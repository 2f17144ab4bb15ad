"""What the live previews cost a training (issue 37: <= 5 % of the CPU demo's training time).

    python bench/previews.py [--scene hop] [--iterations N]

Trains the coarse stage (the whole training where the scene has no fine stage, as hop and
sway) of a demo scene with the shipped config's method for it (the sheet's ``cpu_demo``
preset: 128x80, 21 frames, 300 iterations stopped early at 200) and its default
``preview_every`` (-1: iterations // 10 = every 30, and after the last), on the oracle, in a
temporary folder; ``--iterations N`` stops after the first N iterations of that schedule
(the previews keep the full run's cadence). Prints the training's wall time, the previews'
(written by :class:`chord.training.live_preview.Previews`, counted by the process) and their share.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="hop", choices=["hop", "sway"])
    ap.add_argument("--iterations", type=int, help="stop after this many (default: the run's)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from chord.cli import upstream_train
    from chord.config import settings
    from chord.plan import results_layout
    from chord.resources import tiers
    from chord.scene import demo
    from chord.stages import train as train_stage
    from chord.training import live_preview
    from chord.training.run_settings import RunSettings

    conf = settings.load_file(REPO / "config" / "config.yaml")
    spec = conf.scenes[args.scene]
    # the training's method as the workflow runs it on the first tier (a CPU has no other)
    tier = next(iter(tiers.parse(conf.tiers).values()))
    job = tiers.training_job(spec.method, conf.memory, tier, scene=args.scene)
    method = job.rank_method
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = demo.write_demo_scene(args.scene, root / "data", frame_num=spec.method.frame_num)
        inputs = upstream_train.oracle_train_inputs(
            data=data, results=root / "results", scene=args.scene, method=spec.method
        )
        folder = results_layout.previews_dir(root / "results", args.scene)
        preview = live_preview.view_keys(spec.method, folder)
        if args.iterations:
            from chord.training import run_loop

            real_run = run_loop.run

            def short(trainer, start, stop, **kw):
                return real_run(trainer, start, min(stop, args.iterations + 1), **kw)

            run_loop.run = short
        t0 = time.perf_counter()
        summary = train_stage.run_stage(
            "coarse",
            inputs=inputs,
            out=root / "coarse.pt",
            loss_log=root / "losses.tsv",
            checkpoint_dir=root / "ckpt",
            method=method,
            guidance=conf.guidance,
            memory=job.memory,
            run_settings=RunSettings(scene=args.scene, preview=preview),
        )
        wall = time.perf_counter() - t0
        (ckpt,) = (root / "ckpt").iterdir()
        latest = json.loads((ckpt / "progress.json").read_text())
        previews = sorted(p.name for p in folder.glob("it_*.mp4"))
    spent = latest.get("preview_s") or 0.0
    print(
        f"{args.scene}: iterations {summary['start']}..{summary['last']} in {wall:.1f} s "
        f"(stage wall, loading included), {latest['s_per_it']:.3f} s/it; {len(previews)} "
        f"previews every {preview['every']} ({', '.join(previews)}) took {spent:.2f} s = "
        f"{100 * spent / wall:.2f} % of the stage, "
        f"{100 * spent / (wall - spent):.2f} % of the rest"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
