"""Renders of a scene through :func:`~chord.render.rasterizer.rasterize` (METHOD §8): static
Gaussians from many cameras without gradient (:func:`render_views`: the reference stage),
per-frame Gaussians from one camera, differentiable (:func:`render_video`: training, the
oracle), and per-frame Gaussians each from its own camera without gradient
(:func:`render_frames`: exports, evaluation, live previews).
"""

from __future__ import annotations

import torch
from torch import Tensor

from chord.render.rasterizer import rasterize


def render_views(
    splats: dict,
    viewmats: Tensor,
    K: Tensor,
    width: int,
    height: int,
    *,
    background=(1.0, 1.0, 1.0),
    chunk: int = 8,
    backend: str = "auto",
) -> Tensor:
    """Render static Gaussians (``splat_tensors``) into C views without gradient, ``chunk``
    cameras at a time: viewmats [C, 4, 4], K [3, 3] -> images [C, H, W, 3] in [0, 1]."""
    dtype, device = splats["means"].dtype, splats["means"].device
    out = []
    with torch.no_grad():
        for s in range(0, viewmats.shape[0], chunk):
            vm = viewmats[s : s + chunk].to(dtype=dtype, device=device)
            Ks = K.to(dtype=dtype, device=device).expand(vm.shape[0], 3, 3)
            bg = torch.tensor(background, dtype=dtype, device=device).expand(vm.shape[0], 3)
            rgb, _, _ = rasterize(
                splats["means"],
                splats["quats"],
                splats["scales"],
                splats["opacities"],
                splats["sh"],
                vm,
                Ks,
                width,
                height,
                sh_degree=splats["sh_degree"],
                backgrounds=bg,
                backend=backend,
            )
            out.append(rgb.clamp(0, 1))
    return torch.cat(out)


def render_video(
    frames: dict,
    viewmat: Tensor,
    K: Tensor,
    width: int,
    height: int,
    background: Tensor,
    *,
    backend: str = "auto",
) -> Tensor:
    """Per-frame Gaussians from one camera: ``frames`` holds means [F, N, 3], quats
    [F, N, 4] and constant scales [N, 3], opacities [N], sh [N, K, 3] and sh_degree (as
    :meth:`chord.motion.model.MotionScene.frame_gaussians` returns). Returns [F, 3, H, W]."""
    F = frames["means"].shape[0]
    dtype, device = frames["scales"].dtype, frames["means"].device
    viewmat, K, background = (x.to(device, dtype) for x in (viewmat, K, background))

    def rep(x: Tensor) -> Tensor:  # constant over frames
        return x[None].expand(F, *x.shape)

    rgb, _, _ = rasterize(
        frames["means"].to(dtype),
        frames["quats"].to(dtype),
        rep(frames["scales"]),
        rep(frames["opacities"]),
        rep(frames["sh"]),
        viewmat.to(dtype)[None, None].expand(F, 1, 4, 4),
        K.to(dtype)[None, None].expand(F, 1, 3, 3),
        width,
        height,
        sh_degree=frames["sh_degree"],
        backgrounds=background.to(dtype)[None, None].expand(F, 1, 3),
        backend=backend,
    )
    return rgb[:, 0].permute(0, 3, 1, 2)  # [F, 3, H, W]


def render_frames(
    frames: dict,
    viewmats: Tensor,
    K: Tensor,
    width: int,
    height: int,
    background,
    *,
    chunk: int = 4,
    backend: str = "auto",
) -> Tensor:
    """Render per-frame Gaussians, each frame from its own camera, without gradient.

    Args:
        frames: means [F, N, 3], quats [F, N, 4], constant scales [N, 3], opacities [N],
            sh [N, K, 3] and sh_degree (:meth:`chord.motion.model.MotionScene.frame_gaussians`).
        viewmats: world-to-camera [F, 4, 4] (one per frame) or [4, 4] (the same for all).
        K: intrinsics [3, 3].
        background: RGB in [0, 1].

    Returns:
        images [F, H, W, 3] in [0, 1] (float32, on the CPU).
    """
    F = frames["means"].shape[0]
    dtype, device = frames["scales"].dtype, frames["scales"].device
    if viewmats.ndim == 2:
        viewmats = viewmats[None].expand(F, 4, 4)
    if viewmats.shape[0] != F:
        raise ValueError(f"viewmats: {viewmats.shape[0]} cameras for {F} frames")
    bg = torch.as_tensor(background, dtype=dtype, device=device)
    out = []
    with torch.no_grad():
        for s in range(0, F, chunk):
            n = min(chunk, F - s)

            def rep(x: Tensor, n=n) -> Tensor:  # constant over frames
                return x[None].expand(n, *x.shape)

            rgb, _, _ = rasterize(
                frames["means"][s : s + n].to(dtype),
                frames["quats"][s : s + n].to(dtype),
                rep(frames["scales"]),
                rep(frames["opacities"]),
                rep(frames["sh"]),
                viewmats[s : s + n, None].to(dtype=dtype, device=device),  # [n, 1, 4, 4]
                K.to(dtype=dtype, device=device)[None, None].expand(n, 1, 3, 3),
                width,
                height,
                sh_degree=frames["sh_degree"],
                backgrounds=bg[None, None].expand(n, 1, 3),
                backend=backend,
            )
            out.append(rgb[:, 0].clamp(0, 1).float().cpu())  # [n, H, W, 3]
    return torch.cat(out)
