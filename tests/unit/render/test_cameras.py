import math

import numpy as np
import pytest
import torch

from chord.render import cameras


def test_orbit_position_and_view_matrix():
    view = cameras.orbit_viewmats(30.0, 60.0, 2.0, target=(0.0, 0.5, 0.0))
    c2w = torch.linalg.inv(view)
    e, a = math.radians(30), math.radians(60)
    expect = [2 * math.cos(e) * math.sin(a), 0.5 + 2 * math.sin(e), 2 * math.cos(e) * math.cos(a)]
    torch.testing.assert_close(c2w[:3, 3], torch.tensor(expect, dtype=torch.float64))
    # OpenCV: the camera's +z looks at the target, its +y points down (world −y side)
    forward = c2w[:3, 2]
    to_target = torch.tensor([0.0, 0.5, 0.0], dtype=torch.float64) - c2w[:3, 3]
    torch.testing.assert_close(forward, to_target / to_target.norm())
    assert float(c2w[1, 1]) < 0
    torch.testing.assert_close(view[:3, :3] @ view[:3, :3].T, torch.eye(3, dtype=torch.float64))


def test_intrinsics_keep_the_vertical_fov_at_every_size():
    for w, h in ((832, 480), (416, 240), (480, 832)):
        K = cameras.intrinsics(w, h)
        fovy = 2 * math.degrees(math.atan(h / 2 / float(K[1, 1])))
        assert fovy == pytest.approx(49.1)
        assert float(K[0, 0]) == float(K[1, 1]) and float(K[0, 2]) == w / 2


def test_segments_merge_and_sample_over_the_union():
    assert cameras.merge_segments([200, 250, 0, 30, 20, 40]) == [(0, 40), (200, 250)]
    with pytest.raises(ValueError, match="azim_segments: needs \\[start end\\] pairs"):
        cameras.merge_segments([0, 30, 40], name="azim_segments")
    g = torch.Generator().manual_seed(0)
    x = cameras.sample_uniform(0, 360, [0, 40, 200, 250], 20000, g)
    inside = ((x >= 0) & (x <= 40)) | ((x >= 200) & (x <= 250))
    assert bool(inside.all())
    assert float((x <= 40).double().mean()) == pytest.approx(40 / 90, abs=0.02)  # ∝ length


def test_training_cameras_are_reproducible_and_backgrounds_follow_the_probability():
    kw = dict(azim_l=0, azim_r=360, elev_l=-10, elev_r=40, radius=2.0)
    a = cameras.sample_training_cameras(8, torch.Generator().manual_seed(3), **kw)
    b = cameras.sample_training_cameras(8, torch.Generator().manual_seed(3), **kw)
    torch.testing.assert_close(a["viewmats"], b["viewmats"])
    assert bool(((a["elev"] >= -10) & (a["elev"] <= 40)).all())
    white = cameras.sample_training_cameras(50, torch.Generator(), **kw, invert_bg_prob=-1.0)
    assert bool((white["backgrounds"] == 1).all())
    mixed = cameras.sample_training_cameras(
        4000, torch.Generator().manual_seed(1), **kw, invert_bg_prob=0.25
    )
    assert float((mixed["backgrounds"][:, 0] == 0).double().mean()) == pytest.approx(0.25, abs=0.03)


def test_camera_target_and_reference_view():
    np.testing.assert_allclose(cameras.camera_target(0.1), [0, 0.1, 0])
    bounds = [[[-1, 0, 0], [0, 1, 1]], [[0, 0, -1], [1, 2, 0]]]
    np.testing.assert_allclose(cameras.camera_target(0.1, True, bounds), [0, 1.1, 0])
    ref = cameras.reference_view(-10, 40, 60, 2.0, (0, 0, 0))
    pos = torch.linalg.inv(ref)[:3, 3]
    assert math.degrees(math.asin(float(pos[1]) / 2.0)) == pytest.approx(15.0)
