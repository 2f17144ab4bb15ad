"""The torch backend (:class:`chord.render.backend.RenderBackend`): gsplat's conventions (EWA
splatting, antialiased mode, packed=False) in plain differentiable torch, for a CPU or a GPU
without gsplat's kernels: :mod:`chord.render.projection` projects the Gaussians,
:mod:`chord.render.compositor` composites them front to back per pixel (a sparse pair list
with an analytic backward pass).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from chord.render.compositor import PAIR_BUDGET, composite, composite_dense
from chord.render.projection import project
from chord.render.raster_inputs import RasterInputs, RasterSettings
from chord.render.sh import spherical_harmonics

#: its name in ``render_backend``
NAME = "torch"


def unavailable_reason() -> str | None:
    """None: plain torch draws wherever the tensors are."""
    return None


def describe() -> str:
    """Which renderer draws (for logs and state files)."""
    return "torch rasterizer (chord.render.torch_backend)"


def rasterize(
    inputs: RasterInputs,
    settings: RasterSettings,
    *,
    antialiased: bool = True,
    dense: bool = False,
    pair_budget: int = PAIR_BUDGET,
) -> tuple[Tensor, Tensor, dict]:
    """Render ``inputs`` into colours [..., C, H, W, D] and alphas [..., C, H, W, 1]; the meta
    dict holds :func:`~chord.render.projection.project`'s outputs with the leading batch dims
    folded into one, B. ``dense``: the per-pixel test oracle
    (:func:`~chord.render.compositor.composite_dense`), small inputs only; ``pair_budget``:
    candidate pairs per chunk of images (:func:`~chord.render.compositor.composite`)."""
    batch = inputs.means.shape[:-2]
    B = math.prod(batch)
    x = inputs.map(lambda t: t.reshape(B, *t.shape[len(batch) :]))  # batch dims folded: [B, ...]
    width, height = settings.width, settings.height
    C = x.viewmats.shape[1]
    proj = project(
        x.means,
        x.quats,
        x.scales,
        x.opacities,
        x.viewmats,
        x.Ks,
        width,
        height,
        near_plane=settings.near_plane,
        far_plane=settings.far_plane,
        eps2d=settings.eps2d,
        antialiased=antialiased,
    )
    colors, sh_degree, backgrounds = x.colors, x.sh_degree, x.backgrounds
    if colors.dim() == x.means.dim() + (0 if sh_degree is None else 1):
        colors = colors[:, None].expand(B, C, *colors.shape[1:])  # shared by every camera
    if sh_degree is not None:
        R, t = x.viewmats[..., :3, :3], x.viewmats[..., :3, 3]
        campos = -torch.einsum("bcji,bcj->bci", R, t)
        dirs = x.means[:, None] - campos[:, :, None]  # [B, C, N, 3]
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
    rgb = rgb.reshape(*batch, C, height, width, D)
    alpha = alpha.reshape(*batch, C, height, width, 1)
    return rgb, alpha, proj
