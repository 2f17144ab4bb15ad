"""A glTF's compressed and quantised geometry made plain (for :mod:`chord.gltf.reader`):
``EXT_meshopt_compression`` / ``KHR_meshopt_compression`` buffer views (meshopt, meshoptimizer's
codec), ``KHR_draco_mesh_compression`` primitives (DracoPy, Google's Draco decoder), and the
scaling of normalised integer accessors (``KHR_mesh_quantization``)."""

from __future__ import annotations

import numpy as np

from chord.core.errors import InputError
from chord.gltf.container import (
    COMPONENTS,
    FLOAT,
)

DRACO = "KHR_draco_mesh_compression"
MESHOPT = ("EXT_meshopt_compression", "KHR_meshopt_compression")


def decode_meshopt(ext: dict, buffers: list[bytes | None], where: str) -> bytes:
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
    except Exception as exc:  # meshopt raises several types on malformed data
        raise InputError(f"{where}: cannot decode a meshopt bufferView ({exc})") from exc
    return np.ascontiguousarray(rows).tobytes()


def flat_views(doc: dict, buffers: list[bytes | None], where: str) -> tuple[list[dict], bytes]:
    """Every bufferView's bytes (meshopt decoded) laid end to end in one blob, and views
    pointing into it, so :func:`chord.gltf.container.read_accessor` reads any accessor."""
    views, blob = [], bytearray()
    for i, view in enumerate(doc.get("bufferViews", [])):
        ext = next(
            (view["extensions"][m] for m in MESHOPT if m in view.get("extensions", {})), None
        )
        if ext is not None:
            data = decode_meshopt(ext, buffers, f"{where} bufferView {i}")
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


def decode_draco(prim: dict, views: list[dict], blob: bytes, where: str) -> dict[int, np.ndarray]:
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
            out[prim["attributes"][name]] = rows.reshape(len(rows), -1 if rows.size else 0)
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


def integer_accessors(doc: dict) -> tuple[set[int], set[int]]:
    """Accessors that keep an integer type: (indices, JOINTS_n)."""
    indices, joints = set(), set()
    for mesh in doc.get("meshes", []):
        for prim in mesh.get("primitives", []):
            if "indices" in prim:
                indices.add(prim["indices"])
            attrs = prim.get("attributes", {})
            joints.update(v for k, v in attrs.items() if k.startswith("JOINTS_"))
    return indices, joints


def normalised_values(acc: dict, rows: np.ndarray) -> np.ndarray:
    """Draco gives a normalised integer attribute as its stored integers: scale them as
    glTF does."""
    if acc.get("normalized") and acc["componentType"] != FLOAT and rows.dtype.kind in "iu":
        info = np.iinfo(np.dtype(COMPONENTS[acc["componentType"]]))
        return np.maximum(rows.astype(np.float64) / info.max, -1.0)
    return rows.astype(np.float64)
