"""Rule ``aggregate``: every scene's metrics.json as one table (``results/metrics.tsv``, one
row per scene) and the plots across scenes (metric bars, loss curves)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError
from chord.evaluation import metrics_file, plots

logger = logging.getLogger(__name__)


def table(metrics: dict[str, Path]) -> pd.DataFrame:
    """One row per scene (in the given order) of the scalar entries of each metrics.json. A
    file that cannot be read or is damaged (:func:`chord.evaluation.metrics_file.read`, with
    the plotted metrics as numbers) is a warning naming it and its scene's row holds only
    ``unreadable`` (why): every other scene's row is kept. None readable is an InputError."""
    numbers = [*plots.BAR_METRICS, *(m for m, _ in plots.BAR_MARKS.values())]
    rows, unreadable = [], []
    for scene, path in metrics.items():
        try:
            row = metrics_file.scalars(metrics_file.read(path, numbers))
        except InputError as exc:
            logger.warning("%s (scene %s left out of the table's metrics)", exc, scene)
            row = {"unreadable": str(exc)}
            unreadable.append(str(exc))
        row["scene"] = scene
        rows.append(row)
    if not rows:
        raise InputError("aggregate: no scenes to aggregate")
    if len(unreadable) == len(rows):
        raise InputError(f"aggregate: no readable metrics.json; {unreadable[0]}")
    df = pd.DataFrame(rows).set_index("scene")
    return df


def run(
    *,
    metrics: dict[str, Path],
    loss_logs: dict[str, dict[str, Path]],
    out_tsv: Path,
    out_metrics_png: Path,
    out_losses_png: Path,
) -> pd.DataFrame:
    df = table(metrics)
    with atomic_path(out_tsv, suffix=".tsv") as tmp:
        df.to_csv(tmp, sep="\t", na_rep="NA", float_format="%.6g")
    plots.metric_bars(out_metrics_png, df)
    plots.losses_across_scenes(out_losses_png, loss_logs)
    logger.info("%d scenes -> %s", len(df), out_tsv)
    return df
