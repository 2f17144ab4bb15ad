"""The animated glTF ``dynamic_scene.glb`` (METHOD §20), written on the glTF JSON and binary
chunk directly (trimesh and pygltflib have no morph-target animation writer): it copies every
source object's glTF (nodes, meshes, materials, textures, samplers, skins, cameras) into one
file, and gives each mesh node of a dynamic object one morph target per frame k ≥ 1 plus a STEP
animation of its weights. Also the GLB reading helpers its tests and the export stage use.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import mimetypes
import struct
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import numpy as np

from chord.errors import InputError
from chord.io import atomic_path

logger = logging.getLogger(__name__)

GLB_MAGIC = b"glTF"
CHUNK_JSON = 0x4E4F534A
CHUNK_BIN = 0x004E4942
ARRAY_BUFFER = 34962
ELEMENT_ARRAY_BUFFER = 34963
FLOAT = 5126
COMPONENTS = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT2": 4, "MAT3": 9, "MAT4": 16}
# extensions whose data we cannot carry over correctly: decompress or flatten the file first
UNSUPPORTED = {
    "KHR_draco_mesh_compression",
    "EXT_meshopt_compression",
    "KHR_meshopt_compression",
    "EXT_mesh_gpu_instancing",
}
DROPPED = {"KHR_lights_punctual", "KHR_materials_variants"}  # root-level data we do not copy


def read_glb(path: Path | str) -> tuple[dict, bytes]:
    """The JSON document and the binary chunk (b"" if none) of a GLB file."""
    data = Path(path).read_bytes()
    if len(data) < 20 or data[:4] != GLB_MAGIC:
        raise InputError(f"{path}: not a GLB file (binary glTF must start with 'glTF')")
    version, length = struct.unpack_from("<II", data, 4)
    if version != 2 or length > len(data):
        raise InputError(f"{path}: GLB version {version}, length {length}: expected glTF 2.0")
    doc, blob, pos = None, b"", 12
    while pos + 8 <= length:
        size, kind = struct.unpack_from("<II", data, pos)
        chunk = data[pos + 8 : pos + 8 + size]
        if kind == CHUNK_JSON and doc is None:
            try:
                doc = json.loads(chunk.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise InputError(f"{path}: unreadable glTF JSON chunk ({exc})") from exc
        elif kind == CHUNK_BIN and not blob:
            blob = chunk
        pos += 8 + size
    if doc is None:
        raise InputError(f"{path}: GLB without a JSON chunk")
    return doc, blob


def write_glb(path: Path | str, doc: dict, blob: bytes) -> None:
    """A GLB of ``doc`` and one binary chunk (padded to 4 bytes), written atomically."""
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 4)
    blob = bytes(blob) + b"\0" * (-len(blob) % 4)
    body = struct.pack("<II", len(text), CHUNK_JSON) + text
    if blob:
        body += struct.pack("<II", len(blob), CHUNK_BIN) + blob
    with atomic_path(path, suffix=".glb") as tmp:
        Path(tmp).write_bytes(struct.pack("<4sII", GLB_MAGIC, 2, 12 + len(body)) + body)


def node_matrix(node: dict) -> np.ndarray:
    """A glTF node's local transform [4, 4]: ``matrix`` (column-major) or T·R·S."""
    if "matrix" in node:
        return np.asarray(node["matrix"], dtype=np.float64).reshape(4, 4).T
    x, y, z, w = node.get("rotation", (0.0, 0.0, 0.0, 1.0))
    R = np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )
    M = np.eye(4)
    M[:3, :3] = R * np.asarray(node.get("scale", (1.0, 1.0, 1.0)), dtype=np.float64)[None]
    M[:3, 3] = node.get("translation", (0.0, 0.0, 0.0))
    return M


def world_matrices(doc: dict, roots: list[int]) -> dict[int, np.ndarray]:
    """World transforms [4, 4] of every node under ``roots``."""
    out, stack = {}, [(r, np.eye(4)) for r in roots]
    while stack:
        i, parent = stack.pop()
        if i in out:
            raise InputError(f"node {i} is reached twice: the node graph is not a forest")
        out[i] = parent @ node_matrix(doc["nodes"][i])
        stack.extend((c, out[i]) for c in doc["nodes"][i].get("children", []))
    return out


def read_accessor(doc: dict, blob: bytes, index: int) -> np.ndarray:
    """Accessor ``index`` as an array [count, width] (float64; normalised integers scaled),
    honouring byteStride and sparse substitution."""
    acc = doc["accessors"][index]
    kind, width, count = COMPONENTS[acc["componentType"]], WIDTH[acc["type"]], acc["count"]
    dt = np.dtype(kind)
    if "bufferView" in acc and count:
        view = doc["bufferViews"][acc["bufferView"]]
        start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
        stride = view.get("byteStride", dt.itemsize * width)
        raw = np.frombuffer(blob, dtype=np.uint8, count=stride * (count - 1) + dt.itemsize * width,
                            offset=start)  # fmt: skip
        rows = np.lib.stride_tricks.as_strided(raw, (count, dt.itemsize * width), (stride, 1))
        out = np.ascontiguousarray(rows).view(dt).reshape(count, width).astype(np.float64)
    else:
        out = np.zeros((count, width))
    if "sparse" in acc:
        sp = acc["sparse"]
        idx_acc = {"componentType": sp["indices"]["componentType"], "type": "SCALAR"}
        val_acc = {"componentType": acc["componentType"], "type": acc["type"]}
        n = sp["count"]
        tmp = {"accessors": [], "bufferViews": doc["bufferViews"]}
        for part, spec in (("indices", idx_acc), ("values", val_acc)):
            tmp["accessors"].append(
                {
                    **spec,
                    "count": n,
                    "bufferView": sp[part]["bufferView"],
                    "byteOffset": sp[part].get("byteOffset", 0),
                }
            )
        idx = read_accessor(tmp, blob, 0)[:, 0].astype(np.int64)
        out[idx] = read_accessor(tmp, blob, 1)
    if acc.get("normalized") and acc["componentType"] != FLOAT:
        info = np.iinfo(dt)
        out = np.maximum(out / info.max, -1.0)
    return out


class GltfBuilder:
    """A glTF document under construction with one binary buffer."""

    def __init__(self, generator: str = "chord-pipeline"):
        self.doc: dict = {"asset": {"version": "2.0", "generator": generator}}
        self.blob = bytearray()

    def _list(self, key: str) -> list:
        return self.doc.setdefault(key, [])

    def add(self, key: str, item: dict) -> int:
        items = self._list(key)
        items.append(item)
        return len(items) - 1

    def add_bytes(self, data: bytes, *, align: int = 16) -> int:
        """Append raw bytes to the buffer; returns their offset."""
        self.blob.extend(b"\0" * (-len(self.blob) % align))
        offset = len(self.blob)
        self.blob.extend(data)
        return offset

    def add_view(self, data: bytes, *, target: int | None = None) -> int:
        view = {"buffer": 0, "byteOffset": self.add_bytes(data), "byteLength": len(data)}
        if target is not None:
            view["target"] = target
        return self.add("bufferViews", view)

    def add_accessor(self, array: np.ndarray, kind: str, *, target: int | None = None) -> int:
        """A float32 accessor of ``array`` [count, width] (or [count] for SCALAR) with
        min/max."""
        a = np.ascontiguousarray(np.asarray(array, dtype=np.float32).reshape(len(array), -1))
        if a.shape[1] != WIDTH[kind]:
            raise ValueError(f"accessor {kind}: got rows of {a.shape[1]} values")
        acc = {
            "bufferView": self.add_view(a.tobytes(), target=target),
            "componentType": FLOAT,
            "count": int(a.shape[0]),
            "type": kind,
        }
        if len(a):
            acc["min"] = [float(v) for v in a.min(0)]
            acc["max"] = [float(v) for v in a.max(0)]
        return self.add("accessors", acc)

    def to_glb(self, path: Path | str) -> None:
        doc = copy.deepcopy(self.doc)
        if self.blob:
            doc["buffers"] = [{"byteLength": len(self.blob)}]
        write_glb(path, doc, bytes(self.blob))


def _remap_texture_refs(value, tex: Callable[[int], int]):
    """Material JSON with every ``*Texture: {"index": i}`` remapped (extensions included)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k.endswith("Texture") and isinstance(v, dict) and "index" in v:
                v = {**v, "index": tex(v["index"])}
            out[k] = _remap_texture_refs(v, tex)
        return out
    if isinstance(value, list):
        return [_remap_texture_refs(v, tex) for v in value]
    return value


def _buffer_bytes(buf: dict, i: int, blob: bytes, folder: Path, where: str) -> bytes:
    uri = buf.get("uri")
    if uri is None:
        if i != 0 or not blob:
            raise InputError(f"{where}: buffer {i} has no uri and is not the GLB binary chunk")
        data = blob
    elif uri.startswith("data:"):
        data = base64.b64decode(uri.split(",", 1)[1])
    else:
        path = folder / unquote(uri)
        if not path.is_file():
            raise InputError(f"{where}: buffer {i} refers to {path}, which does not exist")
        data = path.read_bytes()
    if len(data) < buf["byteLength"]:
        raise InputError(f"{where}: buffer {i} holds {len(data)} bytes, not {buf['byteLength']}")
    return data[: buf["byteLength"]]


def merge_gltf(out: GltfBuilder, path: Path, name: str) -> tuple[dict, int]:
    """Copy the default scene of the GLB ``path`` into ``out`` under a new root node ``name``.

    Returns (the node index map {source index: new index}, the new root's index). Animations
    are not copied (the output is animated by its morph targets); lights and material
    variants are dropped; compressed or GPU-instanced meshes are an error.
    """
    path = Path(path)
    doc, blob = read_glb(path)
    used = set(doc.get("extensionsUsed", []))
    bad = sorted(used & UNSUPPORTED)
    if bad:
        raise InputError(
            f"{path}: uses {bad}; decompress and flatten it first "
            "(e.g. gltf-transform copy --no-... or Blender)"
        )
    if doc.get("animations"):
        logger.warning("%s: its %d animation(s) are not exported", path, len(doc["animations"]))
    dropped = sorted(used & DROPPED)
    if dropped:
        logger.warning("%s: %s are not exported", path, dropped)
    # 1. buffers -> one buffer; each source buffer keeps its internal alignment
    base = [
        out.add_bytes(_buffer_bytes(b, i, blob, path.parent, str(path)))
        for i, b in enumerate(doc.get("buffers", []))
    ]
    offs = {key: len(out.doc.get(key, [])) for key in _ARRAYS}

    def idx(key: str, i: int) -> int:
        return offs[key] + i

    for v in doc.get("bufferViews", []):
        v = {**v, "buffer": 0, "byteOffset": base[v["buffer"]] + v.get("byteOffset", 0)}
        out.add("bufferViews", v)
    for a in doc.get("accessors", []):
        a = copy.deepcopy(a)
        if "bufferView" in a:
            a["bufferView"] = idx("bufferViews", a["bufferView"])
        if "sparse" in a:
            for part in ("indices", "values"):
                a["sparse"][part]["bufferView"] = idx(
                    "bufferViews", a["sparse"][part]["bufferView"]
                )
        out.add("accessors", a)
    for im in doc.get("images", []):
        im = dict(im)
        if "bufferView" in im:
            im["bufferView"] = idx("bufferViews", im["bufferView"])
        elif not im.get("uri", "").startswith("data:"):  # embed an external image file
            file = path.parent / unquote(im.pop("uri"))
            if not file.is_file():
                raise InputError(f"{path}: image {file} does not exist")
            im["bufferView"] = out.add_view(file.read_bytes())
            im["mimeType"] = mimetypes.guess_type(file.name)[0] or "image/png"
        out.add("images", im)
    for s in doc.get("samplers", []):
        out.add("samplers", dict(s))
    for t in doc.get("textures", []):
        t = copy.deepcopy(t)
        if "sampler" in t:
            t["sampler"] = idx("samplers", t["sampler"])
        if "source" in t:
            t["source"] = idx("images", t["source"])
        for ext in t.get("extensions", {}).values():
            if isinstance(ext, dict) and "source" in ext:
                ext["source"] = idx("images", ext["source"])
        out.add("textures", t)
    for m in doc.get("materials", []):
        out.add("materials", _remap_texture_refs(m, lambda i: idx("textures", i)))
    for mesh in doc.get("meshes", []):
        mesh = copy.deepcopy(mesh)
        for p in mesh["primitives"]:
            p["attributes"] = {k: idx("accessors", v) for k, v in p["attributes"].items()}
            if "indices" in p:
                p["indices"] = idx("accessors", p["indices"])
            if "material" in p:
                p["material"] = idx("materials", p["material"])
            if "targets" in p:
                p["targets"] = [
                    {k: idx("accessors", v) for k, v in t.items()} for t in p["targets"]
                ]
            for ext in DROPPED:
                p.get("extensions", {}).pop(ext, None)
            if "extensions" in p and not p["extensions"]:
                del p["extensions"]
        out.add("meshes", mesh)
    for c in doc.get("cameras", []):
        out.add("cameras", dict(c))
    for sk in doc.get("skins", []):
        sk = dict(sk)
        sk["joints"] = [idx("nodes", j) for j in sk["joints"]]
        if "skeleton" in sk:
            sk["skeleton"] = idx("nodes", sk["skeleton"])
        if "inverseBindMatrices" in sk:
            sk["inverseBindMatrices"] = idx("accessors", sk["inverseBindMatrices"])
        out.add("skins", sk)
    node_map = {}
    for i, n in enumerate(doc.get("nodes", [])):
        n = copy.deepcopy(n)
        for key, arr in (("mesh", "meshes"), ("skin", "skins"), ("camera", "cameras")):
            if key in n:
                n[key] = idx(arr, n[key])
        if "children" in n:
            n["children"] = [idx("nodes", c) for c in n["children"]]
        for ext in DROPPED:
            n.get("extensions", {}).pop(ext, None)
        if "extensions" in n and not n["extensions"]:
            del n["extensions"]
        node_map[i] = out.add("nodes", n)
    scenes = doc.get("scenes", [])
    roots = scenes[doc.get("scene", 0)].get("nodes", []) if scenes else []
    root = out.add("nodes", {"name": name, "children": [node_map[r] for r in roots]})
    for ext in sorted(used - DROPPED):
        if ext not in out.doc.setdefault("extensionsUsed", []):
            out.doc["extensionsUsed"].append(ext)
    for ext in sorted(set(doc.get("extensionsRequired", [])) - DROPPED):
        if ext not in out.doc.setdefault("extensionsRequired", []):
            out.doc["extensionsRequired"].append(ext)
    return node_map, root


_ARRAYS = (
    "bufferViews",
    "accessors",
    "images",
    "samplers",
    "textures",
    "materials",
    "meshes",
    "cameras",
    "skins",
    "nodes",
)

# A deformer maps normalised rest points [n, 3] to their positions [F, n, 3] in frames
# 0..F-1 (frame 0 the rest points themselves).
Deformer = Callable[[np.ndarray], np.ndarray]


def _morph_mesh(
    out: GltfBuilder,
    mesh_index: int,
    M: np.ndarray,
    centre: np.ndarray,
    scale: float,
    deformer: Deformer,
    frames: int,
    where: str,
) -> None:
    """Give every primitive of mesh ``mesh_index`` (placed by world matrix M) one POSITION
    morph target per frame k ≥ 1 (METHOD §20's vertex mapping); its default weights are 0."""
    mesh = out.doc["meshes"][mesh_index]
    A_inv = np.linalg.inv(M[:3, :3])
    cache: dict[int, list[int]] = {}
    for p in mesh["primitives"]:
        if "POSITION" not in p["attributes"]:
            raise InputError(f"{where}: a primitive of mesh {mesh_index} has no POSITION")
        if p.get("targets"):
            logger.warning("%s: replacing the source's morph targets of mesh %d", where, mesh_index)
        pos = p["attributes"]["POSITION"]
        if pos not in cache:
            if out.doc["accessors"][pos]["componentType"] != FLOAT:
                raise InputError(f"{where}: quantised POSITION in mesh {mesh_index}")
            v_l = read_accessor(out.doc, bytes(out.blob), pos)  # [n, 3]
            v_n = ((v_l @ M[:3, :3].T + M[:3, 3]) - centre) * scale  # [n, 3]
            X = np.asarray(deformer(v_n), dtype=np.float64)  # [F, n, 3]
            if X.shape != (frames, *v_n.shape):
                raise ValueError(f"deformer returned {X.shape}, expected {(frames, *v_n.shape)}")
            # v_l^k − v_l = M⁻¹·(v_n^k/s + c) − M⁻¹·(v_n^0/s + c) = A⁻¹·(v_n^k − v_n^0)/s
            delta = ((X[1:] - X[:1]) / scale) @ A_inv.T  # [F-1, n, 3]
            cache[pos] = [out.add_accessor(d, "VEC3", target=ARRAY_BUFFER) for d in delta]
        p["targets"] = [{"POSITION": a} for a in cache[pos]]
    mesh["weights"] = [0.0] * (frames - 1)


def _set_view_targets(doc: dict) -> None:
    """Mark a buffer view read by a single vertex-attribute accessor, or only by index
    accessors, as such where a source left ``target`` out (the validator's
    BUFFER_VIEW_TARGET_MISSING hint); views with any other use are left alone."""
    role: dict[int, int] = {}  # accessor -> its use in a mesh
    for mesh in doc.get("meshes", []):
        for p in mesh["primitives"]:
            for a in [
                *p["attributes"].values(),
                *(a for t in p.get("targets", []) for a in t.values()),
            ]:
                role[a] = ARRAY_BUFFER
            if "indices" in p:
                role[p["indices"]] = ELEMENT_ARRAY_BUFFER
    users: dict[int, list] = {}  # view -> the uses of the accessors and images that read it
    for i, a in enumerate(doc.get("accessors", [])):
        if "bufferView" in a:
            users.setdefault(a["bufferView"], []).append(role.get(i))
        for part in ("indices", "values") if "sparse" in a else ():
            users.setdefault(a["sparse"][part]["bufferView"], []).append(None)
    for im in doc.get("images", []):
        if "bufferView" in im:
            users.setdefault(im["bufferView"], []).append(None)
    for view, uses in users.items():
        if "target" in doc["bufferViews"][view] or None in uses or len(set(uses)) != 1:
            continue
        if uses[0] == ELEMENT_ARRAY_BUFFER or len(uses) == 1:
            doc["bufferViews"][view]["target"] = uses[0]


def dynamic_scene_glb(
    out_path: Path | str,
    objects: list[tuple[str, Path, Deformer | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """METHOD §20: write the animated glTF of a scene.

    Args:
        objects: (name, source GLB, deformer or None for an unanimated object) in id order;
            excluded objects are simply not listed.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F = min(T, lst_frame) frames; frame k ≥ 1 is morph target k.
        fps: key k sits at k/fps; STEP interpolation.

    Returns a summary: {"nodes": animated node count, "targets": F − 1, "frames": F}.
    """
    if frames < 1:
        raise ValueError(f"frames: expected at least 1, got {frames}")
    if not objects:
        raise InputError(f"{out_path}: no objects to export")
    out = GltfBuilder()
    c = np.asarray(centre, dtype=np.float64)
    roots, animated = [], []
    for name, path, deformer in objects:
        node_map, root = merge_gltf(out, Path(path), name)
        roots.append(root)
        if deformer is None or frames < 2:
            continue
        world = world_matrices(out.doc, [root])
        placed = [n for n in sorted(world) if "mesh" in out.doc["nodes"][n]]
        seen: set[int] = set()
        for n in placed:  # a mesh shared by several nodes: one copy per node
            node = out.doc["nodes"][n]
            if node["mesh"] in seen:
                node["mesh"] = out.add("meshes", copy.deepcopy(out.doc["meshes"][node["mesh"]]))
            seen.add(node["mesh"])
        for n in placed:
            mesh = out.doc["nodes"][n]["mesh"]
            _morph_mesh(out, mesh, world[n], c, scale, deformer, frames, str(path))
        animated += placed
    _set_view_targets(out.doc)
    out.doc["scenes"] = [{"nodes": roots}]
    out.doc["scene"] = 0
    if animated:
        times = np.arange(frames, dtype=np.float64) / fps  # key k at k/fps
        onehot = np.zeros((frames, frames - 1))
        onehot[np.arange(1, frames), np.arange(frames - 1)] = 1.0  # all zeros at k = 0
        t_acc = out.add_accessor(times, "SCALAR")
        w_acc = out.add_accessor(onehot.reshape(-1), "SCALAR")
        anim = {"name": "motion", "samplers": [], "channels": []}
        for n in animated:
            anim["samplers"].append({"input": t_acc, "output": w_acc, "interpolation": "STEP"})
            anim["channels"].append(
                {"sampler": len(anim["samplers"]) - 1, "target": {"node": n, "path": "weights"}}
            )
        out.doc["animations"] = [anim]
    for key in [k for k, v in out.doc.items() if v == []]:
        del out.doc[key]
    out.to_glb(out_path)
    return {"nodes": len(animated), "targets": frames - 1 if animated else 0, "frames": frames}
