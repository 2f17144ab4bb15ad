"""The torch backend's sparse pair-list compositor, in gsplat's conventions (METHOD §8).

It enumerates, per image, the (Gaussian, pixel) pairs whose alpha can reach 1/255 (row by
row from the conic, inside the footprint box), composites them front to back per pixel and,
with gradients, keeps only each composited pair's indices, alpha and transmittance for an
analytic backward pass (as gsplat's kernels do): no autograd graph and no recomputation over
millions of pairs.

As gsplat's CUDA path: alpha = min(0.999, o·exp(−σ)) and pairs with alpha < 1/255 or σ < 0
are skipped; a pixel stops before the Gaussian that would take its transmittance to ≤ 1e-4;
the background is added as bg·T.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from chord.render.projection import ALPHA_THRESHOLD

MAX_ALPHA = 0.999
T_THRESHOLD = 1e-4
PAIR_BUDGET = 1_000_000  # footprint-box pairs per chunk of images: bounds the transient memory


def _pairs(means2d, conics, opacities, depths, radii, width, height):
    """Candidate (Gaussian, pixel) pairs of I images, without gradient.

    Inputs [I, N, ...] (detached). Per image the visible Gaussians are taken front to back
    (stable depth order); each covers the pixels of its footprint box whose centre can reach
    alpha ≥ 1/255, found row by row from the conic with a small margin: a superset of the
    pairs the compositor keeps (its exact test decides), several times smaller than the box.
    Returns gid [P] (flat indices into I·N) and pix [P] (flat indices into I·H·W), int64,
    ordered by image, then depth, then row-major pixel.
    """
    I, N = depths.shape
    device = means2d.device
    valid = radii.any(-1)
    order = torch.argsort(torch.where(valid, depths, torch.inf), dim=1, stable=True)
    sel = torch.arange(N, device=device)[None] < valid.sum(1)[:, None]
    img = torch.arange(I, device=device)[:, None].expand(I, N)[sel]
    flat = img * N + order[sel]  # [G] visible, image-major, front to back
    m = means2d.reshape(I * N, 2).index_select(0, flat)
    r = radii.reshape(I * N, 2).index_select(0, flat).to(m.dtype)
    x0 = torch.floor(m[:, 0] - r[:, 0]).clamp(0, width)
    x1 = torch.ceil(m[:, 0] + r[:, 0]).clamp(0, width)
    y0 = torch.floor(m[:, 1] - r[:, 1]).clamp(0, height)
    y1 = torch.ceil(m[:, 1] + r[:, 1]).clamp(0, height)
    # alpha = o·exp(−σ) ≥ 1/255  <=>  σ ≤ ln(255·o): per row an interval of x (float64),
    # widened so that rounding in the compositor's σ never loses a pair: σ's terms reach
    # s·ac/(ac − b²) inside the ellipse, so the margin grows with that ratio.
    o = opacities.reshape(I * N).index_select(0, flat).double()
    con = conics.reshape(I * N, 3).index_select(0, flat).double()
    ac = con[:, 0] * con[:, 2]
    kappa = ac / (ac - con[:, 1] ** 2).clamp_min(1e-300)
    s = torch.log((o / ALPHA_THRESHOLD).clamp_min(1.0))
    s = s * (1 + 1e-4 * kappa.clamp(1, 1e6)) + 1e-4
    per_g = torch.stack(  # every per-row quantity, a float64 column each (see _columns)
        [*m.unbind(-1), *con.unbind(-1), s, x0, x1, y0, img * (width * height), flat]
    ).to(torch.float64)
    h = (y1 - y0).long()  # rows of each box: (Gaussian, y)
    row_g = torch.repeat_interleave(torch.arange(len(flat), device=device), h)
    mx, my, a, b, c, s, x0, x1, y0, base, gid = _columns(per_g, row_g)
    y = y0 + _local_index(h, row_g)
    dy = my - (y + 0.5)
    disc = (b * dy) ** 2 - a * (c * dy * dy - 2 * s)
    root = torch.sqrt(disc.clamp_min(0))
    lo = torch.ceil(mx - (-b * dy + root) / a - 0.5 - 1e-6)  # pixel x with centre x + 0.5
    hi = torch.floor(mx - (-b * dy - root) / a - 0.5 + 1e-6) + 1  # exclusive
    lo = torch.maximum(torch.nan_to_num(lo, nan=0.0), x0)
    hi = torch.minimum(torch.nan_to_num(hi, nan=float(width)), x1)
    w = torch.where(disc >= 0, hi - lo, 0).clamp_min(0).long()
    # pixel k of row j: pix = base_j + y_j·W + lo_j + (k − first_j)
    first = torch.cumsum(w, 0) - w
    per_row = torch.stack([(base + y * width + lo).long() - first, gid.long()], -1)
    pr = torch.repeat_interleave(torch.arange(len(w), device=device), w)
    start, gid = per_row.index_select(0, pr).unbind(-1)
    return gid, start + torch.arange(len(pr), device=device)


def _local_index(counts: Tensor, owner: Tensor) -> Tensor:
    """0, 1, …, counts[k] − 1 for each k, concatenated (``owner`` = repeat_interleave(k))."""
    first = torch.cumsum(counts, 0) - counts
    return torch.arange(len(owner), device=counts.device) - first.index_select(0, owner)


def _take(t: Tensor, index: Tensor) -> Tensor:
    return t.index_select(0, index)


def _columns(table: Tensor, index: Tensor) -> list[Tensor]:
    """Rows ``index`` of a table stored by columns [K, n], a contiguous tensor per column: on
    a CPU, index_select of rows of six or more values is several times slower than one per
    column (torch 2.13: 2M rows of 6 float32, 42 ms against 6 × 2.3 ms)."""
    return [column.index_select(0, index) for column in table]


def _sigma(table, gid, pix, width, height):
    """Per pair from the Gaussian table [6, I·N] (x, y, conic a, b, c, opacity): offsets
    dx, dy of the centre from the pixel centre, a, b, c, the opacity and
    σ = ½(a·dx² + c·dy²) + b·dx·dy."""
    mx, my, a, b, c, o = _columns(table, gid)
    local = pix % (width * height)
    px = (local % width).to(table.dtype) + 0.5
    py = (local // width).to(table.dtype) + 0.5
    dx, dy = mx - px, my - py
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    return dx, dy, a, b, c, o, sigma


def _segments(pix: Tensor) -> tuple[Tensor, Tensor]:
    """For pairs sorted by pixel: the first-of-pixel mask and each pair's segment id."""
    new_seg = torch.ones_like(pix, dtype=torch.bool)
    new_seg[1:] = pix[1:] != pix[:-1]
    return new_seg, torch.cumsum(new_seg, 0) - 1


def _composite_chunk(table, colors, pairs, width, height, out, log_tf):
    """Sparse front-to-back compositing of one chunk of images, without gradient.

    ``table`` [6, I·N] (means2d, conic, opacity), colors [I·N, D]; ``pairs`` from
    :func:`_pairs`. Accumulates Σ α·T·c into ``out`` [I·H·W, D] and Σ log(1 − α) into
    ``log_tf`` [I·H·W] (float64) over the pairs a pixel composites, and returns those pairs
    (gid, pix, alpha, T), sorted by pixel then depth, for the backward pass.
    """
    gid, pix = pairs
    *_, o, sigma = _sigma(table, gid, pix, width, height)
    alpha = torch.clamp(o * torch.exp(-sigma), max=MAX_ALPHA)
    keep = (sigma >= 0) & (alpha >= ALPHA_THRESHOLD)
    if not bool(keep.all()):
        k = keep.nonzero().squeeze(1)
        alpha, pix, gid = _take(alpha, k), _take(pix, k), _take(gid, k)
    # A stable sort by pixel keeps each pixel's pairs front to back.
    key = pix.to(torch.int32) if len(out) < 2**31 else pix
    pix, order = torch.sort(key, stable=True)
    pix = pix.long()
    alpha, gid = _take(alpha, order), _take(gid, order)
    # Segmented exclusive cumulative sum of log(1 − α): transmittance before each pair.
    # float64 keeps the global running sum exact enough across millions of pairs.
    log1m = torch.log1p(-alpha.double())
    excl = torch.cumsum(log1m, 0) - log1m
    new_seg, seg_id = _segments(pix)
    log_t = excl - _take(_take(excl, new_seg.nonzero().squeeze(1)), seg_id)  # log T before
    live = (log_t + log1m) > math.log(T_THRESHOLD)  # pixel not yet done
    if not bool(live.all()):
        k = live.nonzero().squeeze(1)
        gid, pix, alpha, log1m, log_t = (_take(t, k) for t in (gid, pix, alpha, log1m, log_t))
    T = torch.exp(log_t).to(alpha.dtype)
    out.index_add_(0, pix, (alpha * T)[:, None] * _take(colors, gid))
    log_tf.index_add_(0, pix, log1m)
    return gid, pix, alpha, T


def _chunks_of_images(radii, pair_budget):
    """Image ranges whose footprint boxes hold at most ``pair_budget`` pairs (at least one
    image per range): bounds the memory of one chunk's pair lists."""
    r = radii.to(torch.int64)
    boxes = ((2 * r[..., 0] + 1) * (2 * r[..., 1] + 1) * (r.any(-1))).sum(-1).tolist()
    chunks, start, total = [], 0, 0
    for i, n in enumerate(boxes):
        if i > start and total + n > pair_budget:
            chunks.append((start, i))
            start, total = i, 0
        total += n
    chunks.append((start, len(boxes)))
    return chunks


def _table(means2d, conics, opacities) -> Tensor:
    """The per-Gaussian table the pair computations gather rows from, by columns: [6, I·N]."""
    return torch.cat([means2d, conics, opacities[..., None]], -1).reshape(-1, 6).T.contiguous()


def _composite_forward(means2d, conics, opacities, colors, depths, radii, bgs, w, h, budget):
    """Composite every image without gradient: colours [I, H·W, D], T_final [I·H·W] and the
    per-chunk pair records of :func:`_composite_chunk`."""
    I, N, D = colors.shape
    HW = w * h
    with torch.no_grad():
        table = _table(means2d.detach(), conics.detach(), opacities.detach())
        col = colors.detach().reshape(I * N, D)
        out = torch.zeros(I * HW, D, dtype=colors.dtype, device=colors.device)
        log_tf = torch.zeros(I * HW, dtype=torch.float64, device=colors.device)
        saved = []
        for s, e in _chunks_of_images(radii, budget):
            gid, pix = _pairs(
                means2d[s:e].detach(),
                conics[s:e].detach(),
                opacities[s:e].detach(),
                depths[s:e].detach(),
                radii[s:e],
                w,
                h,
            )
            pairs = (gid + s * N, pix + s * HW)
            saved.append(_composite_chunk(table, col, pairs, w, h, out, log_tf))
        t_final = torch.exp(log_tf).to(colors.dtype)
        rgb = out.reshape(I, HW, D) + t_final.reshape(I, HW, 1) * bgs.detach()[:, None, :]
    return rgb, t_final, saved


class _Composite(torch.autograd.Function):
    """Sparse compositing with an analytic backward (as gsplat's kernels): the forward keeps
    each composited pair's α and the transmittance T before it; the backward needs no
    recomputation of the pair lists and no autograd graph over millions of pairs."""

    @staticmethod
    def forward(ctx, means2d, conics, opacities, colors, backgrounds, depths, radii, w, h, budget):
        I, N, D = colors.shape
        rgb, t_final, saved = _composite_forward(
            means2d, conics, opacities, colors, depths, radii, backgrounds, w, h, budget
        )
        ctx.save_for_backward(
            means2d, conics, opacities, colors, backgrounds, t_final, *[t for p in saved for t in p]
        )
        ctx.size = (I, N, D, w, h)
        return rgb.reshape(I, h, w, D), (1 - t_final).reshape(I, h, w, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_rgb, grad_alpha):
        """C = Σ α_i·T_i·c_i + T_f·bg and A = 1 − T_f per pixel, with T_i = Π_{j<i}(1 − α_j):
        ∂L/∂α_i = T_i·(c_i·G) − (Σ_{j>i} α_j·T_j·(c_j·G) + T_f·(bg·G − G_A))/(1 − α_i),
        then through α = min(0.999, o·exp(−σ)) to the opacity, conic and 2D mean."""
        means2d, conics, opacities, colors, backgrounds, t_final, *saved = ctx.saved_tensors
        I, N, D, w, h = ctx.size
        HW = w * h
        dtype = colors.dtype
        G = grad_rgb.reshape(I * HW, D).to(dtype)
        q = (G.reshape(I, HW, D) * backgrounds[:, None, :]).sum(-1).reshape(-1)
        if grad_alpha is not None:
            q = q - grad_alpha.reshape(-1).to(dtype)
        q = t_final * q
        table = _table(means2d, conics, opacities)
        col = colors.reshape(I * N, D)
        grad = torch.zeros(I * N, 6 + D, dtype=dtype, device=colors.device)
        for k in range(0, len(saved), 4):
            gid, pix, alpha, T = saved[k : k + 4]
            wgt = alpha * T
            g = _take(G, pix)
            cg = (_take(col, gid) * g).sum(-1)
            # Σ over the later pairs of the same pixel of α_j·T_j·(c_j·G): reverse segmented sum
            u = torch.cumsum((wgt * cg).double(), 0)
            new_seg, seg_id = _segments(pix)
            last = torch.ones_like(new_seg)
            last[:-1] = new_seg[1:]
            after = (_take(_take(u, last.nonzero().squeeze(1)), seg_id) - u).to(dtype)
            d_alpha = T * cg - (after + _take(q, pix)) / (1 - alpha)
            dx, dy, a, b, c, o, sigma = _sigma(table, gid, pix, w, h)
            e = torch.exp(-sigma)
            raw = o * e
            d_alpha = torch.where(raw <= MAX_ALPHA, d_alpha, 0)  # clamp(max) passes at ≤
            d_sigma = -d_alpha * raw
            rows = torch.empty(len(gid), 6 + D, dtype=dtype, device=colors.device)
            rows[:, 0] = (a * dx + b * dy) * d_sigma
            rows[:, 1] = (c * dy + b * dx) * d_sigma
            rows[:, 2] = 0.5 * dx * dx * d_sigma
            rows[:, 3] = dx * dy * d_sigma
            rows[:, 4] = 0.5 * dy * dy * d_sigma
            rows[:, 5] = d_alpha * e
            torch.mul(wgt[:, None], g, out=rows[:, 6:])
            grad.index_add_(0, gid, rows)
        g_bg = (t_final.reshape(I, HW, 1) * G.reshape(I, HW, D)).sum(1)
        need = ctx.needs_input_grad
        return (
            grad[:, :2].reshape(means2d.shape) if need[0] else None,
            grad[:, 2:5].reshape(conics.shape) if need[1] else None,
            grad[:, 5].reshape(opacities.shape) if need[2] else None,
            grad[:, 6:].reshape(colors.shape) if need[3] else None,
            g_bg if need[4] else None,
            *([None] * 5),
        )


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

    Pairs are enumerated without gradient and composited a chunk of at most ``pair_budget``
    candidate pairs at a time; with gradients, :class:`_Composite` keeps only each composited
    pair's indices, α and transmittance for its analytic backward.
    """
    I, N, D = colors.shape
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (means2d, conics, opacities, colors, backgrounds)
    )
    if needs_grad:
        return _Composite.apply(
            means2d, conics, opacities, colors, backgrounds, depths, radii, width, height,
            pair_budget,
        )  # fmt: skip
    rgb, t_final, _ = _composite_forward(
        means2d, conics, opacities, colors, depths, radii, backgrounds, width, height, pair_budget
    )
    return rgb.reshape(I, height, width, D), (1 - t_final).reshape(I, height, width, 1)


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
