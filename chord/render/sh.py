"""Spherical-harmonics colour evaluation, shared by the torch backend.

gsplat's pure-torch reference implementation is reused: gsplat is pinned in pyproject.toml
and tests/unit/render/test_rasterizer.py guards the private name. Its constants and basis order
match
the CUDA kernel the gsplat backend runs.
"""

from __future__ import annotations

from gsplat.cuda._torch_impl import _spherical_harmonics
from torch import Tensor


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """SH colour [..., 3] of view directions [..., 3] (any length) and coefficients
    [..., K, 3], using the first (degree + 1)² bases (gsplat's convention, before +0.5)."""
    return _spherical_harmonics(degree, dirs, coeffs)
