"""``rasterize``: one differentiable Gaussian rasterizer with two backends (METHOD §8).

``gsplat`` (CUDA kernels) when the tensors are on a GPU and its extension loads, else the
project's torch implementation (``chord.render.torch_backend``), which follows the same
conventions (:mod:`chord.render.backend`). Arguments and outputs follow gsplat's
``rasterization`` with packed=False.
"""

from __future__ import annotations

import torch
from torch import Tensor

from chord.render.backend import BACKENDS, IMPLEMENTATIONS, resolve_backend
from chord.render.raster_inputs import RasterInputs, RasterSettings


def rasterize(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., (C,) N, D] or SH [..., (C,) N, K, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    *,
    sh_degree: int | None = None,
    backgrounds: Tensor | None = None,  # [..., C, D]
    backend: str = "auto",
    **settings,
) -> tuple[Tensor, Tensor, dict]:
    """Render Gaussians into C cameras for every leading batch index (e.g. frames).

    Args:
        means, quats, scales, opacities, colors, viewmats, Ks, backgrounds, sh_degree: the
            Gaussians and cameras, as :class:`~chord.render.raster_inputs.RasterInputs`
            describes them.
        width, height: image size in pixels.
        backend: "auto" (gsplat on CUDA tensors, where its kernels not loading is an
            error: :func:`~chord.render.backend.resolve_backend`; torch on a CPU), "gsplat"
            or "torch".
        settings: ``near_plane``, ``far_plane``, ``eps2d`` when not METHOD §8's defaults
            (:class:`~chord.render.raster_inputs.RasterSettings`).

    Returns:
        colours [..., C, H, W, D], alphas [..., C, H, W, 1], and a meta dict of
        intermediates (projected means, radii, depths, ...).

    Example:
        >>> import torch
        >>> from chord.render.rasterizer import rasterize
        >>> rgb, alpha, _ = rasterize(torch.zeros(1, 3), torch.tensor([[1.0, 0, 0, 0]]),
        ...     torch.full((1, 3), 0.1), torch.ones(1), torch.ones(1, 3),
        ...     torch.tensor([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 2], [0, 0, 0, 1]]]),
        ...     torch.tensor([[[32.0, 0, 16], [0, 32, 16], [0, 0, 1]]]), 32, 32)
        >>> tuple(rgb.shape), tuple(alpha.shape)
        ((1, 32, 32, 3), (1, 32, 32, 1))
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {BACKENDS}")
    if backend == "gsplat" and not means.is_cuda:
        raise ValueError(
            "backend 'gsplat' needs CUDA tensors (gsplat's kernels are CUDA-only); "
            f"got tensors on {means.device}; use backend='torch' on a CPU"
        )
    if backend != "torch":  # gsplat's kernels load (built for this card) or say why not
        backend = resolve_backend(backend, means.device)
    inputs = RasterInputs(
        means, quats, scales, opacities, colors, viewmats, Ks, backgrounds, sh_degree
    )
    return IMPLEMENTATIONS[backend].rasterize(inputs, RasterSettings(width, height, **settings))


def splat_tensors(g, *, dtype=torch.float32, device="cpu") -> dict[str, Tensor]:
    """Activated render inputs of a :class:`chord.gaussians.gaussian_set.GaussianSet`: means
    [N, 3], quats [N, 4], scales [N, 3] (exp), opacities [N] (sigmoid), sh [N, K, 3], and its
    sh_degree."""
    t = lambda a: torch.as_tensor(a, dtype=dtype, device=device)  # noqa: E731
    return {
        "means": t(g.means),
        "quats": t(g.quats),
        "scales": torch.exp(t(g.log_scales)),
        "opacities": torch.sigmoid(t(g.opacity_logits)),
        "sh": t(g.sh),
        "sh_degree": g.sh_degree,
    }
