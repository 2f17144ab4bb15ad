"""RF-SDS (METHOD §11), timestep schedules (METHOD §12), CFG ramp (METHOD §13), scales (§14)."""

import math

import numpy as np
import pytest
import torch

from chord.guidance import rfsds

N = 3000


def _expert_is_high(t: float) -> bool:
    """METHOD §9: the high-noise expert runs when 1000·t ≥ 0.9·1000."""
    return 1000 * t >= 0.9 * 1000


# --- §12 schedules ----------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "w"), [(0.98, 0.513), (0.9, 3.57), (0.5, 1.60)])
def test_annealed_weight_values(t, w):
    assert rfsds.annealed_weight(t) == pytest.approx(w, abs=5e-3)


def test_logit_normal_density_floats_and_arrays():
    assert rfsds.logit_normal_density(0.5) == pytest.approx(4 / math.sqrt(2 * math.pi))
    ts = np.array([0.1, 0.5, 0.9])
    out = rfsds.logit_normal_density(ts)
    assert isinstance(out, np.ndarray) and out.shape == (3,)
    assert out[0] == pytest.approx(out[2])  # symmetric about 0.5
    with pytest.raises(ValueError, match="t:"):
        rfsds.logit_normal_density(1.0)


@pytest.mark.parametrize(
    ("it", "t"),
    [
        (1, 0.980),
        (100, 0.944),
        (300, 0.907),
        (500, 0.877),
        (1000, 0.807),
        (1500, 0.731),
        (2000, 0.639),
        (2500, 0.508),
        (3000, 0.083),
    ],
)
def test_resampled_timesteps(it, t):
    got, w = rfsds.timestep_at(it, N, resample=True)
    assert got == pytest.approx(t, abs=5e-4)
    assert w == 1.0


def test_quantile_table_shape_order_range_and_median():
    table = rfsds.quantile_table(N)
    assert table.shape == (N,) and table.dtype == np.float64
    assert np.all(np.diff(table) >= 0)
    assert table.min() >= 0.02 and table.max() <= 0.98
    assert np.median(table) == pytest.approx(0.731, abs=5e-4)
    table[0] = -1.0  # the caller's copy; the cached table is untouched
    assert rfsds.quantile_table(N)[0] > 0


def test_resample_index_quirk_at_2500():
    """⌊(1 − 2500/3000)·3000⌋ is 499 in double precision, not 500."""
    table = rfsds.quantile_table(N)
    assert math.floor((1.0 - 2500 / N) * N) == 499
    assert rfsds.timestep_at(2500, N, resample=True)[0] == table[499]
    assert table[499] != table[500]


def test_high_noise_expert_iterations():
    resampled = [
        it for it in range(1, N + 1) if _expert_is_high(rfsds.timestep_at(it, N, resample=True)[0])
    ]
    annealed = [
        it for it in range(1, N + 1) if _expert_is_high(rfsds.timestep_at(it, N, resample=False)[0])
    ]
    assert resampled == list(range(1, 347))
    assert annealed == list(range(1, 301))


@pytest.mark.parametrize(
    ("it", "t_annealed", "t_resampled"),
    [(1, 0.98, 0.98), (1000, 2 / 3, 0.807), (2000, 1 / 3, 0.639)],
)
def test_annealed_versus_resampled(it, t_annealed, t_resampled):
    t, w = rfsds.timestep_at(it, N, resample=False)
    assert t == pytest.approx(t_annealed, abs=1e-12)
    assert w == pytest.approx(rfsds.annealed_weight(t_annealed))
    assert rfsds.timestep_at(it, N, resample=True)[0] == pytest.approx(t_resampled, abs=5e-4)


def test_annealed_clamps():
    assert rfsds.timestep_at(N, N, resample=False)[0] == 0.02
    assert rfsds.timestep_at(2 * N, N, resample=True)[0] == rfsds.quantile_table(N)[0]


def test_schedule_bad_input():
    with pytest.raises(ValueError, match="n_iters"):
        rfsds.timestep_at(1, 0, resample=False)
    with pytest.raises(ValueError, match="it:"):
        rfsds.timestep_at(-1, N, resample=True)
    with pytest.raises(ValueError, match="n_iters"):
        rfsds.quantile_table(2.5)


# --- §13 CFG ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("it", "s"), [(1, 25 - 13 / 3000), (300, 23.7), (2000, 16.333333333333), (3000, 12.0)]
)
def test_cfg_ramp(it, s):
    assert rfsds.cfg_scale_at(it, N) == pytest.approx(s, abs=1e-9)


# --- §11 RF-SDS -------------------------------------------------------------------------------


def _latents(shape=(2, 16, 3, 4, 6), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype)


def test_noisy_latents_formula_and_no_gradient():
    z = _latents().requires_grad_(True)
    eps = _latents(seed=1)
    zt = rfsds.noisy_latents(z, eps, 0.3)
    assert torch.allclose(zt, 0.7 * z.detach() + 0.3 * eps)
    assert not zt.requires_grad and zt.grad_fn is None
    with pytest.raises(ValueError, match="eps"):
        rfsds.noisy_latents(z, eps[0], 0.3)
    for t in (1.5, -0.1):  # outside [0, 1]: past the noise or the clean latent
        with pytest.raises(ValueError, match="t:"):
            rfsds.noisy_latents(z, eps, t)
    assert torch.equal(rfsds.noisy_latents(z, eps, 0.0), z.detach())
    assert torch.equal(rfsds.noisy_latents(z, eps, 1.0), eps)


def test_sds_grad_formula_and_nans():
    z, eps, v = _latents(), _latents(seed=1), _latents(seed=2)
    g = rfsds.sds_grad(z.requires_grad_(True), eps, v, 0.5)
    assert torch.allclose(g, 0.5 * (v - (eps - z.detach())))
    assert not g.requires_grad
    v_bad = v.clone()
    v_bad[0, 0, 0, 0, 0] = float("nan")
    v_bad[1, 2, 1, 1, 1] = float("inf")
    g_bad = rfsds.sds_grad(z, eps, v_bad, 0.5)
    assert g_bad[0, 0, 0, 0, 0] == 0.0
    assert not torch.isnan(g_bad).any()
    assert g_bad[1, 2, 1, 1, 1] == float("inf")  # only NaNs are replaced
    with pytest.raises(ValueError, match="v_hat"):
        rfsds.sds_grad(z, eps, v[0], 0.5)


@pytest.mark.parametrize("shape", [(16, 3, 4, 6), (2, 16, 3, 4, 6)])
def test_sds_loss_gradient_is_exactly_g(shape):
    z = (_latents(shape, torch.float64) * 3.7).requires_grad_(True)
    g = rfsds.sds_grad(z, _latents(shape, torch.float64, 1), _latents(shape, torch.float64, 2), 1.3)
    loss, reported = rfsds.sds_loss(z, g)
    (grad,) = torch.autograd.grad(loss, z)
    assert torch.equal(grad, g)
    assert torch.equal(loss.detach(), reported)
    assert reported.item() == pytest.approx(0.5 * float((g**2).sum()))
    assert not reported.requires_grad and reported.ndim == 0


def test_sds_loss_equals_the_method_form():
    """½·Σ (z − sg(z − g))² agrees in value and gradient up to rounding."""
    z = _latents(dtype=torch.float64).requires_grad_(True)
    g = _latents(dtype=torch.float64, seed=3)
    loss, _ = rfsds.sds_loss(z, g)
    method = 0.5 * (z - (z - g).detach()).square().sum()
    assert loss.item() == pytest.approx(method.item(), rel=1e-12)
    (a,) = torch.autograd.grad(loss, z)
    (b,) = torch.autograd.grad(method, z)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("size", "scale"), [((832, 480), 1.0), ((576, 320), 2.1666666666666665), ((416, 240), 4.0)]
)
def test_resolution_scales(size, scale):
    sds, temporal = rfsds.resolution_scales(*size)
    assert sds == pytest.approx(scale, abs=1e-12) and temporal == pytest.approx(scale, abs=1e-12)
    if size == (832, 480):
        assert sds == 1.0 and temporal == 1.0


def test_noise_like_reproducible():
    z = torch.zeros(2, 16, 3, 4, 6)
    a = rfsds.noise_like(z, torch.Generator().manual_seed(7))
    b = rfsds.noise_like(z, torch.Generator().manual_seed(7))
    c = rfsds.noise_like(z, torch.Generator().manual_seed(8))
    assert a.shape == z.shape and a.dtype == z.dtype and a.device == z.device
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="generator"):
        rfsds.noise_like(z, 7)
    with pytest.raises(ValueError, match="z:"):
        rfsds.noise_like(torch.zeros(3, 4), torch.Generator())
