"""Rectified-flow score distillation (METHOD §11), its timestep schedules (METHOD §12) and the
CFG ramp (METHOD §13).

Conventions: iterations run it = 1..N and the step ratio is r = min(1, it/N). One t is shared by
every video of an iteration; ε is fresh per video. Latents z are float32, [C, F, h, w] for one
video or [B, C, F, h, w] for a batch. The DiT calls themselves live with the caller: this module
only turns (z, ε, t, v̂) into a gradient and a loss.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from chord.motion import regularisers

T_MIN, T_MAX = 0.02, 0.98  # the range every schedule clamps t to
QUANTILE_GRID_POINTS = 1_000_000  # grid of the resampled density (METHOD §12, step 1)
QUANTILE_GRID_EPS = 1e-6  # the grid spans [eps, 1 - eps]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# --- timestep schedules -----------------------------------------------------------------------


def logit_normal_density(t):
    """METHOD §12: LN(t) = φ(logit t)/(t(1 − t)), the LogitNormal(0, 1) density.

    ``t`` is a float in (0, 1) -> float, or a numpy array [...] of such values -> array [...].
    """
    arr = np.asarray(t, dtype=np.float64)
    if np.any(~((arr > 0.0) & (arr < 1.0))):
        raise ValueError(f"t: expected values in the open interval (0, 1), got {t!r}")
    one_minus = 1.0 - arr
    logit = np.log(arr) - np.log(one_minus)
    out = _INV_SQRT_2PI * np.exp(-0.5 * logit * logit) / (arr * one_minus)
    return float(out) if out.ndim == 0 else out


def annealed_weight(t: float) -> float:
    """METHOD §12: w(t) = (t/(1 − t))·LN(t); w(0.98) = 0.513, w(0.9) = 3.57, w(0.5) = 1.60."""
    t = float(t)
    if not 0.0 < t < 1.0:
        raise ValueError(f"t: expected a value in the open interval (0, 1), got {t}")
    return (t / (1.0 - t)) * logit_normal_density(t)


@functools.lru_cache(maxsize=8)
def _cached_quantile_table(n_iters: int) -> np.ndarray:
    grid = np.linspace(QUANTILE_GRID_EPS, 1.0 - QUANTILE_GRID_EPS, QUANTILE_GRID_POINTS)
    density = (grid / (1.0 - grid)) * logit_normal_density(grid)
    density = density / np.trapezoid(density, grid)  # the release's numpy.trapz, same value
    cdf = np.cumsum(density)
    cdf = cdf / cdf[-1]
    levels = np.arange(1, n_iters + 1, dtype=np.float64) / (n_iters + 1)
    table = np.clip(np.interp(levels, cdf, grid), T_MIN, T_MAX)
    table.flags.writeable = False  # shared by every caller through the cache
    return table


def quantile_table(n_iters: int) -> np.ndarray:
    """METHOD §12: the ``resample_timestep`` table t_i, i = 1..N -> float64 [N], ascending.

    t_i = interp(i/(N+1), CDF, grid), clipped to [0.02, 0.98], where CDF is the normalised
    cumulative sum of p(t) ∝ (t/(1 − t))·LN(t) on 10⁶ points over [1e-6, 1 − 1e-6]. The table
    is cached per N (the grid is the expensive part); a fresh writable copy is returned.
    """
    _check_n_iters(n_iters)
    return _cached_quantile_table(int(n_iters)).copy()


def timestep_at(it: int, n_iters: int, *, resample: bool) -> tuple[float, float]:
    """METHOD §12: the iteration's shared timestep and SDS weight -> (t, w).

    Annealed (``resample`` False): t = clamp(1 − r, 0.02, 0.98), w = (t/(1 − t))·LN(t).
    Resampled: t = quantile_table(N)[⌊(1 − r)·N⌋] (index in double precision, clamped to
    [0, N − 1], so t runs from high to low) and w = 1.
    """
    _check_n_iters(n_iters)
    r = _step_ratio(it, n_iters)
    if resample:
        index = min(max(math.floor((1.0 - r) * n_iters), 0), n_iters - 1)
        return float(_cached_quantile_table(int(n_iters))[index]), 1.0
    t = min(max(1.0 - r, T_MIN), T_MAX)
    return t, annealed_weight(t)


# --- CFG ramp ---------------------------------------------------------------------------------


def cfg_scale_at(
    it: int, n_iters: int, init_cfg_scale: float = 25.0, last_cfg_scale: float = 12.0
) -> float:
    """METHOD §13: s(it) = init + (last − init)·r, linear from 25 to 12 over N iterations."""
    _check_n_iters(n_iters)
    r = _step_ratio(it, n_iters)
    return float(init_cfg_scale) + (float(last_cfg_scale) - float(init_cfg_scale)) * r


# --- RF-SDS -----------------------------------------------------------------------------------


def noise_like(z: Tensor, generator: torch.Generator) -> Tensor:
    """METHOD §11: ε ~ N(0, I) shaped like z ([C, F, h, w] or [B, C, F, h, w]), on z's device.

    The draw happens on the generator's device (so a seeded CPU generator gives the same ε
    whatever device z lives on), in z's dtype, then moves to z's device.
    """
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    _check_latents("z", z)
    eps = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=generator.device)
    return eps.to(z.device)


def noisy_latents(z: Tensor, eps: Tensor, t: float) -> Tensor:
    """METHOD §11 step 1: z_t = (1 − t)·sg(z) + t·ε, [C, F, h, w] or [B, C, F, h, w].

    z is detached: no gradient flows from the DiT input back to the renderer.
    """
    _check_latents("z", z)
    _check_same_shape("eps", eps, z)
    _check_t(t)
    return (1.0 - t) * z.detach() + t * eps


def sds_grad(z: Tensor, eps: Tensor, v_hat: Tensor, w: float) -> Tensor:
    """METHOD §11 step 3: g = w·(v̂ − (ε − sg(z))), NaN entries set to 0 -> [*z.shape], detached.

    ε − z is the rectified-flow target velocity, so g is the weighted velocity residual. Only
    NaNs are replaced: ±inf pass through unchanged (``torch.nan_to_num``'s default would clamp
    them to the largest finite value).
    """
    _check_latents("z", z)
    _check_same_shape("eps", eps, z)
    _check_same_shape("v_hat", v_hat, z)
    if not math.isfinite(float(w)):
        raise ValueError(f"w: expected a finite weight, got {w}")
    with torch.no_grad():
        g = float(w) * (v_hat.detach() - (eps.detach() - z.detach()))
        return torch.nan_to_num(g, nan=0.0, posinf=math.inf, neginf=-math.inf)


def sds_loss(z: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """METHOD §11 step 4: L = ½·Σ (z − sg(z − g))² -> (loss, reported), both 0-dim tensors.

    z [C, F, h, w] or [B, C, F, h, w] carries the graph back to the renderer; the sum runs
    over every element (all videos when batched). In exact arithmetic z − sg(z − g) = g; it is
    written as Σ g·(z − sg(z)) + ½·Σ g² so that, in floating point too, the value is ½·Σ g² and
    ∂L/∂z = g bit for bit. ``reported`` is ½·Σ g², detached.
    """
    _check_latents("z", z)
    _check_same_shape("g", g, z)
    g = g.detach()
    reported = 0.5 * g.square().sum()
    loss = (g * (z - z.detach())).sum() + reported
    return loss, reported.detach()


def resolution_scales(width: int, height: int) -> tuple[float, float]:
    """METHOD §14: (sds_scale, temporal_scale) for a W×H render; both exactly 1.0 at 832×480.

    sds_scale = (60·104)/((H/8)·(W/8)), temporal_scale = (832·480)/(W·H): 2.1667 at 576×320,
    4.0 at 416×240. The formulas live in ``chord.motion.regularisers``.
    """
    return regularisers.sds_scale(width, height), regularisers.temporal_scale(width, height)


# --- checks -----------------------------------------------------------------------------------


def _step_ratio(it: int, n_iters: int) -> float:
    if it < 0:
        raise ValueError(f"it: expected a non-negative iteration (1..{n_iters}), got {it}")
    return min(1.0, it / n_iters)


def _check_n_iters(n_iters: int) -> None:
    if isinstance(n_iters, bool) or int(n_iters) != n_iters or n_iters <= 0:
        raise ValueError(f"n_iters: expected a positive integer iteration count, got {n_iters}")


def _check_t(t: float) -> None:
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"t: expected a timestep in [0, 1], got {t}")


def _check_latents(name: str, z: Tensor) -> None:
    if not isinstance(z, Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(z).__name__}")
    if z.ndim not in (4, 5):
        raise ValueError(
            f"{name}: expected latents [C, F, h, w] or [B, C, F, h, w], got shape {tuple(z.shape)}"
        )
    if not z.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {z.dtype}")


def _check_same_shape(name: str, x: Tensor, z: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(x).__name__}")
    if x.shape != z.shape:
        raise ValueError(
            f"{name}: expected the latent shape {tuple(z.shape)}, got {tuple(x.shape)}"
        )
