"""chord.evaluation.plots: the aggregate's bars show the scripted motion's value beside the
trained one where the table has it (issue 36: teacher and trained penetration side by side)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from chord.evaluation import plots


def drawn(monkeypatch, tmp_path, table):
    """The figure metric_bars draws for ``table`` (kept instead of closed)."""
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    plots.metric_bars(tmp_path / "bars.png", table)
    (fig,) = figs
    return {ax.get_title(): ax for ax in fig.axes}


def test_the_penetration_panel_marks_the_scripted_motions_value(monkeypatch, tmp_path):
    table = pd.DataFrame(
        {
            "penetration_excess": [0.0, 0.0047],
            "scripted_penetration_excess": [0.0, 0.036],
            "penetration_warning": [False, False],
        },
        index=pd.Index(["hop", "slide"], name="scene"),
    )
    ax = drawn(monkeypatch, tmp_path, table)[plots.BAR_METRICS["penetration_excess"]]
    (ticks,) = ax.collections
    assert np.allclose(ticks.get_offsets(), [[0, 0.0], [1, 0.036]])
    assert [b.get_height() for b in ax.patches] == [0.0, 0.0047]
    assert ax.get_legend().get_texts()[0].get_text() == "scripted motion"
    # a run without scripted motions (Wan): bars alone
    bare = drawn(monkeypatch, tmp_path, table.drop(columns="scripted_penetration_excess"))
    assert not bare[plots.BAR_METRICS["penetration_excess"]].collections
