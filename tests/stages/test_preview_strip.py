"""Rule preview_strip's stage (issue 48): a training's live previews as one image, one row per
previewed iteration in the order trained (whatever order the inputs come in), each row frames
from the first to the last; a training without previews says so; a bad file is named."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from chord.core import media
from chord.core.errors import InputError
from chord.stages import preview_strip

W, H, T = 32, 16, 6


def preview(path, level: int) -> None:
    """A preview whose frame k is flat grey ``level + 8·k`` (a row's columns then tell the
    frames apart and its level the iteration)."""
    frames = np.stack([np.full((H, W, 3), level + 8 * k, np.uint8) for k in range(T)])
    media.write_mp4(path, frames, 5)


def test_one_row_per_iteration_in_order_with_the_first_to_last_frames(tmp_path):
    levels = {2: 40, 10: 200, 4: 120}  # written out of order; iteration 10 after 4 (not "1" < "4")
    for it, level in levels.items():
        preview(tmp_path / f"it_{it}.mp4", level)
    out = tmp_path / "eval" / "previews.png"
    summary = preview_strip.run(previews=sorted(tmp_path.glob("it_*.mp4")), out_png=out)
    assert summary["iterations"] == [2, 4, 10]
    img = np.asarray(Image.open(out).convert("RGB")).astype(float)
    cols = preview_strip.COLUMNS
    assert img.shape == (3 * H, preview_strip.LABEL_WIDTH + cols * W, 3)
    # each cell's mean grey: rows by iteration, columns frame 0 .. T−1 (H.264: a few levels)
    x0 = preview_strip.LABEL_WIDTH
    picked = np.linspace(0, T - 1, cols).round()
    for row, it in enumerate(sorted(levels)):
        cells = [img[row * H : (row + 1) * H, x0 + c * W : x0 + (c + 1) * W].mean()
                 for c in range(cols)]  # fmt: skip
        np.testing.assert_allclose(cells, levels[it] + 8 * picked, atol=3.0, err_msg=f"it {it}")


def test_a_training_without_previews_gets_an_image_that_says_so(tmp_path):
    out = tmp_path / "previews.png"
    assert preview_strip.run(previews=[], out_png=out)["iterations"] == []
    img = np.asarray(Image.open(out).convert("L"))
    assert img.min() < 128 < img.max()  # some text on white


def test_a_bad_preview_is_named_and_nothing_is_written(tmp_path):
    bad = tmp_path / "it_3.mp4"
    bad.write_bytes(b"not a video")
    out = tmp_path / "previews.png"
    with pytest.raises(InputError, match="it_3.mp4: not a readable MP4"):
        preview_strip.run(previews=[bad], out_png=out)
    assert not out.exists()
    with pytest.raises(InputError, match="not a live preview"):
        preview_strip.iteration(tmp_path / "latest.mp4")
