"""chord.evaluation.metrics on synthetic motions with known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from chord.evaluation import metrics
from chord.motion import regularisers


def cloud(n: int = 300, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=torch.float64) * torch.tensor([0.4, 0.8, 0.3])


def rotation_y(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)


def test_rigid_translation_gives_exact_displacement_and_zero_residuals():
    T, v = 9, torch.tensor([0.03, 0.0, -0.04], dtype=torch.float64)  # |v| = 0.05 per frame
    x0 = cloud()
    X = x0[None] + torch.arange(T, dtype=torch.float64)[:, None, None] * v  # [T, N, 3]
    d = metrics.displacement(X)
    assert d["mean_displacement"] == pytest.approx(0.05 * T / 2)  # mean of 0.05·t, t = 1..T-1
    assert d["max_displacement"] == pytest.approx(0.05 * (T - 1))
    s = metrics.smoothness(X)
    assert s["mean_acceleration"] == pytest.approx(0.0, abs=1e-12)
    assert s["mean_jerk"] == pytest.approx(0.0, abs=1e-12)
    nbr, mask = regularisers.arap_connectivity(x0)
    r = metrics.arap_residual(X, nbr, mask)
    assert len(r) == T and max(r) < 1e-7


def test_arap_residual_of_rotation_and_scaling():
    x0 = cloud()
    nbr, mask = regularisers.arap_connectivity(x0)
    rotated = torch.stack([x0, x0 @ rotation_y(0.8).T + 0.1])
    assert metrics.arap_residual(rotated, nbr, mask)[1] < 1e-7  # rigid: zero
    scaled = torch.stack([x0, x0 * 1.1, x0 * 0.7])
    r = metrics.arap_residual(scaled, nbr, mask)  # e(t) = a·e(0), R = I: residual |a − 1|
    assert r == pytest.approx([0.0, 0.1, 0.3], abs=1e-9)


def test_smoothness_of_a_constant_acceleration():
    T, a = 7, 0.002
    t = torch.arange(T, dtype=torch.float64)
    X = torch.zeros(T, 4, 3, dtype=torch.float64)
    X[..., 1] = (0.5 * a * t**2)[:, None]
    s = metrics.smoothness(X)
    assert s["mean_acceleration"] == pytest.approx(a)
    assert s["mean_jerk"] == pytest.approx(0.0, abs=1e-15)
    few = metrics.smoothness(X[:2])
    assert math.isnan(few["mean_acceleration"]) and math.isnan(few["mean_jerk"])


def test_ground_penetration():
    Y = torch.tensor([[0.5, 0.2, 0.1], [0.5, -0.05, 0.1], [0.5, -0.2, 0.1], [0.5, 0.3, -0.1]])
    g = metrics.ground_penetration(Y, 0.0)
    assert g["ground_depth"] == pytest.approx(0.2)
    assert g["ground_fraction"] == pytest.approx(3 / 12)
    assert metrics.ground_penetration(Y, -1.0) == {"ground_depth": 0.0, "ground_fraction": 0.0}


def test_recovery_error_of_a_known_offset():
    T = 5
    x0 = cloud(50)
    truth = x0[None] + torch.arange(T, dtype=torch.float64)[:, None, None] * torch.tensor(
        [0.02, 0.0, 0.0], dtype=torch.float64
    )
    off = torch.tensor([0.0, 0.003, 0.004], dtype=torch.float64)  # |off| = 0.005
    pred = truth.clone()
    pred[1:] += off
    r = metrics.recovery_error(pred, truth)
    assert r["recovery_error"] == pytest.approx(0.005)
    assert r["recovery_max_error"] == pytest.approx(0.005)
    assert r["recovery_relative"] == pytest.approx(0.005 / (0.02 * T / 2))  # / mean |x*_t − x*_0|
    assert r["recovery_per_frame"] == pytest.approx([0.0] + [0.005] * (T - 1))
    still = metrics.recovery_error(truth[:1].expand(T, -1, -1), truth)
    assert still["recovery_relative"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ"):
        metrics.recovery_error(pred[:, :3], truth)


def test_psnr_and_ssim_known_values():
    a = np.zeros((16, 20, 3))
    assert metrics.psnr(a, a + 0.1) == pytest.approx(20.0)
    assert metrics.psnr(a, a) == metrics.PSNR_CAP
    u8 = (np.random.default_rng(0).random((16, 20, 3)) * 255).astype(np.uint8)
    assert metrics.psnr(u8, u8) == metrics.PSNR_CAP
    assert metrics.ssim(u8, u8) == pytest.approx(1.0)
    # constant images: SSIM = (2·μa·μb + C1)/(μa² + μb² + C1)
    ma, mb, C1 = 0.2, 0.4, 0.01**2
    assert metrics.ssim(a + ma, a + mb) == pytest.approx((2 * ma * mb + C1) / (ma**2 + mb**2 + C1))
    noisy = np.clip(u8 / 255.0 + np.random.default_rng(1).normal(0, 0.2, u8.shape), 0, 1)
    assert metrics.ssim(u8, noisy) < 0.9
    with pytest.raises(ValueError, match="image sizes differ"):
        metrics.psnr(a, a[:8])


# -- interaction: a unit cube against a slab whose top face is y = 0 --------------------------

N_SAMPLES = 20_000
U64 = 2.0**-53


def box(extents, centre):
    """A closed box mesh (12 outward triangles): vertices [8, 3], faces [12, 3]."""
    import trimesh

    m = trimesh.creation.box(extents)
    return np.asarray(m.vertices) + centre, np.asarray(m.faces)


CUBE = box((1.0, 1.0, 1.0), (0.0, 0.5, 0.0))  # resting on y = 0 with its bottom face
SLAB = box((4.0, 2.0, 4.0), (0.0, -1.0, 0.0))  # top face y = 0, 2 thick, 4 wide


def cube_samples(offsets) -> np.ndarray:
    """The cube's surface samples [T, S, 3] translated by offsets [T, 3]."""
    S = metrics.surface_samples(*CUBE, N_SAMPLES, seed=0)
    return S[None] + np.asarray(offsets, dtype=np.float64)[:, None]


def share_tolerance(p: float) -> float:
    """Five binomial standard deviations of a share p estimated from N_SAMPLES independent
    uniform samples (the samples are i.i.d. uniform over the area, so the count inside is
    Binomial(N, p)); two-sided, the estimate leaves it with probability below 1e-6."""
    return 5 * math.sqrt(p * (1 - p) / N_SAMPLES) + 1 / N_SAMPLES


# Distances are float64 sums and products of coordinates of magnitude ≤ 2.5 (a few roundings
# of u·2.5 each); squared distance d² carries ~10·u·2.5², so d = sqrt carries that over 2d,
# below 1e-13 for the d ≥ 0.1 used here: 1e-12 leaves an order of magnitude.
DIST_TOL = 1e-12


def test_surface_samples_are_uniform_over_the_area():
    S = metrics.surface_samples(*CUBE, N_SAMPLES, seed=3)
    assert S.shape == (N_SAMPLES, 3)
    on_bottom = np.isclose(S[:, 1], 0.0, atol=1e-12).mean()  # one of six unit faces
    assert abs(on_bottom - 1 / 6) <= share_tolerance(1 / 6)
    eps = 4 * U64  # the barycentric blend: three products and two sums of values ≤ 1
    assert (S >= np.array([-0.5, 0, -0.5]) - eps).all() and (
        S <= np.array([0.5, 1, 0.5]) + eps
    ).all()
    np.testing.assert_array_equal(S, metrics.surface_samples(*CUBE, N_SAMPLES, seed=3))
    with pytest.raises(ValueError, match="zero"):
        metrics.surface_samples(np.zeros((3, 3)), np.array([[0, 1, 2]]), 5, seed=0)


@pytest.mark.parametrize("flip", [False, True], ids=["outward", "inward faces"])
@pytest.mark.parametrize("open_bottom", [False, True], ids=["closed", "slab without bottom"])
def test_cube_sinking_into_a_slab_by_known_depths(flip, open_bottom):
    """The cube sinks d_t = 0.1·t (t = 0..4) into the slab: inside are its bottom face and
    the lower d_t − band of its four sides, a share (1 + 4·(d_t − CONTACT_BAND))/6 of its area
    (0 at t = 0: the resting bottom face touches, within the band); the deepest sample is on
    the bottom face at depth d_t exactly (the slab's other faces are ≥ 1.5 away). Winding
    numbers make this hold for an inverted or an open slab (its bottom face removed) too."""
    V, F = SLAB
    if open_bottom:  # trimesh's box: the two faces with every vertex at y = -2
        F = F[~np.isclose(V[F][:, :, 1], -2.0).all(1)]
        assert len(F) == 10
    if flip:
        F = F[:, ::-1]
    d = 0.1 * np.arange(5)
    r = metrics.pair_interaction(cube_samples([(0, -x, 0) for x in d]), V, F)
    assert r["fraction"][0] == 0.0 and r["depth"][0] == 0.0 and r["separation"][0] == 0.0
    for t in range(1, 5):
        p = (1 + 4 * (d[t] - metrics.CONTACT_BAND)) / 6
        assert abs(r["fraction"][t] - p) <= share_tolerance(p), t
        assert abs(r["depth"][t] - d[t]) <= DIST_TOL, t
        assert r["separation"][t] == 0.0
    assert np.all(np.diff(r["fraction"]) > 0) and np.all(np.diff(r["depth"]) > 0)
    s = metrics.interaction_summary([{"object": "cube", "other": "slab", **r}], rest_tolerance=0.01)
    assert s["penetration_depth"] == s["penetration_excess"] == r["depth"][4]
    assert s["penetration_fraction"] == r["fraction"][4]
    assert s["penetration_depth_rest"] == 0.0
    assert s["resting_pairs"] == 1 and s["float_gap"] == 0.0  # in contact throughout
    assert s["per_frame"]["penetration_depth"] == r["depth"]


def test_cube_sliding_over_the_slab_or_beside_a_cube_does_not_penetrate():
    """Sliding 0.3 per frame along +x on the slab's top (touching, never inside), and passing
    a long block 0.05 beside its path: no sample inside, depth 0; the slab pair stays in
    contact, the block pair 0.05 apart."""
    P = cube_samples([(0.3 * t, 0, 0) for t in range(5)])
    on_slab = metrics.pair_interaction(P, *SLAB)
    assert on_slab["fraction"] == [0.0] * 5 and on_slab["depth"] == [0.0] * 5
    assert on_slab["separation"] == [0.0] * 5
    other_v, other_f = box((4.0, 1.0, 1.0), (1.0, 0.5, 1.05))  # its -z face at z = 0.55
    beside = metrics.pair_interaction(P, other_v, other_f)
    assert beside["fraction"] == [0.0] * 5 and beside["depth"] == [0.0] * 5
    assert all(abs(s - 0.05) <= DIST_TOL for s in beside["separation"])
    s = metrics.interaction_summary(
        [{"object": "c", "other": "slab", **on_slab}, {"object": "c", "other": "b", **beside}],
        rest_tolerance=0.01,
    )
    assert s["penetration_fraction"] == s["penetration_depth"] == s["penetration_excess"] == 0
    assert s["resting_pairs"] == 1 and s["float_gap"] == 0.0


def test_a_block_lifting_off_the_slab_floats_by_the_lift():
    """The resting cube lifts by h_t = 0.05·t: gap h_t per frame (its bottom face is the
    nearest part, straight above the slab's top); a pair apart at rest (0.5 over the
    tolerance) is not resting and has no gap."""
    h = 0.05 * np.arange(5)
    r = metrics.pair_interaction(cube_samples([(0, x, 0) for x in h]), *SLAB)
    far = metrics.pair_interaction(cube_samples([(0, 0.51 + x, 0) for x in h]), *SLAB)
    assert r["fraction"] == [0.0] * 5 and r["depth"] == [0.0] * 5
    pairs = [{"object": "c", "other": "slab", **r}, {"object": "c2", "other": "slab", **far}]
    s = metrics.interaction_summary(pairs, rest_tolerance=0.5)
    assert [p["resting"] for p in pairs] == [True, False] and pairs[1]["gap"] is None
    for t in range(5):
        assert abs(pairs[0]["gap"][t] - h[t]) <= DIST_TOL, t
    assert abs(s["float_gap"] - h[4]) <= DIST_TOL and s["resting_pairs"] == 1
    assert s["per_frame"]["float_gap"] == pairs[0]["gap"]
    alone = metrics.interaction_summary(pairs[1:], rest_tolerance=0.5)
    assert alone["float_gap"] is None and alone["per_frame"]["float_gap"] is None


def test_a_moving_other_mesh_is_taken_per_frame():
    """The slab rising d_t under a cube at rest is the cube sinking d_t: per-frame vertices
    [T, V, 3] give what the sinking cube gives against the static slab, and a static slab
    given per frame gives what the batched static query gives."""
    d = 0.1 * np.arange(5)
    V, F = SLAB
    rising = V[None] + np.stack([(0.0, x, 0.0) for x in d])[:, None]  # [T, V, 3]
    still = cube_samples([(0, 0, 0)] * 5)
    moved = metrics.pair_interaction(still, rising, F)
    sunk = metrics.pair_interaction(cube_samples([(0, -x, 0) for x in d]), V, F)
    assert moved["fraction"] == sunk["fraction"]  # the same samples, the same side of 0
    for a, b in zip(moved["depth"], sunk["depth"], strict=True):
        assert abs(a - b) <= DIST_TOL
    per_frame = metrics.pair_interaction(still, np.broadcast_to(V, (5, *V.shape)), F)
    assert per_frame == metrics.pair_interaction(still, V, F)
