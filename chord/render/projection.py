"""The torch backend's EWA projection of 3D Gaussians to screen-space ellipses, in gsplat's
conventions (METHOD §8): pixel centres at +0.5; camera space is OpenCV (x right, y down, z
forward); the 2D covariance gets the 0.3 low-pass and, in antialiased mode, opacities are
multiplied by sqrt(det(Σ)/det(Σ + 0.3·I)); the screen footprint is the opacity-aware box
ceil(min(3.33, sqrt(2 ln(o/(1/255))))·σ) per axis.
"""

from __future__ import annotations

import torch

from chord.core.quaternion import to_rotmat

ALPHA_THRESHOLD = 1.0 / 255.0  # the least alpha a pixel composites: bounds the footprint too
EXTEND = 3.33  # the footprint's half-width cap, in standard deviations


def project(
    means,
    quats,
    scales,
    opacities,
    viewmats,
    Ks,
    width,
    height,
    *,
    near_plane=0.01,
    far_plane=1e10,
    eps2d=0.3,
    antialiased=True,
):
    """EWA projection of B×N Gaussians into B×C cameras.

    Args:
        means [B, N, 3], quats [B, N, 4] (wxyz), scales [B, N, 3] (activated),
        opacities [B, N] (activated), viewmats [B, C, 4, 4] (world-to-camera, OpenCV),
        Ks [B, C, 3, 3].

    Returns:
        dict with means2d [B, C, N, 2], conics [B, C, N, 3] (a, b, c of Σ⁻¹), depths
        [B, C, N], opacities [B, C, N] (compensated in antialiased mode), radii
        [B, C, N, 2] int (0 = culled, no gradient).
    """
    # Per-Gaussian 3×3 algebra is written per component on [B, C, N] tensors: batched tiny
    # matmuls, einsums and broadcast reductions cost several times more on a CPU.
    Rv = viewmats[..., :3, :3].unsqueeze(2)  # [B, C, 1, 3, 3]
    R = [[Rv[..., i, j] for j in range(3)] for i in range(3)]  # R[i][j]: [B, C, 1]
    t = viewmats[..., :3, 3].unsqueeze(2)  # [B, C, 1, 3]
    m = [means[:, None, :, j] for j in range(3)]  # [B, 1, N]
    x, y, z = (  # camera space [B, C, N]
        R[i][0] * m[0] + R[i][1] * m[1] + R[i][2] * m[2] + t[..., i] for i in range(3)
    )
    Mq = to_rotmat(quats) * scales[..., None, :]  # [B, N, 3, 3] = R_q·S, Σ = M·Mᵀ
    M = [[Mq[:, None, :, j, k] for k in range(3)] for j in range(3)]  # [B, 1, N]

    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]  # [B, C, 1]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    # Clamp the Jacobian's x/z, y/z to 1.3× the frustum, as gsplat does.
    tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
    lim_xp, lim_xn = (width - cx) / fx + 0.3 * tan_x, cx / fx + 0.3 * tan_x
    lim_yp, lim_yn = (height - cy) / fy + 0.3 * tan_y, cy / fy + 0.3 * tan_y
    tx = z * torch.minimum(torch.maximum(x / z, -lim_xn), lim_xp)
    ty = z * torch.minimum(torch.maximum(y / z, -lim_yn), lim_yp)
    # Σ2D = J·R·Σ·Rᵀ·Jᵀ = P·Pᵀ with P = J·R·M [2, 3]; J's rows are
    # (fx/z, 0, −fx·tx/z²) and (0, fy/z, −fy·ty/z²), so the rows of J·R mix R's rows.
    u0, w0, u1, w1 = fx / z, fx * tx / (z * z), fy / z, fy * ty / (z * z)
    JR0 = [u0 * R[0][j] - w0 * R[2][j] for j in range(3)]  # [B, C, N] each
    JR1 = [u1 * R[1][j] - w1 * R[2][j] for j in range(3)]
    P0 = [JR0[0] * M[0][k] + JR0[1] * M[1][k] + JR0[2] * M[2][k] for k in range(3)]
    P1 = [JR1[0] * M[0][k] + JR1[1] * M[1][k] + JR1[2] * M[2][k] for k in range(3)]
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)  # [B, C, N, 2]

    a = P0[0] * P0[0] + P0[1] * P0[1] + P0[2] * P0[2]  # Σ2D entries
    b = P0[0] * P1[0] + P0[1] * P1[1] + P0[2] * P1[2]
    c = P1[0] * P1[0] + P1[1] * P1[1] + P1[2] * P1[2]
    det_orig = a * c - b * b
    a, c = a + eps2d, c + eps2d
    det = a * c - b * b
    opac = opacities[:, None, :].expand_as(det)
    if antialiased:
        opac = opac * torch.sqrt(torch.clamp(det_orig / det.clamp_min(1e-30), min=0.0))
    conics = torch.stack([c, -b, a], dim=-1) / det.clamp_min(1e-30)[..., None]

    with torch.no_grad():  # the footprint is not differentiable (as in gsplat)
        valid = (det > 0) & (z > near_plane) & (z < far_plane) & (opac >= ALPHA_THRESHOLD)
        ratio = (opac / ALPHA_THRESHOLD).clamp_min(1.0)
        extend = torch.clamp(torch.sqrt(2.0 * torch.log(ratio)), max=EXTEND)
        radii = torch.stack(
            [
                torch.ceil(extend * a.clamp_min(0).sqrt()),
                torch.ceil(extend * c.clamp_min(0).sqrt()),
            ],
            dim=-1,
        )
        valid &= (radii > 0).any(-1)
        mx, my = means2d[..., 0], means2d[..., 1]
        rx, ry = radii[..., 0], radii[..., 1]
        valid &= (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)
        radii = torch.where(valid[..., None], radii, 0).to(torch.int32)
    return {"means2d": means2d, "conics": conics, "depths": z, "opacities": opac, "radii": radii}
