"""A user's glTF (``.glb``, or ``.gltf`` with external or embedded buffers and images) made plain:
core glTF 2.0 in one GLB buffer that trimesh and our writers read right. The one reader of
every stage: ingest, the colour sampling (through ingest's meshes) and the export's re-reading
of the sources all see what :func:`read` returns, so what ingest accepts, export can write.

What it resolves into core glTF, with the decoders made for it:

- ``KHR_draco_mesh_compression``: DracoPy (Google's Draco decoder);
- ``EXT_meshopt_compression`` / ``KHR_meshopt_compression``: meshopt (meshoptimizer's codec);
- ``KHR_mesh_quantization`` and sparse accessors: every accessor rewritten dense, float32
  (normalised integers scaled), indices and ``JOINTS_n`` keeping their integer types;
- ``EXT_mesh_gpu_instancing``: one child node per instance, with the instance's transform;
- ``KHR_texture_transform`` on the base-colour texture: baked into the UVs it reads, which
  become ``TEXCOORD_0`` (the set trimesh and our colour sampling read; other textures keep
  their own sets and transforms);
- ``KHR_texture_basisu`` (KTX2): the texture's PNG/JPEG fallback where it has one, else its
  KTX2 image transcoded to PNG (:mod:`chord.ktx2`); ``EXT_texture_webp`` / ``EXT_texture_avif``:
  the image itself (Pillow decodes both).

A required extension outside these is refused, naming the file, the extension and the fix;
material features that change the look but not the base colour (transmission, sheen,
clearcoat, ...) are warnings (:attr:`Source.warnings`)."""

from __future__ import annotations

import base64
import copy
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
from PIL import Image

from chord.errors import InputError
from chord.gltf_io import (
    ARRAY_BUFFER,
    COMPONENTS,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    GLB_MAGIC,
    UNSIGNED_INT,
    WIDTH,
    GltfBuilder,
    glb_bytes,
    read_accessor,
    read_glb,
)

SUFFIXES = (".glb", ".gltf")
DRACO = "KHR_draco_mesh_compression"
MESHOPT = ("EXT_meshopt_compression", "KHR_meshopt_compression")
QUANTIZATION = "KHR_mesh_quantization"
INSTANCING = "EXT_mesh_gpu_instancing"
TRANSFORM = "KHR_texture_transform"
BASISU = "KHR_texture_basisu"
IMAGE_EXTENSIONS = {BASISU: "KTX2", "EXT_texture_webp": "WebP", "EXT_texture_avif": "AVIF"}
#: resolved into core glTF by :func:`read`
DECODED = {DRACO, *MESHOPT, QUANTIZATION, INSTANCING, TRANSFORM, *IMAGE_EXTENSIONS}
#: kept as they are: they change neither the geometry nor the base colour (lights and variants
#: are not exported; spec-gloss materials trimesh reads as metal-rough)
HARMLESS = {
    "KHR_lights_punctual",
    "KHR_materials_variants",
    "KHR_materials_emissive_strength",
    "KHR_materials_unlit",
    "KHR_materials_pbrSpecularGlossiness",
    "KHR_xmp_json_ld",
    "KHR_animation_pointer",
    "EXT_lights_image_based",
}
#: material features the Gaussians cannot show (they take the base colour): a warning each
UNRENDERED = {
    "KHR_materials_transmission": "transmission (glass is drawn opaque)",
    "KHR_materials_volume": "volume (thickness and attenuation)",
    "KHR_materials_diffuse_transmission": "diffuse transmission",
    "KHR_materials_sheen": "sheen",
    "KHR_materials_clearcoat": "clearcoat",
    "KHR_materials_iridescence": "iridescence",
    "KHR_materials_anisotropy": "anisotropy",
    "KHR_materials_specular": "specular strength and colour",
    "KHR_materials_ior": "index of refraction",
    "KHR_materials_dispersion": "dispersion",
}
FIX = "re-export it without the extension (e.g. from Blender's glTF exporter)"
TRIANGLES = 4
MODES = {0: "POINTS", 1: "LINES", 2: "LINE_LOOP", 3: "LINE_STRIP", 4: "TRIANGLES",
         5: "TRIANGLE_STRIP", 6: "TRIANGLE_FAN"}  # fmt: skip


@dataclass(frozen=True)
class Source:
    """A source file made plain: its glTF JSON and one binary buffer (GLB layout), the
    extensions resolved, and warnings about what it holds that chord does not show."""

    path: Path
    doc: dict
    blob: bytes
    decoded: tuple[str, ...]
    warnings: tuple[str, ...]

    def glb_bytes(self) -> bytes:
        """The plain file as GLB bytes."""
        return glb_bytes(self.doc, self.blob)


# --- files --------------------------------------------------------------------------------


def is_source(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES


def external_files(path: Path | str) -> list[Path]:
    """The files a ``.gltf`` refers to (buffers and images by relative URI), for the
    workflow's inputs; [] for a GLB or a file that cannot be parsed (read reports that)."""
    path = Path(path)
    if path.suffix.lower() != ".gltf" or not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []
    uris = [x.get("uri") for key in ("buffers", "images") for x in doc.get(key, [])]
    return [path.parent / unquote(u) for u in uris if isinstance(u, str) and ":" not in u[:6]]


def _uri_bytes(uri: str, folder: Path, where: str, what: str) -> bytes:
    if uri.startswith("data:"):
        try:
            return base64.b64decode(uri.split(",", 1)[1])
        except (IndexError, ValueError) as exc:
            raise InputError(f"{where}: {what} has an unreadable data URI ({exc})") from exc
    file = folder / unquote(uri)
    if not file.is_file():
        raise InputError(f"{where}: {what} refers to {file}, which does not exist")
    return file.read_bytes()


def _load(path: Path) -> tuple[dict, list[bytes | None]]:
    """The JSON and each buffer's bytes (None for a meshopt fallback buffer, which has none)."""
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a glTF file")
    if not path.is_file():
        raise InputError(f"{path}: does not exist")
    data = path.read_bytes()
    if data[:4] == GLB_MAGIC:
        doc, blob = read_glb(path)
    else:
        if path.suffix.lower() == ".glb":
            raise InputError(f"{path}: not a GLB file (binary glTF must start with 'glTF')")
        try:
            doc, blob = json.loads(data.decode("utf-8")), b""
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not a glTF file (unreadable JSON: {exc})") from exc
    if not isinstance(doc, dict) or str(doc.get("asset", {}).get("version", "")) != "2.0":
        raise InputError(f'{path}: not a glTF 2.0 file (asset.version must be "2.0")')
    buffers: list[bytes | None] = []
    for i, buf in enumerate(doc.get("buffers", [])):
        what = f"buffer {i}"
        if "uri" in buf:
            data = _uri_bytes(buf["uri"], path.parent, str(path), what)
        elif i == 0 and blob:
            data = blob
        elif any(buf.get("extensions", {}).get(m, {}).get("fallback") for m in MESHOPT):
            buffers.append(None)
            continue
        else:
            raise InputError(f"{path}: {what} has no uri and is not the GLB's binary chunk")
        if len(data) < buf.get("byteLength", 0):
            raise InputError(f"{path}: {what} holds {len(data)} bytes, not {buf['byteLength']}")
        buffers.append(data)
    return doc, buffers


# --- extensions ---------------------------------------------------------------------------


def _check_extensions(doc: dict, where: str) -> list[str]:
    """Refuse what cannot be read; warnings for what is ignored or not rendered."""
    used = set(doc.get("extensionsUsed", []))
    required = set(doc.get("extensionsRequired", []))
    known = DECODED | HARMLESS | set(UNRENDERED)
    refused = sorted(required - known)
    if refused:
        raise InputError(f"{where}: uses {refused[0]}, which chord cannot read; {FIX}")
    warnings = [
        f"{where}: ignores the optional extension {ext} (not supported)"
        for ext in sorted(used - required - known)
    ]
    for i, mat in enumerate(doc.get("materials", [])):
        for ext in sorted(set(mat.get("extensions", {})) & set(UNRENDERED)):
            warnings.append(
                f"{where}: material {mat.get('name') or i} uses {ext}: its {UNRENDERED[ext]} is "
                "not rendered (the Gaussians take its base colour)"
            )
    return warnings


# --- buffer views and accessors -------------------------------------------------------------


def _meshopt(ext: dict, buffers: list[bytes | None], where: str) -> bytes:
    try:
        import meshopt
    except ImportError as exc:
        raise InputError(
            f"{where}: uses EXT_meshopt_compression; decoding it needs the meshopt package "
            "(`pip install meshopt`, Python 3.11 or later)"
        ) from exc
    data = buffers[ext["buffer"]]
    if data is None:
        raise InputError(f"{where}: a meshopt bufferView reads from a fallback buffer")
    start = ext.get("byteOffset", 0)
    raw = data[start : start + ext["byteLength"]]
    count, stride = ext["count"], ext["byteStride"]
    mode, filt = ext.get("mode", "ATTRIBUTES"), ext.get("filter", "NONE")
    try:
        rows = meshopt.decode_gltf_buffer(raw, count, stride, mode, filt)
    except ValueError as exc:
        raise InputError(f"{where}: cannot decode a meshopt bufferView ({exc})") from exc
    return np.ascontiguousarray(rows).tobytes()


def _flat_views(doc: dict, buffers: list[bytes | None], where: str) -> tuple[list[dict], bytes]:
    """Every bufferView's bytes (meshopt decoded) laid end to end in one blob, and views
    pointing into it, so :func:`chord.gltf_io.read_accessor` reads any accessor."""
    views, blob = [], bytearray()
    for i, view in enumerate(doc.get("bufferViews", [])):
        ext = next(
            (view["extensions"][m] for m in MESHOPT if m in view.get("extensions", {})), None
        )
        if ext is not None:
            data = _meshopt(ext, buffers, f"{where} bufferView {i}")
            stride = ext["byteStride"]
        else:
            src = buffers[view["buffer"]] if view["buffer"] < len(buffers) else None
            if src is None:
                raise InputError(f"{where}: bufferView {i} reads from a buffer without data")
            start = view.get("byteOffset", 0)
            data = src[start : start + view["byteLength"]]
            if len(data) < view["byteLength"]:
                raise InputError(f"{where}: bufferView {i} runs past the end of its buffer")
            stride = view.get("byteStride")
        blob.extend(b"\0" * (-len(blob) % 4))
        flat = {"buffer": 0, "byteOffset": len(blob), "byteLength": len(data)}
        if stride:
            flat["byteStride"] = stride
        views.append(flat)
        blob.extend(data)
    return views, bytes(blob)


def _draco(prim: dict, views: list[dict], blob: bytes, where: str) -> dict[int, np.ndarray]:
    """{accessor index: decoded rows} of one Draco primitive (its attributes and indices)."""
    try:
        import DracoPy
    except ImportError as exc:
        raise InputError(
            f"{where}: uses {DRACO}; decoding it needs DracoPy (`pip install DracoPy`)"
        ) from exc
    ext = prim["extensions"][DRACO]
    view = views[ext["bufferView"]]
    data = blob[view["byteOffset"] : view["byteOffset"] + view["byteLength"]]
    try:
        mesh = DracoPy.decode(data)
    except Exception as exc:  # DracoPy raises its own failure types
        raise InputError(f"{where}: cannot decode its Draco data ({exc})") from exc
    names = {ident: name for name, ident in ext.get("attributes", {}).items()}
    out = {}
    for attr in mesh.attributes:
        name = names.get(attr["unique_id"])
        if name in prim.get("attributes", {}):
            rows = np.asarray(attr["data"])
            out[prim["attributes"][name]] = rows.reshape(len(rows), -1)
    if "indices" in prim:
        faces = np.asarray(getattr(mesh, "faces", []))
        out[prim["indices"]] = faces.reshape(-1, 1)
    missing = sorted(
        set(ext.get("attributes", {}))
        - {names[a["unique_id"]] for a in mesh.attributes if a["unique_id"] in names}
    )
    if missing:
        raise InputError(f"{where}: its Draco data lacks the attributes {missing}")
    return out


def _integer_accessors(doc: dict) -> tuple[set[int], set[int]]:
    """Accessors that keep an integer type: (indices, JOINTS_n)."""
    indices, joints = set(), set()
    for mesh in doc.get("meshes", []):
        for prim in mesh.get("primitives", []):
            if "indices" in prim:
                indices.add(prim["indices"])
            attrs = prim.get("attributes", {})
            joints.update(v for k, v in attrs.items() if k.startswith("JOINTS_"))
    return indices, joints


def _normalised_values(acc: dict, rows: np.ndarray) -> np.ndarray:
    """Draco gives a normalised integer attribute as its stored integers: scale them as
    glTF does."""
    if acc.get("normalized") and acc["componentType"] != FLOAT and rows.dtype.kind in "iu":
        info = np.iinfo(np.dtype(COMPONENTS[acc["componentType"]]))
        return np.maximum(rows.astype(np.float64) / info.max, -1.0)
    return rows.astype(np.float64)


# --- texture transform ---------------------------------------------------------------------


def texture_transform(uv: np.ndarray, ext: dict) -> np.ndarray:
    """KHR_texture_transform on glTF UVs [n, 2]: T(offset) · R(rotation) · S(scale) · uv, the
    rotation matrix [[cos r, sin r], [−sin r, cos r]] as the extension defines it."""
    ox, oy = ext.get("offset", (0.0, 0.0))
    sx, sy = ext.get("scale", (1.0, 1.0))
    r = float(ext.get("rotation", 0.0))
    c, s = math.cos(r), math.sin(r)
    u, v = uv[:, 0] * sx, uv[:, 1] * sy
    return np.stack([c * u + s * v + ox, -s * u + c * v + oy], axis=1)


def _texture_infos(mat: dict):
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


def _tex_set(info: dict) -> int:
    ext = info.get("extensions", {}).get(TRANSFORM, {})
    return int(ext.get("texCoord", info.get("texCoord", 0)))


def _bake_base_colour_uvs(out: GltfBuilder, arrays: dict[int, np.ndarray], where: str) -> None:
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
            src = _tex_set(base)
            attrs = prim["attributes"]
            if (ext is None and src == 0) or f"TEXCOORD_{src}" not in attrs:
                continue  # nothing to bake, or no UVs (the colour sampling warns)
            baked = arrays[attrs[f"TEXCOORD_{src}"]]
            if ext is not None:
                baked = texture_transform(baked, ext)
            others = [i for i in _texture_infos(mat) if i is not base and _tex_set(i) == 0]
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
            _edit_material(new, moved)
            if new is not mat:
                target = out.add("materials", new)
                for prim in prims:
                    prim["material"] = target


def _edit_material(mat: dict, moved: int | None) -> None:
    """The base colour without texCoord and transform; the textures that read set 0 moved to
    set ``moved``."""
    base = mat["pbrMetallicRoughness"]["baseColorTexture"]
    base.pop("texCoord", None)
    base.get("extensions", {}).pop(TRANSFORM, None)
    if not base.get("extensions", {}):
        base.pop("extensions", None)
    if moved is None:
        return
    for info in _texture_infos(mat):
        if info is not base and _tex_set(info) == 0:
            info["texCoord"] = moved
            info.get("extensions", {}).get(TRANSFORM, {}).pop("texCoord", None)


# --- images ----------------------------------------------------------------------------------


def _image_bytes(doc: dict, i: int, views: list[dict], blob: bytes, path: Path) -> bytes:
    im = doc["images"][i]
    if "bufferView" in im:
        v = views[im["bufferView"]]
        return blob[v["byteOffset"] : v["byteOffset"] + v["byteLength"]]
    if "uri" in im:
        return _uri_bytes(im["uri"], path.parent, str(path), f"image {i}")
    raise InputError(f"{path}: image {i} has neither a bufferView nor a uri")


def _plain_images(doc: dict, images: list[bytes], where: str) -> None:
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
                from chord import ktx2

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


# --- instancing -------------------------------------------------------------------------------


def _flatten_instances(out: GltfBuilder, arrays: dict[int, np.ndarray]) -> None:
    """EXT_mesh_gpu_instancing: the node's mesh moves to one child per instance, each with
    that instance's translation, rotation and scale (applied before the node's transform)."""
    nodes = out.doc.get("nodes", [])
    for node in list(nodes):
        ext = node.get("extensions", {}).pop(INSTANCING, None)
        if not node.get("extensions", {}):
            node.pop("extensions", None)
        if ext is None or "mesh" not in node:
            continue
        attrs = ext.get("attributes", {})
        count = next(len(arrays[a]) for a in attrs.values()) if attrs else 1
        trs = {
            "translation": arrays.get(attrs.get("TRANSLATION")),
            "rotation": arrays.get(attrs.get("ROTATION")),
            "scale": arrays.get(attrs.get("SCALE")),
        }
        mesh = node.pop("mesh")
        children = []
        for k in range(count):
            child = {"name": f"{node.get('name', 'instance')}_{k}", "mesh": mesh}
            for key, values in trs.items():
                if values is not None:
                    child[key] = [float(x) for x in values[k]]
            if "skin" in node:
                child["skin"] = node["skin"]
            children.append(out.add("nodes", child))
        node.pop("skin", None)
        node["children"] = node.get("children", []) + children


# --- the reader -----------------------------------------------------------------------------


def read(path: Path | str) -> Source:
    """``path`` made plain (see the module's docstring); an :class:`InputError` naming the
    file for what cannot be read."""
    path = Path(path)
    where = str(path)
    doc, buffers = _load(path)
    warnings = _check_extensions(doc, where)
    used = set(doc.get("extensionsUsed", [])) | set(doc.get("extensionsRequired", []))
    views, blob = _flat_views(doc, buffers, where)
    flat = {**doc, "bufferViews": views}

    decoded: dict[int, np.ndarray] = {}
    for m, mesh in enumerate(doc.get("meshes", [])):
        for p, prim in enumerate(mesh.get("primitives", [])):
            if DRACO in prim.get("extensions", {}):
                if prim.get("targets"):
                    raise InputError(
                        f"{where}: mesh {m} primitive {p} has morph targets with Draco "
                        "compression, which the extension does not define; re-export it "
                        "without Draco"
                    )
                decoded.update(_draco(prim, views, blob, f"{where} mesh {m} primitive {p}"))

    out = GltfBuilder()
    data_keys = ("buffers", "bufferViews", "accessors", "images")
    out.doc.update(copy.deepcopy({k: v for k, v in doc.items() if k not in data_keys}))
    indices, joints = _integer_accessors(doc)
    arrays: dict[int, np.ndarray] = {}
    for i, acc in enumerate(doc.get("accessors", [])):
        if i in decoded:
            values = _normalised_values(acc, decoded[i])
        else:
            try:
                values = read_accessor(flat, blob, i)
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                raise InputError(f"{where}: accessor {i} cannot be read ({exc})") from exc
        if acc["type"] not in WIDTH or values.shape[1] != WIDTH[acc["type"]]:
            raise InputError(
                f"{where}: accessor {i} has rows of {values.shape[1]}, not {acc['type']}"
            )
        arrays[i] = values
        if i in indices or i in joints:
            comp = acc["componentType"] if acc["componentType"] != FLOAT else UNSIGNED_INT
            if values.size and values.max() > np.iinfo(np.dtype(COMPONENTS[comp])).max:
                comp = UNSIGNED_INT
            target = ELEMENT_ARRAY_BUFFER if i in indices else ARRAY_BUFFER
            out.add_accessor(values, acc["type"], target=target, component=comp, bounds=False)
        else:
            out.add_accessor(values, acc["type"], bounds=True)
        for key in ("name", "extras"):
            if key in acc:
                out.doc["accessors"][i][key] = acc[key]
    for mesh in out.doc.get("meshes", []):
        for prim in mesh.get("primitives", []):
            prim.get("extensions", {}).pop(DRACO, None)
            if "extensions" in prim and not prim["extensions"]:
                del prim["extensions"]

    images = [_image_bytes(doc, i, views, blob, path) for i in range(len(doc.get("images", [])))]
    out.doc["images"] = [
        {k: v for k, v in im.items() if k not in ("uri", "bufferView")}
        for im in doc.get("images", [])
    ]
    _plain_images(out.doc, images, where)
    _keep_images(out, images, where)
    _flatten_instances(out, arrays)
    _bake_base_colour_uvs(out, arrays, where)

    still = set()
    for mat in out.doc.get("materials", []):
        for info in _texture_infos(mat):
            if TRANSFORM in info.get("extensions", {}):
                still.add(TRANSFORM)
    resolved = (used & (DECODED - {TRANSFORM})) | ((used & {TRANSFORM}) - still)
    for key in ("extensionsUsed", "extensionsRequired"):
        kept = [e for e in doc.get(key, []) if e not in resolved]
        if kept:
            out.doc[key] = kept
        else:
            out.doc.pop(key, None)
    _check_triangles(out.doc, where)
    out.doc["buffers"] = [{"byteLength": len(out.blob)}] if out.blob else []
    if not out.doc["buffers"]:
        del out.doc["buffers"]
    return Source(path, out.doc, bytes(out.blob), tuple(sorted(resolved)), tuple(warnings))


def _keep_images(out: GltfBuilder, images: list[bytes], where: str) -> None:
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
        im.setdefault("mimeType", _mime(images[i], f"{where}: image {i}"))
        kept.append(im)
    for tex in doc.get("textures", []):
        if "source" in tex:
            tex["source"] = renumber[tex["source"]]
    doc["images"] = kept
    if not kept:
        del doc["images"]


def _mime(data: bytes, where: str) -> str:
    try:
        fmt = Image.open(io.BytesIO(data)).format
    except Exception as exc:  # Pillow raises several types for unreadable images
        raise InputError(f"{where} cannot be read ({exc})") from exc
    return Image.MIME.get(fmt, "image/png")


def _check_triangles(doc: dict, where: str) -> None:
    """A file whose meshes hold no triangles is refused, naming the primitive modes it has."""
    modes = {
        prim.get("mode", TRIANGLES)
        for mesh in doc.get("meshes", [])
        for prim in mesh.get("primitives", [])
    }
    if modes and not modes & {4, 5, 6}:
        kinds = ", ".join(MODES.get(m, str(m)) for m in sorted(modes))
        raise InputError(f"{where}: holds no triangles, only {kinds} primitives")
