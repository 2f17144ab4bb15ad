"""A user's glTF checked before a byte of it is used (for :mod:`chord.gltf.reader`): the file is
untrusted input, so every number it gives is checked against what it holds before an array is
allocated or an index followed. Each refusal is one :class:`InputError` line naming the file,
the object (``accessor 3``, ``mesh 0 primitive 1``, ...) and the numbers.

- structure: the JSON no deeper than :data:`MAX_DEPTH`; each top-level array a list of
  objects; every ``extensions`` an object;
- references: every node, mesh, skin, camera, accessor, bufferView, buffer, image, texture,
  sampler and material index an integer within its array; the node graph a forest (one parent
  a node, no cycles, scenes list roots);
- sizes: every bufferView inside its buffer's bytes; every accessor's elements (count, byte
  offset, stride, component type and type) inside its bufferView, sparse indices and values
  too; a primitive's attributes of one count; an accessor without a bufferView (zeros, maybe
  sparse) no longer than the longest accessor the file holds data for (a bufferView, or Draco
  data whose decoded rows are checked against it) or :data:`UNBACKED_FLOOR`.

What is checked once read (indices, decoded rows) or from an image's header is in
:mod:`chord.gltf.read_checks`; the reader's memory estimate and budget in
:mod:`chord.gltf.memory_budget`.
"""

from __future__ import annotations

import math
import re

import numpy as np

from chord.core.errors import InputError
from chord.gltf.container import COMPONENTS, WIDTH
from chord.gltf.uri import shown

MAX_DEPTH = 64  # JSON nesting: glTF's deepest is ~8 (material > extension > texture info > ...)
MAX_COUNT = 2**32 - 1  # glTF's integers are uint32
UNBACKED_FLOOR = 1 << 16  # elements an accessor without a bufferView may have in any file
ARRAYS = ("buffers", "bufferViews", "accessors", "meshes", "nodes", "scenes", "images",
          "textures", "materials", "samplers", "skins", "animations", "cameras")  # fmt: skip
INDEX_TYPES = (5121, 5123, 5125)
MESHOPT = ("EXT_meshopt_compression", "KHR_meshopt_compression")
MESHOPT_MODES = ("ATTRIBUTES", "TRIANGLES", "INDICES")
MESHOPT_FILTERS = ("NONE", "OCTAHEDRAL", "QUATERNION", "EXPONENTIAL", "COLOR")
DRACO = "KHR_draco_mesh_compression"
INSTANCING = "EXT_mesh_gpu_instancing"
INSTANCE_TYPES = {"TRANSLATION": "VEC3", "ROTATION": "VEC4", "SCALE": "VEC3"}
IMAGE_SOURCES = ("KHR_texture_basisu", "EXT_texture_webp", "EXT_texture_avif")
ATTRIBUTE_TYPES = {"POSITION": ("VEC3",), "NORMAL": ("VEC3",), "TANGENT": ("VEC4",),
                   "TEXCOORD": ("VEC2",), "COLOR": ("VEC4", "VEC3"), "JOINTS": ("VEC4",),
                   "WEIGHTS": ("VEC4",)}  # fmt: skip
TRS_LENGTHS = {"matrix": 16, "translation": 3, "rotation": 4, "scale": 3}
SET_NAME = re.compile(r"^(TEXCOORD|COLOR|JOINTS|WEIGHTS)_(\d+)$")


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else "null"
    )


def check_depth(doc, where: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_DEPTH` (copies and walks recurse)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: its JSON is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "extensions" and not isinstance(item, dict):
                    raise InputError(f"{where}: an 'extensions' is {_kind(item)}, not an object")
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


class Checker:
    """The checks of one document; ``where`` names the file in every message."""

    def __init__(self, doc: dict, where: str):
        self.doc, self.where = doc, where

    def fail(self, what: str, why: str):
        raise InputError(f"{self.where}: {what}: {why}")

    # --- values ----------------------------------------------------------------------------

    def _int_field(self, obj: dict, key: str, what: str, required: bool, noun: str):
        """``obj[key]`` if it is there and an integer (None if absent and not required)."""
        if key not in obj:
            if required:
                self.fail(what, f"has no {key}")
            return None
        value = obj[key]
        if type(value) is not int:
            self.fail(what, f"{key} is {shown(value, 40)} ({_kind(value)}), not {noun}")
        return value

    def integer(self, obj: dict, key: str, what: str, lo=0, hi=MAX_COUNT, *, required=False):
        value = self._int_field(obj, key, what, required, "an integer")
        if value is None:
            return None
        if not lo <= value <= hi:
            self.fail(what, f"{key} is {value}, outside [{lo}, {hi}]")
        return value

    def ref(self, obj: dict, key: str, what: str, target: str, *, required=False, within=None):
        """``obj[key]`` as an index into the file's ``target`` array (or ``within``)."""
        items = self.doc.get(target, []) if within is None else within
        value = self._int_field(obj, key, what, required, "an index")
        if value is None:
            return None
        if not 0 <= value < len(items):
            held = f"{len(items)} ({target} 0 to {len(items) - 1})" if items else "no"
            self.fail(what, f"{key} refers to {target} {value}, but the file holds {held} {target}")
        return value

    def typed(self, obj: dict, key: str, what: str, kind: type, *, required=False):
        if key not in obj:
            if required:
                self.fail(what, f"has no {key}")
            return None
        if not isinstance(obj[key], kind) or (kind is not bool and isinstance(obj[key], bool)):
            want = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}[kind]
            self.fail(what, f"{key} is {shown(obj[key], 40)} ({_kind(obj[key])}), not {want}")
        return obj[key]

    def ext(self, obj: dict, name: str, what: str) -> dict | None:
        """The extension ``name`` of ``obj``, None if absent; present, it is an object."""
        exts = obj.get("extensions", {})
        if name not in exts:
            return None
        if not isinstance(exts[name], dict):
            self.fail(what, f"its {name} is {_kind(exts[name])}, not an object")
        return exts[name]

    def numbers(self, obj: dict, key: str, what: str, length: int | None = None) -> None:
        if key not in obj:
            return
        value = obj[key]
        values = value if isinstance(value, list) and length is not None else [value]
        ok = all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in values
        )
        if not ok or (length is not None and len(values) != length):
            want = f"{length} finite numbers" if length is not None else "a finite number"
            self.fail(what, f"{key} is {shown(value, 40)}, not {want}")

    # --- the document -------------------------------------------------------------------------

    def top(self) -> None:
        """The arrays, extension lists and the default scene: before any buffer is read."""
        for key in ARRAYS:
            items = self.typed(self.doc, key, "the file", list) or []
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    self.fail(f"{key}[{i}]", f"is {_kind(item)}, not an object")
        for key in ("extensionsUsed", "extensionsRequired"):
            names = self.typed(self.doc, key, "the file", list) or []
            if not all(isinstance(n, str) for n in names):
                self.fail(key, f"{shown(names, 60)} is not a list of names")
        self.ref(self.doc, "scene", "the file", "scenes")
        for i, buf in enumerate(self.doc.get("buffers", [])):
            self.integer(buf, "byteLength", f"buffer {i}")

    def data(self, sizes: list[int | None]) -> None:
        """Everything else, given each buffer's bytes (None: a meshopt fallback, no data)."""
        for i, view in enumerate(self.doc.get("bufferViews", [])):
            self.view(i, view, sizes)
        accessors = self.doc.get("accessors", [])
        for i, acc in enumerate(accessors):
            self.accessor(i, acc)
        self.draco: set[int] = set()
        for m, mesh in enumerate(self.doc.get("meshes", [])):
            prims = self.typed(mesh, "primitives", f"mesh {m}", list, required=True)
            for p, prim in enumerate(prims):
                self.primitive(f"mesh {m} primitive {p}", prim)
            self.numbers(mesh, "weights", f"mesh {m}", len(mesh.get("weights", [])))
        # Draco's counts are checked against its decoded rows before any zeros are made
        held = [a["count"] for i, a in enumerate(accessors) if "bufferView" in a or i in self.draco]
        bound = max(max(held, default=0), UNBACKED_FLOOR)
        for i, acc in enumerate(accessors):
            if "bufferView" not in acc and i not in self.draco and acc["count"] > bound:
                self.fail(
                    f"accessor {i}",
                    f"count {acc['count']} without a bufferView is more than the {bound} "
                    "elements of the file's longest accessor with data",
                )
        self.nodes()
        for i, scene in enumerate(self.doc.get("scenes", [])):
            for n in self.typed(scene, "nodes", f"scene {i}", list) or []:
                self.ref({"nodes": n}, "nodes", f"scene {i}", "nodes")
                if n in self.parent:
                    self.fail(f"scene {i}", f"lists node {n}, a child of node {self.parent[n]}")
        self.images()
        for i, mat in enumerate(self.doc.get("materials", [])):
            self.material(f"material {i}", mat)
        for i, skin in enumerate(self.doc.get("skins", [])):
            what = f"skin {i}"
            for j in self.typed(skin, "joints", what, list, required=True):
                self.ref({"joint": j}, "joint", what, "nodes")
            self.ref(skin, "inverseBindMatrices", what, "accessors")
            self.ref(skin, "skeleton", what, "nodes")
        for i, anim in enumerate(self.doc.get("animations", [])):
            self.animation(f"animation {i}", anim)

    def view(self, i: int, view: dict, sizes: list[int | None]) -> None:
        what = f"bufferView {i}"
        buf = self.ref(view, "buffer", what, "buffers", required=True)
        start = self.integer(view, "byteOffset", what) or 0
        length = self.integer(view, "byteLength", what, required=True)
        self.integer(view, "byteStride", what, 1, 252)
        ext = next(
            (self.ext(view, m, what) for m in MESHOPT if m in view.get("extensions", {})), None
        )
        if ext is not None:
            what = f"{what} (meshopt)"
            src = self.ref(ext, "buffer", what, "buffers", required=True)
            offset = self.integer(ext, "byteOffset", what) or 0
            size = self.integer(ext, "byteLength", what, required=True)
            count = self.integer(ext, "count", what, 1, required=True)
            stride = self.integer(ext, "byteStride", what, 1, 256, required=True)
            if ext.get("mode", "ATTRIBUTES") not in MESHOPT_MODES:
                self.fail(what, f"mode is {shown(ext['mode'], 40)}, not one of {MESHOPT_MODES}")
            if ext.get("filter", "NONE") not in MESHOPT_FILTERS:
                self.fail(what, f"filter is {shown(ext['filter'], 40)}, not a meshopt filter")
            self._fits(what, offset, size, sizes[src], f"buffer {src}")
            if count * stride > length:
                self.fail(
                    what,
                    f"decodes to {count} x {stride} = {count * stride} bytes, but its byteLength "
                    f"is {length}",
                )
            return
        self._fits(what, start, length, sizes[buf], f"buffer {buf}")

    def _fits(self, what: str, start: int, length: int, size: int | None, whose: str) -> None:
        if size is None:
            self.fail(what, f"reads from {whose}, which holds no data (a meshopt fallback)")
        if start + length > size:
            self.fail(
                what,
                f"bytes {start} to {start + length} run past the end of {whose} ({size} bytes)",
            )

    def _elements(self, what, view_index, offset, count, elem) -> None:
        """``count`` elements of ``elem`` bytes from ``offset`` fit in the bufferView."""
        view = self.doc["bufferViews"][view_index]
        stride = view.get("byteStride") or elem
        if stride < elem:
            self.fail(what, f"elements of {elem} bytes under bufferView {view_index}'s byteStride "
                      f"{stride}")  # fmt: skip
        need = offset + stride * (count - 1) + elem if count else 0
        exts = view.get("extensions", {})
        length = view["byteLength"]
        if any(m in exts for m in MESHOPT):
            ext = next(exts[m] for m in MESHOPT if m in exts)
            length = ext["count"] * ext["byteStride"]
        if need > length:
            self.fail(
                what,
                f"{count} elements of {elem} bytes (stride {stride}) from byte {offset} need "
                f"{need} bytes, but bufferView {view_index} holds {length}",
            )

    def accessor(self, i: int, acc: dict) -> None:
        what = f"accessor {i}"
        comp = acc.get("componentType")
        if type(comp) is not int or comp not in COMPONENTS:
            self.fail(what, f"componentType is {shown(comp, 40)}, not one of {sorted(COMPONENTS)}")
        if not isinstance(acc.get("type"), str) or acc["type"] not in WIDTH:
            self.fail(what, f"type is {shown(acc.get('type'), 40)}, not one of {list(WIDTH)}")
        count = self.integer(acc, "count", what, 1, required=True)
        self.typed(acc, "normalized", what, bool)
        elem = np.dtype(COMPONENTS[comp]).itemsize * WIDTH[acc["type"]]
        view = self.ref(acc, "bufferView", what, "bufferViews")
        offset = self.integer(acc, "byteOffset", what) or 0
        if view is not None:
            self._elements(what, view, offset, count, elem)
        sparse = self.typed(acc, "sparse", what, dict)
        if sparse is None:
            return
        what = f"accessor {i} (sparse)"
        n = self.integer(sparse, "count", what, 1, count, required=True)
        for part in ("indices", "values"):
            spec = self.typed(sparse, part, what, dict, required=True)
            v = self.ref(spec, "bufferView", f"{what} {part}", "bufferViews", required=True)
            start = self.integer(spec, "byteOffset", f"{what} {part}") or 0
            if part == "indices":
                kind = spec.get("componentType")
                if type(kind) is not int or kind not in INDEX_TYPES:
                    self.fail(what, f"indices componentType is {shown(kind, 40)}, not one of "
                              f"{list(INDEX_TYPES)}")  # fmt: skip
                size = np.dtype(COMPONENTS[kind]).itemsize
            else:
                size = elem
            self._elements(f"{what} {part}", v, start, n, size)

    def primitive(self, what: str, prim: dict) -> None:
        if not isinstance(prim, dict):
            self.fail(what, f"is {_kind(prim)}, not an object")
        attrs = self.typed(prim, "attributes", what, dict, required=True)
        counts = {}
        for name in attrs:
            m = SET_NAME.match(name)
            if name.startswith(("TEXCOORD_", "COLOR_", "JOINTS_", "WEIGHTS_")) and (
                m is None or int(m[2]) > 31
            ):
                self.fail(what, f"attribute {shown(name, 40)} is not NAME_<set> (set 0 to 31)")
            index = self.ref(attrs, name, what, "accessors")
            acc = self.doc["accessors"][index]
            kinds = ATTRIBUTE_TYPES.get(m[1] if m else name)
            if kinds and acc["type"] not in kinds:
                self.fail(what, f"{name} is accessor {index} of type {acc['type']}, not {kinds[0]}")
            if name.startswith("JOINTS_") and acc["componentType"] not in INDEX_TYPES:
                self.fail(what, f"{name} is of componentType {acc['componentType']}, not unsigned")
            counts[name] = acc["count"]
        if len(set(counts.values())) > 1:
            self.fail(what, f"its attributes have different counts ({counts})"[:200])
        idx = self.ref(prim, "indices", what, "accessors")
        if idx is not None:
            acc = self.doc["accessors"][idx]
            if acc["type"] != "SCALAR" or acc["componentType"] not in INDEX_TYPES:
                self.fail(what, f"indices accessor {idx} is {acc['type']} of componentType "
                          f"{acc['componentType']}, not unsigned integer SCALAR")  # fmt: skip
        self.ref(prim, "material", what, "materials")
        self.integer(prim, "mode", what, 0, 6)
        for t, target in enumerate(self.typed(prim, "targets", what, list) or []):
            if not isinstance(target, dict):
                self.fail(f"{what} target {t}", f"is {_kind(target)}, not an object")
            for name in target:
                acc = self.ref(target, name, f"{what} target {t}", "accessors")
                if counts and self.doc["accessors"][acc]["count"] != max(counts.values()):
                    self.fail(f"{what} target {t}", f"{name} count differs from the attributes'")
        draco = self.ext(prim, DRACO, what)
        if draco is not None:
            what = f"{what} (Draco)"
            self.ref(draco, "bufferView", what, "bufferViews", required=True)
            ids = self.typed(draco, "attributes", what, dict, required=True)
            for name in ids:
                self.integer(ids, name, what)
            self.draco.update(attrs[name] for name in ids if name in attrs)
            if "indices" in prim:
                self.draco.add(prim["indices"])

    def nodes(self) -> None:
        nodes = self.doc.get("nodes", [])
        self.parent: dict[int, int] = {}
        for i, node in enumerate(nodes):
            what = f"node {i}"
            for child in self.typed(node, "children", what, list) or []:
                self.ref({"children": child}, "children", what, "nodes")
                if child in self.parent or child == i:
                    first = self.parent.get(child, i)
                    self.fail(what, f"node {child} is a child of node {first} and of node {i}: "
                              "the node graph is not a tree")  # fmt: skip
                self.parent[child] = i
            for key in ("mesh", "skin", "camera"):
                self.ref(node, key, what, key + ("es" if key == "mesh" else "s"))
            for key, length in TRS_LENGTHS.items():
                self.numbers(node, key, what, length)
            self.numbers(node, "weights", what, len(node.get("weights", [])))
            ext = self.ext(node, INSTANCING, what)
            if ext is not None:
                self.instancing(f"{what} ({INSTANCING})", ext)
        for i in range(len(nodes)):  # one parent each: a node that never reaches a root cycles
            seen, n = {i}, i
            while n in self.parent:
                n = self.parent[n]
                if n in seen:
                    self.fail(f"node {i}", "is its own ancestor: the node graph has a cycle")
                seen.add(n)

    def instancing(self, what: str, ext) -> None:
        if not isinstance(ext, dict):
            self.fail(what, f"is {_kind(ext)}, not an object")
        attrs = self.typed(ext, "attributes", what, dict) or {}
        counts = set()
        for name, want in INSTANCE_TYPES.items():
            index = self.ref(attrs, name, what, "accessors")
            if index is not None:
                acc = self.doc["accessors"][index]
                if acc["type"] != want:
                    self.fail(what, f"{name} accessor {index} is {acc['type']}, not {want}")
                counts.add(acc["count"])
        if len(counts) > 1:
            self.fail(what, f"its attributes have different counts {sorted(counts)}")

    def images(self) -> None:
        for i, im in enumerate(self.doc.get("images", [])):
            what = f"image {i}"
            self.ref(im, "bufferView", what, "bufferViews")
            self.typed(im, "mimeType", what, str)
            if "bufferView" not in im and "uri" not in im:
                self.fail(what, "has neither a bufferView nor a uri")
        for i, tex in enumerate(self.doc.get("textures", [])):
            what = f"texture {i}"
            self.ref(tex, "source", what, "images")
            self.ref(tex, "sampler", what, "samplers")
            for name in IMAGE_SOURCES:
                ext = self.ext(tex, name, what)
                if ext is not None:
                    self.ref(ext, "source", f"{what} ({name})", "images")
        for i, sampler in enumerate(self.doc.get("samplers", [])):
            for key in ("magFilter", "minFilter", "wrapS", "wrapT"):
                self.integer(sampler, key, f"sampler {i}", 0, 65535)

    def material(self, what: str, mat: dict) -> None:
        stack = [mat]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                for key, item in value.items():
                    if key.endswith("Texture"):
                        if not isinstance(item, dict):
                            self.fail(f"{what} {key}", f"is {_kind(item)}, not an object")
                        self.texture_info(f"{what} {key}", item)
                    elif key.endswith("Factor"):
                        length = len(item) if isinstance(item, list) else None
                        self.numbers(value, key, what, length)
                    if key != "extras":
                        stack.append(item)
            elif isinstance(value, list):
                stack.extend(value)
        pbr = self.typed(mat, "pbrMetallicRoughness", what, dict)
        if pbr is not None:
            self.numbers(pbr, "baseColorFactor", what, 4)
        self.numbers(mat, "alphaCutoff", what)
        self.typed(mat, "alphaMode", what, str)

    def texture_info(self, what: str, info: dict) -> None:
        self.ref(info, "index", what, "textures", required=True)
        self.integer(info, "texCoord", what, 0, 31)
        ext = self.ext(info, "KHR_texture_transform", what)
        if ext is not None:
            self.numbers(ext, "offset", what, 2)
            self.numbers(ext, "scale", what, 2)
            self.numbers(ext, "rotation", what)
            self.integer(ext, "texCoord", what, 0, 31)

    def animation(self, what: str, anim: dict) -> None:
        samplers = self.typed(anim, "samplers", what, list) or []
        for j, s in enumerate(samplers):
            if not isinstance(s, dict):
                self.fail(f"{what} sampler {j}", f"is {_kind(s)}, not an object")
            self.ref(s, "input", f"{what} sampler {j}", "accessors", required=True)
            self.ref(s, "output", f"{what} sampler {j}", "accessors", required=True)
        for j, ch in enumerate(self.typed(anim, "channels", what, list) or []):
            if not isinstance(ch, dict):
                self.fail(f"{what} channel {j}", f"is {_kind(ch)}, not an object")
            self.ref(ch, "sampler", f"{what} channel {j}", "samplers", within=samplers)
            target = self.typed(ch, "target", f"{what} channel {j}", dict) or {}
            self.ref(target, "node", f"{what} channel {j} target", "nodes")
