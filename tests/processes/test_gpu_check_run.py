"""bench/gpu_check.py's --tiny run in its own process, as a user runs it: every tier a row, each
failure a row with its reason (its rows' logic in-process: tests/unit/bench/test_gpu_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from tests import components
from tests.components import skip_without
from tests.conftest import REPO as ROOT

SCRIPT = ROOT / "bench" / "gpu_check.py"
#: runs a script with the imports the GPU image lacks, and bench/gpu_wheels.txt does not carry,
#: blocked (bench/gpu_imports.py)
GUARD = ROOT / "bench" / "gpu_imports.py"


@skip_without(components.CPU_ONLY, not torch.cuda.is_available(), "the --tiny run is the CPU check")
def test_tiny_run_prints_every_tier_and_fails_soft(tmp_path):
    """The whole --tiny run, importing only what the GPU image has or bench/gpu_wheels.txt
    carries (mmgp too, which the offload tiers import on a GPU): a missing wheel fails here."""
    out = tmp_path / "check.json"
    guarded = [sys.executable, str(GUARD), "--import", "mmgp.offload"]
    proc = subprocess.run(
        [*guarded, str(SCRIPT), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = ["full", "split", "split_plain", "offload", "lowres", "lowres_min"]
    for name in names:
        assert f"\n{name} " in proc.stdout
    report = json.loads(out.read_text())
    rows = {r["tier"]: r for r in report["rows"]}
    assert [r["tier"] for r in report["rows"]] == names
    for name in ("full", "split", "split_plain"):
        r = rows[name]
        assert r["status"] == "ok"
        assert r["s_it"] > 0 and r["render"] > 0 and r["encode"] > 0 and r["dit"] > 0
        # the RSS above the tier's start: a later tier may reuse pages an earlier one freed
        assert r["allocated"] >= 0 and r["estimate"] > 0
    assert rows["full"]["allocated"] > 0
    # split renders and encodes again instead of keeping the graphs: less memory
    assert rows["split"]["allocated"] < rows["full"]["allocated"]
    # mmgp needs CUDA: those tiers are rows with the reason, not a crash
    for name in ("offload", "lowres", "lowres_min"):
        assert "needs a CUDA GPU" in rows[name]["status"]
    assert (rows["lowres"]["size"], rows["lowres_min"]["size"]) == ("48x32", "32x16")
    assert report["parity"]["status"].startswith("skipped")
    # the float32 fallback row: split flags after use_float32, beside the float32 estimate
    assert "\nsplit_fp32 " in proc.stdout
    f32 = report["float32"]
    assert (f32["tier"], f32["size"], f32["status"]) == ("split_fp32", "32x16", "ok")
    assert isinstance(f32["allocated"], int) and f32["s_it"] > 0 and f32["dit"] > 0
    assert f32["estimate"] > 0 and f32["estimate_main_size"] > f32["estimate"]
    # the expert saved once, then a high -> low switch: release, load from disk, to device
    reload = report["reload"]
    assert reload["status"] == "ok" and reload["loads"] == 2
    assert reload["save_s"] > 0 and reload["weights_bytes"] > 0
    assert reload["switch_s"] >= reload["load_s"] > 0 and reload["release_s"] > 0
    assert reload["host_peak"] is not None and reload["gpu_peak"] is None
    assert "expert reload (high -> low noise switch" in proc.stdout
    # gsplat timing needs CUDA: skipped with the reason
    timing = report["render_timing"]["status"]
    assert timing.startswith("skipped: ") and "needs CUDA" in timing
    assert "renderer timing: skipped" in proc.stdout
