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
  KTX2 image transcoded to PNG (:mod:`chord.gltf.ktx2`); ``EXT_texture_webp`` /
  ``EXT_texture_avif``:
  the image itself (Pillow decodes both).

A required extension outside these is refused, naming the file, the extension and the fix;
material features that change the look but not the base colour (transmission, sheen,
clearcoat, ...) are warnings (:attr:`Source.warnings`)."""

from __future__ import annotations

import base64
import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.gltf import format_rules
from chord.gltf.container import (
    ARRAY_BUFFER,
    COMPONENTS,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    GLB_MAGIC,
    UNSIGNED_INT,
    WIDTH,
    GltfBuilder,
    glb_bytes,
    parse_glb,
    read_accessor,
)
from chord.gltf.decode import (
    DRACO,
    MESHOPT,
    decode_draco,
    flat_views,
    integer_accessors,
    normalised_values,
)
from chord.gltf.document_checks import Checker, check_depth
from chord.gltf.memory_budget import (
    budget_fix,
    check_budget,
    check_counts,
    mem_budget_mb,
    peak_bytes,
)
from chord.gltf.read_checks import MAX_IMAGE_PIXELS, check_decoded, check_indices, image_pixels
from chord.gltf.textures import (
    IMAGE_EXTENSIONS,
    TRANSFORM,
    bake_base_colour_uvs,
    keep_images,
    plain_images,
    texture_infos,
)
from chord.gltf.uri import is_data, regular_bytes, scene_path

QUANTIZATION = "KHR_mesh_quantization"
INSTANCING = "EXT_mesh_gpu_instancing"
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
#: the largest image file read: the most pixels chord decodes at 8 bytes each (16-bit RGBA
#: stored uncompressed) and 1 MiB of headers and metadata
MAX_IMAGE_FILE_BYTES = MAX_IMAGE_PIXELS * 8 + 2**20
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


def external_files(path: Path | str) -> list[Path]:
    """The files a ``.gltf`` refers to (buffers and images by relative URI), for the
    workflow's inputs; [] for a GLB or a file that cannot be parsed (read reports that). A
    URI that leads outside the scene's folder (or is absolute, or of a scheme but ``data:``)
    is an :class:`InputError` naming the file, the URI and the rule (:mod:`chord.gltf.uri`):
    nothing outside the folder becomes an input."""
    path = Path(path)
    if path.suffix.lower() != ".gltf" or not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return []
    files = []
    for key, what in (("buffers", "buffer"), ("images", "image")):
        items = doc.get(key, []) if isinstance(doc, dict) else []
        for i, item in enumerate(items if isinstance(items, list) else []):
            uri = item.get("uri") if isinstance(item, dict) else None
            if uri is not None and not is_data(uri):
                files.append(scene_path(uri, path.parent, str(path), f"{what} {i}"))
    return files


def _uri_bytes(uri: str, folder: Path, where: str, what: str, length: int | None = None) -> bytes:
    """The bytes a buffer's (``length``: its byteLength, all that is read) or an image's URI
    names: a data URI's, or a regular file's inside the scene's folder (:mod:`chord.gltf.uri`);
    an image file no larger than the largest image chord decodes could be."""
    if is_data(uri):
        try:
            return base64.b64decode(uri.split(",", 1)[1])
        except (IndexError, ValueError) as exc:
            raise InputError(f"{where}: {what} has an unreadable data URI ({exc})") from exc
    file = scene_path(uri, folder, where, what)

    def refuse(why: str):
        raise InputError(f"{where}: {what} refers to {file}, which {why}")

    limit = None
    if length is None:
        limit = (MAX_IMAGE_FILE_BYTES, f"more than an image of the most pixels chord decodes "
                 f"({MAX_IMAGE_PIXELS}) can hold")  # fmt: skip
    return regular_bytes(file, refuse, length=length, limit=limit)


def _load(path: Path, mem_mb: int) -> tuple[dict, list[bytes | None], int]:
    """The JSON (its structure checked), each buffer's bytes (None for a meshopt fallback
    buffer, which has none) and the file's size; a file over ``mem_mb`` is not read."""
    where = str(path)

    def refuse(why: str):
        raise InputError(f"{path}: {why}")

    try:  # the figure for the message; regular_bytes checks the open file
        size = os.stat(path).st_size
    except OSError:
        size = 0
    over = f"more than the ingest job's {mem_mb} MB (its mem_mb); {budget_fix(size)}"
    data = regular_bytes(path, refuse, limit=(mem_mb * 2**20, over))
    size = len(data)
    if data[:4] == GLB_MAGIC:
        doc, blob = parse_glb(data, where)
    else:
        if path.suffix.lower() == ".glb":
            raise InputError(f"{path}: not a GLB file (binary glTF must start with 'glTF')")
        try:
            doc, blob = json.loads(data.decode("utf-8")), b""
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            reason = "nested too deep" if isinstance(exc, RecursionError) else exc
            raise InputError(f"{path}: not a glTF file (unreadable JSON: {reason})") from exc
    asset = doc.get("asset") if isinstance(doc, dict) else None
    if not isinstance(asset, dict) or str(asset.get("version", "")) != "2.0":
        raise InputError(f'{path}: not a glTF 2.0 file (asset.version must be "2.0")')
    check_counts(where, doc, checked=False)  # a million nodes refused before a walk over them
    check_depth(doc, where)
    Checker(doc, where).top()
    # the buffers' declared bytes (each file is read only if it holds exactly those) against
    # the budget before one is read: a .gltf naming one large .bin many times is refused here
    declared = size + sum(b.get("byteLength", 0) for b in doc.get("buffers", []) if "uri" in b)
    check_budget(where, declared, mem_mb)
    buffers: list[bytes | None] = []
    for i, buf in enumerate(doc.get("buffers", [])):
        what = f"buffer {i}"
        exts = buf.get("extensions", {})
        if "uri" in buf:
            data = _uri_bytes(buf["uri"], path.parent, where, what, buf.get("byteLength", 0))
        elif i == 0 and blob:
            data = blob
        elif any(isinstance(exts.get(m), dict) and exts[m].get("fallback") for m in MESHOPT):
            buffers.append(None)
            continue
        else:
            raise InputError(f"{path}: {what} has no uri and is not the GLB's binary chunk")
        if len(data) < buf.get("byteLength", 0):
            raise InputError(f"{path}: {what} holds {len(data)} bytes, not {buf['byteLength']}")
        buffers.append(data)
    return doc, buffers, size


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


# --- images ----------------------------------------------------------------------------------


def _image_bytes(doc: dict, i: int, buffers: list[bytes | None], path: Path) -> bytes:
    im = doc["images"][i]
    if "bufferView" in im:
        view = doc["bufferViews"][im["bufferView"]]
        data = buffers[view["buffer"]]
        if data is None or any(m in view.get("extensions", {}) for m in MESHOPT):
            raise InputError(f"{path}: image {i} is in a meshopt-compressed bufferView")
        start = view.get("byteOffset", 0)
        return data[start : start + view["byteLength"]]
    return _uri_bytes(im["uri"], path.parent, str(path), f"image {i}")


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


def read(path: Path | str, *, mem_mb: int | None = None) -> Source:
    """``path`` made plain (see the module's docstring); an :class:`InputError` of one line
    naming the file for what cannot be read: every number checked against what the file holds
    before it is used (:mod:`chord.gltf.document_checks`, :mod:`chord.gltf.read_checks`), and
    a file whose estimated peak memory exceeds ``mem_mb`` (default ``$CHORD_MEM_MB``, else the
    ingest rule's; :mod:`chord.gltf.memory_budget`) refused, naming the figure."""
    try:
        return _read(Path(path), mem_mb)
    except InputError as exc:
        message = str(exc)
        if "\n" in message or "\r" in message:  # a decoder's message quoted in it
            raise InputError(" ".join(message.split())) from exc
        raise


def _read(path: Path, mem_mb: int | None) -> Source:
    where = str(path)
    budget = mem_budget_mb(mem_mb)
    doc, buffers, size = _load(path, budget)
    checker = Checker(doc, where)
    checker.data([None if b is None else len(b) for b in buffers])
    check_counts(where, doc)  # before an image is opened or an array made
    format_rules.check_counts(doc, where)
    warnings = _check_extensions(doc, where)
    held = sum(len(b) for b in buffers if b is not None)
    images = []
    for i in range(len(doc.get("images", []))):  # what is held checked as each one is read
        images.append(_image_bytes(doc, i, buffers, path))
        check_budget(where, size + held + sum(len(data) for data in images), budget)
    pixels = sum(image_pixels(data, f"{where}: image {i}") for i, data in enumerate(images))
    check_budget(where, peak_bytes(doc, size, held, pixels), budget)
    used = set(doc.get("extensionsUsed", [])) | set(doc.get("extensionsRequired", []))
    views, blob = flat_views(doc, buffers, where)
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
                decoded.update(decode_draco(prim, views, blob, f"{where} mesh {m} primitive {p}"))
    for i, rows in decoded.items():
        check_decoded(where, i, rows, doc["accessors"][i])

    out = GltfBuilder()
    data_keys = ("buffers", "bufferViews", "accessors", "images")
    out.doc.update(copy.deepcopy({k: v for k, v in doc.items() if k not in data_keys}))
    indices, joints = integer_accessors(doc)
    arrays: dict[int, np.ndarray] = {}
    for i, acc in enumerate(doc.get("accessors", [])):
        if i in decoded:
            values = normalised_values(acc, decoded[i])
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
            if values.size and not (np.isfinite(values).all() and values.min() >= 0):
                raise InputError(f"{where}: accessor {i} holds indices that are not whole numbers")
            out.add_accessor(values, acc["type"], target=target, component=comp, bounds=False)
        else:
            out.add_accessor(values, acc["type"], bounds=True)
        for key in ("name", "extras"):
            if key in acc:
                out.doc["accessors"][i][key] = acc[key]
    check_indices(doc, arrays, where)
    format_rules.check_values(doc, arrays, where)
    for mesh in out.doc.get("meshes", []):
        for prim in mesh.get("primitives", []):
            prim.get("extensions", {}).pop(DRACO, None)
            if "extensions" in prim and not prim["extensions"]:
                del prim["extensions"]

    out.doc["images"] = [
        {k: v for k, v in im.items() if k not in ("uri", "bufferView")}
        for im in doc.get("images", [])
    ]
    plain_images(out.doc, images, where)
    keep_images(out, images, where)
    _flatten_instances(out, arrays)
    bake_base_colour_uvs(out, arrays, where)

    still = set()
    for mat in out.doc.get("materials", []):
        for info in texture_infos(mat):
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
