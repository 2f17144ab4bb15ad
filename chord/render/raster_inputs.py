"""What one rasterization takes (METHOD §8), declared once for every backend: the tensors to
draw (:class:`RasterInputs`) and how to draw them (:class:`RasterSettings`), in the names of
gsplat's ``rasterization``. :func:`chord.render.rasterizer.rasterize` builds both; a backend
(:class:`chord.render.backend.RenderBackend`) receives them as they are.

Imports no torch, so the gsplat backend's build and lock helpers stay light to import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class RasterSettings:
    """How Gaussians are drawn: the image size in pixels, the camera-space depth range a
    Gaussian's centre must lie in, and the low-pass ``eps2d`` added to each 2D covariance's
    diagonal. Every backend draws antialiased and unpacked (gsplat's packed=False)."""

    width: int
    height: int
    near_plane: float = 0.01
    far_plane: float = 100.0
    eps2d: float = 0.3


@dataclass(frozen=True)
class RasterInputs:
    """Gaussians and the C cameras they are drawn into, for any leading batch dims ``...``
    (e.g. frames), shared by Gaussians and cameras.

    Attributes:
        means: centres [..., N, 3] in world space.
        quats: rotations [..., N, 4], (w, x, y, z), need not be normalised.
        scales: activated scales [..., N, 3] (exp of the PLY's log-scales).
        opacities: activated opacities [..., N] (sigmoid of the PLY's logits).
        colors: post-activation features [..., (C,) N, D] when ``sh_degree`` is None (used
            as given, e.g. displacement colours), else SH coefficients [..., (C,) N, K, 3]
            evaluated per camera, plus 0.5, clamped at 0.
        viewmats: world-to-camera matrices [..., C, 4, 4] (OpenCV: x right, y down, z ahead).
        Ks: intrinsics [..., C, 3, 3]; not differentiable.
        backgrounds: [..., C, D] colour behind the Gaussians, added as bg·(1 − alpha); None:
            none (black).
        sh_degree: the SH degree of ``colors``, or None for plain features.
    """

    means: Tensor
    quats: Tensor
    scales: Tensor
    opacities: Tensor
    colors: Tensor
    viewmats: Tensor
    Ks: Tensor
    backgrounds: Tensor | None = None
    sh_degree: int | None = None

    def map(self, fn: Callable[[Tensor], Tensor]) -> RasterInputs:
        """These inputs with ``fn`` applied to every tensor (``backgrounds`` when given)."""
        changed = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "sh_degree" and value is not None:
                changed[field.name] = fn(value)
        return dataclasses.replace(self, **changed)
