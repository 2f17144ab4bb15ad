"""Stage sweep: the seeds' videos and metrics side by side, the chosen seed and a bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from chord.config.settings import SweepConfig
from chord.core import media
from chord.core.atomic_files import write_json
from chord.core.errors import InputError
from chord.stages import sweep

FRAMES, H, W = 5, 32, 48


def seed_files(root, seed: int, *, arap: float, still: bool = False):
    """A seed's ref_view.mp4 (a grey level per frame, different per seed) and metrics.json."""
    folder = root / f"seed_{seed}"
    levels = [40 * seed + 30 * t for t in range(FRAMES)]
    frames = np.stack([np.full((H, W, 3), v, np.uint8) for v in levels])
    media.write_mp4(folder / "export" / "ref_view.mp4", frames, fps=10)
    doc = {"format": "chord-metrics/1", "seed": seed, "arap_residual_mean": arap,
           "static_warning": still, "mean_displacement": 0.0 if still else 0.1,
           "per_frame": {"x": [1.0]}}  # fmt: skip
    write_json(folder / "metrics.json", doc)
    return folder / "export" / "ref_view.mp4", folder / "metrics.json"


def run(tmp_path, specs: dict[int, dict], **rule):
    files = {s: seed_files(tmp_path, s, **kw) for s, kw in specs.items()}
    out = tmp_path / "out"
    choice = sweep.run(
        scene="toy",
        videos={s: f[0] for s, f in files.items()},
        metrics={s: f[1] for s, f in files.items()},
        rule=SweepConfig(**{"metric": "arap_residual_mean", **rule}),  # the files' metric
        out_png=out / "seeds.png",
        out_tsv=out / "seeds.tsv",
        out_json=out / "best" / "selection.json",
    )
    return choice, out


def test_the_seeds_side_by_side_and_the_chosen_one(tmp_path):
    choice, out = run(
        tmp_path, {0: {"arap": 0.3}, 1: {"arap": 0.1, "still": True}, 2: {"arap": 0.2}}
    )
    assert choice.seed == 2  # seed 1 has less, but did not move
    best = json.loads((out / "best" / "selection.json").read_text())
    assert best["seed"] == 2 and best["run"] == "toy/seed_2"
    assert best["folder"] == str(tmp_path / "seed_2")
    assert best["seeds"]["1"] == {"value": 0.1, "moved": False}
    lines = (out / "seeds.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    assert [r["chosen"] for r in rows] == ["False", "False", "True"]
    assert "per_frame" not in header and "format" not in header
    with Image.open(out / "seeds.png") as im:
        assert im.size[1] > im.size[0] / 3  # three rows of frames


def test_the_picture_holds_each_seeds_first_middle_and_last_frames():
    frames = [np.full((H, W, 3), v, np.uint8) for v in (0, 1, 2, 3, 4)]
    assert [int(f[0, 0, 0]) for f in sweep.picked(frames)] == [0, 2, 4]


def test_a_metrics_file_of_another_format_is_an_input_error(tmp_path):
    video, metrics = seed_files(tmp_path, 0, arap=0.1)
    metrics.write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match=f"{metrics}: not a chord-metrics/1 file"):
        sweep.run(scene="toy", videos={0: video}, metrics={0: metrics}, rule=SweepConfig(),
                  out_png=tmp_path / "p.png", out_tsv=tmp_path / "t.tsv",
                  out_json=tmp_path / "b.json")  # fmt: skip
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "b.json").exists()
