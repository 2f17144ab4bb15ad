"""Rule ``preview_strip`` (issue 48): a training's live previews (``train/previews/it_<i>.mp4``,
:mod:`chord.training.live_preview`) as one image for the report's scene page: one row per
previewed iteration, in order, each a few of its frames from the first to the last, labelled
with the iteration. The previews reach the rule as declared inputs (the workflow lists them
once the training, a Snakemake checkpoint, has finished; DESIGN §3), so a finished training is
never run again for it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from chord.core import media
from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError

logger = logging.getLogger(__name__)

#: frames shown per previewed iteration (first to last, evenly spaced)
COLUMNS = 5
LABEL_WIDTH = 72  # pixels left of each row for "it <i>"
NAME = re.compile(r"it_(\d+)\.mp4")


def iteration(path: Path) -> int:
    """The iteration of a preview ``it_<i>.mp4`` (a ValueError naming a file not so named)."""
    match = NAME.fullmatch(Path(path).name)
    if match is None:
        raise InputError(f"{path}: not a live preview (expected it_<iteration>.mp4)")
    return int(match[1])


def strip(previews: list[Path], columns: int = COLUMNS) -> Image.Image:
    """The strip of ``previews`` (any order: sorted by iteration here); with none, a short
    image that says so (a run trained with ``preview_every: 0``, without an MP4 encoder, or
    before previews existed)."""
    previews = sorted(previews, key=iteration)
    if not previews:
        img = Image.new("RGB", (420, 40), "white")
        ImageDraw.Draw(img).text((8, 12), "this training wrote no live previews", fill="black")
        return img
    rows = []
    for path in previews:
        try:
            frames, _ = media.read_mp4(path)
        except Exception as exc:  # a truncated or foreign file: name it, in one line
            raise InputError(f"{path}: not a readable MP4 ({exc})") from exc
        pick = np.unique(np.linspace(0, len(frames) - 1, columns).round().astype(int))
        row = np.concatenate([frames[i] for i in pick], axis=1)
        rows.append((iteration(path), row))
    width = max(r.shape[1] for _, r in rows) + LABEL_WIDTH
    height = sum(r.shape[0] for _, r in rows)
    img = Image.new("RGB", (width, height), "white")
    draw, y = ImageDraw.Draw(img), 0
    for it, row in rows:
        img.paste(Image.fromarray(row), (LABEL_WIDTH, y))
        draw.text((6, y + row.shape[0] // 2 - 6), f"it {it}", fill="black")
        y += row.shape[0]
    return img


def run(*, previews: list[Path], out_png: Path) -> dict:
    """Write the strip of ``previews`` to ``out_png``; returns {"iterations": [...]}."""
    img = strip([Path(p) for p in previews])
    with atomic_path(out_png, suffix=".png") as tmp:
        img.save(tmp)
    its = sorted(iteration(p) for p in previews)
    logger.info("%s: %d previews, iterations %s", out_png, len(its), its)
    return {"iterations": its}
