"""chord.gltf.reader on a corpus of the glTF features users' files carry (tests/gltf_corpus.py):
each file reads as the plain original does (faces, bounds, the colours its material defines),
or is refused in one line naming the file and the feature."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import trimesh
from scipy.spatial import cKDTree

from chord.core.errors import InputError
from chord.gaussians.mesh_colour import part_colours
from chord.gltf import container, ktx2, reader
from chord.scene import ingestion
from tests import components
from tests import gltf_corpus as corpus
from tests.conftest import empty_glb, validate_glb

F32 = np.finfo(np.float32).eps
POSITION_BITS, TEXCOORD_BITS = 14, 12  # glTF Transform's defaults (draco, quantize, meshopt)


def load(path: Path) -> list[trimesh.Trimesh]:
    return ingestion.load_source(path)[1]


def centroid_colours(parts) -> tuple[np.ndarray, np.ndarray]:
    """Face centroids [m, 3] and the colours (rgb [m, 3]) the material gives them."""
    cents, cols = [], []
    for i, part in enumerate(parts):
        faces = np.arange(len(part.faces))
        bary = np.full((len(faces), 3), 1.0 / 3.0)
        rgb, *_ = part_colours(f"part {i}", part, faces, bary, {})
        cents.append(part.triangles_center)
        cols.append(rgb)
    return np.concatenate(cents), np.concatenate(cols)


def bounds(parts) -> np.ndarray:
    return ingestion.bounds_of(parts)


def assert_same_surface(got, want, *, position_tol: float, colour_tol: float):
    """The same faces, the bounds within ``position_tol`` and the colours at matching face
    centroids (nearest, as a compressor may reorder faces) within ``colour_tol``."""
    assert sum(len(p.faces) for p in got) == sum(len(p.faces) for p in want)
    np.testing.assert_allclose(bounds(got), bounds(want), rtol=0, atol=position_tol)
    c_got, rgb_got = centroid_colours(got)
    c_want, rgb_want = centroid_colours(want)
    dist, match = cKDTree(c_got).query(c_want)
    assert dist.max() <= 2 * position_tol + 1e-12
    np.testing.assert_allclose(rgb_got[match], rgb_want, rtol=0, atol=colour_tol)


@pytest.fixture
def duck(khronos) -> Path:
    return khronos / "Duck.glb"


def quantisation_tolerances(path: Path) -> tuple[float, float]:
    """One step of glTF Transform's position (14 bits over the longest extent) and texcoord
    (12 bits over [0, 1]) grids, and the colour error a texcoord step makes in the duck's
    texture (one step of UV is W texels of one at most full-range texel difference)."""
    parts = load(path)
    extent = float((bounds(parts)[1] - bounds(parts)[0]).max())
    width = max(p.visual.material.baseColorTexture.size[0] for p in parts)
    uv_step = 1.0 / (2**TEXCOORD_BITS - 1)
    return extent / (2**POSITION_BITS - 1), 2 * width * uv_step


@pytest.mark.parametrize("command", ["draco", "meshopt", "quantize"])
def test_compressed_and_quantised_files_read_as_the_original(tmp_path, duck, command):
    """glTF Transform's `draco`, `meshopt` and `quantize`: the duck's faces, bounds (within one
    step of the 14-bit position grid) and texture colours (within a 12-bit UV step)."""
    out = corpus.transform(command, duck, tmp_path / f"{command}.glb")
    used = set(container.read_glb(out)[0].get("extensionsRequired", []))
    expect = {
        "draco": {"KHR_draco_mesh_compression"},
        "meshopt": {"EXT_meshopt_compression", "KHR_mesh_quantization"},
        "quantize": {"KHR_mesh_quantization"},
    }[command]
    assert expect <= used
    source, got = ingestion.load_source(out)
    assert set(source.decoded) == used
    position_tol, colour_tol = quantisation_tolerances(duck)
    assert_same_surface(got, load(duck), position_tol=position_tol, colour_tol=colour_tol)


def test_a_gltf_with_external_buffers_and_images_reads_as_the_glb(tmp_path, duck):
    out = corpus.transform("copy", duck, tmp_path / "duck" / "obj_0.gltf")
    assert {p.name for p in reader.external_files(out)} >= {"obj_0.bin"}
    assert all(p.is_file() for p in reader.external_files(out))
    assert_same_surface(load(out), load(duck), position_tol=0, colour_tol=0)
    missing = reader.external_files(out)[0]
    missing.unlink()
    with pytest.raises(InputError, match=f"obj_0.gltf: .* refers to .*{missing.name}, which does"):
        reader.read(out)


def test_gpu_instancing_becomes_one_node_per_instance(tmp_path):
    src, mats = corpus.shared_mesh_nodes(tmp_path / "shared.glb", n=5)
    out = corpus.transform("instance", src, tmp_path / "instanced.glb")
    assert "EXT_mesh_gpu_instancing" in container.read_glb(out)[0]["extensionsUsed"]
    got, want = load(out), load(src)
    assert len(got) == len(want) == 5
    # each instance's box, in its own placement: same vertex sets as the five nodes give
    key = lambda parts: sorted(np.round(p.vertices, 5).tobytes() for p in parts)  # noqa: E731
    assert key(got) == key(want)
    assert_same_surface(got, want, position_tol=1e-6, colour_tol=0)


def test_sparse_accessors_are_substituted(tmp_path):
    src = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    idx = np.array([1, 4, 7])
    out = corpus.with_sparse_positions(src, tmp_path / "sparse.glb", idx, [0.0, 0.3, 0.0])
    (got,) = load(out)
    (want,) = load(src)
    expect = np.asarray(want.vertices).copy()
    expect[idx] += [0.0, 0.3, 0.0]
    np.testing.assert_allclose(got.vertices, expect, rtol=0, atol=4 * F32)  # float32 storage


@pytest.fixture(params=["cells_box", "BoxTextured"])
def textured(request, tmp_path) -> Path:
    """A textured GLB: a box over a texture of solid cells, or the Khronos sample asset."""
    if request.param == "BoxTextured":
        return request.getfixturevalue("khronos") / "BoxTextured.glb"
    return corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")


def texture_width(path: Path) -> int:
    return max(p.visual.material.baseColorTexture.size[0] for p in load(path))


def texcoord0(path: Path) -> np.ndarray:
    doc, blob = container.read_glb(path)
    return container.read_accessor(
        doc, blob, doc["meshes"][0]["primitives"][0]["attributes"]["TEXCOORD_0"]
    )


def test_the_base_colour_texture_transform_is_baked_into_the_uvs(tmp_path, textured):
    """KHR_texture_transform (offset, rotation, scale) on the base colour, the UVs moved by its
    inverse: the colours are the untransformed original's; an emissive texture reading the
    original UVs without a transform keeps them in a set of its own."""
    src = textured
    ext = {"offset": [0.25, -0.1], "rotation": 0.4, "scale": [0.5, 2.0]}
    out = corpus.with_texture_transform(src, tmp_path / "tt.glb", ext, second_texture=True)
    source, (got,) = ingestion.load_source(out)
    (want,) = load(src)
    np.testing.assert_allclose(got.visual.uv, want.visual.uv, rtol=0, atol=uv_tol(ext))
    mat = source.doc["materials"][source.doc["meshes"][0]["primitives"][0]["material"]]
    assert "extensions" not in mat["pbrMetallicRoughness"]["baseColorTexture"]
    prim = source.doc["meshes"][0]["primitives"][0]
    emissive = prim["attributes"][f"TEXCOORD_{mat['emissiveTexture']['texCoord']}"]
    np.testing.assert_array_equal(
        container.read_accessor(source.doc, source.blob, emissive), texcoord0(src)
    )
    tol = 2 * texture_width(src) * uv_tol(ext)
    assert_same_surface([got], [want], position_tol=0, colour_tol=tol)


def uv_tol(ext: dict) -> float:
    """The float32 rounding of the moved UVs, carried through the transform's scale."""
    return 4 * F32 * (1 + 4 / min(ext["scale"])) * max(ext["scale"])


def test_gltfpack_quantised_uvs_under_a_texture_transform_read_right(tmp_path, textured):
    """KHR_mesh_quantization + KHR_texture_transform as gltfpack writes them: UVs as
    normalised uint16 over their range: within one 16-bit step of the original UVs."""
    src = textured
    out = corpus.gltfpack_quantised_uvs(src, tmp_path / "gltfpack.glb")
    source, (got,) = ingestion.load_source(out)
    (want,) = load(src)
    assert set(source.decoded) == {"KHR_mesh_quantization", "KHR_texture_transform"}
    uv = texcoord0(src)
    step = float((uv.max(0) - uv.min(0)).max()) / 65535
    np.testing.assert_allclose(got.visual.uv, want.visual.uv, rtol=0, atol=step)
    tol = 2 * texture_width(src) * step
    assert_same_surface([got], [want], position_tol=0, colour_tol=tol)


def test_vertex_colours_multiply_the_texture(tmp_path, textured):
    src = textured
    (want,) = load(src)
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (len(want.vertices), 4), dtype=np.uint8)
    rgba[:, 3] = 255
    out = corpus.with_vertex_colours(src, tmp_path / "vc.glb", rgba)
    (got,) = load(out)
    _, tex = centroid_colours([want])
    _, both = centroid_colours([got])
    vc = (rgba[:, :3] / 255.0)[want.faces].mean(axis=1)  # COLOR_0 at the centroids
    # the reader stores COLOR_0 as float32: k/255 within half a float32 ulp, times tex <= 1
    np.testing.assert_allclose(both, tex * vc, rtol=0, atol=F32)


def test_ktx2_textures_decode_to_the_same_colours(tmp_path):
    """UASTC KTX2 (basisu) under KHR_texture_basisu, no fallback: a texture of solid 4x4
    blocks, which UASTC stores exactly, gives the PNG's colours exactly."""
    if ktx2.unavailable_reason():
        components.missing(components.NODE, ktx2.unavailable_reason())
    src = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    encoder = corpus.basisu(tmp_path / "bin")
    out = corpus.with_ktx2_textures(src, tmp_path / "ktx2.glb", encoder, tmp_path / "work")
    source, (got,) = ingestion.load_source(out)
    assert source.decoded == ("KHR_texture_basisu",)
    assert source.doc["images"][0]["mimeType"] == "image/png"
    assert_same_surface([got], load(src), position_tol=0, colour_tol=0)


def test_ktx2_without_node_is_refused_with_the_fix(tmp_path, monkeypatch):
    src = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    out = corpus.with_ktx2_textures(
        src, tmp_path / "obj_0.glb", corpus.basisu(tmp_path / "bin"), tmp_path / "work"
    )
    monkeypatch.setenv("CHORD_NODE", str(tmp_path / "no-node"))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(InputError, match=r"obj_0.glb: texture 0 \(KTX2 image 0\): a KTX2 .*Node"):
        reader.read(out)


def test_material_features_not_rendered_are_warnings(tmp_path):
    src = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    out = corpus.with_material_extension(
        src, tmp_path / "glass.glb", "KHR_materials_transmission", {"transmissionFactor": 1.0}
    )
    source = reader.read(out)
    (warning,) = source.warnings
    assert "glass.glb: material" in warning and "KHR_materials_transmission" in warning
    assert "KHR_materials_transmission" in source.doc["extensionsUsed"]  # kept for viewers


def test_a_required_extension_chord_cannot_read_is_refused_naming_it(tmp_path):
    src = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    out = corpus.with_required_extension(src, tmp_path / "obj_0.glb", "EXT_foo")
    with pytest.raises(InputError, match="obj_0.glb: uses EXT_foo, which chord cannot read; re-"):
        reader.read(out)


@pytest.mark.parametrize(
    "make, message",
    [
        (corpus.lines_only, "holds no triangles, only LINES primitives"),
        (corpus.zero_area, "its triangles have zero total area"),
    ],
)
def test_files_without_a_surface_are_refused_naming_the_file(tmp_path, make, message):
    path = make(tmp_path / "obj_0.glb")
    with pytest.raises(ingestion.SceneError, match=f"obj_0.glb: {message}"):
        ingestion.load_source(path)


def test_a_folder_where_a_file_should_be_is_refused(tmp_path):
    (tmp_path / "scene.glb").write_bytes(empty_glb())  # its content is not read
    (tmp_path / "obj_0.glb").mkdir()
    with pytest.raises(
        ingestion.SceneError, match=r"obj_0.glb: is not a regular file \(a folder\)"
    ):
        ingestion.discover_objects(tmp_path)


def test_one_object_given_twice_is_refused(tmp_path):
    for name in ("scene.glb", "obj_0.glb", "obj_0.gltf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(
        ingestion.SceneError, match=r"obj_0 is given twice \(obj_0.glb and obj_0.gltf\)"
    ):
        ingestion.discover_objects(tmp_path)


@pytest.mark.parametrize("command", ["draco", "meshopt", "instance"])
def test_the_plain_file_passes_the_khronos_validator(tmp_path, duck, gltf_validator, command):
    """What the reader makes of a compressed or instanced file is valid glTF (the export
    merges it into its outputs)."""
    src = corpus.shared_mesh_nodes(tmp_path / "shared.glb")[0] if command == "instance" else duck
    out = corpus.transform(command, src, tmp_path / f"{command}.glb")
    plain = tmp_path / f"{command}_plain.glb"
    plain.write_bytes(reader.read(out).glb_bytes())
    issues = validate_glb(gltf_validator, plain, tmp_path)
    assert issues["numErrors"] == 0, issues["messages"][:5]
