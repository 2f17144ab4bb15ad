"""A glTF's textures made plain (for :mod:`chord.gltf.reader`): ``KHR_texture_transform`` on
the base colour baked into the UVs it reads, KTX2 (``KHR_texture_basisu``: the fallback, else
transcoded by :mod:`chord.gltf.ktx2`), WebP and AVIF images as PNG, and the images a texture reads
kept in the output buffer."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
from PIL import Image

from chord.core.errors import InputError
from chord.gltf.container import (
    ARRAY_BUFFER,
    GltfBuilder,
)

TRANSFORM = "KHR_texture_transform"
BASISU = "KHR_texture_basisu"
IMAGE_EXTENSIONS = {BASISU: "KTX2", "EXT_texture_webp": "WebP", "EXT_texture_avif": "AVIF"}


def texture_transform(uv: np.ndarray, ext: dict) -> np.ndarray:
    """KHR_texture_transform on glTF UVs [n, 2]: T(offset) · R(rotation) · S(scale) · uv, the
    rotation matrix [[cos r, sin r], [−sin r, cos r]] as the extension defines it."""
    ox, oy = ext.get("offset", (0.0, 0.0))
    sx, sy = ext.get("scale", (1.0, 1.0))
    r = float(ext.get("rotation", 0.0))
    c, s = math.cos(r), math.sin(r)
    u, v = uv[:, 0] * sx, uv[:, 1] * sy
    return np.stack([c * u + s * v + ox, -s * u + c * v + oy], axis=1)


def texture_infos(mat: dict):
    """Every texture reference (a dict with ``index``) in a material, extensions included."""
    stack = [mat]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key.endswith("Texture") and isinstance(item, dict) and "index" in item:
                    yield item
                stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)


def texture_set(info: dict) -> int:
    ext = info.get("extensions", {}).get(TRANSFORM, {})
    return int(ext.get("texCoord", info.get("texCoord", 0)))


def bake_base_colour_uvs(out: GltfBuilder, arrays: dict[int, np.ndarray], where: str) -> None:
    """Make each textured primitive's base colour read TEXCOORD_0 with no transform: its
    transformed UVs become TEXCOORD_0; the old TEXCOORD_0 moves to a free set for the other
    textures that read it. A material is edited in place, or copied per primitive layout
    where its primitives need different edits."""
    doc = out.doc
    edits: dict[int, dict[int | None, list[dict]]] = {}  # material -> moved set -> primitives
    for mesh in doc.get("meshes", []):
        for prim in mesh.get("primitives", []):
            if "material" not in prim:
                continue
            mat = doc["materials"][prim["material"]]
            base = mat.get("pbrMetallicRoughness", {}).get("baseColorTexture")
            if base is None:
                continue
            ext = base.get("extensions", {}).get(TRANSFORM)
            src = texture_set(base)
            attrs = prim["attributes"]
            if (ext is None and src == 0) or f"TEXCOORD_{src}" not in attrs:
                continue  # nothing to bake, or no UVs (the colour sampling warns)
            baked = arrays[attrs[f"TEXCOORD_{src}"]]
            if ext is not None:
                baked = texture_transform(baked, ext)
            others = [i for i in texture_infos(mat) if i is not base and texture_set(i) == 0]
            moved = None
            if "TEXCOORD_0" in attrs and others:
                moved = 1 + max(int(k.split("_")[1]) for k in attrs if k.startswith("TEXCOORD_"))
                attrs[f"TEXCOORD_{moved}"] = attrs["TEXCOORD_0"]
            attrs["TEXCOORD_0"] = out.add_accessor(baked, "VEC2", target=ARRAY_BUFFER, bounds=False)
            edits.setdefault(prim["material"], {}).setdefault(moved, []).append(prim)
    for index, by_moved in edits.items():
        for k, (moved, prims) in enumerate(by_moved.items()):
            mat = doc["materials"][index]
            new = mat if k == len(by_moved) - 1 else copy.deepcopy(mat)
            edit_material(new, moved)
            if new is not mat:
                target = out.add("materials", new)
                for prim in prims:
                    prim["material"] = target


def edit_material(mat: dict, moved: int | None) -> None:
    """The base colour without texCoord and transform; the textures that read set 0 moved to
    set ``moved``."""
    base = mat["pbrMetallicRoughness"]["baseColorTexture"]
    base.pop("texCoord", None)
    base.get("extensions", {}).pop(TRANSFORM, None)
    if not base.get("extensions", {}):
        base.pop("extensions", None)
    if moved is None:
        return
    for info in texture_infos(mat):
        if info is not base and texture_set(info) == 0:
            info["texCoord"] = moved
            info.get("extensions", {}).get(TRANSFORM, {}).pop("texCoord", None)


def plain_images(doc: dict, images: list[bytes], where: str) -> None:
    """Textures read their image from ``source``: a KTX2/WebP/AVIF source becomes a PNG (KTX2)
    or stays as Pillow reads it (WebP, AVIF), unless the texture has a fallback source."""
    from PIL import features

    for t_index, tex in enumerate(doc.get("textures", [])):
        exts = tex.get("extensions", {})
        for name, kind in IMAGE_EXTENSIONS.items():
            if name not in exts:
                continue
            ext = exts.pop(name)
            if "source" in tex or "source" not in ext:
                continue  # the fallback image is what we read
            src = ext["source"]
            what = f"{where}: texture {t_index} ({kind} image {src})"
            if name == BASISU:
                from chord.gltf import ktx2

                images[src] = ktx2.to_png(images[src], what)
                doc["images"][src]["mimeType"] = "image/png"
            elif kind == "AVIF" and not features.check("avif"):
                raise InputError(
                    f"{what}: this Pillow cannot decode AVIF; `pip install -U pillow` (11.3 or "
                    "later) or convert the textures: `npx @gltf-transform/cli png IN OUT`"
                )
            tex["source"] = src
        if not exts:
            tex.pop("extensions", None)
    for i, data in enumerate(images):  # every image must open as Pillow reads it
        try:
            Image.open(io.BytesIO(data)).verify()
        except Exception as exc:  # Pillow raises several types for unreadable images
            used = any(t.get("source") == i for t in doc.get("textures", []))
            if used:
                raise InputError(f"{where}: image {i} cannot be read ({exc})") from exc


def keep_images(out: GltfBuilder, images: list[bytes], where: str) -> None:
    """Each image a texture reads (or that is not KTX2) into the buffer; a KTX2 image that only
    a resolved texture's extension read is dropped, the textures' sources renumbered."""
    doc = out.doc
    read = {t["source"] for t in doc.get("textures", []) if "source" in t}
    keep = [
        i for i, im in enumerate(doc["images"]) if i in read or im.get("mimeType") != "image/ktx2"
    ]
    renumber = {old: new for new, old in enumerate(keep)}
    kept = []
    for i in keep:
        im = doc["images"][i]
        im["bufferView"] = out.add_view(images[i])
        im.setdefault("mimeType", mime_type(images[i], f"{where}: image {i}"))
        kept.append(im)
    for tex in doc.get("textures", []):
        if "source" in tex:
            tex["source"] = renumber[tex["source"]]
    doc["images"] = kept
    if not kept:
        del doc["images"]


def mime_type(data: bytes, where: str) -> str:
    try:
        fmt = Image.open(io.BytesIO(data)).format
    except Exception as exc:  # Pillow raises several types for unreadable images
        raise InputError(f"{where} cannot be read ({exc})") from exc
    return Image.MIME.get(fmt, "image/png")
