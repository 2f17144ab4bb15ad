"""Rule ``sweep``: a scene trained with several seeds, side by side. Writes
``results/<scene>/sweep/seeds.png`` (the first, middle and last frames of each seed's
reference-camera video, with its metrics), ``sweep/seeds.tsv`` (one row per seed) and
``best/selection.json`` (the seed the config's ``sweep`` rule chose, and why)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from chord.config.settings import SweepConfig
from chord.core import media
from chord.core.atomic_files import atomic_path, write_json
from chord.core.errors import InputError
from chord.evaluation import metrics_file, plots
from chord.evaluation import seed_choice as sw
from chord.plan import results_layout

logger = logging.getLogger(__name__)

FORMAT = "chord-sweep/1"
# beside the rule's metric, under each seed's row of the picture
CAPTION_METRICS = ("mean_displacement", "arap_residual_mean", "psnr_frame0")
FRAME_LABELS = ("first frame", "middle frame", "last frame")


def picked(frames) -> list:
    """The first, middle and last of ``frames`` (:data:`FRAME_LABELS`)."""
    n = len(frames)
    return [frames[0], frames[(n - 1) // 2], frames[n - 1]]


def read_video(video: Path):
    try:
        frames, _ = media.read_mp4(video)
    except (OSError, RuntimeError, StopIteration, ValueError) as exc:
        raise InputError(f"{video}: unreadable video ({exc})") from exc
    if not len(frames):
        raise InputError(f"{video}: the video has no frames")
    return frames


def caption(doc: dict, metric: str) -> str:
    keys = dict.fromkeys((metric, *CAPTION_METRICS))
    lines = []
    for key in keys:
        value = doc.get(key)
        lines.append(f"{key}: {'n/a' if value is None else f'{value:.4g}'}")
    if doc.get(sw.MOVED_KEY):
        lines.append("static_warning: did not move")
    return "\n".join(lines)


def run(
    *,
    scene: str,
    videos: dict[int, Path],
    metrics: dict[int, Path],
    rule: SweepConfig,
    out_png: Path,
    out_tsv: Path,
    out_json: Path,
) -> sw.Choice:
    """Compare the seeds of ``scene`` ({seed: its ref_view.mp4 / metrics.json}) and choose one
    by ``rule``; returns the choice."""
    if set(videos) != set(metrics):
        raise InputError(
            f"sweep {scene}: videos of seeds {sorted(videos)}, metrics of {sorted(metrics)}"
        )
    seeds = sorted(metrics)
    docs = {s: metrics_file.read(metrics[s], [rule.metric]) for s in seeds}
    frames = {s: picked(read_video(videos[s])) for s in seeds}  # every input read: then write
    choice = sw.choose(
        docs, metric=rule.metric, mode=rule.mode, require_moved=rule.require_moved, where=metrics
    )
    if "none of the seeds moved" in choice.reason:
        logger.warning("%s: %s", scene, choice.reason)
    rows = []
    for s in seeds:
        scalars = metrics_file.scalars(docs[s])
        seed_run = results_layout.run_name(scene, s)
        rows.append({"seed": s, "run": seed_run, "chosen": s == choice.seed,
                     rule.metric: choice.values[s], **scalars})  # fmt: skip
    with atomic_path(out_tsv, suffix=".tsv") as tmp:
        pd.DataFrame(rows).to_csv(tmp, sep="\t", index=False, na_rep="NA", float_format="%.6g")
    plots.seed_sweep(
        out_png,
        frames,
        {s: caption(docs[s], rule.metric) for s in seeds},
        chosen=choice.seed,
        labels=FRAME_LABELS,
        title=f"{scene}: {len(seeds)} seeds; chosen seed {choice.seed} ({rule.mode} {rule.metric})",
    )
    write_json(
        out_json,
        {
            "format": FORMAT,
            "scene": scene,
            "seed": choice.seed,
            "run": results_layout.run_name(scene, choice.seed),
            "folder": str(Path(metrics[choice.seed]).parent),
            "rule": {"metric": rule.metric, "mode": rule.mode, "require_moved": rule.require_moved},
            "value": choice.value,
            "reason": choice.reason,
            "seeds": {str(s): {"value": choice.values[s], "moved": choice.moved[s]} for s in seeds},
        },
    )
    logger.info("%s: seed %d chosen: %s", scene, choice.seed, choice.reason)
    return choice
