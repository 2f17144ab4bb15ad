"""The GPU run at its real shapes, traced on a faked ``cuda:0``: peak memory per tier beside the
peak-memory model and the tier's budget, and the floor per iteration from its FLOPs.

Runs ``python -m chord.checks.fake_iteration --experts a14b`` (a fresh interpreter: the fake
device loads before torch) over every tier of the config at the config's own method (832x480,
41 frames, batch 4 by default): Wan 2.2 I2V A14B's experts, the Wan 2.1 VAE and the Tiny VAE
built on the fake device from their shapes, nothing read or materialised. Then:

- memory: per tier the traced peak of live device bytes (``traced_peak_bytes``, with the peak
  per phase), the model's estimate (``model_peak_bytes``) and the budget (``budget_bytes``:
  the tier's ``gpu_mem_gb``, 10^9 bytes as cards are sold);
- compute: FLOPs per iteration by component (``flops``: torch's FlopCounterMode over the
  iteration, forward and backward), the floor in seconds at the cards' dense bf16 peaks
  (:data:`PEAK_BF16`), the projection at 40 % and 60 % of it, and the release's s/it as a
  multiple of the floor.

    python bench/gpu_trace.py [--config FILE] [--tier NAME]... [--gaussians N] [--json OUT]

``--json bench/gpu_trace.json`` writes the file bench/gpu_check.py reads on the device: its
scene (:func:`chord.checks.fake_iteration.block_on_slab`, 50,000 Gaussians per object) and the
workflow's method are this trace's, so each measured row stands beside its traced peak.

About 6 minutes on 2 cores for the five default tiers (BENCHMARKS.md has the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from chord.checks.fake_iteration import CHECK_GAUSSIANS  # noqa: E402  (stdlib imports only)

#: dense bf16 Tensor Core peaks, FLOP/s: NVIDIA's H100 (SXM5) and H200 (SXM) datasheets give
#: 1,979 TFLOPS "with sparsity" for both; dense is half
PEAK_BF16 = {"H100 SXM": 989.4e12, "H200 SXM": 989.4e12}
UTILISATION = (0.4, 0.6)
#: CHORD's release: about 12 h per scene on an H200 at its 2,000 iterations
RELEASE_S_PER_IT = 21.6


def trace(config: Path, tiers: list[str], out: Path, gaussians: int) -> dict:
    cmd = [sys.executable, "-m", "chord.checks.fake_iteration", "--experts", "a14b"]
    cmd += ["--config", str(config), "--json", str(out), "--gaussians", str(gaussians)]
    for tier in tiers:
        cmd += ["--tier", tier]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True)
    if not out.is_file():
        sys.exit(f"gpu_trace: the faked run wrote no report (exit {proc.returncode})")
    return json.loads(out.read_text())


def budgets(config: Path) -> dict[str, int]:
    from chord.config import settings
    from chord.resources import tiers

    parsed = tiers.parse(settings.validate_config(settings.read_yaml(config))["tiers"])
    return {name: int(t.gpu_mem_gb * 1e9) for name, t in parsed.items()}


def floor(flops: int) -> dict:
    """Seconds per iteration at each card's peak and at :data:`UTILISATION` of it."""
    out = {}
    for card, peak in PEAK_BF16.items():
        s = flops / peak
        out[card] = {"floor_s": s, **{f"at_{int(u * 100)}pct_s": s / u for u in UTILISATION}}
        out[card]["release_over_floor"] = RELEASE_S_PER_IT / s
    return out


def table(report: dict) -> str:
    gib = lambda b: f"{b / 2**30:.1f}"  # noqa: E731
    rows = [
        "| tier | size | traced peak GiB | model GiB | model / trace | budget GiB | DiT TFLOP "
        "| total TFLOP/it | floor s (H100/H200) | at 40 % / 60 % s | release / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["tiers"]:
        if not row["ok"]:
            rows.append(f"| {row['tier']} | failed: {row['error'].splitlines()[0][:120]} |")
            continue
        f = row["flops_per_iteration"]
        fl = floor(f["total"])["H100 SXM"]
        rows.append(
            f"| {row['tier']} | {row['size']} | {gib(row['traced_peak_bytes'])} | "
            f"{gib(row['model_peak_bytes'])} | "
            f"{row['model_peak_bytes'] / row['traced_peak_bytes']:.3f} | "
            f"{gib(row['budget_bytes'])} | {f['dit'] / 1e12:.0f} | {f['total'] / 1e12:.0f} | "
            f"{fl['floor_s']:.2f} | {fl['at_40pct_s']:.2f} / {fl['at_60pct_s']:.2f} | "
            f"{fl['release_over_floor']:.1f}x |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--tier", action="append", default=[])
    parser.add_argument(
        "--gaussians",
        type=int,
        default=CHECK_GAUSSIANS,
        help=f"per object (default {CHECK_GAUSSIANS:,}: bench/gpu_check.py's scene, so its "
        "measured peaks go beside these)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = trace(args.config, args.tier, Path(tmp) / "trace.json", args.gaussians)
    budget = budgets(args.config)
    for row in report["tiers"]:
        row["budget_bytes"] = budget[row["tier"]]
        if row["ok"]:
            row["floor"] = floor(row["flops_per_iteration"]["total"])
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
