"""Every number a glTF gives is checked against what it holds before use
(chord.gltf.document_checks, chord.gltf.read_checks, chord.gltf.memory_budget): each hostile file
below is refused by chord.gltf.reader.read in one line naming the file, the object and the
numbers, without allocating more than the file justifies (tracemalloc peak)."""

from __future__ import annotations

import copy
import io
import json
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

from chord.core.errors import InputError
from chord.gltf import container, read_checks, reader

PEAK_LIMIT = 32 * 2**20  # no hostile case below may make the reader allocate more


def box_glb() -> tuple[dict, bytes]:
    """A textured, indexed box under a parent node: (JSON, binary chunk)."""
    out = container.GltfBuilder("test")
    box = trimesh.creation.box(extents=(0.5, 0.4, 0.3))
    pos = out.add_accessor(box.vertices, "VEC3", target=container.ARRAY_BUFFER)
    uv = out.add_accessor(box.vertices[:, :2] + 0.5, "VEC2", bounds=False)
    idx = out.add_accessor(
        box.faces.reshape(-1), "SCALAR", target=container.ELEMENT_ARRAY_BUFFER,
        component=container.UNSIGNED_SHORT, bounds=False,
    )  # fmt: skip
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, format="PNG")
    out.add("images", {"bufferView": out.add_view(png.getvalue()), "mimeType": "image/png"})
    out.add("textures", {"source": 0})
    out.add("materials", {"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}})
    prim = {"attributes": {"POSITION": pos, "TEXCOORD_0": uv}, "indices": idx, "material": 0}
    mesh = out.add("meshes", {"primitives": [prim]})
    child = out.add("nodes", {"mesh": mesh, "translation": [0.0, 0.2, 0.0]})
    out.add("nodes", {"children": [child], "name": "root"})
    out.doc["scenes"] = [{"nodes": [1]}]
    out.doc["scene"] = 0
    out.doc["buffers"] = [{"byteLength": len(out.blob)}]
    return out.doc, bytes(out.blob)


def write(tmp_path: Path, doc: dict, blob: bytes, name: str = "obj_0.glb") -> Path:
    path = tmp_path / name
    path.write_bytes(container.glb_bytes(doc, blob))
    return path


def refused(path: Path, *, mem_mb: int | None = None) -> str:
    """The one-line refusal of ``path``, checking the reader's allocations stayed small."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            reader.read(path, mem_mb=mem_mb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert peak < PEAK_LIMIT, (peak, message)
    return message


def test_the_plain_box_reads(tmp_path):
    doc, blob = box_glb()
    source = reader.read(write(tmp_path, doc, blob))
    assert len(source.doc["meshes"]) == 1


def edit(fn):
    doc, blob = box_glb()
    doc = copy.deepcopy(doc)
    fn(doc)
    return doc, blob


def _set(path: str, value):
    """An edit setting ``doc[path]`` (keys and list indices split on '/')."""

    def fn(doc):
        keys = [int(k) if k.isdigit() else k for k in path.split("/")]
        target = doc
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return fn


HOSTILE = {
    # the 1 KB file: two billion elements without a bufferView (44.7 GiB asked of numpy)
    "two_billion_zeros": (
        lambda d: d["accessors"].append(
            {"componentType": 5126, "type": "MAT3", "count": 2_000_000_000}
        ),
        r"accessor 3: count 2000000000 without a bufferView is more than the 65536 elements",
    ),
    "count_past_its_view": (
        _set("accessors/0/count", 1_000_000),
        r"accessor 0: 1000000 elements of 12 bytes \(stride 12\) from byte 0 need 12000000 "
        r"bytes, but bufferView 0 holds \d+",
    ),
    "offset_past_its_view": (_set("accessors/0/byteOffset", 4096), r"accessor 0: .* need \d+"),
    "stride_under_element": (
        _set("bufferViews/0/byteStride", 4),
        r"accessor 0: elements of 12 bytes under bufferView 0's byteStride 4",
    ),
    "view_past_its_buffer": (
        _set("bufferViews/1/byteLength", 10**9),
        r"bufferView 1: bytes \d+ to \d+ run past the end of buffer 0 \(\d+ bytes\)",
    ),
    "negative_count": (_set("accessors/0/count", -3), r"accessor 0: count is -3, outside"),
    "count_a_string": (
        _set("accessors/0/count", "36"),
        r"accessor 0: count is '36' \(a string\), not an integer",
    ),
    "bad_component_type": (_set("accessors/0/componentType", 5130), r"componentType is 5130"),
    "node_mesh_out_of_range": (
        _set("nodes/0/mesh", 7),
        r"node 0: mesh refers to meshes 7, but the file holds 1 \(meshes 0 to 0\) meshes",
    ),
    "indices_accessor_out_of_range": (
        _set("meshes/0/primitives/0/indices", 99),
        r"mesh 0 primitive 0: indices refers to accessors 99, but the file holds 3",
    ),
    "accessor_view_out_of_range": (
        _set("accessors/1/bufferView", 12),
        r"accessor 1: bufferView refers to bufferViews 12",
    ),
    "image_view_out_of_range": (
        _set("images/0/bufferView", 40),
        r"image 0: bufferView refers to bufferViews 40",
    ),
    "texture_source_out_of_range": (
        _set("textures/0/source", 3),
        r"texture 0: source refers to images 3, but the file holds 1",
    ),
    "material_texture_out_of_range": (
        _set("materials/0/pbrMetallicRoughness/baseColorTexture/index", 5),
        r"material 0 baseColorTexture: index refers to textures 5",
    ),
    "scene_node_out_of_range": (_set("scenes/0/nodes", [9]), r"scene 0: nodes refers to nodes 9"),
    "node_cycle": (
        _set("nodes/0/children", [1]),
        r"node \d: is its own ancestor: the node graph has a cycle",
    ),
    "node_own_child": (_set("nodes/1/children", [0, 1]), r"node 1: node 1 is a child of node 1"),
    "attribute_counts_differ": (
        _set("accessors/1/count", 3),
        r"mesh 0 primitive 0: its attributes have different counts",
    ),
    "meshes_not_a_list": (_set("meshes", {"0": {}}), r"the file: meshes is .* not a list"),
    "extensions_a_list": (_set("nodes/0/extensions", []), r"an 'extensions' is a list"),
    "translation_of_two": (_set("nodes/0/translation", [1, 2]), r"translation is \[1, 2\]"),
    "nan_rotation": (_set("nodes/0/rotation", [0, 0, 0, float("nan")]), r"rotation is"),
    "deep_nesting": (
        _set("extras", json.loads("[" * 200 + "]" * 200)),
        r"its JSON is nested deeper than 64 levels",
    ),
    "position_a_scalar": (
        _set("meshes/0/primitives/0/attributes/POSITION", 2),
        r"mesh 0 primitive 0: POSITION is accessor 2 of type SCALAR, not VEC3",
    ),
    "texture_transform_null": (
        _set(
            "materials/0/pbrMetallicRoughness/baseColorTexture/extensions",
            {"KHR_texture_transform": None},
        ),
        r"baseColorTexture: its KHR_texture_transform is null, not an object",
    ),  # fmt: skip
    "sparse_count_over_the_accessor": (
        _set("accessors/0/sparse", {"count": 10**6, "indices": {}, "values": {}}),
        r"accessor 0 \(sparse\): count is 1000000, outside \[1, 8\]",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_number_is_refused_in_one_line(tmp_path, name):
    fn, pattern = HOSTILE[name]
    doc, blob = edit(fn)
    path = write(tmp_path, doc, blob)
    import re

    assert re.search(pattern, refused(path)), refused(path)


def with_indices(tmp_path: Path, values: list[int]) -> Path:
    doc, blob = box_glb()
    b = bytearray(blob)
    view = doc["bufferViews"][doc["accessors"][2]["bufferView"]]
    b[view["byteOffset"] : view["byteOffset"] + 2 * len(values)] = np.array(values, "<u2").tobytes()
    return write(tmp_path, doc, bytes(b))


def test_a_vertex_index_beyond_the_vertices_is_refused(tmp_path):
    message = refused(with_indices(tmp_path, [0, 1, 4000]))
    assert (
        "mesh 0 primitive 0: vertex index 4000 (indices accessor 2) is beyond its 8 vertices"
        in (message)
    )


def test_a_sparse_index_beyond_the_count_is_refused(tmp_path):
    doc, blob = box_glb()
    out = bytearray(blob)
    out.extend(b"\0" * (-len(out) % 4))
    start = len(out)
    out.extend(np.array([2, 900], "<u2").tobytes() + np.zeros((2, 3), "<f4").tobytes())
    doc["bufferViews"] += [
        {"buffer": 0, "byteOffset": start, "byteLength": 4},
        {"buffer": 0, "byteOffset": start + 4, "byteLength": 24},
    ]
    n = len(doc["bufferViews"])
    doc["accessors"][0]["sparse"] = {
        "count": 2,
        "indices": {"bufferView": n - 2, "componentType": 5123},
        "values": {"bufferView": n - 1},
    }
    doc["buffers"][0]["byteLength"] = len(out)
    message = refused(write(tmp_path, doc, bytes(out)))
    assert "accessor 0 (sparse): index 900 is beyond its 8 elements" in message


@pytest.mark.parametrize("cut", [3, 11, 16, 40, -5])
def test_a_glb_cut_short_is_refused_as_cut_short(tmp_path, cut):
    doc, blob = box_glb()
    data = container.glb_bytes(doc, blob)
    path = tmp_path / "obj_0.glb"
    path.write_bytes(data[:cut])
    message = refused(path)
    assert "cut short" in message or (cut == 3 and "not a GLB file" in message), message
    assert "version" not in message


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and IHDR: what Pillow reads to open it (no pixel data)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n"
    for kind, body in ((b"IHDR", ihdr), (b"IDAT", zlib.compress(b"\0" * 64)), (b"IEND", b"")):
        out += (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )
    return out


def with_image(tmp_path: Path, data: bytes) -> Path:
    doc, blob = box_glb()
    out = bytearray(blob)
    out.extend(b"\0" * (-len(out) % 4))
    doc["bufferViews"].append({"buffer": 0, "byteOffset": len(out), "byteLength": len(data)})
    out.extend(data)
    doc["images"][0]["bufferView"] = len(doc["bufferViews"]) - 1
    doc["buffers"][0]["byteLength"] = len(out)
    return write(tmp_path, doc, bytes(out))


def test_an_image_of_too_many_pixels_is_refused_before_decoding(tmp_path):
    message = refused(with_image(tmp_path, png_header(100_000, 100_000)))
    assert "image 0: 100000 x 100000 = 10000000000 pixels, more than chord decodes" in message


def test_a_ktx2_of_too_many_pixels_is_refused_before_transcoding(tmp_path):
    header = read_checks.KTX2_ID + struct.pack("<IIII", 0, 1, 65536, 65536) + b"\0" * 64
    message = refused(with_image(tmp_path, header))
    assert "image 0: 65536 x 65536 = 4294967296 pixels" in message


def test_an_honest_file_over_the_memory_budget_is_refused_naming_the_figure(tmp_path):
    doc, blob = box_glb()
    n = 40_000
    pos = np.random.default_rng(0).random((n, 3)).astype("<f4").tobytes()
    doc["bufferViews"].append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(pos)})
    doc["accessors"].append(
        {
            "bufferView": len(doc["bufferViews"]) - 1,
            "componentType": 5126,
            "count": n,
            "type": "VEC3",
        }  # fmt: skip
    )
    doc["buffers"][0]["byteLength"] = len(blob) + len(pos)
    path = write(tmp_path, doc, blob + pos)
    reader.read(path, mem_mb=100)
    message = refused(path, mem_mb=1)
    assert "reading it needs an estimated 0.0 GiB, more than the ingest job's 1 MB" in message
    assert "--set-resources ingest:mem_mb=" in message and "decimate" in message
