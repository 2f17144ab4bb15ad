"""Rules ``demo_<name>``: a bundled procedural demo scene (:mod:`chord.scene.demo`) in CHORD's input
layout, with its scripted motion at the frame count of the sheet rows that use it."""

from __future__ import annotations

from pathlib import Path

from chord.scene import demo


def run(*, name: str, out_dir: Path, frame_num: int) -> Path:
    """Write demo scene ``name`` into ``out_dir``/<name>/; returns that folder."""
    return demo.write_demo_scene(name, Path(out_dir), frame_num=frame_num)
