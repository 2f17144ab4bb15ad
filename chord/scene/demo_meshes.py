"""The demo scenes' meshes and textures (for :mod:`chord.scene.demo`): subdivided boxes and columns
with uv rectangles, their procedural textures, and the ground slab whose top face is the plane
``y = SLAB_TOP_Y``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

if TYPE_CHECKING:  # imported where used, not here: the DAG build imports this module
    import trimesh

SLAB_TOP_Y = 0.0
SLAB_EXTENTS = (2.0, 0.08, 1.4)


# Box faces: (origin, u edge, v edge) in units of the extents, with u x v pointing outward.
BOX_FACES: dict[str, tuple[tuple[float, ...], ...]] = {
    "+z": ((-0.5, 0.0, 0.5), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)),
    "-z": ((0.5, 0.0, -0.5), (-1.0, 0.0, 0.0), (0.0, 1.0, 0.0)),
    "+x": ((0.5, 0.0, 0.5), (0.0, 0.0, -1.0), (0.0, 1.0, 0.0)),
    "-x": ((-0.5, 0.0, -0.5), (0.0, 0.0, 1.0), (0.0, 1.0, 0.0)),
    "+y": ((-0.5, 1.0, 0.5), (1.0, 0.0, 0.0), (0.0, 0.0, -1.0)),
    "-y": ((-0.5, 0.0, -0.5), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
}


@dataclass
class Part:
    """Triangle soup with per-vertex data: vertices ``[V, 3]``, faces ``[F, 3]``, uv ``[V, 2]``."""

    vertices: np.ndarray
    faces: np.ndarray
    uv: np.ndarray
    tag: np.ndarray  # [V] int, which face/part each vertex belongs to


def _grid(origin, du, dv, nu: int, nv: int, rect) -> tuple[np.ndarray, ...]:
    """Quad grid over ``origin + a du + b dv`` (a, b in [0, 1]); uv mapped into ``rect``."""
    a = np.linspace(0.0, 1.0, nu + 1)
    b = np.linspace(0.0, 1.0, nv + 1)
    aa, bb = np.meshgrid(a, b, indexing="xy")  # [nv+1, nu+1]
    verts = (
        np.asarray(origin)[None, None]
        + aa[..., None] * np.asarray(du)
        + bb[..., None] * np.asarray(dv)
    ).reshape(-1, 3)
    u0, v0, u1, v1 = rect
    uv = np.stack([u0 + (u1 - u0) * aa, v0 + (v1 - v0) * bb], axis=-1).reshape(-1, 2)
    idx = np.arange((nu + 1) * (nv + 1)).reshape(nv + 1, nu + 1)
    a00, a10 = idx[:-1, :-1].ravel(), idx[:-1, 1:].ravel()
    a01, a11 = idx[1:, :-1].ravel(), idx[1:, 1:].ravel()
    faces = np.concatenate([np.stack([a00, a10, a11], 1), np.stack([a00, a11, a01], 1)])
    return verts, faces, uv


def _concat(parts: list[tuple[np.ndarray, ...]]) -> Part:
    verts, faces, uvs, tags = [], [], [], []
    offset = 0
    for i, (v, f, uv) in enumerate(parts):
        verts.append(v)
        faces.append(f + offset)
        uvs.append(uv)
        tags.append(np.full(len(v), i))
        offset += len(v)
    return Part(
        np.concatenate(verts),
        np.concatenate(faces).astype(np.int64),
        np.concatenate(uvs),
        np.concatenate(tags),
    )


def join_parts(parts: list[Part]) -> Part:
    """One part of several (their tags become the part's index)."""
    return _concat([(p.vertices, p.faces, p.uv) for p in parts])


def box_part(extents, subdiv: Mapping[str, tuple[int, int]], rects: Mapping[str, tuple]) -> Part:
    """Box ``extents`` ``(w, h, d)`` centred in x/z with its base at y = 0; faces in
    :data:`BOX_FACES` order, each a subdivided grid with its own uv rectangle."""
    ext = np.asarray(extents, dtype=np.float64)
    parts = []
    for face, (o, du, dv) in BOX_FACES.items():
        nu, nv = subdiv[face]
        parts.append(
            _grid(
                np.multiply(o, ext), np.multiply(du, ext), np.multiply(dv, ext), nu, nv, rects[face]
            )
        )
    return _concat(parts)


def column_part(height: float, r_base: float, r_top: float, n_around: int, n_rings: int) -> Part:
    """Tapered closed cylinder with its base centre at the origin, axis +Y.

    uv layout: side in ``u in [0, 1], v in [0.25, 1]``; top cap disk centred at
    ``(0.125, 0.125)``, bottom cap disk at ``(0.375, 0.125)`` (radius 0.11).
    """
    theta = np.linspace(0.0, 2.0 * np.pi, n_around + 1)
    frac = np.linspace(0.0, 1.0, n_rings + 1)
    tt, ff = np.meshgrid(theta, frac, indexing="xy")
    rr = r_base + (r_top - r_base) * ff
    side_v = np.stack([rr * np.cos(tt), height * ff, -rr * np.sin(tt)], -1).reshape(-1, 3)
    side_uv = np.stack([tt / (2 * np.pi), 0.25 + 0.75 * ff], -1).reshape(-1, 2)
    idx = np.arange(side_v.shape[0]).reshape(n_rings + 1, n_around + 1)
    a00, a10 = idx[:-1, :-1].ravel(), idx[:-1, 1:].ravel()
    a01, a11 = idx[1:, :-1].ravel(), idx[1:, 1:].ravel()
    side_f = np.concatenate([np.stack([a00, a10, a11], 1), np.stack([a00, a11, a01], 1)])
    parts = [(side_v, side_f, side_uv)]
    ring = theta[:-1]
    k = np.arange(n_around)
    for y, r, centre, top in ((height, r_top, 0.125, True), (0.0, r_base, 0.375, False)):
        v = np.concatenate(
            [
                [[0.0, y, 0.0]],
                np.stack([r * np.cos(ring), np.full_like(ring, y), -r * np.sin(ring)], -1),
            ]
        )
        uv = np.concatenate(
            [
                [[centre, 0.125]],
                np.stack([centre + 0.11 * np.cos(ring), 0.125 + 0.11 * np.sin(ring)], -1),
            ]
        )
        nxt = (k + 1) % n_around + 1
        f = (
            np.stack([np.zeros_like(k), k + 1, nxt], 1)
            if top
            else np.stack([np.zeros_like(k), nxt, k + 1], 1)
        )
        parts.append((v, f, uv))
    return _concat(parts)


def _uv_to_px(u: float, v: float, size: tuple[int, int]) -> tuple[float, float]:
    """trimesh uv (v up) to PIL pixel coordinates (row 0 at the top)."""
    return u * size[0], (1.0 - v) * size[1]


def block_texture() -> tuple[Image.Image, dict[str, tuple]]:
    """3 x 2 atlas for the toy block: a distinct striped colour per face, a face on +Z."""
    cell = 64
    size = (3 * cell, 2 * cell)
    img = Image.new("RGB", size, (0, 0, 0))
    draw = ImageDraw.Draw(img)
    colours = {
        "+z": ((235, 170, 40), (250, 215, 120)),  # front: orange, with the face
        "-z": ((60, 110, 210), (140, 180, 245)),  # back: blue
        "+x": ((200, 50, 60), (245, 140, 140)),  # right: red
        "-x": ((60, 160, 80), (150, 220, 150)),  # left: green
        "+y": ((240, 240, 235), (190, 190, 185)),  # top: white
        "-y": ((90, 70, 60), (130, 110, 95)),  # bottom: brown
    }
    rects: dict[str, tuple] = {}
    inset = 2.0 / cell
    for i, face in enumerate(BOX_FACES):
        cx, cy = i % 3, i // 3  # cy = 0 is the top row of the image
        x0, y0 = cx * cell, cy * cell
        base, stripe = colours[face]
        draw.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=base)
        for s in range(0, cell, 16):  # horizontal stripes
            draw.rectangle([x0, y0 + s + 10, x0 + cell - 1, y0 + s + 14], fill=stripe)
        u0, u1 = cx / 3 + inset / 3, (cx + 1) / 3 - inset / 3
        v1, v0 = 1 - cy / 2 - inset / 2, 1 - (cy + 1) / 2 + inset / 2
        rects[face] = (u0, v0, u1, v1)
    # a face on the front (+z) cell: two eyes and a mouth (eyes near the top, v up)
    x0, y0 = 0, 0
    for ex in (18, 46):
        draw.ellipse([x0 + ex - 6, y0 + 12, x0 + ex + 6, y0 + 24], fill=(255, 255, 255))
        draw.ellipse([x0 + ex - 3, y0 + 15, x0 + ex + 3, y0 + 21], fill=(20, 20, 20))
    draw.rectangle([x0 + 20, y0 + 34, x0 + 44, y0 + 38], fill=(120, 20, 20))
    return img, rects


def column_texture() -> Image.Image:
    """Plant-stalk texture: green bands, light vertical veins, a red band near the top."""
    size = (128, 128)
    img = Image.new("RGB", size, (40, 120, 50))
    draw = ImageDraw.Draw(img)
    side_top = 0
    side_bottom = int(round(0.75 * size[1]))  # rows [0, 96) hold the side (v in [0.25, 1])
    for i, row in enumerate(range(side_top, side_bottom, 8)):
        colour = (50, 140, 60) if i % 2 == 0 else (30, 95, 45)
        draw.rectangle([0, row, size[0] - 1, row + 7], fill=colour)
    for col in range(0, size[0], 16):  # veins around the stalk
        draw.rectangle([col, side_top, col + 2, side_bottom - 1], fill=(200, 230, 110))
    draw.rectangle([0, 6, size[0] - 1, 13], fill=(210, 40, 60))  # red band near the top
    # caps: top flower-pink, bottom brown
    for centre, colour in ((0.125, (235, 110, 170)), (0.375, (110, 80, 50))):
        cx, cy = _uv_to_px(centre, 0.125, size)
        r = 0.12 * size[0]
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    return img


def checker_texture(n: int = 8, px: int = 16) -> Image.Image:
    """Checkerboard ``n x n`` squares of ``px`` pixels in two warm greys, blue border."""
    size = n * px
    img = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(img)
    for i in range(n):
        for j in range(n):
            colour = (205, 195, 175) if (i + j) % 2 == 0 else (120, 110, 100)
            draw.rectangle([i * px, j * px, (i + 1) * px - 1, (j + 1) * px - 1], fill=colour)
    draw.rectangle([0, 0, size - 1, size - 1], outline=(50, 70, 140), width=2)
    return img


def textured_mesh(part: Part, image: Image.Image, name: str) -> trimesh.Trimesh:
    import trimesh

    material = trimesh.visual.material.PBRMaterial(
        name=f"{name}_material", baseColorTexture=image, metallicFactor=0.0, roughnessFactor=0.9
    )
    visual = trimesh.visual.TextureVisuals(uv=part.uv, material=material)
    return trimesh.Trimesh(part.vertices, part.faces, visual=visual, process=False)


def slab_part() -> Part:
    """Ground slab ``SLAB_EXTENTS`` with its top face at y = SLAB_TOP_Y (vertices baked)."""
    small = (0.0, 0.0, 0.06, 0.06)  # sides and bottom: a corner of the texture (border colour)
    rects = {f: small for f in BOX_FACES}
    rects["+y"] = (0.0, 0.0, 1.0, 1.0)
    subdiv = {f: (1, 1) for f in BOX_FACES}
    subdiv["+y"] = (14, 10)
    part = box_part(SLAB_EXTENTS, subdiv, rects)
    part.vertices = part.vertices + [0.0, SLAB_TOP_Y - SLAB_EXTENTS[1], 0.0]
    return part
