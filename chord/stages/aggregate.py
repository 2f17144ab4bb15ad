"""Rule ``aggregate``: every scene's metrics.json as one table (``results/metrics.tsv``, one
row per scene) and the plots across scenes (metric bars, loss curves)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from chord import plots
from chord.errors import InputError
from chord.io import atomic_path, read_json

logger = logging.getLogger(__name__)

FORMAT = "chord-metrics/1"


def table(metrics: dict[str, Path]) -> pd.DataFrame:
    """One row per scene (in the given order) of the scalar entries of each metrics.json."""
    rows = []
    for scene, path in metrics.items():
        try:
            doc = read_json(path)
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: unreadable metrics ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InputError(f"{path}: not a {FORMAT} file")
        row = {k: v for k, v in doc.items() if not isinstance(v, (dict, list)) and k != "format"}
        row["scene"] = scene
        rows.append(row)
    if not rows:
        raise InputError("aggregate: no scenes to aggregate")
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
