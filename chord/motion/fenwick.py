"""The Fenwick-tree temporal table of a control-point layer (METHOD §6).

D ∈ R^{(P+1)×M×7}, P = 2^⌈log₂ T⌉, row 0 unused; per control point the 7 values are
[Δq_w, Δq_x, Δq_y, Δq_z, Δτ_x, Δτ_y, Δτ_z]. Frame t reads the rows of chain(t + 1), so entry
j enters exactly the frames j − 1 ≤ t < j − 1 + lowbit(j): a dyadic, block-constant,
coarse-to-fine parameterisation of a cumulative trajectory.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from chord.core.quaternion import normalize

IDENTITY = (1.0, 0.0, 0.0, 0.0)


def table_size(frame_num: int) -> int:
    """P = 2^⌈log₂ T⌉ (64 for T = 41); the table has P + 1 rows."""
    if frame_num < 1:
        raise ValueError(f"frame_num is {frame_num}; expected ≥ 1")
    return 1 << max(0, math.ceil(math.log2(frame_num)))


def lowbit(n: int) -> int:
    return n & -n


def chain(n: int) -> list[int]:
    """chain(n) = n, n − lowbit(n), … while > 0."""
    out = []
    while n > 0:
        out.append(n)
        n -= lowbit(n)
    return out


@functools.cache
def _chain_matrix(frame_num: int) -> Tensor:
    P = table_size(frame_num)
    A = torch.zeros(frame_num, P + 1, dtype=torch.float64)
    for t in range(frame_num):
        A[t, chain(t + 1)] = 1.0
    return A


def chain_matrix(frame_num: int, *, dtype=torch.float32, device="cpu") -> Tensor:
    """A [T, P+1] with A[t, i] = 1 iff i ∈ chain(t + 1), so raw sums are A @ D."""
    return _chain_matrix(frame_num).to(dtype=dtype, device=device)


def raw_sums(D: Tensor, frames: Tensor, frame_num: int) -> Tensor:
    """S [F, M, 7]: Σ_{i ∈ chain(t+1)} D[i] for each t in ``frames`` [F] (before the +1 on w)."""
    A = chain_matrix(frame_num, dtype=D.dtype, device=D.device)[frames]  # [F, P+1]
    return torch.einsum("fi,imc->fmc", A, D)


def transforms(D: Tensor, frames: Tensor, frame_num: int, *, per_frame: bool = False):
    """Per-frame control-point transforms: q [F, M, 4] = N(S_{0:4} + (1,0,0,0)), τ [F, M, 3].

    With ``per_frame`` (after the §6 conversion) row t+1 holds frame t directly, +1 included.
    """
    if per_frame:
        S = D[frames + 1]  # [F, M, 7]
        return normalize(S[..., :4]), S[..., 4:]
    S = raw_sums(D, frames, frame_num)
    one = torch.tensor(IDENTITY, dtype=D.dtype, device=D.device)
    return normalize(S[..., :4] + one), S[..., 4:]


def reset_enabled(back_iter: int, n_iters: int, prev_frame_number: int, frame_num: int) -> bool:
    """METHOD §6: the progressive reset is off if back_iter < 1 or > N, or p ≥ T − 1."""
    return 1 <= back_iter <= n_iters and prev_frame_number < frame_num - 1


@torch.no_grad()
def progressive_reset(D: Tensor, prev_frame_number: int) -> list[int]:
    """METHOD §6 (in place): frames p+1.. take frame p's deformation; frames ≤ p unchanged.

    For f = p+1, …, P−1 in increasing order, D[f+1] ← S* − Σ_{i ∈ chain(f+1), i ≠ f+1} D[i],
    using rows already updated, with S* the raw chain sum of frame p. Returns the rows it
    replaced (the optimiser's moments of this table must then be zeroed).
    """
    p = prev_frame_number
    target = D[chain(p + 1)].sum(0)  # S*: [M, 7]
    P = D.shape[0] - 1
    rows = []
    for f in range(p + 1, P):
        others = [i for i in chain(f + 1) if i != f + 1]
        D[f + 1] = target - (D[others].sum(0) if others else 0.0)
        rows.append(f + 1)
    return rows


@torch.no_grad()
def to_per_frame(D: Tensor, frame_num: int) -> Tensor:
    """METHOD §6 (optional conversion): D'[t+1] = raw chain sum of frame t with the +1 on w;
    other rows zero. Use with ``transforms(..., per_frame=True)``."""
    out = torch.zeros_like(D)
    frames = torch.arange(frame_num, device=D.device)
    S = raw_sums(D, frames, frame_num)
    S[..., 0] += 1.0
    out[1 : frame_num + 1] = S
    return out
