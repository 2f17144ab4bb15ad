"""Colour of surface samples of a textured mesh (METHOD §2, step 2–3): the base-colour texture
at the interpolated UV (bilinear, glTF wrap), times ``baseColorFactor`` and the vertex colours
``COLOR_0`` where present (glTF multiplies them); else vertex colours times the factor; else
``baseColorFactor``; else 0.5 grey; and the glTF alpha mode (OPAQUE, MASK, BLEND) with its
cutoff. sRGB [0, 1], no lighting."""

from __future__ import annotations

import logging

import numpy as np
import trimesh
from PIL import Image

logger = logging.getLogger(__name__)

#: glTF default for ``alphaCutoff``.
DEFAULT_ALPHA_CUTOFF = 0.5

MODE_OPAQUE, MODE_MASK, MODE_BLEND = 0, 1, 2


def part_colours(
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
    mode = np.full(m, MODE_OPAQUE, dtype=np.int8)
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

    mode = {"MASK": MODE_MASK, "BLEND": MODE_BLEND}.get(str(alpha_mode).upper(), MODE_OPAQUE)
    cut = DEFAULT_ALPHA_CUTOFF if cutoff is None else float(cutoff)
    f = np.ones(4) if factor is None else factor

    if tex is not None and uv is not None:
        key = id(tex)
        if key not in tex_cache:
            tex_cache[key] = _texture_array(tex, label)
        rgba = _sample_bilinear_repeat(tex_cache[key], uv) * f
        if vcols is not None:  # glTF: COLOR_0 multiplies the base colour texture
            rgba = rgba * vcols
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
