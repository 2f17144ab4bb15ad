"""The render backends' one interface (METHOD §8) and which backend draws.

:class:`RenderBackend` is what a backend module provides: :mod:`chord.render.gsplat_backend`
(gsplat's CUDA kernels) and :mod:`chord.render.torch_backend` (plain torch, gsplat's
conventions) both do, each taking a rasterization's :class:`~chord.render.raster_inputs.
RasterInputs` and :class:`~chord.render.raster_inputs.RasterSettings` as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from chord.core.errors import InputError
from chord.render import gsplat_backend, torch_backend

if TYPE_CHECKING:
    from torch import Tensor

    from chord.render.raster_inputs import RasterInputs, RasterSettings

#: what ``render_backend`` may say: "auto" resolves to one of :data:`IMPLEMENTATIONS`
BACKENDS = ("auto", "gsplat", "torch")


@runtime_checkable
class RenderBackend(Protocol):
    """A rasterizer of Gaussians; its module satisfies this protocol (module functions as
    its methods)."""

    NAME: str  # its name in ``render_backend``

    def unavailable_reason(self) -> str | None:
        """Why it cannot draw here, or None."""

    def describe(self) -> str:
        """One phrase for logs and state files."""

    def rasterize(
        self, inputs: RasterInputs, settings: RasterSettings
    ) -> tuple[Tensor, Tensor, dict]:
        """Colours [..., C, H, W, D], alphas [..., C, H, W, 1] and a meta dict of
        intermediates (projected means, radii, depths, ...) of ``inputs``."""


#: the backends by name
IMPLEMENTATIONS: dict[str, RenderBackend] = {
    gsplat_backend.NAME: gsplat_backend,
    torch_backend.NAME: torch_backend,
}


class BackendUnavailable(InputError):
    """The configured renderer cannot run on this device; the message says why and the fix."""


def resolve_backend(backend: str, device) -> str:
    """The renderer that draws tensors on ``device``: "gsplat" or "torch".

    "auto" is gsplat on CUDA and the torch rasterizer on a CPU. On CUDA without gsplat's
    kernels "auto" is an error with the reason and the fix, never a silent fall back to the
    torch rasterizer (slower, more memory on a GPU); ``render_backend: torch`` asks for it.
    """
    if backend not in BACKENDS:
        raise ValueError(f"render_backend: {backend!r} is not one of {BACKENDS}")
    cuda = torch.device(device).type == "cuda"
    if backend == "torch" or (backend == "auto" and not cuda):
        return "torch"
    if not cuda:
        raise BackendUnavailable(
            f"render_backend: gsplat needs CUDA tensors (its kernels are CUDA-only); this "
            f"training runs on {device}; use render_backend: torch or auto"
        )
    reason = gsplat_backend.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(
            f"render_backend: {backend}: {reason}. Fix: install a CUDA toolkit matching "
            f"torch's CUDA {torch.version.cuda} (nvcc; CUDA_HOME set) so gsplat can build its "
            "kernels (minutes, once per GPU kind; `chord build-kernels --rebuild` on the GPU node "
            "redoes a broken build), or a prebuilt gsplat wheel for this torch; or set "
            "render_backend: torch (chord train --render_backend torch) to render with the "
            "project's torch rasterizer on the GPU (slower, more memory)"
        )
    return "gsplat"


def describe_backend(backend: str) -> str:
    """One phrase for logs and state files: which renderer draws ("gsplat", else torch)."""
    return (gsplat_backend if backend == "gsplat" else torch_backend).describe()
