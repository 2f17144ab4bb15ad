"""chord.evaluation.plots: the aggregate's bars show the scripted motion's value beside the
trained one where the table has it (issue 36: teacher and trained penetration side by side),
and a damaged scene's value that cannot be drawn is drawn as n/a (issue 47)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from chord.evaluation import metrics_file, plots
from chord.stages import aggregate


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


# values a damaged metrics.json may hold in a plotted number that metrics_file.read accepts
# (tests/unit/training/test_state_fuzz.py): drawable ones, and ones drawn as n/a. Drawn as
# bars or marks, the latter crash the figure only in some layouts (1e308 overflows the tick
# locator on an axis short enough for one tick, as in a figure of a hundred scenes' long names;
# 1e308 beside -1e308 collapses the axis to +-0.05 silently): what is drawn is asserted instead
ABSENT = object()  # the entry left out of the file
DRAWN = {"0.25": 0.25, "1.5": 1.5, "-1": -1, "0": 0, "2**63": 2**63}
NOT_DRAWN = {"1e308": 1e308, "-1e308": -1e308, "inf": math.inf, "-inf": -math.inf,
             "nan": math.nan, "null": None, "absent": ABSENT}  # fmt: skip


def test_a_damaged_scenes_value_is_drawn_as_na_and_leaves_the_axis_alone(monkeypatch, tmp_path):
    # each scene's metrics.json holds its value in every bar and every mark: the table
    # aggregate builds of them, drawn and saved as the report's PNG
    numbers = [*plots.BAR_METRICS, *(m for m, _ in plots.BAR_MARKS.values())]
    files = {}
    for scene, value in {**DRAWN, **NOT_DRAWN}.items():
        doc = {"format": metrics_file.FORMAT, "scene": scene}
        doc |= {m: value for m in numbers if value is not ABSENT}
        files[scene] = tmp_path / f"{scene}.json"
        files[scene].write_text(json.dumps(doc))
    table = aggregate.table(files)
    assert "unreadable" not in table.columns  # every scene's values accepted
    figs = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (save(fig, path), figs.append(fig)))
    plots.metric_bars(tmp_path / "bars.png", table)
    assert (tmp_path / "bars.png").read_bytes().startswith(b"\x89PNG")
    (fig,) = figs
    panels = {ax.get_title(): ax for ax in fig.axes if ax.axison}
    assert set(panels) == set(plots.BAR_METRICS.values())
    scenes = list(table.index)
    drawn_at = [scenes.index(s) for s in DRAWN]
    values = np.array([float(v) for v in DRAWN.values()])
    marked = [plots.BAR_METRICS[c] for c in plots.BAR_MARKS]
    for title, ax in panels.items():
        heights = np.array([b.get_height() for b in ax.patches])
        labels = [t.get_text() for t in ax.texts]
        assert np.array_equal(heights[drawn_at], values), title
        assert [labels[k] for k in drawn_at] == [f"{v:.3g}" for v in values], title
        for scene in NOT_DRAWN:  # n/a on a bar of nothing
            assert (labels[scenes.index(scene)], heights[scenes.index(scene)]) == ("n/a", 0)
        assert len(ax.collections) == (title in marked), title
        for ticks in ax.collections:  # a mark: the drawable values, none of the others
            y = ticks.get_offsets()[:, 1]
            assert np.array_equal(y[drawn_at], values), title
            shown = {s: y[scenes.index(s)] for s in NOT_DRAWN}
            assert not {s: v for s, v in shown.items() if v is not np.ma.masked}, title
        # the axis shows the largest drawable value and is not stretched by those drawn as
        # n/a: its limits at most the drawable values' span (at most twice their largest
        # size) beyond them by metric_bars' margins (0.2 of the span)
        low, high = ax.get_ylim()
        size = np.abs(values).max()
        assert high >= values.max() and max(-low, high) <= size * (1 + 2 * 0.2), (title, low, high)
