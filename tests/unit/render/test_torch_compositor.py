"""The torch backend's compositor: the row-wise pair enumeration keeps every pair the alpha
test keeps (thin, rotated Gaussians included), and the analytic backward equals autograd
through the dense per-pixel oracle."""

from __future__ import annotations

import math

import pytest
import torch

from chord.render import cameras, compositor, projection

W, H = 40, 30


def projected(n: int, seed: int, dtype, *, thin: bool):
    """Projected Gaussians of a random scene (one camera), some of them needle-thin."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g, dtype=dtype) - 0.5) * 0.8
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    scales = 0.01 + 0.12 * torch.rand(n, 3, generator=g, dtype=dtype)
    if thin:  # needles: one long axis, two tiny ones, at every angle
        scales[::2, 1:] = 1e-4
        scales[::2, 0] = 0.3
    opac = 0.05 + 0.94 * torch.rand(n, generator=g, dtype=dtype)
    view = cameras.orbit_viewmats(torch.tensor(15.0), torch.tensor(40.0), 2.0).to(dtype)
    K = cameras.intrinsics(W, H).to(dtype)
    p = projection.project(means[None], quats[None], scales[None], opac[None],
                           view[None, None], K[None, None], W, H)  # fmt: skip
    colors = torch.rand(1, n, 3, generator=g, dtype=dtype)
    return {k: v[0, 0] for k, v in p.items()}, colors  # [N, ...] of the one image


def box_pairs(p) -> set[tuple[int, int]]:
    """Every footprint-box pair that passes the compositor's exact alpha test."""
    keep = set()
    for i in torch.nonzero(p["radii"].any(-1)).squeeze(1).tolist():
        (mx, my), (rx, ry) = p["means2d"][i].tolist(), p["radii"][i].tolist()
        a, b, c = p["conics"][i]
        for y in range(max(0, math.floor(my - ry)), min(H, math.ceil(my + ry))):
            for x in range(max(0, math.floor(mx - rx)), min(W, math.ceil(mx + rx))):
                dx = p["means2d"][i, 0] - (x + 0.5)
                dy = p["means2d"][i, 1] - (y + 0.5)
                sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
                alpha = torch.clamp(p["opacities"][i] * torch.exp(-sigma), max=compositor.MAX_ALPHA)
                if sigma >= 0 and alpha >= projection.ALPHA_THRESHOLD:
                    keep.add((i, y * W + x))
    return keep


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_enumeration_keeps_every_pair_the_box_keeps(dtype):
    p, _ = projected(60, seed=1, dtype=dtype, thin=True)
    gid, pix = compositor._pairs(
        *(p[k][None] for k in ("means2d", "conics", "opacities", "depths", "radii")), W, H
    )
    enumerated = set(zip(gid.tolist(), pix.tolist(), strict=True))
    wanted = box_pairs(p)
    assert wanted <= enumerated
    # and it is tight: far fewer candidates than the boxes hold
    r = p["radii"].long()
    assert len(enumerated) < 0.8 * int(((2 * r[:, 0] + 1) * (2 * r[:, 1] + 1)).sum())


def test_sparse_matches_dense_for_thin_float32_gaussians():
    p, colors = projected(120, seed=2, dtype=torch.float32, thin=True)
    args = [p["means2d"][None], p["conics"][None], p["opacities"][None], colors,
            p["depths"][None], p["radii"][None], torch.tensor([[0.2, 0.4, 0.6]])]  # fmt: skip
    sparse = compositor.composite(*args, W, H)
    dense = compositor.composite_dense(*args, W, H)
    torch.testing.assert_close(sparse[0], dense[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(sparse[1], dense[1], atol=2e-5, rtol=0)


def test_analytic_backward_equals_autograd_through_the_dense_oracle():
    p, colors = projected(25, seed=3, dtype=torch.float64, thin=False)
    p["opacities"][:5] = 0.995  # some pixels terminate early, some alphas clamp at 0.999
    inputs = {
        "means2d": p["means2d"][None],
        "conics": p["conics"][None],
        "opacities": p["opacities"][None],
        "colors": colors,
        "bg": torch.tensor([[0.3, 0.5, 0.7]], dtype=torch.float64),
    }
    g = torch.Generator().manual_seed(4)
    w_rgb = torch.rand(1, H, W, 3, generator=g, dtype=torch.float64)
    w_alpha = torch.rand(1, H, W, 1, generator=g, dtype=torch.float64)
    grads = []
    for fn in (compositor.composite, compositor.composite_dense):
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
        rgb, alpha = fn(
            leaves["means2d"], leaves["conics"], leaves["opacities"], leaves["colors"],
            p["depths"][None], p["radii"][None], leaves["bg"], W, H,
        )  # fmt: skip
        ((rgb * w_rgb).sum() + (alpha * w_alpha).sum()).backward()
        grads.append({k: v.grad for k, v in leaves.items()})
    for k in inputs:
        torch.testing.assert_close(grads[0][k], grads[1][k], atol=1e-9, rtol=1e-7, msg=k)
    assert float(grads[0]["means2d"].abs().sum()) > 0


def test_chunks_split_images_by_their_footprint_boxes():
    radii = torch.zeros(5, 3, 2, dtype=torch.int32)
    radii[:, 0] = 3  # one 7x7 box per image: 49 pairs
    assert compositor._chunks_of_images(radii, 100) == [(0, 2), (2, 4), (4, 5)]
    assert compositor._chunks_of_images(radii, 10) == [(i, i + 1) for i in range(5)]
    assert compositor._chunks_of_images(radii, 10**9) == [(0, 5)]
