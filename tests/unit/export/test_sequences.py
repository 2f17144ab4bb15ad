"""Exports of a trained scene (chord.export.sequences): GIF, per-frame PLY sequence; and the
per-frame renders they take (chord.render.views.render_frames)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from chord.export import sequences
from chord.gaussians import gaussian_set as gs
from chord.gaussians import ply


def test_gif_and_ply_sequence(tmp_path):
    frames = np.zeros((4, 16, 24, 3), np.uint8)
    frames[:, :, :, 0] = np.arange(4)[:, None, None] * 60
    sequences.write_gif(tmp_path / "p.gif", frames, fps=5)
    with Image.open(tmp_path / "p.gif") as im:
        assert im.n_frames == 4 and im.size == (24, 16)
        assert im.info["duration"] == 200 and im.info["loop"] == 0
        im.seek(3)
        assert abs(im.convert("RGB").getpixel((5, 5))[0] - 180) <= 4
    rng = np.random.default_rng(0)
    N, T = 7, 3
    rest = gs.GaussianSet(
        means=rng.normal(size=(N, 3)),
        log_scales=np.full((N, 3), -3.0),
        quats=np.tile([1.0, 0, 0, 0], (N, 1)),
        opacity_logits=np.zeros(N),
        sh=rng.normal(size=(N, 4, 3)),
    )
    means = rest.means[None] + np.arange(T)[:, None, None] * np.array([0.1, 0, 0])
    quats = np.repeat(rest.quats[None], T, 0)
    files = sequences.write_ply_sequence(tmp_path / "ply", rest, means, quats)
    assert [f.name for f in files] == ["frame_0000.ply", "frame_0001.ply", "frame_0002.ply"]
    back = ply.read_ply(files[2])
    np.testing.assert_allclose(back.means, means[2], atol=1e-6)
    np.testing.assert_allclose(back.sh, rest.sh, atol=1e-6)
    with pytest.raises(ValueError, match="7 rest Gaussians"):
        sequences.write_ply_sequence(tmp_path / "bad", rest, means[:, :5], quats[:, :5])
    assert not (tmp_path / "bad").exists()


def test_render_frames_moves_with_the_means():
    """One Gaussian moving right: per-frame renders follow it, one camera for all frames."""
    from chord.render import cameras
    from chord.render.views import render_frames

    F = 3
    means = torch.zeros(F, 1, 3)
    means[:, 0, 0] = torch.tensor([-0.3, 0.0, 0.3])
    g = {
        "means": means,
        "quats": torch.tensor([[1.0, 0, 0, 0]]).expand(F, 1, 4),
        "scales": torch.full((1, 3), 0.05),
        "opacities": torch.ones(1),
        "sh": torch.zeros(1, 1, 3),
        "sh_degree": 0,
    }
    view = cameras.orbit_viewmats(0.0, 0.0, 2.0)
    img = render_frames(g, view, cameras.intrinsics(32, 16), 32, 16, [1.0, 1.0, 1.0])
    assert img.shape == (F, 16, 32, 3)
    dark = [int(img[t].sum(-1).argmin()) % 32 for t in range(F)]
    assert dark[0] < dark[1] < dark[2]
