"""glTF's container and data, read and written on the JSON and the binary chunk directly: GLB
files, node transforms, accessors (strides, sparse substitution, normalised integers) and a
document builder with one buffer. What the source reader (:mod:`chord.gltf.reader`) and the
animated-scene writers (:mod:`chord.gltf.animated_scene`) share."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import numpy as np

from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError

GLB_MAGIC = b"glTF"
CHUNK_JSON = 0x4E4F534A
CHUNK_BIN = 0x004E4942
ARRAY_BUFFER = 34962
ELEMENT_ARRAY_BUFFER = 34963
UNSIGNED_BYTE = 5121
UNSIGNED_SHORT = 5123
UNSIGNED_INT = 5125
FLOAT = 5126
TRS = ("matrix", "translation", "rotation", "scale")
COMPONENTS = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT2": 4, "MAT3": 9, "MAT4": 16}


def read_glb(path: Path | str) -> tuple[dict, bytes]:
    """The JSON document and the binary chunk (b"" if none) of a GLB file."""
    return parse_glb(Path(path).read_bytes(), str(path))


def parse_glb(data: bytes, where: str) -> tuple[dict, bytes]:
    """:func:`read_glb` of a GLB's bytes; a file cut short is refused as such, naming the
    bytes its header or a chunk claims and those it holds; a second BIN chunk is refused
    (a GLB holds at most one)."""
    if data[:4] != GLB_MAGIC:
        raise InputError(f"{where}: not a GLB file (binary glTF must start with 'glTF')")
    if len(data) < 12:
        raise InputError(f"{where}: a GLB file cut short: {len(data)} bytes, less than its header")
    version, length = struct.unpack_from("<II", data, 4)
    if version != 2:
        raise InputError(f"{where}: GLB version {version}: expected glTF 2.0 (version 2)")
    if length > len(data):
        raise InputError(
            f"{where}: a GLB file cut short: its header gives {length} bytes, the file holds "
            f"{len(data)}"
        )
    doc, blob, pos, bins = None, b"", 12, 0
    while pos < length:
        if pos + 8 > length:
            raise InputError(f"{where}: a GLB file cut short: a chunk header at byte {pos}")
        size, kind = struct.unpack_from("<II", data, pos)
        if pos + 8 + size > length:
            raise InputError(
                f"{where}: a GLB file cut short: the chunk at byte {pos} gives {size} bytes, "
                f"past the file's end ({length} bytes)"
            )
        chunk = data[pos + 8 : pos + 8 + size]
        if kind == CHUNK_JSON and doc is None:
            try:
                doc = json.loads(chunk.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                reason = "nested too deep" if isinstance(exc, RecursionError) else exc
                raise InputError(f"{where}: unreadable glTF JSON chunk ({reason})") from exc
        elif kind == CHUNK_BIN:
            if bins:
                raise InputError(
                    f"{where}: a second BIN chunk at byte {pos}; a GLB holds at most one"
                )
            blob, bins = chunk, 1
        pos += 8 + size
    if doc is None:
        raise InputError(f"{where}: GLB without a JSON chunk")
    return doc, blob


def glb_bytes(doc: dict, blob: bytes) -> bytes:
    """A GLB of ``doc`` and one binary chunk (padded to 4 bytes)."""
    text = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 4)
    blob = bytes(blob) + b"\0" * (-len(blob) % 4)
    body = struct.pack("<II", len(text), CHUNK_JSON) + text
    if blob:
        body += struct.pack("<II", len(blob), CHUNK_BIN) + blob
    return struct.pack("<4sII", GLB_MAGIC, 2, 12 + len(body)) + body


def write_glb(path: Path | str, doc: dict, blob: bytes) -> None:
    """A GLB of ``doc`` and one binary chunk, written atomically."""
    with atomic_path(path, suffix=".glb") as tmp:
        Path(tmp).write_bytes(glb_bytes(doc, blob))


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
        if idx.size and idx.max() >= count:
            raise InputError(
                f"accessor {index} (sparse): index {int(idx.max())} is beyond its {count} elements"
            )
        if idx.size > 1 and (np.diff(idx) <= 0).any():  # glTF: strictly increasing
            k = int(np.flatnonzero(np.diff(idx) <= 0)[0])
            raise InputError(
                f"accessor {index} (sparse): index {idx[k + 1]} at position {k + 1} follows "
                f"{idx[k]}; sparse indices must strictly increase"
            )
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

    def add_accessor(
        self,
        array: np.ndarray,
        kind: str,
        *,
        target: int | None = None,
        component: int = FLOAT,
        bounds: bool = True,
    ) -> int:
        """An accessor of ``array`` [count, width] (or [count] for SCALAR) stored as
        ``component`` (float32 by default; an integer type for indices or JOINTS), with
        min/max unless ``bounds`` is False (glTF requires them only for POSITION and
        animation inputs)."""
        dt = np.dtype(COMPONENTS[component])
        a = np.ascontiguousarray(np.asarray(array).reshape(len(array), -1))
        if component != FLOAT:
            info = np.iinfo(dt)
            if len(a) and (a.min() < info.min or a.max() > info.max):
                raise ValueError(f"accessor {kind}: values outside {dt} [{info.min}, {info.max}]")
        a = a.astype(dt)
        if a.shape[1] != WIDTH[kind]:
            raise ValueError(f"accessor {kind}: got rows of {a.shape[1]} values")
        acc = {
            "bufferView": self.add_view(a.tobytes(), target=target),
            "componentType": component,
            "count": int(a.shape[0]),
            "type": kind,
        }
        if bounds and len(a):
            cast = float if component == FLOAT else int
            acc["min"] = [cast(v) for v in a.min(0)]
            acc["max"] = [cast(v) for v in a.max(0)]
        return self.add("accessors", acc)

    def to_glb(self, path: Path | str) -> None:
        doc = copy.deepcopy(self.doc)
        if self.blob:
            doc["buffers"] = [{"byteLength": len(self.blob)}]
        write_glb(path, doc, bytes(self.blob))
