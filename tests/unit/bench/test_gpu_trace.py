"""bench/gpu_trace.py's arithmetic: the floor per iteration from FLOPs and the cards' peaks."""

from __future__ import annotations

import pytest

from bench import gpu_trace


def test_the_floor_is_flops_over_the_dense_peak_and_the_projections_divide_it():
    one_second = gpu_trace.PEAK_BF16["H100 SXM"]
    out = gpu_trace.floor(int(one_second))["H100 SXM"]
    assert out["floor_s"] == pytest.approx(1.0)
    assert (out["at_40pct_s"], out["at_60pct_s"]) == (pytest.approx(2.5), pytest.approx(1 / 0.6))
    assert out["release_over_floor"] == pytest.approx(gpu_trace.RELEASE_S_PER_IT)


def test_the_table_has_a_row_per_tier_and_names_a_failure():
    ok = {
        "tier": "split", "ok": True, "size": "832*480", "traced_peak_bytes": 2**30,
        "model_peak_bytes": 2**31, "budget_bytes": 48 * 10**9,
        "flops_per_iteration": {"dit": 10**15, "total": 2 * 10**15},
    }  # fmt: skip
    bad = {"tier": "full", "ok": False, "error": "DeviceRuleError: aten.mm.default: ..."}
    lines = gpu_trace.table({"tiers": [ok, bad]}).splitlines()
    assert lines[2].startswith("| split | 832*480 | 1.0 | 2.0 | 2.000 | 44.7 | 1000 | 2000 |")
    assert lines[3] == "| full | failed: DeviceRuleError: aten.mm.default: ... |"
