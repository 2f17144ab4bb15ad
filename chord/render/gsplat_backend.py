"""The CUDA backend: gsplat's ``rasterization`` with METHOD §8's settings."""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)


@functools.cache
def available() -> bool:
    """Whether gsplat's CUDA extension loads (probed once; gsplat is never patched)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        from gsplat.cuda._backend import _C

        return _C is not None
    except Exception as exc:  # ImportError, or a failed JIT build of the extension
        logger.warning("gsplat CUDA extension unavailable (%s); using the torch rasterizer", exc)
        return False


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
    near_plane,
    far_plane,
    sh_degree,
    backgrounds,
    eps2d,
):
    from gsplat import rasterization

    rgb, alpha, meta = rasterization(
        means,
        quats,
        scales,
        opacities,
        colors,
        viewmats,
        Ks,
        width,
        height,
        near_plane=near_plane,
        far_plane=far_plane,
        eps2d=eps2d,
        sh_degree=sh_degree,
        packed=False,
        absgrad=True,
        rasterize_mode="antialiased",
        backgrounds=backgrounds,
    )
    return rgb, alpha, meta
