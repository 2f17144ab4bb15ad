"""PNG figures of the evaluation (matplotlib, Agg backend): loss curves from the training
logs, metric bars across scenes, and the frame-0 comparison with ref.png."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from chord.core.atomic_files import atomic_path  # noqa: E402

logger = logging.getLogger(__name__)

LOSS_TERMS = ("sds", "arap", "temporal", "ground")
# metric column -> axis label of the bar chart across scenes
BAR_METRICS = {
    "mean_displacement": "mean displacement",
    "max_displacement": "max displacement",
    "mean_acceleration": "mean acceleration (/frame²)",
    "mean_jerk": "mean jerk (/frame³)",
    "arap_residual_mean": "ARAP residual (mean)",
    "psnr_frame0": "frame-0 PSNR (dB)",
    "ssim_frame0": "frame-0 SSIM",
    "ground_depth": "ground penetration depth",
    "ground_fraction": "fraction below ground",
    "penetration_depth": "deepest interpenetration",
    "penetration_excess": "interpenetration the motion adds",
    "float_gap": "floating gap (resting pairs)",
    "recovery_error": "recovery error (mean)",
    "recovery_relative": "recovery error / scripted motion",
}


def read_loss_log(path: Path | str) -> pd.DataFrame:
    """A training loss log (TSV with an ``it`` column), or a ValueError naming the file."""
    try:
        df = pd.read_csv(path, sep="\t")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path}: unreadable loss log ({exc})") from exc
    if "it" not in df.columns:
        raise ValueError(f"{path}: not a loss log (no 'it' column; columns {list(df.columns)})")
    return df


def _save(fig, path: Path | str) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _scale(ax, values) -> None:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) and (v > 0).all() and v.max() / v.min() > 50:
        ax.set_yscale("log")


def loss_curves(path: Path | str, logs: dict[str, Path], *, title: str) -> None:
    """One panel per loss term, one line per training stage (e.g. coarse, fine)."""
    frames = {stage: read_loss_log(p) for stage, p in logs.items()}
    _loss_panels(path, frames, title=f"{title}: training losses", legend=len(frames) > 1)


def losses_across_scenes(path: Path | str, logs: dict[str, dict[str, Path]]) -> None:
    """One panel per loss term, one line per scene (its stages joined in order)."""
    frames = {}
    for scene, stages in logs.items():
        dfs = [read_loss_log(p) for p in stages.values()]
        frames[scene] = pd.concat(dfs) if dfs else pd.DataFrame()
    _loss_panels(path, frames, title="training losses across scenes", legend=True)


def _loss_panels(path: Path | str, frames: dict[str, pd.DataFrame], *, title, legend) -> None:
    """One panel per loss term of :data:`LOSS_TERMS`, one line per loss log in ``frames``."""
    fig, axes = plt.subplots(1, len(LOSS_TERMS), figsize=(4 * len(LOSS_TERMS), 3.2))
    for ax, term in zip(axes, LOSS_TERMS, strict=True):
        values = []
        for label, df in frames.items():
            if term in df.columns and len(df):
                ax.plot(df["it"], df[term], marker="." if len(df) < 50 else None, label=label)
                values.extend(df[term].tolist())
        _scale(ax, values)
        ax.set_title(term)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if legend:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)


#: a value drawn as a black tick over a panel's bars, where the table has it: the scripted
#: motion's own (what the oracle teacher renders), so the report shows teacher and trained side
#: by side
PLOTTABLE = np.finfo(np.float64).max / 1e8  # a bar's value; the axis' arithmetic stays finite
BAR_MARKS = {"penetration_excess": ("scripted_penetration_excess", "scripted motion")}


def metric_bars(path: Path | str, table: pd.DataFrame) -> None:
    """Bars of :data:`BAR_METRICS` (those present with a value), one bar per scene, with the
    :data:`BAR_MARKS` ticks."""
    cols = [c for c in BAR_METRICS if c in table.columns and table[c].notna().any()]
    if not cols:
        raise ValueError("metric_bars: the table has none of the plotted metrics")
    ncol = 4
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 2.9 * nrow), squeeze=False)
    scenes = [str(s) for s in table.index]
    colours = plt.cm.tab10(np.arange(len(scenes)) % 10)
    # the warned scenes, hatched and named in the x labels: "it did not move" (//) and
    # "passes through" (xx)
    hatches = [""] * len(scenes)
    for column, hatch, note in (("static_warning", "//", "static!"),
                                ("penetration_warning", "xx", "penetrates!")):  # fmt: skip
        if column not in table.columns:
            continue
        flags = table[column].fillna(False).astype(bool).to_numpy()
        scenes = [f"{s} ({note})" if f else s for s, f in zip(scenes, flags, strict=True)]
        hatches = [h + hatch if f else h for h, f in zip(hatches, flags, strict=True)]
    for ax, col in zip(axes.flat, cols, strict=False):
        vals = table[col].astype(float).to_numpy(copy=True)
        # an infinite metric, or one so large that the axis' margins and ticks overflow (a
        # damaged file's): drawn as n/a
        vals[~(np.abs(vals) < PLOTTABLE)] = np.nan
        bars = ax.bar(scenes, np.nan_to_num(vals), color=colours)
        for bar, hatch in zip(bars, hatches, strict=True):
            if hatch:
                bar.set_hatch(hatch)
                bar.set_edgecolor("red")
        for x, v in enumerate(vals):
            ax.annotate("n/a" if np.isnan(v) else f"{v:.3g}", (x, np.nan_to_num(v)),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
        mark, label = BAR_MARKS.get(col, (None, None))
        if mark in table.columns and table[mark].notna().any():
            ticks = table[mark].astype(float).to_numpy(copy=True)
            ticks[~(np.abs(ticks) < PLOTTABLE)] = np.nan
            ax.scatter(range(len(ticks)), ticks, marker="_", s=500, color="k", label=label)
            ax.legend(fontsize=7, loc="upper left")
        ax.set_title(BAR_METRICS[col], fontsize=9)
        ax.tick_params(axis="x", labelsize=8, rotation=30)
        ax.margins(y=0.2)
    for ax in list(axes.flat)[len(cols) :]:
        ax.axis("off")
    fig.suptitle("metrics across scenes")
    fig.tight_layout()
    _save(fig, path)


def frame0_comparison(
    path: Path | str, ref: np.ndarray, frame0: np.ndarray, *, psnr: float, ssim: float
) -> None:
    """ref.png, the frame-0 render and 10× their absolute difference side by side."""
    diff = np.clip(np.abs(ref.astype(float) - frame0.astype(float)) * 10, 0, 255).astype(np.uint8)
    H, W = ref.shape[:2]
    fig, axes = plt.subplots(1, 3, figsize=(3 * max(3.0, 3.0 * W / H), 3.3))
    for ax, img, label in zip(
        axes,
        (ref, frame0, diff),
        ("reference (ref.png)", "trained motion, frame 0", "|difference| × 10"),
        strict=True,
    ):
        ax.imshow(img, interpolation="nearest")
        ax.set_title(label, fontsize=9)
        ax.axis("off")
    fig.suptitle(f"frame-0 fidelity: PSNR {psnr:.2f} dB, SSIM {ssim:.4f}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def seed_sweep(
    path: Path | str,
    frames: dict[int, list[np.ndarray]],
    captions: dict[int, str],
    *,
    chosen: int,
    labels: tuple[str, ...],
    title: str,
) -> None:
    """A swept scene's seeds side by side: one row per seed (``frames``: its images, one per
    column of ``labels``), ``captions`` under each row's name; the chosen seed's row framed."""
    seeds = list(frames)
    h, w = next(iter(frames.values()))[0].shape[:2]
    cols = len(labels)
    fig, axes = plt.subplots(
        len(seeds), cols, figsize=(2.6 * cols * w / h + 2.4, 2.6 * len(seeds) + 0.6), squeeze=False
    )
    for row, seed in zip(axes, seeds, strict=True):
        for ax, img, label in zip(row, frames[seed], labels, strict=True):
            ax.imshow(img, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if seed == seeds[0]:
                ax.set_title(label, fontsize=9)
            if seed == chosen:
                for spine in ax.spines.values():
                    spine.set_edgecolor("tab:green")
                    spine.set_linewidth(3)
        name = f"seed {seed}" + ("  (chosen)" if seed == chosen else "")
        colour = "tab:green" if seed == chosen else "black"
        row[0].set_ylabel(f"{name}\n{captions[seed]}", fontsize=8, rotation=0, ha="right",
                          va="center", color=colour)  # fmt: skip
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def interaction(
    path: Path | str,
    pairs: list[dict],
    *,
    threshold: float,
    title: str,
    scripted: list[dict] | None = None,
) -> None:
    """Per frame, one line per ordered object pair (``object`` → ``other``, the records of
    :func:`chord.evaluation.interaction.pairs` after
    :func:`chord.evaluation.metrics.interaction_summary`):
    the share of the object's surface samples inside the other, the deepest of them (with the
    warning level: the pair's rest depth + ``threshold``) and, for resting pairs, the gap that
    opens. Lengths in normalised scene units. ``scripted``: the same records of the scripted
    motion, drawn dotted beside the trained depths."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    share, depth, gap = axes
    colours = plt.cm.tab10(np.arange(max(len(pairs), 1)) % 10)
    for p, colour in zip(pairs, colours, strict=False):
        label = f"{p['object']} → {p['other']}"
        frames = np.arange(len(p["depth"]))
        share.plot(frames, 100 * np.asarray(p["fraction"]), color=colour, marker=".", label=label)
        depth.plot(frames, p["depth"], color=colour, marker=".", label=label)
        depth.axhline(p["depth"][0] + threshold, color=colour, linestyle="--", linewidth=0.8)
        if scripted is not None:
            (q,) = [q for q in scripted if (q["object"], q["other"]) == (p["object"], p["other"])]
            depth.plot(frames, q["depth"], color=colour, linestyle=":", linewidth=1.2)
        if p.get("gap") is not None:
            gap.plot(frames, p["gap"], color=colour, marker=".", label=label)
    share.set_title("surface inside the other (%)", fontsize=9)
    dotted = "; dotted: scripted" if scripted is not None else ""
    depth.set_title(
        f"deepest inside (scene units; dashed: rest + {threshold:g}{dotted})", fontsize=9
    )
    if not any(p.get("gap") is not None for p in pairs):
        gap.text(0.5, 0.5, "no resting pairs", ha="center", va="center", transform=gap.transAxes)
    gap.set_title("gap opened by resting pairs (scene units)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("frame")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: interaction between objects")
    if pairs:  # one legend under the panels, clear of the curves
        handles, labels = share.get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(len(pairs), 6), fontsize=8)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
    else:
        fig.tight_layout()
    _save(fig, path)
