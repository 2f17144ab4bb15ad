"""The evaluate stage's "it did not move" flag (static_warning) through to metrics.tsv and the
aggregate plot."""

from __future__ import annotations

import dataclasses

import pandas as pd

from chord import paths, plots
from chord.stages import aggregate, evaluate
from tests.stages.test_export_stage import sway  # noqa: F401 (a trained demo scene)


def test_a_scene_that_barely_moves_is_flagged(sway, tmp_path, caplog, monkeypatch):  # noqa: F811
    res, s = sway.res, sway.s
    kw = {
        **sway.inputs,
        "state_path": paths.train_state(res, s, "coarse"),
        "ref_png": paths.reference_png(res, s),
        "loss_logs": {"coarse": paths.train_losses(res, s, "coarse")},
        "motion_json": None,
        "out_frame0": tmp_path / "frame0.png",
        "out_losses": tmp_path / "losses.png",
    }
    moved = evaluate.run(**kw, method=sway.m, out_json=tmp_path / "a.json")["mean_displacement"]
    assert moved > 0
    results = {}
    for name, threshold in (("moves", moved / 2), ("static", moved * 2)):
        m = dataclasses.replace(sway.m, static_threshold=threshold)
        with caplog.at_level("WARNING", logger="chord.stages.evaluate"):
            caplog.clear()
            results[name] = evaluate.run(**kw, method=m, out_json=tmp_path / f"{name}.json")
        assert results[name]["static_warning"] == (name == "static")
        assert ("barely move" in caplog.text) == (name == "static")
    shown = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: shown.setdefault("fig", fig))
    aggregate.run(
        metrics={n: tmp_path / f"{n}.json" for n in results},
        loss_logs={n: kw["loss_logs"] for n in results},
        out_tsv=tmp_path / "metrics.tsv",
        out_metrics_png=tmp_path / "bars.png",
        out_losses_png=tmp_path / "all_losses.png",
    )
    table = pd.read_csv(tmp_path / "metrics.tsv", sep="\t", index_col="scene")
    assert table["static_warning"].to_dict() == {"moves": False, "static": True}
    # the tier and device that produced each result
    assert table["tier"].to_dict() == {"moves": "split", "static": "split"}
    assert set(table["device"]) == {"cpu"}
    labels = [t.get_text() for t in shown["fig"].axes[0].get_xticklabels()]
    assert labels == ["moves", "static (static!)"]
    hatched = [bar.get_hatch() for bar in shown["fig"].axes[0].patches]
    assert hatched == [None, "//"]
