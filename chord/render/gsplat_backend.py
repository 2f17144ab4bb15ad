"""The CUDA backend: gsplat's ``rasterization`` with METHOD §8's settings."""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)


@functools.cache
def unavailable_reason() -> str | None:
    """Why gsplat's CUDA kernels cannot run here, or None when they load (probed once;
    gsplat is never patched). gsplat 1.5 compiles its kernels on first import when it finds a
    CUDA toolkit (nvcc), which takes minutes once and is cached in TORCH_EXTENSIONS_DIR;
    without one its extension is None."""
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    try:
        import gsplat
    except ImportError as exc:
        return f"gsplat is not installed ({exc})"
    try:
        from gsplat.cuda._backend import _C
    except Exception as exc:  # a failed JIT build of the extension
        return f"gsplat {gsplat.__version__}'s CUDA kernels failed to build ({exc})"
    if _C is None:
        return (
            f"gsplat {gsplat.__version__} found no CUDA toolkit (nvcc under CUDA_HOME or on "
            "PATH) to compile its kernels, and no prebuilt ones"
        )
    return None


def available() -> bool:
    """Whether gsplat's CUDA extension loads."""
    return unavailable_reason() is None


def describe() -> str:
    """Which gsplat renders (for logs and state files)."""
    import gsplat

    return f"gsplat {gsplat.__version__} (CUDA kernels)"


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
