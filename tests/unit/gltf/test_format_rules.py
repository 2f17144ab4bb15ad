"""glTF's rules the reader no longer waives (issue 47; chord.gltf.format_rules, read_accessor's
sparse indices, parse_glb's chunks): each hostile file below, built from the plain textured box,
is refused by chord.gltf.reader.read (as ingest and ``chord validate`` read) in one line naming
the file, the object and the numbers, while the same file with the rule kept reads."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from chord.gltf import container, reader
from tests.unit.gltf.test_untrusted import box_glb, refused, write


def _add(
    doc: dict, blob: bytes, values, dtype: str, kind: str, component: int
) -> tuple[int, bytes]:
    """``values`` appended as a new accessor (its own bufferView): (its index, the blob)."""
    data = np.ascontiguousarray(values, dtype=dtype).tobytes()
    blob = blob + b"\0" * (-len(blob) % 4)
    doc["bufferViews"].append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(data)})
    count = len(data) // (np.dtype(dtype).itemsize * container.WIDTH[kind])
    acc = {"bufferView": len(doc["bufferViews"]) - 1, "componentType": component,
           "count": count, "type": kind}  # fmt: skip
    doc["accessors"].append(acc)
    blob += data
    doc["buffers"][0]["byteLength"] = len(blob)
    return len(doc["accessors"]) - 1, blob


def skinned(joint: int = 0, ibm_type: str = "MAT4", ibm_count: int = 1):
    """The box skinned to one joint: JOINTS_0 all ``joint``, its inverse-bind accessor of
    ``ibm_count`` ``ibm_type``."""
    doc, blob = box_glb()
    n = doc["accessors"][0]["count"]
    j, blob = _add(doc, blob, np.full((n, 4), [joint, 0, 0, 0]), "u1", "VEC4", 5121)
    w, blob = _add(doc, blob, np.tile([1.0, 0, 0, 0], (n, 1)), "<f4", "VEC4", 5126)
    eye = np.eye(4).reshape(-1)[: container.WIDTH[ibm_type]]
    ibm, blob = _add(doc, blob, np.tile(eye, (ibm_count, 1)), "<f4", ibm_type, 5126)
    doc["meshes"][0]["primitives"][0]["attributes"].update(JOINTS_0=j, WEIGHTS_0=w)
    doc["nodes"].append({"name": "joint"})
    doc["nodes"][1]["children"].append(len(doc["nodes"]) - 1)
    doc["skins"] = [{"joints": [len(doc["nodes"]) - 1], "inverseBindMatrices": ibm}]
    doc["nodes"][0]["skin"] = 0
    return doc, blob


def animated(times, outputs: int | None = None, interpolation: str = "LINEAR"):
    """The box's node translated at ``times`` (``outputs`` values; one per time by default)."""
    doc, blob = box_glb()
    t, blob = _add(doc, blob, np.asarray(times, float)[:, None], "<f4", "SCALAR", 5126)
    k = len(times) if outputs is None else outputs
    v, blob = _add(doc, blob, np.zeros((k, 3)), "<f4", "VEC3", 5126)
    sampler = {"input": t, "output": v, "interpolation": interpolation}
    channel = {"sampler": 0, "target": {"node": 0, "path": "translation"}}
    doc["animations"] = [{"samplers": [sampler], "channels": [channel]}]
    return doc, blob


def sparse(indices):
    """The box's positions with sparse substitutes at ``indices``."""
    doc, blob = box_glb()
    i, blob = _add(doc, blob, np.asarray(indices)[:, None], "<u2", "SCALAR", 5123)
    v, blob = _add(doc, blob, np.zeros((len(indices), 3)), "<f4", "VEC3", 5126)
    doc["accessors"][0]["sparse"] = {
        "count": len(indices),
        "indices": {"bufferView": doc["accessors"][i]["bufferView"], "componentType": 5123},
        "values": {"bufferView": doc["accessors"][v]["bufferView"]},
    }
    return doc, blob


KEPT = {
    "joints": lambda: skinned(),
    "inverse_bind": lambda: skinned(),
    "sparse": lambda: sparse([1, 5]),
    "sampler_counts": lambda: animated([0.0, 0.5, 1.0]),
    "cubic_counts": lambda: animated([0.0, 1.0], 6, "CUBICSPLINE"),
    "times": lambda: animated([0.0, 0.5, 0.5, 1.0]),  # equal times: non-decreasing
}
BROKEN = {
    "joints": (
        lambda: skinned(joint=3),
        "mesh 0 primitive 0: JOINTS_0 (accessor 3) holds joint 3, but node 0's skin 0 has 1 joints",
    ),
    "inverse_bind": (
        lambda: skinned(ibm_type="SCALAR"),
        "skin 0: inverseBindMatrices accessor 5 holds 1 SCALAR of componentType 5126, not 1 "
        "float MAT4 (one per joint)",
    ),
    "inverse_bind_count": (
        lambda: skinned(ibm_count=2),
        "skin 0: inverseBindMatrices accessor 5 holds 2 MAT4 of componentType 5126, not 1",
    ),
    "sparse": (
        lambda: sparse([5, 5]),
        "accessor 0 (sparse): index 5 at position 1 follows 5; sparse indices must strictly "
        "increase",
    ),
    "sparse_decreasing": (lambda: sparse([6, 2]), "index 2 at position 1 follows 6"),
    "sampler_counts": (
        lambda: animated([0.0, 0.5, 1.0], outputs=2),
        "animation 0 channel 0: sampler 0 has 3 input times but 2 output values, not 3",
    ),
    "cubic_counts": (
        lambda: animated([0.0, 1.0], 2, "CUBICSPLINE"),
        "sampler 0 has 2 input times but 2 output values, not 6 (3 per time",
    ),
    "nan_time": (
        lambda: animated([0.0, float("nan"), 1.0]),
        "animation 0 sampler 0: input accessor 3 holds nan at key 1, not a finite time",
    ),
    "decreasing_time": (
        lambda: animated([0.0, 1.0, 0.5]),
        "time 0.5 at key 2 comes before 1 at key 1; times must not decrease",
    ),
}


@pytest.mark.parametrize("name", list(KEPT))
def test_a_file_keeping_each_rule_reads(tmp_path, name):
    doc, blob = KEPT[name]()
    assert reader.read(write(tmp_path, doc, blob)).doc["meshes"]


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_file_breaking_each_rule_is_refused_in_one_line(tmp_path, name):
    make, want = BROKEN[name]
    doc, blob = make()
    message = refused(write(tmp_path, doc, blob))
    assert want in message, message


def test_a_glb_with_a_second_bin_chunk_is_refused(tmp_path):
    doc, blob = box_glb()
    data = container.glb_bytes(doc, blob)
    extra = struct.pack("<II", 8, container.CHUNK_BIN) + b"\0" * 8
    path = tmp_path / "obj_0.glb"
    path.write_bytes(data[:8] + struct.pack("<I", len(data) + len(extra)) + data[12:] + extra)
    message = refused(path)
    assert message == f"{path}: a second BIN chunk at byte {len(data)}; a GLB holds at most one"
    path.write_bytes(data)
    reader.read(path)
