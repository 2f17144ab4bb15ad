"""glTF accessors read directly (chord.gltf.container.read_accessor) from bytes written here
with numpy, not by the builder that shares its tables: every component and element type,
offsets and interleaved strides, normalised integers, accessors without a buffer view, sparse
substitution and its bounds, and a buffer cut short."""

from __future__ import annotations

import numpy as np
import pytest

from chord.core.errors import InputError
from chord.gltf import container

# componentType -> the numpy type glTF stores it as (little-endian)
TYPES = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
ELEMENTS = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT2": 4, "MAT3": 9, "MAT4": 16}


def doc_of(blob: bytes, *accessors: dict, views=None) -> dict:
    views = views or [{"buffer": 0, "byteLength": len(blob)}]
    return {"bufferViews": views, "accessors": list(accessors)}


@pytest.mark.parametrize("component", TYPES)
def test_every_component_and_element_type_reads_as_stored(component):
    for kind, width in ELEMENTS.items():
        values = (np.arange(3 * width) % 100).reshape(3, width).astype(TYPES[component])
        acc = {"bufferView": 0, "componentType": component, "count": 3, "type": kind}
        got = container.read_accessor(doc_of(values.tobytes(), acc), values.tobytes(), 0)
        assert got.dtype == np.float64 and got.shape == (3, width), kind
        np.testing.assert_array_equal(got, values)


def test_offsets_and_an_interleaved_stride_pick_each_accessors_bytes():
    """Positions (3 float32) and colours (4 bytes) interleaved, 16 bytes a vertex, after 8
    bytes of something else; the accessors start 8 + 0 and 8 + 12 bytes in."""
    pos = np.arange(12, dtype="<f4").reshape(4, 3)
    col = np.arange(16, dtype="u1").reshape(4, 4) * 10
    rows = [p.tobytes() + c.tobytes() for p, c in zip(pos, col, strict=True)]
    blob = b"\xff" * 8 + b"".join(rows)
    view = {"buffer": 0, "byteOffset": 8, "byteLength": 64, "byteStride": 16}
    doc = doc_of(
        blob,
        {"bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3"},
        {"bufferView": 0, "byteOffset": 12, "componentType": 5121, "count": 4, "type": "VEC4"},
        views=[view],
    )
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 0), pos)
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 1), col)


def test_normalised_integers_scale_to_unit_range_and_floats_stay():
    cases = [
        (5120, [-128, -127, 0, 127], [-1.0, -1.0, 0.0, 1.0]),  # -128 clamps to -1
        (5121, [0, 51, 255], [0.0, 0.2, 1.0]),
        (5122, [-32768, 0, 32767], [-1.0, 0.0, 1.0]),
        (5123, [0, 65535], [0.0, 1.0]),
        (5126, [-3.0, 2.5], [-3.0, 2.5]),  # normalized means nothing for floats
    ]
    for component, stored, expected in cases:
        data = np.array(stored, TYPES[component]).tobytes()
        acc = {"bufferView": 0, "componentType": component, "count": len(stored)}
        acc |= {"type": "SCALAR", "normalized": True}
        got = container.read_accessor(doc_of(data, acc), data, 0)[:, 0]
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_an_accessor_without_a_buffer_view_is_zeros_and_an_empty_one_reads_empty():
    acc = {"componentType": 5126, "count": 3, "type": "VEC2"}
    np.testing.assert_array_equal(
        container.read_accessor(doc_of(b"", acc), b"", 0), np.zeros((3, 2))
    )
    acc = {"bufferView": 0, "componentType": 5126, "count": 0, "type": "VEC3"}
    assert container.read_accessor(doc_of(b"", acc), b"", 0).shape == (0, 3)


def sparse_doc(indices, count=4, base=True):
    """A VEC2 float accessor of ``count`` rows (zeros without a base view) with its rows
    ``indices`` replaced by (10 i, 1)."""
    idx = np.array(indices, "<u2").tobytes()
    idx += b"\0" * (-len(idx) % 4)
    vals = np.array([[10.0 * i, 1.0] for i in indices], "<f4").tobytes()
    rows = np.arange(2 * count, dtype="<f4").tobytes() if base else b""
    blob = rows + idx + vals
    views = [
        {"buffer": 0, "byteOffset": 0, "byteLength": max(len(rows), 1)},
        {"buffer": 0, "byteOffset": len(rows), "byteLength": len(idx)},
        {"buffer": 0, "byteOffset": len(rows) + len(idx), "byteLength": len(vals)},
    ]
    acc = {"componentType": 5126, "count": count, "type": "VEC2"}
    acc["sparse"] = {
        "count": len(indices),
        "indices": {"bufferView": 1, "componentType": 5123},
        "values": {"bufferView": 2},
    }
    if base:
        acc["bufferView"] = 0
    return doc_of(blob, acc, views=views), blob


def test_sparse_rows_replace_the_base_or_the_zeros():
    doc, blob = sparse_doc([1, 3])
    expected = np.arange(8.0).reshape(4, 2)
    expected[[1, 3]] = [[10.0, 1.0], [30.0, 1.0]]
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 0), expected)
    doc, blob = sparse_doc([0, 3], base=False)
    expected = np.zeros((4, 2))
    expected[[0, 3]] = [[0.0, 1.0], [30.0, 1.0]]
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 0), expected)


def test_a_sparse_index_at_or_past_the_count_is_refused():
    for last in (4, 5):
        doc, blob = sparse_doc([1, last])
        with pytest.raises(InputError, match=f"index {last} is beyond its 4 elements"):
            container.read_accessor(doc, blob, 0)


def test_an_accessor_past_the_buffers_end_is_refused_not_read():
    values = np.arange(12, dtype="<f4")
    acc = {"bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3"}
    blob = values.tobytes()
    with pytest.raises(ValueError):
        container.read_accessor(doc_of(blob, acc), blob[:-1], 0)
