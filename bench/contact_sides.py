"""The contact loss off and on, side by side (issue 36): for each scene of two finished results
folders, the evaluate stage's penetration_excess, float_gap, penetration_warning and
recovery_relative, and the training's CPU seconds per iteration (its Snakemake benchmark's
cpu_time over the iterations run), as a Markdown table.

    snakemake --cores all --configfile config/config.yaml bench/contact_off.yaml
    snakemake --cores all --config results=results-on
    python bench/contact_sides.py --off results-off --on results-on

The first command trains with lambda_contact 0 (bench/contact_off.yaml), the second with the
shipped default. CPU seconds per iteration of two separate runs are only as comparable as the
machine's load was; bench/contact_cost.py measures the ratio in one process. Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

COLUMNS = ("penetration_excess", "float_gap", "penetration_warning", "recovery_relative")


def row(results: Path, scene: str) -> dict:
    metrics = json.loads((results / scene / "metrics.json").read_text())
    with open(results / scene / "bench" / "train_coarse.tsv", newline="") as f:
        bench = next(csv.DictReader(f, delimiter="\t"))
    out = {k: metrics.get(k) for k in COLUMNS}
    out["cpu_s_per_it"] = float(bench["cpu_time"]) / metrics["iteration"]
    return out


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--off", type=Path, required=True)
    ap.add_argument("--on", type=Path, required=True)
    args = ap.parse_args()
    scenes = [p.parent.name for p in sorted(args.on.glob("*/metrics.json"))]
    keys = (*COLUMNS, "cpu_s_per_it")
    print("| scene | " + " | ".join(f"{k} off | on" for k in keys) + " |")
    print("|---|" + "---|---|" * len(keys))
    for scene in scenes:
        off, on = row(args.off, scene), row(args.on, scene)
        cells = [f"{fmt(off[k])} | {fmt(on[k])}" for k in keys]
        print(f"| {scene} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
