"""Quaternion helpers, (w, x, y, z) order (METHOD §0): N(q), the Hamilton product, R(q)."""

from __future__ import annotations

import torch
from torch import Tensor


def normalize(q: Tensor) -> Tensor:
    """N(q) = q/‖q‖ over the last dim [..., 4]."""
    return q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a ⊗ b of [..., 4] quaternions (broadcasting)."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def to_rotmat(q: Tensor) -> Tensor:
    """R(q) [..., 3, 3] of quaternions [..., 4] (normalised here)."""
    w, x, y, z = normalize(q).unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*q.shape[:-1], 3, 3)


def rotate(q: Tensor, v: Tensor) -> Tensor:
    """R(q)·v for unit quaternions q [..., 4] and vectors v [..., 3] (broadcasting), without
    building matrices: v + 2w(u × v) + 2u × (u × v) with u = (x, y, z)."""
    shape = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    w, u = q[..., :1], q[..., 1:].expand(*shape, 3)
    uv = torch.linalg.cross(u, v.expand(*shape, 3), dim=-1)
    return v + 2.0 * (w * uv + torch.linalg.cross(u, uv, dim=-1))
