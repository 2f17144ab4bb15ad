"""The CPU rasterizer: gsplat's conventions (EWA splatting, antialiased mode, packed=False)
in plain differentiable torch, with a sparse pair-list compositor.

Conventions mirrored from gsplat's CUDA path (METHOD §8): pixel centres at +0.5; camera
space is OpenCV (x right, y down, z forward); the 2D covariance gets the 0.3 low-pass and,
in antialiased mode, opacities are multiplied by sqrt(det(Σ)/det(Σ + 0.3·I)); the screen
footprint is the opacity-aware box ceil(min(3.33, sqrt(2 ln(o/(1/255))))·σ) per axis;
alpha = min(0.999, o·exp(−σ)) and pairs with alpha < 1/255 or σ < 0 are skipped; a pixel
stops before the Gaussian that would take its transmittance to ≤ 1e-4; the background is
added as bg·T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from chord.quaternion import to_rotmat
from chord.render.sh import spherical_harmonics

ALPHA_THRESHOLD = 1.0 / 255.0
MAX_ALPHA = 0.999
T_THRESHOLD = 1e-4
EXTEND = 3.33
PAIR_BUDGET = 1_000_000  # (Gaussian, pixel) pairs per checkpointed chunk: ~0.3 GB peak


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
    R = viewmats[..., :3, :3]  # [B, C, 3, 3]
    t = viewmats[..., :3, 3]  # [B, C, 3]
    mc = torch.einsum("bcij,bnj->bcni", R, means) + t[:, :, None, :]  # [B, C, N, 3]
    M = to_rotmat(quats) * scales[..., None, :]  # [B, N, 3, 3] = R_q·S
    covar = M @ M.transpose(-1, -2)  # [B, N, 3, 3]
    covar_c = torch.einsum("bcij,bnjk,bclk->bcnil", R, covar, R)  # [B, C, N, 3, 3]

    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]  # [B, C, 1]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    x, y, z = mc.unbind(-1)  # [B, C, N]
    # Clamp the Jacobian's x/z, y/z to 1.3× the frustum, as gsplat does.
    tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
    lim_xp, lim_xn = (width - cx) / fx + 0.3 * tan_x, cx / fx + 0.3 * tan_x
    lim_yp, lim_yn = (height - cy) / fy + 0.3 * tan_y, cy / fy + 0.3 * tan_y
    tx = z * torch.minimum(torch.maximum(x / z, -lim_xn), lim_xp)
    ty = z * torch.minimum(torch.maximum(y / z, -lim_yn), lim_yp)
    zero = torch.zeros_like(z)
    J = torch.stack([fx / z, zero, -fx * tx / (z * z), zero, fy / z, -fy * ty / (z * z)], -1)
    J = J.reshape(*z.shape, 2, 3)  # [B, C, N, 2, 3]
    cov2d = J @ covar_c @ J.transpose(-1, -2)  # [B, C, N, 2, 2]
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)  # [B, C, N, 2]

    a, b, c = cov2d[..., 0, 0], 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0]), cov2d[..., 1, 1]
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


def _pairs(means2d, radii, depths, width, height):
    """(Gaussian, pixel) pairs of one image in compositing order (pixel, then depth).

    All [N]-indexed inputs are detached; returns (gid [P], pix [P]) int64.
    """
    vis = torch.nonzero(radii.any(-1)).squeeze(1)
    vis = vis[torch.argsort(depths[vis], stable=True)]  # front to back
    m, r = means2d[vis], radii[vis].to(means2d.dtype)
    x0 = torch.floor(m[:, 0] - r[:, 0]).clamp(0, width).long()
    x1 = torch.ceil(m[:, 0] + r[:, 0]).clamp(0, width).long()
    y0 = torch.floor(m[:, 1] - r[:, 1]).clamp(0, height).long()
    y1 = torch.ceil(m[:, 1] + r[:, 1]).clamp(0, height).long()
    w, h = x1 - x0, y1 - y0
    counts = w * h
    gid = torch.repeat_interleave(vis, counts)
    first = torch.cumsum(counts, 0) - counts
    local = torch.arange(int(counts.sum()), device=means2d.device)
    local = local - torch.repeat_interleave(first, counts)
    wg = torch.repeat_interleave(w, counts)
    px = torch.repeat_interleave(x0, counts) + local % wg
    py = torch.repeat_interleave(y0, counts) + local // wg
    return gid, py * width + px


def _composite_chunk(
    means2d, conics, opac, colors, backgrounds, gids, pixs, offsets, width, height
):
    """Sparse front-to-back compositing of a chunk of I images (autograd-friendly).

    means2d [I, N, 2], conics [I, N, 3], opac [I, N], colors [I, N, D], backgrounds [I, D];
    gids/pixs: per-image pair lists concatenated with an image offset folded into pixs.
    Returns colours [I, H, W, D] and alphas [I, H, W, 1].
    """
    I, N, D = colors.shape
    HW = width * height
    img = pixs // HW
    flat_g = img * N + gids  # index into [I·N]
    pix_local = pixs % HW
    px = (pix_local % width).to(means2d.dtype) + 0.5
    py = (pix_local // width).to(means2d.dtype) + 0.5
    m = means2d.reshape(I * N, 2)[flat_g]
    con = conics.reshape(I * N, 3)[flat_g]
    dx, dy = m[:, 0] - px, m[:, 1] - py
    sigma = 0.5 * (con[:, 0] * dx * dx + con[:, 2] * dy * dy) + con[:, 1] * dx * dy
    alpha = torch.clamp(opac.reshape(-1)[flat_g] * torch.exp(-sigma), max=MAX_ALPHA)
    keep = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)
    alpha, pixs, flat_g = alpha[keep], pixs[keep], flat_g[keep]
    # Stable sort by pixel keeps each pixel's pairs front to back.
    pixs, order = torch.sort(pixs, stable=True)
    alpha, flat_g = alpha[order], flat_g[order]
    # Segmented exclusive cumulative sum of log(1 − α): transmittance before each pair.
    # float64 keeps the global running sum exact enough across millions of pairs.
    log1m = torch.log1p(-alpha.double())
    incl = torch.cumsum(log1m, 0)
    new_seg = torch.ones_like(pixs, dtype=torch.bool)
    new_seg[1:] = pixs[1:] != pixs[:-1]
    seg_id = torch.cumsum(new_seg, 0) - 1
    base = (incl - log1m)[new_seg][seg_id]
    log_t = incl - log1m - base  # log T before this pair
    live = (log_t + log1m).detach() > math.log(T_THRESHOLD)  # pixel not yet done
    weight = (alpha * torch.exp(log_t).to(alpha.dtype))[live]
    out = torch.zeros(I * HW, D, dtype=colors.dtype, device=colors.device)
    out = out.index_add(0, pixs[live], weight[:, None] * colors.reshape(I * N, D)[flat_g[live]])
    log_tf = torch.zeros(I * HW, dtype=torch.float64, device=colors.device)
    log_tf = log_tf.index_add(0, pixs[live], log1m[live])
    t_final = torch.exp(log_tf).to(colors.dtype).reshape(I, HW, 1)
    out = out.reshape(I, HW, D) + t_final * backgrounds[:, None, :]
    return out.reshape(I, height, width, D), (1 - t_final).reshape(I, height, width, 1)


def composite(
    means2d,
    conics,
    opacities,
    colors,
    depths,
    radii,
    backgrounds,
    width,
    height,
    *,
    pair_budget=PAIR_BUDGET,
):
    """Composite I images: inputs [I, N, ...] -> (colours [I, H, W, D], alphas [I, H, W, 1]).

    Pairs are enumerated without gradient; images are composited in chunks of at most
    ``pair_budget`` candidate pairs, each under activation checkpointing so that memory stays
    bounded by one chunk when gradients are needed.
    """
    I = means2d.shape[0]
    HW = width * height
    with torch.no_grad():
        lists = [
            _pairs(means2d[i].detach(), radii[i], depths[i].detach(), width, height)
            for i in range(I)
        ]
    chunks, start, total = [], 0, 0
    for i, (g, _) in enumerate(lists):
        if i > start and total + len(g) > pair_budget:
            chunks.append((start, i))
            start, total = i, 0
        total += len(g)
    chunks.append((start, I))
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (means2d, conics, opacities, colors, backgrounds)
    )
    rgb, alpha = [], []
    for s, e in chunks:
        gids = torch.cat([lists[i][0] for i in range(s, e)])
        pixs = torch.cat([lists[i][1] + (i - s) * HW for i in range(s, e)])
        args = (
            means2d[s:e],
            conics[s:e],
            opacities[s:e],
            colors[s:e],
            backgrounds[s:e],
            gids,
            pixs,
            None,
            width,
            height,
        )
        if needs_grad:
            c, a = checkpoint(_composite_chunk, *args, use_reentrant=False)
        else:
            c, a = _composite_chunk(*args)
        rgb.append(c)
        alpha.append(a)
    return torch.cat(rgb), torch.cat(alpha)


def composite_dense(means2d, conics, opacities, colors, depths, radii, backgrounds, width, height):
    """Test oracle: every pixel against every Gaussian, front to back, exactly as gsplat's
    per-pixel loop (including early termination). Small inputs only."""
    I, N, D = colors.shape
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    px = xs.reshape(-1).to(means2d.dtype) + 0.5
    py = ys.reshape(-1).to(means2d.dtype) + 0.5
    rgb, alphas = [], []
    for i in range(I):
        T = torch.ones_like(px)
        done = torch.zeros_like(px, dtype=torch.bool)
        out = torch.zeros(px.shape[0], D, dtype=colors.dtype)
        for g in torch.argsort(depths[i].detach(), stable=True).tolist():
            if not bool(radii[i, g].any()):
                continue
            dx, dy = means2d[i, g, 0] - px, means2d[i, g, 1] - py
            a, b, c = conics[i, g]
            sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
            alpha = torch.clamp(opacities[i, g] * torch.exp(-sigma), max=MAX_ALPHA)
            use = ~done & (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)
            next_t = T * (1 - alpha)
            done = done | (use & (next_t <= T_THRESHOLD))
            use = use & (next_t > T_THRESHOLD)
            out = out + torch.where(use[:, None], (alpha * T)[:, None] * colors[i, g], 0.0)
            T = torch.where(use, next_t, T)
        rgb.append((out + T[:, None] * backgrounds[i]).reshape(height, width, D))
        alphas.append((1 - T).reshape(height, width, 1))
    return torch.stack(rgb), torch.stack(alphas)


def rasterize(
    means,
    quats,
    scales,
    opacities,
    colors,
    viewmats,
    Ks,
    width,
    height,
    *,
    near_plane=0.01,
    far_plane=1e10,
    sh_degree=None,
    backgrounds=None,
    eps2d=0.3,
    antialiased=True,
    dense=False,
    pair_budget=PAIR_BUDGET,
):
    """The torch backend of :func:`chord.render.rasterize` (flattened batch: B leading)."""
    B, N = means.shape[:2]
    C = viewmats.shape[1]
    proj = project(
        means,
        quats,
        scales,
        opacities,
        viewmats,
        Ks,
        width,
        height,
        near_plane=near_plane,
        far_plane=far_plane,
        eps2d=eps2d,
        antialiased=antialiased,
    )
    if colors.dim() == means.dim() + (0 if sh_degree is None else 1):
        colors = colors[:, None].expand(B, C, *colors.shape[1:])  # shared by every camera
    if sh_degree is not None:
        campos = -torch.einsum("bcji,bcj->bci", viewmats[..., :3, :3], viewmats[..., :3, 3])
        dirs = means[:, None] - campos[:, :, None]  # [B, C, N, 3]
        colors = torch.clamp_min(spherical_harmonics(sh_degree, dirs, colors) + 0.5, 0.0)
    D = colors.shape[-1]
    if backgrounds is None:
        backgrounds = torch.zeros(B, C, D, dtype=colors.dtype, device=colors.device)

    def flat(t: Tensor) -> Tensor:  # [B, C, ...] -> [B·C, ...]
        return t.reshape(B * C, *t.shape[2:])

    fn = composite_dense if dense else composite
    kw = {} if dense else {"pair_budget": pair_budget}
    rgb, alpha = fn(
        flat(proj["means2d"]),
        flat(proj["conics"]),
        flat(proj["opacities"]),
        flat(colors),
        flat(proj["depths"]),
        flat(proj["radii"]),
        flat(backgrounds),
        width,
        height,
        **kw,
    )
    rgb = rgb.reshape(B, C, height, width, D)
    alpha = alpha.reshape(B, C, height, width, 1)
    return rgb, alpha, proj
