"""Time ``chord status`` over a generated results tree of many scenes (issue 37: <= 2 s for
1,000 scenes).

    python bench/status.py [--scenes 1000] [--repeat 3]

Writes, in a temporary folder, a scene sheet of N rows (each pointing at a bundled demo scene,
as bench/dag.py does) and a results tree in which the runs cycle through the states: a fifth
done (every stage's output to metrics.json), a fifth training with a fresh progress.json, a
fifth stalled (an hour-old one), a fifth failed (an error at the end of a log of a few
thousand lines) and a fifth not started. It prints the best wall time of the whole command
(``python -m chord.cli.main status``: Python start-up, the config and sheet, every run's files) and
the states counted. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_tree(root: Path, n: int) -> Path:
    from chord.plan import results_layout
    from chord.training import progress

    demo = root / "demo"
    res = root / "results"
    rows = ["scene\tdata\tprompt"]
    now = time.time()
    log_lines = "".join(
        f"2026-12-04 10:00:00,000 INFO chord.training.progress: progress scene=s it={i}/3000\n"
        for i in range(3000)
    )
    for i in range(n):
        scene = f"s{i:05d}"
        rows.append(f"{scene}\t{demo / ('hop' if i % 2 else 'sway')}\ta prompt {i}")
        kind = i % 5
        files = [results_layout.scene_json(res, scene)]
        if kind == 0:
            files += [
                results_layout.train_state(res, scene, "coarse"),
                results_layout.metrics_json(res, scene),
            ]
        for f in files:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
        if kind in (1, 2):
            folder = results_layout.checkpoints(res, scene, "coarse") / "0123456789abcdef"
            folder.mkdir(parents=True, exist_ok=True)
            doc = {"stage": "coarse", "it": 1200, "total": 3000, "s_per_it": 21.3,
                   "eta_s": 1800 * 21.3, "sds": 0.01, "arap": 0.003, "tier": "split",
                   "attempt": 1, "state": "running", "slowest_s": 30.0,
                   "updated_at": now - (5 if kind == 1 else 3600)}  # fmt: skip
            (folder / progress.LATEST).write_text(json.dumps(doc))
        if kind in (2, 3):
            log = results_layout.log(res, scene, "train_coarse")
            log.parent.mkdir(parents=True, exist_ok=True)
            tail = "2026-12-04 11:00:00,000 ERROR chord: stage failed\n" if kind == 3 else ""
            log.write_text(log_lines + tail)
    (root / "scenes.tsv").write_text("\n".join(rows) + "\n")
    config = root / "config.yaml"
    config.write_text(
        json.dumps({"scenes": str(root / "scenes.tsv"), "results": str(res), "demo_dir": str(demo)})
    )
    return config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        config = write_tree(Path(tmp), args.scenes)
        cmd = [sys.executable, "-m", "chord.cli.main", "status", "--config", str(config), "--json"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            best = min(best, time.perf_counter() - t0)
        total = json.loads(proc.stdout)["total"]
    states = ", ".join(
        f"{total[s]} {s}" for s in ("done", "running", "stalled", "failed", "waiting")
    )
    print(f"chord status over {args.scenes} scenes: best of {args.repeat}: {best:.2f} s ({states})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
