"""Image and video files (chord.core.media): an MP4 starts with its index (fast start), so a
browser or player begins before the whole file has arrived, and reads back as written."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from chord.core import media


def top_level_boxes(path: Path) -> list[str]:
    """The types of an MP4's top-level boxes, in file order (ISO/IEC 14496-12 §4.2: a 32-bit
    big-endian size, the 4-character type; size 1: a 64-bit size follows, 0: to the end)."""
    data = path.read_bytes()
    boxes, at = [], 0
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        if size == 1:
            (size,) = struct.unpack(">Q", data[at + 8 : at + 16])
        elif size == 0:
            size = len(data) - at
        assert size >= 8, f"box {kind!r} at {at}: size {size}"
        boxes.append(kind.decode("ascii"))
        at += size
    assert at == len(data), "the boxes do not tile the file"
    return boxes


def test_mp4_has_its_index_before_its_data(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (6, 32, 48, 3), dtype=np.uint8)
    path = tmp_path / "clip.mp4"
    media.write_mp4(path, frames, fps=5)
    boxes = top_level_boxes(path)
    assert boxes[0] == "ftyp" and boxes.count("moov") == boxes.count("mdat") == 1, boxes
    assert boxes.index("moov") < boxes.index("mdat"), boxes
    got, meta = media.read_mp4(path)
    assert got.shape == frames.shape and meta["fps"] == 5
    assert not list(tmp_path.glob(".*")), "a temporary file is left"
