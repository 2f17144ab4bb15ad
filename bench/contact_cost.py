"""What the contact terms cost per training iteration (issue 36: at most 15 % more): a demo
scene's trainer built from a results folder's stage outputs (as the training stage builds it),
once with the contact and support weights the config gives the scene and once with both 0,
stepped in turns (ABAB...) on one thread, CPU seconds per iteration of each and their ratio.

    python bench/contact_cost.py --results results --scene slide [--iterations 20]

``--results``: a results folder holding the scene's ingest, gaussians, voxelize and condition
outputs (after ``snakemake --cores all``, or ``--until condition``). Iterations 1.. of the
scene's schedule; the first of each trainer is a warm-up and is not counted. Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

if __package__:
    from bench import fixtures
else:
    import fixtures


def trainer(results: Path, scene: str, overrides: dict):
    from chord.cli import upstream_train
    from chord.plan import results_layout
    from chord.training import scene_trainer

    method, guidance = fixtures.scene_config(scene, overrides=overrides)
    inputs = upstream_train.run_inputs(results / scene)
    cfg = fixtures.load_config()
    return scene_trainer.build(
        **inputs,
        text_path=results_layout.text_condition(results, scene),
        data_dir=cfg.scenes[scene].data,
        method=method,
        guidance=guidance,
        seed=method.seed,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--scene", default="slide")
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    method, _ = fixtures.scene_config(args.scene)
    on = {"lambda_contact": method.lambda_contact, "lambda_support": method.lambda_support}
    if not any(on.values()):
        raise SystemExit(f"{args.scene}: the config sets no contact weight: nothing to compare")
    runs = {
        "off": trainer(args.results, args.scene, {"lambda_contact": 0.0, "lambda_support": 0.0}),
        "on": trainer(args.results, args.scene, {}),
    }
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    for it in range(1, args.iterations + 2):
        for label, tr in runs.items():
            start = time.process_time()
            tr.step(it)
            if it > 1:
                seconds[label].append(time.process_time() - start)
    off, on_s = (statistics.median(seconds[k]) for k in ("off", "on"))
    print(f"{args.scene}: {on}, {args.iterations} iterations each, 1 thread, CPU s/it (median)")
    print(f"off {off:.4f}  on {on_s:.4f}  on/off {on_s / off:.3f}")


if __name__ == "__main__":
    main()
