"""Regularisers (METHOD §16) and resolution scales (METHOD §14) against known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from chord.motion import regularisers
from chord.render import cameras
from chord.render.rasterizer import rasterize

D64 = torch.float64


# --- schedules --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("it", "arap", "time"),
    [(0, 2880, 12), (500, 1920, 12), (1000, 960, 12), (1500, 480, 8), (3000, 120, 2)],
)
def test_weights_at_the_landmarks(it, arap, time):
    assert regularisers.arap_weight(it) == pytest.approx(arap)
    assert regularisers.time_weight(it) == pytest.approx(time)


def test_weights_hold_the_last_value_after_the_last_step():
    assert regularisers.arap_weight(5000) == pytest.approx(120)
    assert regularisers.time_weight(10_000) == pytest.approx(2)


def test_weight_between_landmarks_is_log_linear():
    expected = math.exp(0.5 * math.log(1200) + 0.5 * math.log(800)) * 2.4
    assert regularisers.arap_weight(250) == pytest.approx(expected)
    u = 300 / 1500  # between 1500 (200) and 3000 (50)
    expected = 2.4 * math.exp((1 - u) * math.log(200) + u * math.log(50))
    assert regularisers.arap_weight(1800) == pytest.approx(expected)
    assert regularisers.time_weight(250) == pytest.approx(12)  # constant landmarks stay constant


def test_steps_scale_with_the_iteration_count():
    assert regularisers.arap_weight(250, n_iters=1500) == pytest.approx(
        regularisers.arap_weight(500)
    )
    assert regularisers.time_weight(750, n_iters=1500) == pytest.approx(8)
    assert regularisers.arap_weight(1500, n_iters=1500) == pytest.approx(120)
    for it in (0, 123, 1000, 2999, 3000):
        assert regularisers.arap_weight(it, n_iters=3000) == regularisers.arap_weight(it)
    assert regularisers.arap_weight(1000, n_iters=6000) == pytest.approx(1920)


def test_value_before_the_first_step():
    assert regularisers.landmark_value(0, [0, 10], [5, 1]) == pytest.approx(
        5
    )  # s_0 = 0: starts at v_0
    assert regularisers.landmark_value(99, [100, 200], [5, 1]) == 0.0
    assert regularisers.landmark_value(100, [100, 200], [5, 1]) == pytest.approx(5)


def test_non_positive_landmarks_give_zero():
    assert regularisers.landmark_value(50, [0, 100, 200], [4, 0, 3]) == 0.0
    assert regularisers.landmark_value(150, [0, 100, 200], [4, 0, 3]) == 0.0
    assert regularisers.landmark_value(200, [0, 100, 200], [4, 0, 3]) == pytest.approx(3)


def test_schedule_rejects_bad_landmarks():
    with pytest.raises(ValueError, match="values"):
        regularisers.landmark_value(0, [0, 1], [1.0])
    with pytest.raises(ValueError, match="steps"):
        regularisers.landmark_value(0, [5, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="n_iters"):
        regularisers.arap_weight(0, n_iters=0)


# --- resolution scales ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "scale"), [(832, 480, 1.0), (576, 320, 2.1666666666), (416, 240, 4.0)]
)
def test_resolution_scales(w, h, scale):
    assert regularisers.sds_scale(w, h) == pytest.approx(scale)
    assert regularisers.temporal_scale(w, h) == pytest.approx(scale)


def test_resolution_scales_reject_empty_images():
    with pytest.raises(ValueError, match="width"):
        regularisers.sds_scale(0, 480)
    with pytest.raises(ValueError, match="height"):
        regularisers.temporal_scale(832, -1)


# --- ARAP connectivity and sampling -----------------------------------------------------------


def lattice(n: int, spacing: float) -> torch.Tensor:
    g = torch.arange(n, dtype=D64) * spacing
    return torch.stack(torch.meshgrid(g, g, g, indexing="ij"), dim=-1).reshape(-1, 3)


def test_connectivity_keeps_face_neighbours_on_a_fine_lattice():
    rest = lattice(6, 0.05)
    nbr, mask = regularisers.arap_connectivity(rest)
    assert nbr.shape == mask.shape == (216, 10)
    assert nbr.dtype == torch.int64 and mask.dtype == torch.bool
    assert not (nbr == torch.arange(216)[:, None]).any()
    idx = lambda i, j, k: (i * 6 + j) * 6 + k  # noqa: E731
    for i, j, k in [(1, 1, 1), (2, 3, 4), (4, 4, 2)]:
        v = idx(i, j, k)
        kept = set(nbr[v][mask[v]].tolist())
        faces = {
            idx(i + a, j + b, k + c)
            for a, b, c in [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]
        }
        assert faces <= kept
        d = (rest[nbr[v]] - rest[v]).norm(dim=-1)
        assert torch.allclose(d[:6], torch.full((6,), 0.05, dtype=D64))  # nearest first
        assert mask[v].all()  # the 10 nearest are all within 0.0866 < 0.1


def test_connectivity_masks_far_neighbours_beyond_the_first_three():
    nbr, mask = regularisers.arap_connectivity(lattice(4, 0.2))
    assert nbr.shape == (64, 10)
    assert not (nbr == torch.arange(64)[:, None]).any()
    assert mask[:, :3].all() and not mask[:, 3:].any()
    # keep = 0 is allowed: the radius alone decides (lattice step 0.2, radius 0.1: no edge)
    nbr0, mask0 = regularisers.arap_connectivity(lattice(4, 0.2), keep=0)
    assert torch.equal(nbr0, nbr) and not mask0.any()


def test_connectivity_with_few_voxels_and_duplicates():
    rest = torch.tensor([[0.0, 0, 0], [0.0, 0, 0], [0.01, 0, 0], [0.5, 0, 0]])
    nbr, mask = regularisers.arap_connectivity(rest)
    assert nbr.shape == (4, 3)
    assert not (nbr == torch.arange(4)[:, None]).any()
    assert sorted(nbr[0].tolist()) == [1, 2, 3] and sorted(nbr[1].tolist()) == [0, 2, 3]
    assert mask.all()
    nbr, mask = regularisers.arap_connectivity(torch.zeros(1, 3))
    assert nbr.shape == mask.shape == (1, 0)
    with pytest.raises(ValueError, match="rest"):
        regularisers.arap_connectivity(torch.zeros(5, 2))


def test_sampling_with_replacement_is_reproducible():
    draw = lambda seed: regularisers.arap_sample(  # noqa: E731
        1000, 50, 4, torch.Generator().manual_seed(seed)
    )
    s = draw(3)
    assert s.shape == (200,) and s.dtype == torch.int64
    assert int(s.min()) >= 0 and int(s.max()) < 1000
    assert torch.equal(s, draw(3))
    assert not torch.equal(s, draw(4))
    expected = torch.randint(1000, (200,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(s, expected)


def test_sampling_few_voxels_repeats_every_index():
    s = regularisers.arap_sample(30, 50, 3, torch.Generator().manual_seed(0))
    assert s.shape == (90,)
    assert torch.equal(torch.bincount(s, minlength=30), torch.full((30,), 3))
    s = regularisers.arap_sample(50, 50, 2, torch.Generator())  # V = n: no sampling either
    assert torch.equal(torch.bincount(s), torch.full((50,), 2))
    with pytest.raises(ValueError, match="batch_size"):
        regularisers.arap_sample(30, 50, 0, torch.Generator())
    with pytest.raises(ValueError, match="sample_num"):  # no vertex would ever be sampled
        regularisers.arap_sample(30, 0, 1, torch.Generator())
    with pytest.raises(ValueError, match="num_voxels"):
        regularisers.arap_sample(0, 50, 1, torch.Generator())


# --- rotations --------------------------------------------------------------------------------


def random_rotations(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=gen, dtype=D64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]
    det = torch.linalg.det(q)
    q[..., :, 0] *= det[..., None]  # force det = +1
    return q


def assert_proper(R: torch.Tensor) -> None:
    eye = torch.eye(3, dtype=R.dtype).expand_as(R)
    torch.testing.assert_close(R @ R.transpose(-1, -2), eye, atol=1e-10, rtol=0)
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(R.shape[:-2], dtype=R.dtype))


def test_best_rotation_fixes_a_reflection():
    S = torch.diag(torch.tensor([3.0, 2.0, -1.0], dtype=D64))
    U, _, Wh = torch.linalg.svd(S)
    assert torch.linalg.det(Wh.T @ U.T) < 0  # the raw Procrustes answer is a mirror
    R = regularisers.best_rotations(S)
    assert_proper(R)
    torch.testing.assert_close(R, torch.eye(3, dtype=D64), atol=1e-12, rtol=0)


def test_best_rotation_of_mirrored_and_coplanar_edges_is_proper():
    gen = torch.Generator().manual_seed(0)
    e0 = torch.randn(8, 3, generator=gen, dtype=D64)
    mirrored = e0 * torch.tensor([1.0, 1.0, -1.0], dtype=D64)
    flat = e0 * torch.tensor([1.0, 1.0, 0.0], dtype=D64)
    S = torch.stack([e0.T @ mirrored, flat.T @ flat, flat.T @ (flat @ random_rotations(1, gen)[0])])
    assert_proper(regularisers.best_rotations(S))


def test_best_rotation_is_optimal_among_rotations():
    gen = torch.Generator().manual_seed(1)
    S = torch.randn(20, 3, 3, generator=gen, dtype=D64)
    R = regularisers.best_rotations(S)
    assert_proper(R)
    best = torch.einsum("nab,nba->n", R, S)  # tr(R S) = Σ_j e(t)ᵀ R e(0)
    Q = random_rotations(500, gen)
    other = torch.einsum("mab,nba->nm", Q, S)
    assert (other <= best[:, None] + 1e-12).all()


def test_best_rotation_recovers_a_known_rotation_without_gradient():
    gen = torch.Generator().manual_seed(2)
    R_true = random_rotations(1, gen)[0]
    e0 = torch.randn(10, 3, generator=gen, dtype=D64)
    S = (e0.T @ (e0 @ R_true.T)).requires_grad_()
    R = regularisers.best_rotations(S)
    torch.testing.assert_close(R, R_true, atol=1e-10, rtol=0)
    assert not R.requires_grad


# --- ARAP energy ------------------------------------------------------------------------------


def blob(V: int = 80, seed: int = 0) -> torch.Tensor:
    return torch.rand(V, 3, generator=torch.Generator().manual_seed(seed), dtype=D64) * 0.3


def test_rigid_motion_has_no_energy():
    rest = blob()
    gen = torch.Generator().manual_seed(5)
    R = random_rotations(4, gen)
    t = torch.randn(4, 1, 3, generator=gen, dtype=D64)
    X = torch.cat([rest[None], rest @ R.transpose(-1, -2) + t])  # [5, V, 3]
    nbr, mask = regularisers.arap_connectivity(rest)
    sample = regularisers.arap_sample(80, 200, 2, gen)
    E = regularisers.arap_energy(X, nbr, mask, sample)
    assert E.ndim == 0 and E.item() < 1e-10


def test_non_rigid_motion_has_energy_and_gradient():
    rest = blob()
    stretch = rest * torch.tensor([1.5, 1.0, 0.7], dtype=D64)
    bend = rest.clone()
    bend[:, 1] += 2.0 * rest[:, 0] ** 2
    X = torch.stack([rest, stretch, bend]).requires_grad_()
    nbr, mask = regularisers.arap_connectivity(rest)
    sample = torch.arange(80)
    E = regularisers.arap_energy(X, nbr, mask, sample)
    assert E.item() > 1e-3
    (g,) = torch.autograd.grad(E, X)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_energy_of_three_points_matches_numpy_procrustes():
    x0 = np.array([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.0, 0.08, 0.02]])
    A = np.array([[1.3, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]])
    x1 = x0 @ A.T + np.array([0.5, -0.2, 0.1])
    E_ref, g0, g1 = 0.0, np.zeros_like(x0), np.zeros_like(x1)
    for i in range(3):
        js = [j for j in range(3) if j != i]
        S = sum(np.outer(x0[j] - x0[i], x1[j] - x1[i]) for j in js)
        U, _, Wh = np.linalg.svd(S)
        R = Wh.T @ U.T
        if np.linalg.det(R) <= 0:
            U[:, 2] *= -1
            R = Wh.T @ U.T
        for j in js:
            r = (x1[j] - x1[i]) - R @ (x0[j] - x0[i])
            E_ref += r @ r
            g1[j] += 2 * r
            g1[i] -= 2 * r
            g0[j] -= 2 * R.T @ r
            g0[i] += 2 * R.T @ r
    X = torch.tensor(np.stack([x0, x1])).requires_grad_()
    nbr, mask = regularisers.arap_connectivity(X[0].detach())
    E = regularisers.arap_energy(X, nbr, mask, torch.arange(3))
    assert E.item() == pytest.approx(E_ref, rel=1e-10)
    (g,) = torch.autograd.grad(E, X)  # the gradient with the rotations held fixed
    np.testing.assert_allclose(g.numpy(), np.stack([g0, g1]), atol=1e-12)


def test_energy_graph_has_no_svd():
    X = torch.stack([blob(20), blob(20) * 1.2]).requires_grad_()
    nbr, mask = regularisers.arap_connectivity(X[0].detach())
    E = regularisers.arap_energy(X, nbr, mask, torch.arange(20))
    seen, stack = set(), [E.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    names = {type(fn).__name__ for fn in seen}
    assert not any("Svd" in n or "Det" in n for n in names), names


def test_energy_counts_samples_and_skips_masked_edges():
    X = torch.stack([blob(30), blob(30) * torch.tensor([1.4, 1.0, 0.8], dtype=D64)])
    nbr, mask = regularisers.arap_connectivity(X[0])
    one = regularisers.arap_energy(X, nbr, mask, torch.tensor([7]))
    twice = regularisers.arap_energy(X, nbr, mask, torch.tensor([7, 7]))
    assert one.item() > 0
    torch.testing.assert_close(twice, 2 * one)
    total = regularisers.arap_energy(X, nbr, mask, torch.arange(30))
    parts = sum(regularisers.arap_energy(X, nbr, mask, torch.tensor([i])) for i in range(30))
    torch.testing.assert_close(total, parts)
    assert float(regularisers.arap_energy(X, nbr, torch.zeros_like(mask), torch.arange(30))) == 0.0
    # dropping edges is the same as removing them from the neighbour list
    sub = regularisers.arap_energy(X, nbr[:, :3], mask[:, :3], torch.arange(30))
    only3 = mask.clone()
    only3[:, 3:] = False
    torch.testing.assert_close(regularisers.arap_energy(X, nbr, only3, torch.arange(30)), sub)
    # one neighbour each still has an energy: a stretched edge cannot be rotated back
    assert regularisers.arap_energy(X, nbr[:, :1], mask[:, :1], torch.arange(30)).item() > 0


def test_energy_rejects_bad_shapes():
    X = torch.stack([blob(12), blob(12)])
    nbr, mask = regularisers.arap_connectivity(X[0])
    with pytest.raises(ValueError, match="X"):
        regularisers.arap_energy(X[0], nbr, mask, torch.arange(12))
    with pytest.raises(ValueError, match="nbr"):
        regularisers.arap_energy(X, nbr[:5], mask[:5], torch.arange(12))
    with pytest.raises(ValueError, match="mask"):
        regularisers.arap_energy(X, nbr, mask.float(), torch.arange(12))
    with pytest.raises(ValueError, match="sample"):
        regularisers.arap_energy(X, nbr, mask, torch.tensor([12]))
    assert float(regularisers.arap_energy(X[:1], nbr, mask, torch.arange(12))) == 0.0


# --- temporal displacement --------------------------------------------------------------------

W, H = 32, 24


def camera_pair():
    views = cameras.orbit_viewmats([0.0, 20.0], [0.0, 40.0], 3.0)  # [2, 4, 4] float64
    return views, cameras.intrinsics(W, H)


def gaussians(T: int, N: int = 1, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    quats = torch.nn.functional.normalize(torch.randn(T, N, 4, generator=gen, dtype=D64), dim=-1)
    scales = 0.2 + 0.2 * torch.rand(N, 3, generator=gen, dtype=D64)
    opacities = 0.5 + 0.4 * torch.rand(N, generator=gen, dtype=D64)
    return quats, scales, opacities


def alpha_maps(means, quats, scales, opacities, views, K):
    F, N = means.shape[0] - 1, means.shape[1]
    _, alpha, _ = rasterize(
        means[:-1],
        quats[:-1],
        scales.expand(F, N, 3),
        opacities.expand(F, N),
        torch.ones(F, N, 1, dtype=D64),
        views.expand(F, -1, 4, 4),
        K.expand(F, views.shape[0], 3, 3),
        W,
        H,
        backend="torch",
    )
    return alpha[..., 0]  # [F, B, H, W]


def test_temporal_loss_is_zero_without_motion():
    quats, scales, opacities = gaussians(3, N=4)
    means = (0.2 * torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=D64))[None]
    means = means.expand(3, 4, 3).clone().requires_grad_()
    views, K = camera_pair()
    loss = regularisers.temporal_loss(
        means, quats, scales, opacities, views, K, W, H, backend="torch"
    )
    assert loss.ndim == 0 and loss.item() == 0.0


def test_temporal_loss_of_a_constant_displacement_is_the_alpha_energy():
    T = 4
    d = torch.tensor([0.03, -0.02, 0.05], dtype=D64)
    quats, scales, opacities = gaussians(T)
    means = (torch.arange(T, dtype=D64)[:, None, None] * d).requires_grad_()  # [T, 1, 3]
    views, K = camera_pair()
    quats.requires_grad_()
    scales.requires_grad_()
    opacities.requires_grad_()
    loss = regularisers.temporal_loss(
        means, quats, scales, opacities, views, K, W, H, backend="torch"
    )
    with torch.no_grad():
        A = (alpha_maps(means, quats, scales, opacities, views, K) ** 2).sum(dim=(1, 2, 3))  # [F]
    assert float(A.min()) > 1.0  # the Gaussian covers many pixels in both cameras
    torch.testing.assert_close(loss, A.sum() * (d @ d), rtol=1e-10, atol=0)
    loss.backward()
    # Geometry detached: d_t = x_{t+1} − x_t is the only path, dL/dd_t = 2·A_t·d.
    g = torch.zeros(T, 3, dtype=D64)
    g[1:] += 2 * A[:, None] * d
    g[:-1] -= 2 * A[:, None] * d
    torch.testing.assert_close(means.grad[:, 0], g, rtol=1e-9, atol=1e-12)
    assert quats.grad is None and scales.grad is None and opacities.grad is None


def test_temporal_loss_matches_a_direct_render_of_the_displacements():
    T, N = 3, 5
    gen = torch.Generator().manual_seed(3)
    quats, scales, opacities = gaussians(T, N, seed=4)
    scales = scales * 0.5
    means = (0.3 * torch.randn(T, N, 3, generator=gen, dtype=D64)).requires_grad_()
    views, K = camera_pair()
    Ks = K.expand(2, 3, 3)  # [B, 3, 3] is accepted as well
    loss = regularisers.temporal_loss(
        means, quats, scales, opacities, views, Ks, W, H, backend="torch"
    )
    (g,) = torch.autograd.grad(loss, means)
    geo = means.detach()
    d = means[1:] - means[:-1]
    img, _, _ = rasterize(
        geo[:-1],
        quats[:-1],
        scales.expand(T - 1, N, 3),
        opacities.expand(T - 1, N),
        d,
        views.expand(T - 1, 2, 4, 4),
        Ks.expand(T - 1, 2, 3, 3),
        W,
        H,
        backend="torch",
    )
    ref = (img**2).sum()
    (g_ref,) = torch.autograd.grad(ref, means)
    assert loss.item() > 0
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-14)


def test_temporal_loss_in_float32():
    quats, scales, opacities = gaussians(2)
    means = torch.tensor([[[0.0, 0, 0]], [[0.05, 0, 0]]], requires_grad=True)
    views, K = camera_pair()  # float64 cameras are cast to the means' dtype
    loss = regularisers.temporal_loss(
        means, quats.float(), scales.float(), opacities.float(), views, K, W, H
    )
    assert loss.dtype == torch.float32 and loss.item() > 0
    loss.backward()
    assert torch.isfinite(means.grad).all()


def test_temporal_loss_rejects_bad_shapes():
    quats, scales, opacities = gaussians(3, N=2)
    means = torch.zeros(3, 2, 3, dtype=D64)
    views, K = camera_pair()
    call = lambda **kw: regularisers.temporal_loss(  # noqa: E731
        **{
            "means": means,
            "quats": quats,
            "scales": scales,
            "opacities": opacities,
            "viewmats": views,
            "Ks": K,
            "width": W,
            "height": H,
            **kw,
        }
    )
    with pytest.raises(ValueError, match="means"):
        call(means=means[:1])
    with pytest.raises(ValueError, match="quats"):
        call(quats=quats[0])
    with pytest.raises(ValueError, match="scales"):
        call(scales=scales[:1])
    with pytest.raises(ValueError, match="opacities"):
        call(opacities=opacities[None])
    with pytest.raises(ValueError, match="viewmats"):
        call(viewmats=views[0])
    with pytest.raises(ValueError, match="Ks"):
        call(Ks=K.expand(3, 3, 3))


# --- ground -----------------------------------------------------------------------------------


def test_ground_loss_without_penetration_is_zero_in_the_graph():
    Y = torch.tensor([[0.1, 0.2], [0.0, 0.3]], requires_grad=True)
    loss = regularisers.ground_loss(Y, 0.0)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(Y.grad, torch.zeros_like(Y))


def test_ground_loss_is_the_mean_square_of_the_penetrations():
    Y = torch.tensor([[0.1, -0.2, 0.4], [-0.1, 0.3, 0.05]], dtype=D64, requires_grad=True)
    loss = regularisers.ground_loss(Y, 0.05)
    expected = ((-0.25) ** 2 + (-0.15) ** 2) / 2
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    g = torch.zeros(2, 3, dtype=D64)
    g[0, 1], g[1, 0] = 2 * -0.25 / 2, 2 * -0.15 / 2
    torch.testing.assert_close(Y.grad, g)
    with pytest.raises(ValueError, match="Y"):
        regularisers.ground_loss(Y[0], 0.0)
