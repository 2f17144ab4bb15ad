"""Regularisers of the deformation: ARAP, temporal displacement, ground (METHOD §16), their
landmark weight schedules (METHOD §16) and the resolution scales of the losses (METHOD §14).

The functions return raw sums; the training loop applies the weights (e.g. E·λ_arap(it)/B).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy.spatial import cKDTree
from torch import Tensor

from chord.core import procrustes
from chord.render.rasterizer import rasterize

SCHEDULE_ITERS = 3000  # the iteration count the default landmark steps are written for
LANDMARK_STEPS = (0, 500, 1000, 1500, 3000)
ARAP_LANDMARKS = (1200, 800, 400, 200, 50)
TIME_LANDMARKS = (6, 6, 6, 4, 1)


# --- weight schedules -------------------------------------------------------------------------


def landmark_value(
    it: int, steps: Sequence[float], values: Sequence[float], n_iters: int = SCHEDULE_ITERS
) -> float:
    """METHOD §16: log-linear interpolation between landmarks (s_i, v_i) -> float.

    Steps are scaled by ``n_iters``/3000. The value is 0 before s_0 and v_last from s_last
    on; for s_i ≤ it < s_{i+1}, u = (it − s_i)/(s_{i+1} − s_i), it is
    exp((1 − u)·ln v_i + u·ln v_{i+1}), or 0 when v_i ≤ 0 or v_{i+1} ≤ 0.
    """
    steps, values = list(steps), list(values)
    if not steps:
        raise ValueError("steps: expected at least one landmark step, got none")
    if len(values) != len(steps):
        raise ValueError(f"values: expected {len(steps)} values (one per step), got {len(values)}")
    if any(b < a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"steps: expected a non-decreasing sequence, got {steps}")
    if n_iters <= 0:
        raise ValueError(f"n_iters: expected a positive iteration count, got {n_iters}")
    scale = n_iters / SCHEDULE_ITERS
    s = [float(x) * scale for x in steps]
    if it < s[0]:
        return 0.0
    if it >= s[-1]:
        return float(values[-1])
    for i in range(len(s) - 1):
        if s[i] <= it < s[i + 1]:
            v0, v1 = float(values[i]), float(values[i + 1])
            if v0 <= 0 or v1 <= 0:
                return 0.0
            u = (it - s[i]) / (s[i + 1] - s[i])
            return math.exp((1.0 - u) * math.log(v0) + u * math.log(v1))
    raise AssertionError("unreachable: the steps cover [s_0, s_last)")


def arap_weight(
    it: int,
    *,
    lambda_arap: float = 2.4,
    landmarks: Sequence[float] = ARAP_LANDMARKS,
    steps: Sequence[float] = LANDMARK_STEPS,
    n_iters: int = SCHEDULE_ITERS,
) -> float:
    """METHOD §16: λ_arap(it) = lambda_arap · landmark value (2880 → 120 at N = 3000)."""
    return lambda_arap * landmark_value(it, steps, landmarks, n_iters)


def time_weight(
    it: int,
    *,
    lambda_dis_time: float = 2.0,
    landmarks: Sequence[float] = TIME_LANDMARKS,
    steps: Sequence[float] = LANDMARK_STEPS,
    n_iters: int = SCHEDULE_ITERS,
) -> float:
    """METHOD §16: λ_time(it) = lambda_dis_time · landmark value (12 → 2 at N = 3000)."""
    return lambda_dis_time * landmark_value(it, steps, landmarks, n_iters)


# --- resolution scales ------------------------------------------------------------------------


def sds_scale(width: int, height: int) -> float:
    """METHOD §14: (60·104)/((H/8)·(W/8)), 1 at 832×480 (the latent grid it was tuned on)."""
    _check_size(width, height)
    return (60 * 104) / ((height / 8) * (width / 8))


def temporal_scale(width: int, height: int) -> float:
    """METHOD §14: (832·480)/(W·H), 1 at 832×480."""
    _check_size(width, height)
    return (832 * 480) / (width * height)


def _check_size(width: int, height: int) -> None:
    if width <= 0:
        raise ValueError(f"width: expected a positive pixel count, got {width}")
    if height <= 0:
        raise ValueError(f"height: expected a positive pixel count, got {height}")


# --- ARAP -------------------------------------------------------------------------------------


def arap_connectivity(
    rest: Tensor, *, k: int = 10, keep: int = 3, radius: float = 0.1
) -> tuple[Tensor, Tensor]:
    """METHOD §16: ARAP edges from the rest voxels [V, 3] -> nbr [V, k'] int64, mask [V, k'] bool.

    nbr holds each voxel's k' = min(k, V − 1) nearest other voxels, nearest first; mask keeps
    the first ``keep`` of them always and the rest only if their squared distance is below
    radius². Every kept edge has weight 1. Both live on ``rest``'s device.
    """
    if rest.ndim != 2 or rest.shape[-1] != 3:
        raise ValueError(f"rest: expected voxel positions [V, 3], got {tuple(rest.shape)}")
    if k < 0:
        raise ValueError(f"k: expected a non-negative neighbour count, got {k}")
    if keep < 0:
        raise ValueError(f"keep: expected a non-negative count, got {keep}")
    V = rest.shape[0]
    kk = max(min(k, V - 1), 0)
    device = rest.device
    if kk == 0:
        return (
            torch.zeros(V, 0, dtype=torch.int64, device=device),
            torch.zeros(V, 0, dtype=torch.bool, device=device),
        )
    pts = rest.detach().to("cpu", torch.float64).numpy()
    dist, idx = cKDTree(pts).query(pts, k=kk + 1)
    dist, idx = dist.reshape(V, kk + 1), idx.reshape(V, kk + 1)
    # Drop self; with duplicate points self may not come first, or at all (then drop the last).
    is_self = idx == np.arange(V)[:, None]
    no_self = ~is_self.any(axis=1)
    is_self[no_self, -1] = True
    first_self = is_self.argmax(axis=1)
    drop = np.zeros_like(is_self)
    drop[np.arange(V), first_self] = True
    idx = idx[~drop].reshape(V, kk)
    dist = dist[~drop].reshape(V, kk)
    mask = (np.arange(kk)[None, :] < keep) | (dist**2 < radius**2)
    return (
        torch.as_tensor(idx, dtype=torch.int64, device=device),
        torch.as_tensor(mask, dtype=torch.bool, device=device),
    )


def arap_sample(
    num_voxels: int, sample_num: int, batch_size: int, generator: torch.Generator
) -> Tensor:
    """METHOD §16: the ARAP vertex list [S] int64 on the generator's device.

    If V > n (``sample_num``): B·n draws with replacement, ``torch.randint(V, (B·n,))``;
    else every index 0..V−1, repeated B times (S = B·V).
    """
    if num_voxels <= 0:
        raise ValueError(f"num_voxels: expected a positive voxel count, got {num_voxels}")
    if sample_num <= 0:
        raise ValueError(f"sample_num: expected a positive sample count, got {sample_num}")
    if batch_size <= 0:
        raise ValueError(f"batch_size: expected a positive batch size, got {batch_size}")
    device = generator.device
    if num_voxels > sample_num:
        return torch.randint(
            num_voxels, (batch_size * sample_num,), generator=generator, device=device
        )
    return torch.arange(num_voxels, dtype=torch.int64, device=device).repeat(batch_size)


def best_rotations(S: Tensor) -> Tensor:
    """METHOD §16: R = W·Uᵀ from S = UΣWᵀ [..., 3, 3] -> proper rotations [..., 3, 3].

    Where det(W·Uᵀ) ≤ 0, U's column of the smallest singular value is negated first: R is the
    rotation maximising tr(R·S), computed by :func:`chord.core.procrustes.best_rotations`
    (Horn's quaternion, the SVD where it is not unique). No gradient flows (the rotations are
    constants of the energy).
    """
    return procrustes.best_rotations(S)  # which refuses S not shaped [..., 3, 3]


def arap_energy(X: Tensor, nbr: Tensor, mask: Tensor, sample: Tensor) -> Tensor:
    """METHOD §16: E = Σ_{t≥1} Σ_{i∈sample} Σ_{j∈𝒩(i)} ‖e_ij(t) − R_{i,t}·e_ij(0)‖² -> scalar.

    X: deformed surface voxels [T, V, 3], frame 0 the rest; e_ij(t) = X_t[j] − X_t[i].
    nbr, mask: [V, k] from :func:`arap_connectivity` (masked edges contribute nothing).
    sample: vertex list [S] from :func:`arap_sample` (a vertex drawn twice counts twice).
    R_{i,t} is the best rotation of e_ij(0) onto e_ij(t) (:func:`best_rotations`), detached;
    the energy is differentiable w.r.t. X.
    """
    if X.ndim != 3 or X.shape[-1] != 3:
        raise ValueError(f"X: expected positions over frames [T, V, 3], got {tuple(X.shape)}")
    V = X.shape[1]
    if nbr.ndim != 2 or nbr.shape[0] != V:
        raise ValueError(f"nbr: expected neighbour indices [{V}, k], got {tuple(nbr.shape)}")
    if mask.shape != nbr.shape or mask.dtype != torch.bool:
        raise ValueError(
            f"mask: expected a bool mask shaped like nbr {tuple(nbr.shape)}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    if sample.ndim != 1 or sample.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"sample: expected integer vertex indices [S], got {sample.dtype} {tuple(sample.shape)}"
        )
    if sample.numel() and (int(sample.min()) < 0 or int(sample.max()) >= V):
        raise ValueError(f"sample: expected indices in [0, {V}), got values outside")
    if X.shape[0] < 2 or sample.numel() == 0 or nbr.shape[1] == 0:
        return (X * 0).sum()
    sample = sample.to(X.device).long()
    nb = nbr.to(X.device)[sample]  # [S, k]
    m = mask.to(X.device)[sample].to(X.dtype)[..., None]  # [S, k, 1]
    e = (X[:, nb] - X[:, sample, None]) * m  # [T, S, k, 3]
    e0, et = e[0], e[1:]
    cov = torch.einsum("ska,tskb->tsab", e0.detach(), et.detach())  # Σ_j e(0)·e(t)ᵀ
    R = best_rotations(cov)  # [T-1, S, 3, 3]
    residual = et - torch.einsum("tsab,skb->tska", R, e0)
    return (residual**2).sum()


# --- temporal displacement --------------------------------------------------------------------


def temporal_loss(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    backend: str = "auto",
) -> Tensor:
    """METHOD §16: Σ over frames, cameras, pixels, channels of the splatted displacement² -> scalar.

    means: one dynamic object's Gaussian centres [T, N, 3] (computed with detached skinning
    weights); quats: their rotations [T, N, 4] (wxyz); scales [N, 3] and opacities [N],
    activated. d_t = x_{t+1} − x_t [T−1, N, 3] is rendered as colour over the detached
    geometry of frames 0..T−2 into the B cameras (viewmats [B, 4, 4], Ks [B, 3, 3] or
    [3, 3]) on black, in one rasterize call. Gradients reach ``means`` only through d.
    """
    if means.ndim != 3 or means.shape[-1] != 3:
        raise ValueError(f"means: expected centres over frames [T, N, 3], got {tuple(means.shape)}")
    T, N = means.shape[:2]
    if T < 2:
        raise ValueError(f"means: expected at least 2 frames to take displacements, got {T}")
    if quats.shape != (T, N, 4):
        raise ValueError(
            f"quats: expected [{T}, {N}, 4] (wxyz per frame), got {tuple(quats.shape)}"
        )
    if scales.shape != (N, 3):
        raise ValueError(f"scales: expected activated scales [{N}, 3], got {tuple(scales.shape)}")
    if opacities.shape != (N,):
        raise ValueError(f"opacities: expected [{N}], got {tuple(opacities.shape)}")
    if viewmats.ndim != 3 or viewmats.shape[-2:] != (4, 4):
        raise ValueError(f"viewmats: expected [B, 4, 4], got {tuple(viewmats.shape)}")
    B = viewmats.shape[0]
    if Ks.shape == (3, 3):
        Ks = Ks.expand(B, 3, 3)
    if Ks.shape != (B, 3, 3):
        raise ValueError(f"Ks: expected [{B}, 3, 3] or [3, 3], got {tuple(Ks.shape)}")
    _check_size(width, height)
    F = T - 1
    dtype, device = means.dtype, means.device
    d = means[1:] - means[:-1]  # [F, N, 3]
    vm = viewmats.to(dtype=dtype, device=device)[None].expand(F, B, 4, 4)
    K = Ks.to(dtype=dtype, device=device)[None].expand(F, B, 3, 3)
    disp, _, _ = rasterize(
        means[:-1].detach(),
        quats[:-1].detach().to(dtype),
        scales.detach().to(dtype)[None].expand(F, N, 3),
        opacities.detach().to(dtype)[None].expand(F, N),
        d,
        vm,
        K,
        width,
        height,
        sh_degree=None,
        backgrounds=None,
        backend=backend,
    )  # [F, B, H, W, 3]
    return (disp**2).sum()


# --- ground -----------------------------------------------------------------------------------


def ground_loss(Y: Tensor, ground: float) -> Tensor:
    """METHOD §16: mean((Y − g)²) over the entries of Y [T, V] below g, else 0 -> scalar.

    Y: the heights of an object's deformed surface voxels over all frames. Computed without
    a host sync: a zero result still belongs to the graph.
    """
    if Y.ndim != 2:
        raise ValueError(f"Y: expected voxel heights over frames [T, V], got {tuple(Y.shape)}")
    below = Y < ground
    sq = torch.where(below, (Y - ground) ** 2, torch.zeros_like(Y))
    return sq.sum() / below.sum().clamp(min=1).to(Y.dtype)
