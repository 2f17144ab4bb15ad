"""A control-point layer: centres, radii, rotations, the temporal table, and skinning
(METHOD §4–§6)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree
from torch import Tensor, nn

from chord.core import quaternion as quat
from chord.motion import fenwick

WEIGHT_FLOOR = 1e-7


def init_log_radius(centres: Tensor) -> Tensor:
    """METHOD §4: ρ_k = ln sqrt(mean squared distance to its 2 nearest other centres) [M]."""
    pts = centres.detach().cpu().double().numpy()
    M = len(pts)
    if M < 2:
        raise ValueError(f"a control-point layer needs at least 2 centres, got {M}")
    k = min(2, M - 1)
    dist, _ = cKDTree(pts).query(pts, k=k + 1)  # first column is the point itself
    msq = (np.asarray(dist).reshape(M, k + 1)[:, 1:] ** 2).mean(1)
    return torch.as_tensor(
        0.5 * np.log(np.maximum(msq, 1e-30)), dtype=centres.dtype, device=centres.device
    )


def rotate(q: Tensor, v: Tensor) -> Tensor:
    """:func:`chord.core.quaternion.rotate` written per component: the same formula,
    v + 2w(u × v) + 2u × (u × v), without ``linalg.cross`` on broadcast operands, which is
    3-4x slower on a CPU for the [F, N, K] blends of every frame (forward and backward)."""
    w, x, y, z = q.unbind(-1)
    vx, vy, vz = v.unbind(-1)
    cx, cy, cz = y * vz - z * vy, z * vx - x * vz, x * vy - y * vx  # u × v
    dx, dy, dz = y * cz - z * cy, z * cx - x * cz, x * cy - y * cx  # u × (u × v)
    return torch.stack(
        [vx + 2.0 * (w * cx + dx), vy + 2.0 * (w * cy + dy), vz + 2.0 * (w * cz + dz)], -1
    )


class ControlPointLayer(nn.Module):
    """M control points with fixed centres c, log-radii ρ [M, 3], rotations r [M, 4] and a
    Fenwick table D [P+1, M, 7]; all parameters start at the identity motion."""

    def __init__(self, centres: Tensor, frame_num: int, n_cp_num: int = 3):
        super().__init__()
        M = centres.shape[0]
        self.register_buffer("centres", centres.clone())
        rho = init_log_radius(centres)[:, None].repeat(1, 3)
        self.cp_radius = nn.Parameter(rho)
        rot = torch.zeros(M, 4, dtype=centres.dtype, device=centres.device)
        rot[:, 0] = 1.0
        self.cp_rotation = nn.Parameter(rot)
        P = fenwick.table_size(frame_num)
        self.cp_deform = nn.Parameter(
            torch.zeros(P + 1, M, 7, dtype=centres.dtype, device=centres.device)
        )
        self.frame_num = frame_num
        self.n_cp_num = n_cp_num
        self.per_frame = False

    @property
    def k(self) -> int:
        """K = min(n_cp_num, M) neighbours per point."""
        return min(self.n_cp_num, self.centres.shape[0])

    def neighbours(self, points: Tensor) -> Tensor:
        """Indices [N, K] of each rest point's K nearest centres (Euclidean; fixed)."""
        tree = cKDTree(self.centres.detach().cpu().double().numpy())
        _, idx = tree.query(points.detach().cpu().double().numpy(), k=self.k)
        idx = np.asarray(idx).reshape(len(points), self.k)
        return torch.as_tensor(idx, dtype=torch.long, device=points.device)

    def weights(self, points: Tensor, idx: Tensor, *, detach: bool = False) -> Tensor:
        """METHOD §5: normalised anisotropic Gaussian weights [N, K] of points [N, 3].

        m_k = ‖diag(1/s_k)·R(r_k)ᵀ·(x − c_k)‖² (the exact Mahalanobis distance under the full
        rotation), w̃_k = exp(−½·m_k) + 1e-7, w = w̃/Σw̃. ``detach`` gives sg(w).
        """
        rho, rot = self.cp_radius, self.cp_rotation
        if detach:
            rho, rot = rho.detach(), rot.detach()
        v = points[:, None, :] - self.centres[idx]  # [N, K, 3]
        r = quat.normalize(rot[idx])  # [N, K, 4]
        r_conj = r * torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=r.dtype, device=r.device)
        local = quat.rotate(r_conj, v) * torch.exp(-rho[idx])  # R(r)ᵀ·v / s: [N, K, 3]
        w = torch.exp(-0.5 * local.square().sum(-1)) + WEIGHT_FLOOR
        return w / w.sum(-1, keepdim=True)

    def transforms(self, frames: Tensor) -> tuple[Tensor, Tensor]:
        """Control-point rotations q [F, M, 4] (unit) and translations τ [F, M, 3]."""
        return fenwick.transforms(self.cp_deform, frames, self.frame_num, per_frame=self.per_frame)

    def blend(self, points: Tensor, idx: Tensor, w: Tensor, frames: Tensor):
        """Residual LBS and blended rotations of points [N, 3] for ``frames`` [F].

        Returns dx [F, N, 3] = Σ_k w_k·[R(q_k)(x − c_k) − (x − c_k) + τ_k] and
        b [F, N, 4] = Σ_k w_k·q_k (unnormalised). With Σw = 1, x + dx is METHOD §5's
        Σ_k w_k·[R(q_k)(x − c_k) + c_k + τ_k]; the residual form is exactly x at the identity.
        """
        q, tau = self.transforms(frames)  # [F, M, 4], [F, M, 3]
        v = points[:, None, :] - self.centres[idx]  # [N, K, 3]
        F, (N, K) = q.shape[0], idx.shape
        flat = idx.reshape(-1)  # index_select: a cheaper gather and backward than q[:, idx]
        qk = q.index_select(1, flat).reshape(F, N, K, 4)
        tk = tau.index_select(1, flat).reshape(F, N, K, 3)
        moved = rotate(qk, v) - v + tk  # [F, N, K, 3]
        dx = (w[None, :, :, None] * moved).sum(2)  # [F, N, 3]
        b = (w[None, :, :, None] * qk).sum(2)  # [F, N, 4]
        return dx, b

    @torch.no_grad()
    def convert_to_per_frame(self) -> None:
        """METHOD §6: switch to an independent per-frame table (moments must be zeroed)."""
        if not self.per_frame:
            self.cp_deform.copy_(fenwick.to_per_frame(self.cp_deform, self.frame_num))
            self.per_frame = True
