"""Ablations on a CPU: recovery of the scripted motion with the Fenwick table vs an
independent per-frame table, and time / peak memory of each memory mode relative to the
default mode.

    python bench/recovery.py recovery [--scene hop] [--iterations N]
    python bench/recovery.py memory [--repeat 2]

recovery: the demo scene is generated and prepared in a temporary folder with the shipped
demo config (config/config.yaml's method, its cpu_demo preset and guidance), then trained twice
with the oracle teacher and the same seed and budget: once with the Fenwick table, once
converted to a per-frame table before the first iteration (convert_cp_independent_iter =
1). It prints metrics.json's recovery_relative six times per run: the mean over frames and
dynamic Gaussians of |x_pred − x_scripted|, divided by the mean scripted displacement.

memory: one SDS backward of a 2-video batch on the tiny random Wan components (41 frames,
64x32) per memory mode, each in a fresh process. It prints the best wall time and the peak
RSS above the process's baseline (models loaded, before the first backward) as ratios to
the default mode. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__:
    from bench import fixtures
else:
    import fixtures

MODES = [
    (s, r, c)
    for s, r, c in itertools.product((False, True), (False, True), (-1, 21, 1))
    if r or c == -1
]


def recovery_error(trainer) -> float:
    """metrics.json's recovery_relative: mean |x_pred − x_scripted| over frames and the
    dynamic Gaussians, divided by their mean scripted displacement."""
    from chord.evaluation import metrics

    target = trainer.guidance.target["means"]
    with torch.no_grad():
        pred, true = [], []
        for name, obj in trainer.scene.dynamic.items():
            pred.append(obj.deform(range(trainer.method.frame_num))[0])
            true.append(target[:, trainer.scene.slices[name]].to(pred[-1]))
    return metrics.recovery_error(torch.cat(pred, 1), torch.cat(true, 1))["recovery_relative"]


def recovery(args) -> None:
    from chord.cli import upstream_train
    from chord.training import scene_trainer

    over = {"iterations": args.iterations} if args.iterations else None
    method, guidance = fixtures.scene_config(args.scene, overrides=over)
    every = max(1, method.iterations // 6)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from chord.scene import demo

        data = demo.write_demo_scene(args.scene, root / "data", frame_num=method.frame_num)
        inputs = upstream_train.oracle_train_inputs(
            data=data, results=root, scene=args.scene, method=method
        )
        print(
            f"{args.scene}: the shipped demo config ({method.size}, {method.frame_num} frames, "
            f"{method.iterations} iterations, batch {method.batch_size}), oracle"
        )
        print(
            f"{'table':10s} "
            + " ".join(f"it{it:>5d}" for it in range(every, method.iterations + 1, every))
            + "   s/it"
        )
        for name, extra in (("fenwick", {}), ("per-frame", {"convert_cp_independent_iter": 1})):
            m = dataclasses.replace(method, **extra)
            trainer = scene_trainer.build(**inputs, method=m, guidance=guidance, seed=0)
            row, start = [], time.perf_counter()
            for it in range(1, m.iterations + 1):
                trainer.step(it)
                if it % every == 0:
                    row.append(recovery_error(trainer))
            per_it = (time.perf_counter() - start) / m.iterations
            print(f"{name:10s} " + " ".join(f"{e:7.3f}" for e in row) + f" {per_it:6.2f}")


def one_mode(mode: str, repeat: int) -> None:
    """Child process: time one SDS backward in the given mode; print JSON."""
    from chord.config import settings
    from chord.guidance import tiny_models, wan
    from chord.training import trainer

    s, r, c = json.loads(mode)
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_models.write_tiny_wan(Path(tmp) / "wan")
        guide = wan.WanGuidance(folder)
        method = settings.method_from_mapping({"size": "64*32", "batch_size": 2, "seed": 0})
        # an untextured block (dynamic, 12 control points, 41 frames) on a slab (static)
        scene = fixtures.block_scene(4000, 41, deform=0.02)
        tr = trainer.Trainer(
            scene=scene,
            guidance=guide,
            text=fixtures.tiny_text(folder),
            method=method,
            width=64,
            height=32,
            memory=settings.memory_from_mapping(
                {"split_sds_backward": s, "split_render_backward": r, "split_render_chunk_size": c}
            ),
        )
        cams = tr.cameras_at(1)
        for name in ("transformer", "transformer_2"):  # load both experts before measuring
            guide._activate(name)
        base = fixtures.maxrss_mb()
        best = fixtures.best_of(lambda: tr.sds(1, cams), repeat)
        peak = fixtures.maxrss_mb() - base
    print(json.dumps({"s": best, "peak_mb": peak}))


def memory(args) -> None:
    rows = []
    for mode in MODES:
        out = subprocess.run(
            [sys.executable, __file__, "one-mode", json.dumps(mode), "--repeat", str(args.repeat)],
            capture_output=True,
            text=True,
            check=True,
            cwd=fixtures.ROOT,
        )
        rows.append((mode, json.loads(out.stdout.strip().splitlines()[-1])))
    ref = rows[0][1]
    print("tiny Wan, 41 frames, 64x32, batch 2; ratios to the default mode")
    print(f"{'split_sds':>9s} {'split_render':>12s} {'chunk':>5s} {'time':>6s} {'peak RSS':>9s}")
    for (s, r, c), v in rows:
        print(
            f"{s!s:>9s} {r!s:>12s} {c:>5d} {v['s'] / ref['s']:6.2f} "
            f"{v['peak_mb'] / max(ref['peak_mb'], 1e-9):9.2f}"
        )
    print(f"(default: {ref['s']:.2f} s, {ref['peak_mb']:.0f} MB above baseline)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("recovery")
    r.add_argument("--scene", default="hop")
    r.add_argument("--iterations", type=int, help="default: the demo config's")
    m = sub.add_parser("memory")
    m.add_argument("--repeat", type=int, default=2)
    o = sub.add_parser("one-mode")
    o.add_argument("mode")
    o.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    if args.what == "recovery":
        recovery(args)
    elif args.what == "memory":
        memory(args)
    else:
        one_mode(args.mode, args.repeat)


if __name__ == "__main__":
    main()
