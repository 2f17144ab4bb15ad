"""The proper rotation that best maps one edge set onto another, for many small problems at once:
METHOD §16's ARAP rotations, R = argmax over rotations of tr(R·S) for S = Σ_j e_j(0)·e_j(t)ᵀ.

METHOD §16 states R through the SVD S = UΣWᵀ: R = W·Uᵀ, with U's column of the smallest
singular value negated where that is a mirror (Kabsch). The same rotation is the unit
quaternion q of the largest eigenvalue λ of Horn's symmetric, traceless 4×4 matrix N(S), for
which tr(R(q)·S) = qᵀ·N·q. Here λ is the largest root of N's characteristic polynomial, found by
Newton's method from above (it converges monotonically there, as in Theobald's QCP), and q is
the largest column of adj(N − λI): elementwise arithmetic over the batch, where a batched
3×3 SVD is one LAPACK call per matrix on a CPU (several times slower: ``python
bench/rotations.py``). Where the best rotation is not unique or nearly so (the two largest
eigenvalues of N meet: collinear edges, no edges), the SVD decides, as the method states it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from chord.core.quaternion import to_rotmat

#: problems per block on a CPU: a block's float64 temporaries stay in cache
CPU_BLOCK = 32768
#: Newton steps at most: from the bound sqrt(3)·‖S‖_F, a simple root takes about a dozen, a
#: double one (handed to the SVD) halves its distance each step
NEWTON_STEPS = 80
#: the largest diagonal entry of adj(N − λI), relative to the bound cubed, under which the top
#: eigenvalue counts as (nearly) double: the SVD decides there
DEGENERATE = 1e-6


def best_rotations(S: Tensor) -> Tensor:
    """R maximising tr(R·S) over proper rotations, for S [..., 3, 3] -> R [..., 3, 3] (S's
    dtype; computed in float64, without gradient)."""
    if S.ndim < 2 or S.shape[-2:] != (3, 3):
        raise ValueError(f"S: expected matrices [..., 3, 3], got {tuple(S.shape)}")
    with torch.no_grad():
        flat = S.detach().reshape(-1, 3, 3).double()
        block = len(flat) if S.is_cuda else CPU_BLOCK
        parts = [_horn(flat[i : i + block]) for i in range(0, len(flat), block)]
        R = torch.cat(parts) if parts else flat.new_zeros(0, 3, 3)
    return R.to(S.dtype).reshape(S.shape)


def kabsch(S: Tensor) -> Tensor:
    """METHOD §16's statement of the same R through the SVD (float64 in, as given)."""
    U, _, Wh = torch.linalg.svd(S)
    W = Wh.transpose(-1, -2)
    mirror = torch.linalg.det(W @ U.transpose(-1, -2)) <= 0
    U = torch.cat([U[..., :2], torch.where(mirror[..., None, None], -U[..., 2:], U[..., 2:])], -1)
    return W @ U.transpose(-1, -2)


def _horn(S: Tensor) -> Tensor:
    """best_rotations of S [n, 3, 3] float64."""
    (xx, xy, xz), (yx, yy, yz), (zx, zy, zz) = ([S[:, i, j] for j in range(3)] for i in range(3))
    N = [
        [xx + yy + zz, yz - zy, zx - xz, xy - yx],
        [yz - zy, xx - yy - zz, xy + yx, zx + xz],
        [zx - xz, xy + yx, yy - xx - zz, yz + zy],
        [xy - yx, zx + xz, yz + zy, zz - xx - yy],
    ]
    # det(N − λI) = λ⁴ + c2·λ² + c1·λ + c0 (N is traceless)
    fro2 = (S * S).sum((1, 2))
    c2, c1, c0 = -2 * fro2, -8 * _det3(*(S[:, i, j] for i in range(3) for j in range(3))), _det4(N)
    bound = torch.sqrt(3 * fro2)  # ≥ σ1 + σ2 + σ3 ≥ λ
    lam = bound
    for _ in range(NEWTON_STEPS):
        l2 = lam * lam
        p = (l2 + c2) * l2 + c1 * lam + c0
        dp = (4 * l2 + 2 * c2) * lam + c1
        step = torch.where((p > 0) & (dp > 0), p / dp, 0.0)
        lam = lam - step
        if not bool((step > 1e-15 * bound).any()):
            break
    A = [[N[i][j] - lam if i == j else N[i][j] for j in range(4)] for i in range(4)]
    adj = _adjugate4(A)  # rank one, q·qᵀ scaled, where λ is a simple root
    diag = torch.stack([adj[i][i].abs() for i in range(4)], -1)
    peak, col = diag.max(-1)
    columns = torch.stack([torch.stack(adj[j], -1) for j in range(4)], 1)  # [n, column, 4]
    q = columns.gather(1, col[:, None, None].expand(-1, 1, 4))[:, 0]
    R = to_rotmat(q)
    odd = (peak <= DEGENERATE * bound**3).nonzero().squeeze(1)
    if len(odd):
        R[odd] = kabsch(S[odd])
    return R


def _det3(a, b, c, d, e, f, g, h, i):
    return a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)


def _minor(A, r: int, c: int):
    return _det3(*(A[i][j] for i in range(4) if i != r for j in range(4) if j != c))


def _det4(A):
    return sum((-1) ** j * A[0][j] * _minor(A, 0, j) for j in range(4))


def _adjugate4(A):
    """adj(A) of a symmetric 4×4 A (nested lists of [n] tensors): symmetric too."""
    adj = [[None] * 4 for _ in range(4)]
    for i in range(4):
        for j in range(i, 4):
            adj[i][j] = adj[j][i] = (-1) ** (i + j) * _minor(A, j, i)
    return adj
