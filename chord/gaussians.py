"""3D Gaussian sets: surface initialisation from meshes, INRIA-layout PLY I/O (METHOD §2).

A :class:`GaussianSet` lives in the normalised object space. Parameters are stored raw, in the
3DGS convention: scales as logs (activated by ``exp``), opacities as logits (activated by
``sigmoid``), rotations as unit quaternions ``(w, x, y, z)`` and colour as real spherical
harmonics with ``sh[:, 0]`` the DC term (``rgb = 0.5 + C0 * dc``).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trimesh
from PIL import Image
from plyfile import PlyData, PlyElement

from chord.io import atomic_path

logger = logging.getLogger(__name__)

#: Zeroth-order real spherical-harmonic constant, 1 / (2 sqrt(pi)).
C0 = 0.28209479177387814

#: Opacity given to every surface-initialised Gaussian (before BLEND alpha).
INIT_OPACITY = 0.95

#: Normal-axis scale as a fraction of the in-plane scale for surface initialisation.
NORMAL_SCALE_RATIO = 0.1

#: glTF default for ``alphaCutoff``.
DEFAULT_ALPHA_CUTOFF = 0.5

#: Number of ``f_rest_*`` properties for SH degree 0..3 (3 * ((d + 1)^2 - 1)).
_REST_COUNT_TO_DEGREE = {0: 0, 9: 1, 24: 2, 45: 3}

# Opacity is clipped into [eps, 1 - eps] before the logit so fully transparent BLEND samples
# stay finite.
_OPACITY_EPS = 1e-6

_MODE_OPAQUE, _MODE_MASK, _MODE_BLEND = 0, 1, 2

_ITERATION_RE = re.compile(r"^iteration_(\d+)$")


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
    cutoff = np.full(n, DEFAULT_ALPHA_CUTOFF)
    tex_cache: dict[int, np.ndarray] = {}
    sample_part = part_of_face[face]
    for p_idx in np.unique(sample_part):
        sel = np.flatnonzero(sample_part == p_idx)
        label, mesh = meshes[p_idx]
        c, a, m, t = _part_colours(label, mesh, face_in_part[face[sel]], bary[sel], tex_cache)
        rgb[sel], alpha[sel], mode[sel], cutoff[sel] = c, a, m, t

    keep = ~((mode == _MODE_MASK) & (alpha < cutoff))
    opacity = INIT_OPACITY * np.where(mode == _MODE_BLEND, alpha, 1.0)
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


# ---- colour sources -------------------------------------------------------------------------


def _part_colours(
    label: str,
    mesh: trimesh.Trimesh,
    faces: np.ndarray,
    bary: np.ndarray,
    tex_cache: dict[int, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Colour of samples on one part: rgb ``[m, 3]``, alpha ``[m]``, mode ``[m]``, cutoff ``[m]``.

    ``faces [m]`` are face indices into ``mesh``, ``bary [m, 3]`` the barycentrics.
    """
    m = len(faces)
    rgb = np.full((m, 3), 0.5)
    alpha = np.ones(m)
    mode = np.full(m, _MODE_OPAQUE, dtype=np.int8)
    cutoff = np.full(m, DEFAULT_ALPHA_CUTOFF)
    visual = mesh.visual
    mesh_faces = np.asarray(mesh.faces, dtype=np.int64)

    if isinstance(visual, trimesh.visual.ColorVisuals):
        kind = visual.kind
        if kind == "vertex":
            cols = _normalise_colours(visual.vertex_colors, f"{label} vertex_colors")
            rgba = np.einsum("mk,mkc->mc", bary, cols[mesh_faces[faces]])
            rgb, alpha = rgba[:, :3], rgba[:, 3]
        elif kind == "face":
            rgba = _normalise_colours(visual.face_colors, f"{label} face_colors")[faces]
            rgb, alpha = rgba[:, :3], rgba[:, 3]
        return rgb, alpha, mode, cutoff

    if not isinstance(visual, trimesh.visual.TextureVisuals):
        logger.warning(
            "init_from_mesh: %s has unsupported visual %s; using grey", label, type(visual).__name__
        )
        return rgb, alpha, mode, cutoff

    uv = getattr(visual, "uv", None)
    if uv is not None:
        uv = np.asarray(uv, dtype=np.float64)
        if uv.ndim != 2 or uv.shape[0] != len(mesh.vertices) or uv.shape[1] < 2:
            raise ValueError(
                f"init_from_mesh: {label} has uv of shape {uv.shape} for "
                f"{len(mesh.vertices)} vertices"
            )
        uv = np.einsum("mk,mkc->mc", bary, uv[mesh_faces[faces], :2])
    attrs = getattr(visual, "vertex_attributes", None)
    vcols = attrs["color"] if attrs is not None and "color" in attrs else None
    if vcols is not None:
        vcols = _normalise_colours(vcols, f"{label} COLOR_0")
        if len(vcols) != len(mesh.vertices):
            logger.warning(
                "init_from_mesh: %s COLOR_0 has %d rows for %d vertices; ignored",
                label,
                len(vcols),
                len(mesh.vertices),
            )
            vcols = None
        else:
            vcols = np.einsum("mk,mkc->mc", bary, vcols[mesh_faces[faces]])

    material = visual.material
    groups: list[tuple[np.ndarray, object]]
    if isinstance(material, trimesh.visual.material.MultiMaterial):
        face_mat = getattr(visual, "face_materials", None)
        if face_mat is None or len(face_mat) != len(mesh_faces):
            logger.warning(
                "init_from_mesh: %s MultiMaterial without face_materials; using its first material",
                label,
            )
            groups = [(np.arange(m), material.materials[0] if material.materials else None)]
        else:
            idx = np.asarray(face_mat, dtype=np.int64)[faces]
            groups = [(np.flatnonzero(idx == k), material.materials[k]) for k in np.unique(idx)]
    else:
        groups = [(np.arange(m), material)]

    for sel, mat in groups:
        c, a, md, ct = _material_colours(
            label,
            mat,
            len(sel),
            None if uv is None else uv[sel],
            None if vcols is None else vcols[sel],
            tex_cache,
        )
        rgb[sel], alpha[sel], mode[sel], cutoff[sel] = c, a, md, ct
    return rgb, alpha, mode, cutoff


def _material_colours(
    label: str,
    mat: object,
    m: int,
    uv: np.ndarray | None,
    vcols: np.ndarray | None,
    tex_cache: dict[int, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Colour from one material: texture × factor, vertex colours (× factor), factor, grey."""
    tex, factor, alpha_mode, cutoff = None, None, None, None
    if isinstance(mat, trimesh.visual.material.PBRMaterial):
        tex = mat.baseColorTexture
        if mat.baseColorFactor is not None:
            factor = _normalise_colours(
                np.atleast_2d(mat.baseColorFactor), f"{label} baseColorFactor"
            )[0]
        alpha_mode = mat.alphaMode
        cutoff = mat.alphaCutoff
    elif isinstance(mat, trimesh.visual.material.SimpleMaterial):
        # OBJ-style: map_Kd replaces Kd, so the diffuse colour is used only without an image
        # (trimesh fills an unset diffuse with its default grey).
        tex = mat.image
        if tex is None and mat.diffuse is not None:
            factor = _normalise_colours(np.atleast_2d(mat.diffuse), f"{label} diffuse")[0]
    elif mat is not None:
        logger.warning(
            "init_from_mesh: %s has unsupported material %s; using grey", label, type(mat).__name__
        )

    mode = {"MASK": _MODE_MASK, "BLEND": _MODE_BLEND}.get(str(alpha_mode).upper(), _MODE_OPAQUE)
    cut = DEFAULT_ALPHA_CUTOFF if cutoff is None else float(cutoff)
    f = np.ones(4) if factor is None else factor

    if tex is not None and uv is not None:
        key = id(tex)
        if key not in tex_cache:
            tex_cache[key] = _texture_array(tex, label)
        rgba = _sample_bilinear_repeat(tex_cache[key], uv) * f
    elif vcols is not None:
        if tex is not None:
            logger.warning("init_from_mesh: %s has a texture but no UVs; using COLOR_0", label)
        rgba = vcols * f
    elif factor is not None:
        if tex is not None:
            logger.warning("init_from_mesh: %s has a texture but no UVs; using its factor", label)
        rgba = np.broadcast_to(factor, (m, 4))
    else:
        rgba = np.broadcast_to([0.5, 0.5, 0.5, 1.0], (m, 4))
    return rgba[:, :3], rgba[:, 3], mode, cut


def _normalise_colours(cols: np.ndarray, what: str) -> np.ndarray:
    """Colours ``[K, 3|4]`` (uint8/uint16 or float) → float64 RGBA ``[K, 4]`` in [0, 1]."""
    c = np.asarray(cols)
    if c.ndim != 2 or c.shape[1] not in (3, 4):
        raise ValueError(f"init_from_mesh: {what} has shape {c.shape}, expected [K, 3|4]")
    if c.dtype.kind in "iu":
        # glTF normalised integers: uint8 (and plain ints) over 255, uint16 over 65535
        top = 65535.0 if c.dtype.kind == "u" and c.dtype.itemsize == 2 else 255.0
        c = c.astype(np.float64) / top
    else:
        c = c.astype(np.float64)
    if not np.all(np.isfinite(c)):
        raise ValueError(f"init_from_mesh: {what} contains non-finite values")
    c = np.clip(c, 0.0, 1.0)
    if c.shape[1] == 3:
        c = np.concatenate([c, np.ones((len(c), 1))], axis=1)
    return c


def _texture_array(image: Image.Image, label: str) -> np.ndarray:
    """PIL image (RGB/RGBA/L/LA/P/16-bit grey) → float32 RGBA ``[H, W, 4]`` in [0, 1]."""
    if not isinstance(image, Image.Image):
        raise ValueError(
            f"init_from_mesh: {label} texture is {type(image).__name__}, expected a PIL image"
        )
    if image.mode.startswith("I;16"):
        grey = np.asarray(image, dtype=np.float32) / 65535.0
        arr = np.concatenate(
            [np.repeat(grey[..., None], 3, axis=2), np.ones(grey.shape + (1,), np.float32)], axis=2
        )
    else:
        arr = np.asarray(image.convert("RGBA"), dtype=np.float32) / 255.0
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"init_from_mesh: {label} texture is empty")
    return arr


def _sample_bilinear_repeat(tex: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Bilinear lookup in ``tex [H, W, C]`` at trimesh UVs ``[m, 2]`` with REPEAT wrap.

    trimesh flips V on glTF load, so v = 0 is the bottom image row: the glTF/OpenGL texel
    coordinate is (u·W − 0.5, (1 − v)·H − 0.5) with texel centres at integers.
    """
    h, w = tex.shape[:2]
    x = uv[:, 0] * w - 0.5
    y = (1.0 - uv[:, 1]) * h - 0.5
    x0f, y0f = np.floor(x), np.floor(y)
    fx, fy = (x - x0f)[:, None], (y - y0f)[:, None]
    x0 = np.mod(x0f.astype(np.int64), w)
    y0 = np.mod(y0f.astype(np.int64), h)
    x1, y1 = (x0 + 1) % w, (y0 + 1) % h
    top = tex[y0, x0] * (1 - fx) + tex[y0, x1] * fx
    bottom = tex[y1, x0] * (1 - fx) + tex[y1, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float64)


# --------------------------------------------------------------------------------------------
# PLY I/O (INRIA 3DGS layout)
# --------------------------------------------------------------------------------------------


def _ply_property_names(sh_degree: int) -> list[str]:
    n_rest = 3 * ((sh_degree + 1) ** 2 - 1)
    return (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(n_rest)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )


def write_ply(path: str | os.PathLike, g: GaussianSet) -> None:
    """METHOD §2. Write ``g`` (N Gaussians) as an INRIA-layout binary little-endian PLY.

    Properties, all float32, in order: ``x y z nx ny nz`` (normals zero), ``f_dc_0..2``,
    ``f_rest_*`` channel-major (index ``c·((d+1)^2−1) + (k−1)``), ``opacity`` (logit),
    ``scale_0..2`` (log), ``rot_0..3`` (w, x, y, z). The file is written to a temporary name
    in the same folder and moved into place, so no partial file is left on error.
    Raises ``ValueError`` naming the field if ``g`` holds non-finite values.
    """
    path = Path(path)
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh"):
        if not np.all(np.isfinite(getattr(g, name))):
            raise ValueError(f"write_ply {path}: GaussianSet.{name} contains non-finite values")
    n = len(g)
    k = g.sh.shape[1]
    names = _ply_property_names(g.sh_degree)
    columns = [g.means[:, i] for i in range(3)]
    columns += [np.zeros(n, np.float32)] * 3
    columns += [g.sh[:, 0, c] for c in range(3)]
    columns += [g.sh[:, kk, c] for c in range(3) for kk in range(1, k)]
    columns += [g.opacity_logits]
    columns += [g.log_scales[:, i] for i in range(3)]
    columns += [g.quats[:, i] for i in range(4)]
    assert len(columns) == len(names)
    data = np.empty(n, dtype=[(name, "<f4") for name in names])
    for name, col in zip(names, columns, strict=True):
        data[name] = col
    ply = PlyData([PlyElement.describe(data, "vertex")], text=False, byte_order="<")

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        ply.write(fh)
    logger.debug("wrote %d Gaussians (SH degree %d) to %s", n, g.sh_degree, path)


def read_ply(path: str | os.PathLike, *, sh_degree_cap: int = 3) -> GaussianSet:
    """METHOD §2. Read an INRIA-layout 3DGS PLY into a GaussianSet (``sh [N, (d+1)^2, 3]``).

    The SH degree follows from the ``f_rest_*`` count (0, 9, 24, 45 → d = 0..3) and is then
    capped at ``sh_degree_cap`` (higher coefficients dropped). Normals and extra properties
    are ignored. Raises ``ValueError`` naming the file (and property) for a missing or
    non-PLY file, a missing ``vertex`` element or property, an unsupported ``f_rest`` count,
    or non-finite values.
    """
    path = Path(path)
    if (
        isinstance(sh_degree_cap, bool)
        or not isinstance(sh_degree_cap, (int, np.integer))
        or sh_degree_cap < 0
    ):
        raise ValueError(
            f"read_ply {path}: sh_degree_cap must be an integer >= 0, got {sh_degree_cap!r}"
        )
    if not path.is_file():
        raise ValueError(f"read_ply {path}: file does not exist")
    try:
        with open(path, "rb") as fh:
            ply = PlyData.read(fh, mmap="c")  # fast path; columns are copied below
        vertex = ply["vertex"]
    except KeyError:
        raise ValueError(f"read_ply {path}: no 'vertex' element") from None
    except Exception as exc:  # plyfile raises a variety of parse errors
        raise ValueError(f"read_ply {path}: not a readable PLY file ({exc})") from exc

    present = {prop.name for prop in vertex.properties}
    rest_names = sorted(
        (p for p in present if re.fullmatch(r"f_rest_\d+", p)),
        key=lambda p: int(p[len("f_rest_") :]),
    )
    n_rest = len(rest_names)
    if n_rest not in _REST_COUNT_TO_DEGREE:
        raise ValueError(
            f"read_ply {path}: {n_rest} f_rest_* properties; expected 0, 9, 24 or 45 "
            "(SH degree 0..3)"
        )
    if rest_names != [f"f_rest_{i}" for i in range(n_rest)]:
        raise ValueError(f"read_ply {path}: f_rest_* properties are not numbered 0..{n_rest - 1}")
    degree = _REST_COUNT_TO_DEGREE[n_rest]
    k_file = (degree + 1) ** 2
    degree_out = min(degree, int(sh_degree_cap))
    k_out = (degree_out + 1) ** 2

    def column(name: str) -> np.ndarray:
        if name not in present:
            raise ValueError(f"read_ply {path}: missing vertex property '{name}'")
        try:
            col = np.array(vertex[name], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"read_ply {path}: property '{name}' is not numeric") from exc
        if col.ndim != 1:
            raise ValueError(f"read_ply {path}: property '{name}' is a list, expected scalar")
        if not np.all(np.isfinite(col)):
            raise ValueError(f"read_ply {path}: property '{name}' contains non-finite values")
        return col

    def stack(names: list[str]) -> np.ndarray:
        return np.stack([column(nm) for nm in names], axis=1)

    means = stack(["x", "y", "z"])
    n = len(means)
    sh = np.empty((n, k_out, 3), dtype=np.float32)
    sh[:, 0] = stack(["f_dc_0", "f_dc_1", "f_dc_2"])
    for c in range(3):
        for kk in range(1, k_out):
            sh[:, kk, c] = column(f"f_rest_{c * (k_file - 1) + (kk - 1)}")
    g = GaussianSet(
        means=means,
        log_scales=stack(["scale_0", "scale_1", "scale_2"]),
        quats=stack(["rot_0", "rot_1", "rot_2", "rot_3"]),
        opacity_logits=column("opacity"),
        sh=sh,
    )
    if degree_out < degree:
        logger.debug("read_ply %s: SH degree %d capped to %d", path, degree, degree_out)
    return g


# --------------------------------------------------------------------------------------------
# Fitted 3DGS import
# --------------------------------------------------------------------------------------------


def find_fitted_ply(obj_dir: str | os.PathLike) -> Path:
    """METHOD §2. Locate a fitted 3DGS PLY: ``obj_dir`` itself if it is a ``.ply`` file, else
    ``obj_dir/point_cloud/iteration_<k>/point_cloud.ply`` with the largest integer k.

    Raises ``ValueError`` naming the path and what was expected when nothing matches.
    """
    p = Path(obj_dir)
    if p.is_file():
        if p.suffix.lower() != ".ply":
            raise ValueError(f"find_fitted_ply: {p} is a file but not a .ply")
        return p
    if not p.is_dir():
        raise ValueError(
            f"find_fitted_ply: {p} does not exist (expected a .ply file or a "
            "folder with point_cloud/iteration_<k>/point_cloud.ply)"
        )
    best: tuple[int, Path] | None = None
    pc = p / "point_cloud"
    if pc.is_dir():
        for child in pc.iterdir():
            match = _ITERATION_RE.match(child.name)
            candidate = child / "point_cloud.ply"
            if match and candidate.is_file():
                k = int(match.group(1))
                if best is None or k > best[0]:
                    best = (k, candidate)
    if best is None:
        raise ValueError(
            f"find_fitted_ply: folder {p} has no point_cloud/iteration_<k>/point_cloud.ply"
        )
    logger.debug("find_fitted_ply: %s -> iteration %d", p, best[0])
    return best[1]


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
