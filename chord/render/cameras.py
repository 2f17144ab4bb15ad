"""Orbit cameras, intrinsics and training-camera sampling (METHOD §8).

Y is up; positive elevation looks from above. View matrices are world-to-camera in the
OpenCV convention gsplat expects (x right, y down, z forward).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

FOVY = 49.1
NEAR, FAR = 0.01, 100.0


def orbit_position(elev: Tensor, azim: Tensor, radius, target) -> Tensor:
    """METHOD §8: o = p + r·(cos e·sin a, sin e, cos e·cos a), angles in degrees -> [..., 3]."""
    e, a = torch.deg2rad(elev), torch.deg2rad(azim)
    offset = torch.stack(
        [torch.cos(e) * torch.sin(a), torch.sin(e), torch.cos(e) * torch.cos(a)], dim=-1
    )
    return (
        torch.as_tensor(target, dtype=offset.dtype)
        + torch.as_tensor(radius, dtype=offset.dtype)[..., None] * offset
    )


def look_at_c2w(position: Tensor, target) -> Tensor:
    """OpenGL camera-to-world [..., 4, 4]: z = N(o − p), x = N(ŷ × z), y = z × x."""
    target = torch.as_tensor(target, dtype=position.dtype)
    z = torch.nn.functional.normalize(position - target, dim=-1)
    up = torch.tensor([0.0, 1.0, 0.0], dtype=position.dtype).expand_as(z)
    x = torch.nn.functional.normalize(torch.linalg.cross(up, z, dim=-1), dim=-1)
    y = torch.linalg.cross(z, x, dim=-1)
    c2w = torch.zeros(*position.shape[:-1], 4, 4, dtype=position.dtype)
    c2w[..., :3, 0], c2w[..., :3, 1], c2w[..., :3, 2] = x, y, z
    c2w[..., :3, 3] = position
    c2w[..., 3, 3] = 1.0
    return c2w


def viewmat_from_c2w(c2w_gl: Tensor) -> Tensor:
    """Flip the camera's y and z (OpenGL -> OpenCV), then invert: world-to-camera [..., 4, 4]."""
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=c2w_gl.dtype))
    c2w = c2w_gl @ flip
    R, t = c2w[..., :3, :3], c2w[..., :3, 3]
    view = torch.zeros_like(c2w)
    view[..., :3, :3] = R.transpose(-1, -2)
    view[..., :3, 3] = -(R.transpose(-1, -2) @ t[..., None])[..., 0]
    view[..., 3, 3] = 1.0
    return view


def orbit_viewmats(elev, azim, radius, target=(0.0, 0.0, 0.0)) -> Tensor:
    """World-to-camera matrices [..., 4, 4] (float64) of orbit cameras looking at ``target``."""
    elev = torch.as_tensor(elev, dtype=torch.float64)
    azim = torch.as_tensor(azim, dtype=torch.float64)
    elev, azim = torch.broadcast_tensors(elev, azim)
    radius = torch.as_tensor(radius, dtype=torch.float64).expand_as(elev)
    return viewmat_from_c2w(look_at_c2w(orbit_position(elev, azim, radius, target), target))


def intrinsics(width: int, height: int, fovy: float = FOVY) -> Tensor:
    """METHOD §8: fy = H/(2·tan(fovy/2)), fx = fy, principal point at the centre -> [3, 3]."""
    fy = height / (2.0 * math.tan(math.radians(fovy) / 2.0))
    return torch.tensor(
        [[fy, 0.0, width / 2.0], [0.0, fy, height / 2.0], [0.0, 0.0, 1.0]], dtype=torch.float64
    )


def merge_segments(flat: list[float], *, name: str = "segments") -> list[tuple[float, float]]:
    """Flat [start end start end ...] -> sorted, merged intervals (an odd length is an error)."""
    if len(flat) % 2:
        raise ValueError(f"{name}: needs [start end] pairs, got {len(flat)} values")
    pairs = sorted((min(a, b), max(a, b)) for a, b in zip(flat[::2], flat[1::2], strict=True))
    merged: list[list[float]] = []
    for a, b in pairs:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def sample_uniform(
    lo: float,
    hi: float,
    segments: list[float],
    n: int,
    generator: torch.Generator,
    *,
    name: str = "segments",
) -> Tensor:
    """n draws [n] (float64) from U(lo, hi), or uniformly over the union of ``segments``."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if not segments:
        return lo + (hi - lo) * u
    intervals = merge_segments(segments, name=name)
    lengths = torch.tensor([b - a for a, b in intervals], dtype=torch.float64)
    total = float(lengths.sum())
    if total <= 0:
        return torch.full((n,), intervals[0][0], dtype=torch.float64)
    pos = u * total
    ends = torch.cumsum(lengths, 0)
    k = torch.searchsorted(ends, pos, right=True).clamp(max=len(intervals) - 1)
    starts = torch.tensor([a for a, _ in intervals], dtype=torch.float64)
    return starts[k] + pos - (ends[k] - lengths[k])


def sample_training_cameras(
    n: int,
    generator: torch.Generator,
    *,
    azim_l,
    azim_r,
    elev_l,
    elev_r,
    azim_segments=(),
    elev_segments=(),
    radius,
    target=(0.0, 0.0, 0.0),
    invert_bg_prob=-1.0,
) -> dict[str, Tensor]:
    """METHOD §8: n independent training cameras and backgrounds.

    Draw order (fixed, for reproducibility): azimuths, elevations, background uniforms.
    Returns viewmats [n, 4, 4], azim [n], elev [n] (degrees), backgrounds [n, 3] (white
    where u > invert_bg_prob, else black).
    """
    azim = sample_uniform(azim_l, azim_r, list(azim_segments), n, generator, name="azim_segments")
    elev = sample_uniform(elev_l, elev_r, list(elev_segments), n, generator, name="elev_segments")
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    bg = (u > invert_bg_prob).to(torch.float64)[:, None].expand(n, 3)
    return {
        "viewmats": orbit_viewmats(elev, azim, radius, target),
        "azim": azim,
        "elev": elev,
        "backgrounds": bg.clone(),
    }


def camera_target(
    cam_height: float, recenter_cam: bool = False, dynamic_bounds: list | None = None
) -> np.ndarray:
    """METHOD §8: p = (0, cam_height, 0), or the centre of the dynamic objects' union AABB
    plus cam_height in y with ``recenter_cam``. ``dynamic_bounds``: [[min], [max]] per object."""
    if recenter_cam and dynamic_bounds:
        b = np.asarray(dynamic_bounds, dtype=np.float64)  # [M, 2, 3]
        centre = (b[:, 0].min(0) + b[:, 1].max(0)) / 2.0
        return centre + np.array([0.0, cam_height, 0.0])
    return np.array([0.0, cam_height, 0.0])


def reference_view(
    elev_l: float, elev_r: float, ref_azim: float, ref_cam_radius: float, target
) -> Tensor:
    """METHOD §8: the reference camera, elevation (elev_l + elev_r)/2, azimuth ref_azim."""
    return orbit_viewmats((elev_l + elev_r) / 2.0, ref_azim, ref_cam_radius, target)


def method_reference_view(method, target) -> Tensor:
    """:func:`reference_view` of a method's elevations, ``ref_azim`` and ``ref_cam_radius``
    about ``target`` (the reference render, export, evaluate and the preview share it)."""
    return reference_view(
        method.elev_l, method.elev_r, method.ref_azim, method.ref_cam_radius, target
    )


def background_for(invert_bg_prob: float) -> list[float]:
    """Fixed-view renders (reference, export): white unless black backgrounds are always
    drawn (METHOD §20: white if invert_bg_prob ≤ 0, else black)."""
    return [1.0, 1.0, 1.0] if invert_bg_prob <= 0 else [0.0, 0.0, 0.0]


def scene_target(method, doc: dict) -> np.ndarray:
    """METHOD §8's orbit target of a scene (scene.json ``doc``): :func:`camera_target` of the
    method's ``cam_height`` and ``recenter_cam`` over the dynamic objects' rest bounds."""
    dynamic = [o["bounds"] for o in doc["objects"] if o["role"] == "dynamic"]
    return camera_target(method.cam_height, method.recenter_cam, dynamic)
