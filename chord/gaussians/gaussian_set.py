"""3D Gaussian sets: surface initialisation from meshes (METHOD §2; PLY I/O:
:mod:`chord.gaussians.ply`).

A :class:`GaussianSet` lives in the normalised object space. Parameters are stored raw, in the
3DGS convention: scales as logs (activated by ``exp``), opacities as logits (activated by
``sigmoid``), rotations as unit quaternions ``(w, x, y, z)`` and colour as real spherical
harmonics with ``sh[:, 0]`` the DC term (``rgb = 0.5 + C0 * dc``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import trimesh

from chord.gaussians import mesh_colour

logger = logging.getLogger(__name__)

#: Zeroth-order real spherical-harmonic constant, 1 / (2 sqrt(pi)).
C0 = 0.28209479177387814

#: Opacity given to every surface-initialised Gaussian (before BLEND alpha).
INIT_OPACITY = 0.95

#: Normal-axis scale as a fraction of the in-plane scale for surface initialisation.
NORMAL_SCALE_RATIO = 0.1


# Opacity is clipped into [eps, 1 - eps] before the logit so fully transparent BLEND samples
# stay finite.
_OPACITY_EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Container
# --------------------------------------------------------------------------------------------


@dataclass
class GaussianSet:
    """METHOD §2. A set of N 3D Gaussians in normalised space (raw 3DGS parameters).

    Fields (all float32, converted on construction):
      means: ``[N, 3]`` centres.
      log_scales: ``[N, 3]`` per-axis log standard deviations (activated by ``exp``).
      quats: ``[N, 4]`` rotations as ``(w, x, y, z)``.
      opacity_logits: ``[N]`` opacities as logits (activated by ``sigmoid``).
      sh: ``[N, (d+1)^2, 3]`` SH coefficients per RGB channel; ``sh[:, 0]`` is the DC term.

    Raises ``ValueError`` naming the field when a shape is wrong or the row counts disagree.
    """

    means: np.ndarray
    log_scales: np.ndarray
    quats: np.ndarray
    opacity_logits: np.ndarray
    sh: np.ndarray

    def __post_init__(self) -> None:
        self.means = _as_f32(self.means)
        self.log_scales = _as_f32(self.log_scales)
        self.quats = _as_f32(self.quats)
        self.opacity_logits = _as_f32(self.opacity_logits)
        self.sh = _as_f32(self.sh)
        n = self.means.shape[0] if self.means.ndim == 2 else -1
        expected = {
            "means": (self.means, (n, 3)),
            "log_scales": (self.log_scales, (n, 3)),
            "quats": (self.quats, (n, 4)),
            "opacity_logits": (self.opacity_logits, (n,)),
        }
        for name, (arr, shape) in expected.items():
            if arr.shape != shape or n < 0:
                raise ValueError(
                    f"GaussianSet.{name}: expected shape {_fmt_shape(shape)}, got {arr.shape}"
                )
        if self.sh.ndim != 3 or self.sh.shape[0] != n or self.sh.shape[2] != 3:
            raise ValueError(
                f"GaussianSet.sh: expected shape [N={n}, (d+1)^2, 3], got {self.sh.shape}"
            )
        k = self.sh.shape[1]
        d = math.isqrt(k) - 1
        if k == 0 or (d + 1) ** 2 != k:
            raise ValueError(f"GaussianSet.sh: coefficient count {k} is not a square (d+1)^2")

    @property
    def sh_degree(self) -> int:
        """METHOD §2. SH degree d, from ``sh`` of shape ``[N, (d+1)^2, 3]``."""
        return math.isqrt(self.sh.shape[1]) - 1

    def __len__(self) -> int:
        return int(self.means.shape[0])


def _as_f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("N" if i == 0 else str(s) for i, s in enumerate(shape)) + "]"


def rgb_to_sh_dc(rgb: np.ndarray) -> np.ndarray:
    """METHOD §2. sRGB colours ``[..., 3]`` in [0, 1] → SH DC coefficients ``(rgb − 0.5)/C0``."""
    return (np.asarray(rgb, dtype=np.float64) - 0.5) / C0


def sh_dc_to_rgb(dc: np.ndarray) -> np.ndarray:
    """METHOD §2. SH DC coefficients ``[..., 3]`` → colours ``0.5 + C0·dc`` (not clipped)."""
    return 0.5 + C0 * np.asarray(dc, dtype=np.float64)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _OPACITY_EPS, 1.0 - _OPACITY_EPS)
    return np.log(p) - np.log1p(-p)


# --------------------------------------------------------------------------------------------
# Surface initialisation
# --------------------------------------------------------------------------------------------


def init_from_mesh(
    parts: Sequence[trimesh.Trimesh], n: int, *, scale: float = 1.0, seed: int = 0
) -> GaussianSet:
    """METHOD §2. Initialise flat, surface-aligned Gaussians on an object's triangle meshes.

    ``parts`` are the object's world-space (already normalised) meshes, each with its own
    trimesh visual, e.g. ``trimesh.load(glb, force="scene").dump(concatenate=False)``. Geometry
    without faces (paths, point clouds) is skipped with a warning.

    ``n`` points are drawn area-weighted across all parts (face ∝ area, then uniform
    barycentrics via the square-root trick; zero-area faces are never drawn), deterministically
    for ``seed``. Each sample becomes one Gaussian:

    * colour: base-colour texture at the interpolated UV (bilinear, REPEAT) × baseColorFactor,
      else vertex colours (× baseColorFactor when a material carries them), else
      baseColorFactor, else 0.5 grey; sRGB in [0, 1], stored as SH degree 0, ``sh [N, 1, 3]``;
    * alpha: ``MASK`` drops samples with alpha < alphaCutoff (so fewer than ``n`` Gaussians
      may be returned, possibly none), ``BLEND`` multiplies the opacity by alpha,
      ``OPAQUE``/unset ignores alpha;
    * rotation ``quats [N, 4]``: local z → the face's geometric normal (winding order);
    * scales: in-plane ``σ_t = scale·sqrt(A/(π·n))`` (A = total area, n = requested count),
      normal ``0.1·σ_t``; ``log_scales [N, 3]``;
    * opacity 0.95 (× alpha for BLEND), stored as a logit.

    Raises ``ValueError`` for ``n < 1``, a non-positive/non-finite ``scale``, non-finite
    vertices, or zero total area.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"init_from_mesh: n must be a positive integer, got {n!r}")
    n = int(n)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"init_from_mesh: scale must be positive and finite, got {scale!r}")
    meshes = _collect_parts(parts)

    # Per-face geometry of every part, in float64.
    tris_all, normals_all, areas_all, part_of_face, face_in_part = [], [], [], [], []
    for p_idx, (label, mesh) in enumerate(meshes):
        verts = np.asarray(mesh.vertices, dtype=np.float64)
        faces = np.asarray(mesh.faces, dtype=np.int64).reshape(-1, 3)
        if not np.all(np.isfinite(verts)):
            raise ValueError(f"init_from_mesh: {label} has non-finite vertices")
        if faces.size and (faces.min() < 0 or faces.max() >= len(verts)):
            raise ValueError(f"init_from_mesh: {label} has face indices out of range")
        tris = verts[faces]  # [F, 3, 3]
        cross = np.cross(tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0])
        norm = np.linalg.norm(cross, axis=1)
        valid = np.isfinite(norm) & (norm > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            unit = cross / norm[:, None]
        valid &= np.all(np.isfinite(unit), axis=1)
        area = np.where(valid, 0.5 * norm, 0.0)
        tris_all.append(tris)
        normals_all.append(np.where(valid[:, None], unit, 0.0))
        areas_all.append(area)
        part_of_face.append(np.full(len(faces), p_idx, dtype=np.int64))
        face_in_part.append(np.arange(len(faces), dtype=np.int64))

    areas = np.concatenate(areas_all) if areas_all else np.zeros(0)
    total_area = float(areas.sum())
    if not np.isfinite(total_area) or total_area <= 0:
        names = ", ".join(label for label, _ in meshes)
        raise ValueError(f"init_from_mesh: zero total surface area over parts [{names}]")
    tris = np.concatenate(tris_all)
    normals = np.concatenate(normals_all)
    part_of_face = np.concatenate(part_of_face)
    face_in_part = np.concatenate(face_in_part)

    # Area-weighted face choice; side="right" on the cumulative sum never lands on a
    # zero-area face (its interval is empty).
    rng = np.random.default_rng(seed)
    cum = np.cumsum(areas)
    face = np.searchsorted(cum, rng.random(n) * cum[-1], side="right")
    face = np.minimum(face, int(np.flatnonzero(areas > 0)[-1]))
    r = rng.random((n, 2))
    s = np.sqrt(r[:, 0])
    bary = np.stack([1.0 - s, s * (1.0 - r[:, 1]), s * r[:, 1]], axis=1)  # [n, 3]

    points = np.einsum("nk,nkc->nc", bary, tris[face])
    normal = normals[face]

    # Colour / alpha per part (each part has its own visual).
    rgb = np.full((n, 3), 0.5)
    alpha = np.ones(n)
    mode = np.zeros(n, dtype=np.int8)
    cutoff = np.full(n, mesh_colour.DEFAULT_ALPHA_CUTOFF)
    tex_cache: dict[int, np.ndarray] = {}
    sample_part = part_of_face[face]
    for p_idx in np.unique(sample_part):
        sel = np.flatnonzero(sample_part == p_idx)
        label, mesh = meshes[p_idx]
        c, a, m, t = mesh_colour.part_colours(
            label, mesh, face_in_part[face[sel]], bary[sel], tex_cache
        )
        rgb[sel], alpha[sel], mode[sel], cutoff[sel] = c, a, m, t

    keep = ~((mode == mesh_colour.MODE_MASK) & (alpha < cutoff))
    opacity = INIT_OPACITY * np.where(mode == mesh_colour.MODE_BLEND, alpha, 1.0)
    n_kept = int(keep.sum())
    if n_kept < n:
        level = logging.WARNING if n_kept == 0 else logging.INFO
        logger.log(level, "init_from_mesh: alpha MASK dropped %d of %d samples", n - n_kept, n)

    sigma_t = scale * math.sqrt(total_area / (math.pi * n))
    log_scales = np.log([sigma_t, sigma_t, NORMAL_SCALE_RATIO * sigma_t])
    quats = _normals_to_quats(normal[keep])
    m = n_kept
    return GaussianSet(
        means=points[keep],
        log_scales=np.broadcast_to(log_scales, (m, 3)),
        quats=quats,
        opacity_logits=_logit(opacity[keep]),
        sh=rgb_to_sh_dc(np.clip(rgb[keep], 0.0, 1.0))[:, None, :],
    )


def _collect_parts(parts: Sequence[trimesh.Trimesh]) -> list[tuple[str, trimesh.Trimesh]]:
    if isinstance(parts, trimesh.Trimesh):
        parts = [parts]
    if isinstance(parts, trimesh.Scene):
        raise ValueError(
            "init_from_mesh: parts is a trimesh.Scene; pass scene.dump(concatenate=False)"
        )
    out = []
    for i, geom in enumerate(parts):
        name = (getattr(geom, "metadata", None) or {}).get("name")
        label = f"part {i}" + (f" ({name!r})" if name else "")
        if not isinstance(geom, trimesh.Trimesh):
            logger.warning(
                "init_from_mesh: skipping %s of type %s (no triangles)", label, type(geom).__name__
            )
            continue
        out.append((label, geom))
    if not out:
        raise ValueError("init_from_mesh: parts contains no triangle meshes")
    return out


def _normals_to_quats(normal: np.ndarray) -> np.ndarray:
    """Unit normals ``[M, 3]`` → quaternions ``[M, 4]`` (w, x, y, z) of frames [t1, t2, n]."""
    m = len(normal)
    axis = np.zeros((m, 3))
    axis[np.arange(m), np.argmin(np.abs(normal), axis=1)] = 1.0
    t1 = np.cross(axis, normal)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    t2 = np.cross(normal, t1)
    rot = np.stack([t1, t2, normal], axis=2)  # columns
    return _rotmats_to_quats(rot)


def _rotmats_to_quats(rot: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[M, 3, 3]`` → unit quaternions ``[M, 4]`` (w ≥ 0), Shepperd's method.

    Each row uses the branch with the largest of (trace, m00, m11, m22), so the divisor is
    never small.
    """
    r = np.asarray(rot, dtype=np.float64).reshape(-1, 3, 3)
    q = np.empty((len(r), 4))
    diag = np.stack([np.trace(r, axis1=1, axis2=2), r[:, 0, 0], r[:, 1, 1], r[:, 2, 2]], axis=1)
    case = np.argmax(diag, axis=1)
    for branch in range(4):
        sel = case == branch
        if not sel.any():
            continue
        m = r[sel]
        m00, m01, m02 = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
        m10, m11, m12 = m[:, 1, 0], m[:, 1, 1], m[:, 1, 2]
        m20, m21, m22 = m[:, 2, 0], m[:, 2, 1], m[:, 2, 2]
        if branch == 0:
            w = 0.5 * np.sqrt(np.maximum(1.0 + m00 + m11 + m22, 0.0))
            d = 4.0 * w
            q[sel] = np.stack([w, (m21 - m12) / d, (m02 - m20) / d, (m10 - m01) / d], axis=1)
        elif branch == 1:
            x = 0.5 * np.sqrt(np.maximum(1.0 + m00 - m11 - m22, 0.0))
            d = 4.0 * x
            q[sel] = np.stack([(m21 - m12) / d, x, (m01 + m10) / d, (m02 + m20) / d], axis=1)
        elif branch == 2:
            y = 0.5 * np.sqrt(np.maximum(1.0 - m00 + m11 - m22, 0.0))
            d = 4.0 * y
            q[sel] = np.stack([(m02 - m20) / d, (m01 + m10) / d, y, (m12 + m21) / d], axis=1)
        else:
            z = 0.5 * np.sqrt(np.maximum(1.0 - m00 - m11 + m22, 0.0))
            d = 4.0 * z
            q[sel] = np.stack([(m10 - m01) / d, (m02 + m20) / d, (m12 + m21) / d, z], axis=1)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[q[:, 0] < 0] *= -1.0
    return q


# --------------------------------------------------------------------------------------------
# PLY I/O (INRIA 3DGS layout)
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Fitted 3DGS import
# --------------------------------------------------------------------------------------------


def to_normalised(g: GaussianSet, centre: np.ndarray, scale: float) -> GaussianSet:
    """METHOD §2. World-space Gaussians → normalised space: ``μ ← (μ − c)·s``,
    ``log_scale ← log_scale + ln s``; ``centre [3]``, ``scale`` s > 0. Rotations, opacities
    and SH are unchanged (copied).
    """
    c = np.asarray(centre, dtype=np.float64)
    if c.shape != (3,) or not np.all(np.isfinite(c)):
        raise ValueError(f"to_normalised: centre must be 3 finite numbers, got {centre!r}")
    s = float(scale)
    if not np.isfinite(s) or s <= 0:
        raise ValueError(f"to_normalised: scale must be positive and finite, got {scale!r}")
    return GaussianSet(
        means=(g.means.astype(np.float64) - c) * s,
        log_scales=g.log_scales.astype(np.float64) + math.log(s),
        quats=g.quats.copy(),
        opacity_logits=g.opacity_logits.copy(),
        sh=g.sh.copy(),
    )


def concat(sets: Sequence[GaussianSet]) -> GaussianSet:
    """METHOD §2. Concatenate Gaussian sets along N; lower-degree ``sh`` is zero-padded to
    the highest degree, giving ``sh [ΣN, (d_max+1)^2, 3]``. Raises ``ValueError`` if empty.
    """
    sets = list(sets)
    if not sets:
        raise ValueError("concat: no GaussianSets given")
    k = max(s.sh.shape[1] for s in sets)
    sh = []
    for s in sets:
        pad = np.zeros((len(s), k, 3), dtype=np.float32)
        pad[:, : s.sh.shape[1]] = s.sh
        sh.append(pad)
    return GaussianSet(
        means=np.concatenate([s.means for s in sets]),
        log_scales=np.concatenate([s.log_scales for s in sets]),
        quats=np.concatenate([s.quats for s in sets]),
        opacity_logits=np.concatenate([s.opacity_logits for s in sets]),
        sh=np.concatenate(sh),
    )
