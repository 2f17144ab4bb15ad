"""chord.metrics on synthetic motions with known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from chord import losses, metrics


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
    nbr, mask = losses.arap_connectivity(x0)
    r = metrics.arap_residual(X, nbr, mask)
    assert len(r) == T and max(r) < 1e-7


def test_arap_residual_of_rotation_and_scaling():
    x0 = cloud()
    nbr, mask = losses.arap_connectivity(x0)
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
