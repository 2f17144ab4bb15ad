"""ARAP's best rotations (METHOD §16) by Horn's quaternion, against the SVD that states them."""

from __future__ import annotations

import torch

from chord.core import procrustes

D64 = torch.float64
EPS = torch.finfo(D64).eps


def edge_sets(n: int, seed: int, axes=(1.0, 1.0, 1.0), mirror: bool = False) -> torch.Tensor:
    """S = Σ_j e_j(0)·e_j(t)ᵀ for 8 random edges moved by a random rotation (and a mirror)."""
    gen = torch.Generator().manual_seed(seed)
    e0 = torch.randn(n, 8, 3, generator=gen, dtype=D64) * torch.tensor(axes, dtype=D64)
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=gen, dtype=D64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]
    et = e0 @ q.transpose(-1, -2) + 0.3 * torch.randn(n, 8, 3, generator=gen, dtype=D64)
    if mirror:
        et = et * torch.tensor([1.0, 1.0, -1.0], dtype=D64)
    return torch.einsum("nka,nkb->nab", e0, et)


def top_gap(S: torch.Tensor) -> torch.Tensor:
    """The gap between the two largest eigenvalues of Horn's N(S), relative to ‖S‖_F:
    2(σ2 + sign(det S)·σ3). The quaternion's rounding error grows as ε over this gap."""
    sv = torch.linalg.svdvals(S)
    s = torch.where(torch.linalg.det(S) < 0, -1.0, 1.0).to(D64)
    return 2 * (sv[:, 1] + s * sv[:, 2]) / torch.linalg.matrix_norm(S)


def test_the_rotations_are_the_svds_where_they_are_unique():
    S = torch.cat(
        [
            torch.randn(4000, 3, 3, generator=torch.Generator().manual_seed(0), dtype=D64),
            edge_sets(4000, 1),
            edge_sets(4000, 2, mirror=True),  # mirrored edges: the SVD's answer is a reflection
            edge_sets(4000, 3, axes=(1.0, 1.0, 0.0)),  # coplanar edges: S of rank 2
        ]
    )
    R, K = procrustes.best_rotations(S), procrustes.kabsch(S)
    # the eigenvector's error is about ε/gap; 1e4 covers the cancellations of the 3×3 minors
    error = (R - K).abs().amax((1, 2))
    assert (error <= 1e4 * EPS / top_gap(S)).all(), float((error * top_gap(S) / EPS).max())
    # R(q) of a normalised q: each entry a few roundings (≤ 4ε), so R·Rᵀ − I and det R − 1,
    # sums of three and six products of entries, within 32ε
    eye = torch.eye(3, dtype=D64)
    assert ((R @ R.transpose(-1, -2) - eye).abs() <= 32 * EPS).all()
    assert ((torch.linalg.det(R) - 1).abs() <= 32 * EPS).all()


def test_where_the_best_rotation_is_not_unique_the_svd_decides():
    collinear = edge_sets(50, 4, axes=(1.0, 0.0, 0.0)) * torch.tensor([1.0, 0.0, 0.0], dtype=D64)
    S = torch.cat([collinear, torch.zeros(3, 3, 3, dtype=D64)])
    assert (top_gap(S[:50]) < 1e-12).all() and (torch.linalg.matrix_norm(S[50:]) == 0).all()
    torch.testing.assert_close(procrustes.best_rotations(S), procrustes.kabsch(S), atol=0, rtol=0)


def test_float32_batches_over_several_blocks_keep_shape_and_dtype(monkeypatch):
    monkeypatch.setattr(procrustes, "CPU_BLOCK", 700)  # 4·3·250 problems: 5 blocks
    S = edge_sets(3000, 5).reshape(4, 3, 250, 3, 3)
    R = procrustes.best_rotations(S.float().requires_grad_())
    assert R.shape == S.shape and R.dtype == torch.float32 and not R.requires_grad
    # computed in float64 from S rounded to float32, then rounded: the entries (≤ 1) are within
    # a unit of float32's last place of the SVD's answer for that rounded S
    K = procrustes.kabsch(S.float().double()).float()
    assert (R - K).abs().max() <= torch.finfo(torch.float32).eps


def test_an_empty_batch():
    assert procrustes.best_rotations(torch.zeros(0, 3, 3)).shape == (0, 3, 3)
