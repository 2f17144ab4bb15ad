"""Unit tests for chord.gaussians.gaussian_set (METHOD §2): surface init, PLY I/O, fitted-3DGS
import."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image
from plyfile import PlyData, PlyElement

from chord.gaussians.gaussian_set import (
    C0,
    GaussianSet,
    concat,
    init_from_mesh,
    rgb_to_sh_dc,
    sh_dc_to_rgb,
    to_normalised,
)
from chord.gaussians.ply import find_fitted_ply, read_ply, write_ply
from chord.scene.ingestion import load_mesh_parts

RED = (1.0, 0.0, 0.0)
BLUE = (0.0, 0.0, 1.0)
GREEN = (0.0, 1.0, 0.0)
YELLOW = (1.0, 1.0, 0.0)


# ---- helpers --------------------------------------------------------------------------------


def _random_set(n: int, degree: int, seed: int = 0) -> GaussianSet:
    rng = np.random.default_rng(seed)
    return GaussianSet(
        means=rng.normal(size=(n, 3)),
        log_scales=rng.normal(size=(n, 3)) - 4,
        quats=rng.normal(size=(n, 4)),
        opacity_logits=rng.normal(size=n),
        sh=rng.normal(size=(n, (degree + 1) ** 2, 3)),
    )


def _assert_sets_equal(a: GaussianSet, b: GaussianSet) -> None:
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype == np.float32, name
        assert x.shape == y.shape, name
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), name  # bit-exact


def _quat_to_rotmat(q: np.ndarray) -> np.ndarray:
    """(w, x, y, z) → rotation matrices [N, 3, 3] (independent of the module's code)."""
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        axis=1,
    )


def _rgb(g: GaussianSet) -> np.ndarray:
    return sh_dc_to_rgb(g.sh[:, 0])


def _opacity(g: GaussianSet) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-g.opacity_logits.astype(np.float64)))


def _quad(size: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Square [-size, size]^2 in the z = 0 plane, normal +z: vertices [4, 3], faces [2, 3]."""
    v = np.array([[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]], dtype=np.float64) * size
    f = np.array([[0, 1, 2], [0, 2, 3]])
    return v, f


def _quad_uv() -> np.ndarray:
    # trimesh convention: v = 0 is the bottom of the image, so y = +1 maps to the top row
    v, _ = _quad()
    return (v[:, :2] + 1.0) / 2.0


def _glb_round_trip(*meshes: trimesh.Trimesh) -> list[trimesh.Trimesh]:
    blob = trimesh.Scene(list(meshes)).export(file_type="glb")
    scene = trimesh.load(io.BytesIO(blob), file_type="glb", force="scene")
    return load_mesh_parts(scene)


def _quadrant_texture(size: int = 64, alpha=(255, 255, 255, 255)) -> Image.Image:
    """Top-left red, top-right blue, bottom-left green, bottom-right yellow (RGBA)."""
    h = size // 2
    arr = np.zeros((size, size, 4), dtype=np.uint8)
    arr[:h, :h] = (255, 0, 0, alpha[0])
    arr[:h, h:] = (0, 0, 255, alpha[1])
    arr[h:, :h] = (0, 255, 0, alpha[2])
    arr[h:, h:] = (255, 255, 0, alpha[3])
    return Image.fromarray(arr, "RGBA")


def _textured_quad(image: Image.Image, uv_offset=(0.0, 0.0), **material) -> trimesh.Trimesh:
    v, f = _quad()
    mat = trimesh.visual.material.PBRMaterial(baseColorTexture=image, **material)
    uv = _quad_uv() + np.asarray(uv_offset)
    visual = trimesh.visual.TextureVisuals(uv=uv, material=mat)
    return trimesh.Trimesh(v, f, visual=visual, process=False)


def _interior(means: np.ndarray, margin: float = 0.1) -> np.ndarray:
    """Samples away from the quad's seams (x = 0, y = 0) and its edges (REPEAT blends there)."""
    a = np.abs(means[:, :2])
    return (a.min(axis=1) > margin) & (a.max(axis=1) < 1 - margin)


def _expected_quadrant_colour(means: np.ndarray) -> np.ndarray:
    x, y = means[:, 0], means[:, 1]
    out = np.empty((len(means), 3))
    out[(x < 0) & (y > 0)] = RED
    out[(x > 0) & (y > 0)] = BLUE
    out[(x < 0) & (y < 0)] = GREEN
    out[(x > 0) & (y < 0)] = YELLOW
    return out


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _handmade_glb(positions, texcoords_gltf, indices, png: bytes) -> bytes:
    """A minimal glTF 2.0 binary with one textured triangle primitive, written by hand."""
    pos = np.asarray(positions, dtype="<f4").tobytes()
    tex = np.asarray(texcoords_gltf, dtype="<f4").tobytes()
    idx = np.asarray(indices, dtype="<u2").tobytes()
    chunks, views, offset = [], [], 0
    for blob in (pos, tex, idx, png):
        views.append({"buffer": 0, "byteOffset": offset, "byteLength": len(blob)})
        blob += b"\0" * (-len(blob) % 4)
        chunks.append(blob)
        offset += len(blob)
    binary = b"".join(chunks)
    p = np.asarray(positions, dtype=np.float32)
    doc = {
        "asset": {"version": "2.0"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [
            {
                "primitives": [
                    {"attributes": {"POSITION": 0, "TEXCOORD_0": 1}, "indices": 2, "material": 0}
                ]
            }
        ],
        "materials": [{"pbrMetallicRoughness": {"baseColorTexture": {"index": 0}}}],
        "textures": [{"source": 0, "sampler": 0}],
        "samplers": [{}],
        "images": [{"bufferView": 3, "mimeType": "image/png"}],
        "buffers": [{"byteLength": len(binary)}],
        "bufferViews": views,
        "accessors": [
            {
                "bufferView": 0,
                "componentType": 5126,
                "count": len(p),
                "type": "VEC3",
                "min": p.min(0).tolist(),
                "max": p.max(0).tolist(),
            },
            {"bufferView": 1, "componentType": 5126, "count": len(p), "type": "VEC2"},
            {"bufferView": 2, "componentType": 5123, "count": len(indices), "type": "SCALAR"},
        ],
    }
    js = json.dumps(doc).encode()
    js += b" " * (-len(js) % 4)
    body = struct.pack("<I4s", len(js), b"JSON") + js + struct.pack("<I4s", len(binary), b"BIN\0")
    body += binary
    return struct.pack("<4sII", b"glTF", 2, 12 + len(body)) + body


# ---- GaussianSet -----------------------------------------------------------------------------


def test_gaussian_set_casts_and_validates():
    g = _random_set(5, 2)
    assert len(g) == 5 and g.sh_degree == 2 and g.means.dtype == np.float32
    with pytest.raises(ValueError, match="quats"):
        GaussianSet(
            np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(2), np.zeros((2, 1, 3))
        )
    with pytest.raises(ValueError, match="sh"):
        GaussianSet(
            np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2), np.zeros((2, 5, 3))
        )
    with pytest.raises(ValueError, match="opacity_logits"):
        GaussianSet(
            np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(3), np.zeros((2, 1, 3))
        )


def test_rgb_dc_conversion():
    assert C0 == pytest.approx(1 / (2 * math.sqrt(math.pi)))
    assert np.allclose(rgb_to_sh_dc([0.5, 0.5, 0.5]), 0)
    assert np.allclose(rgb_to_sh_dc([1.0, 0.0, 0.25]), (np.array([1.0, 0.0, 0.25]) - 0.5) / C0)
    assert np.allclose(sh_dc_to_rgb(rgb_to_sh_dc([0.1, 0.7, 0.9])), [0.1, 0.7, 0.9])


# ---- PLY I/O ---------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_ply_round_trip_bit_exact(tmp_path, degree):
    g = _random_set(257, degree, seed=degree)
    path = tmp_path / "g.ply"
    write_ply(path, g)
    back = read_ply(path)
    assert back.sh_degree == degree
    _assert_sets_equal(g, back)
    assert [p.name for p in tmp_path.iterdir()] == ["g.ply"]  # no temp file left behind


def test_ply_property_order_and_format(tmp_path):
    path = tmp_path / "g.ply"
    write_ply(path, _random_set(3, 3))
    raw = PlyData.read(str(path))
    assert not raw.text and raw.byte_order == "<"
    props = raw["vertex"].properties
    names = [p.name for p in props]
    expected = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(45)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    assert names == expected
    assert all(p.val_dtype in ("f4", "float32") for p in props)
    assert path.read_bytes().startswith(b"ply\nformat binary_little_endian 1.0\n")
    for nm in ("nx", "ny", "nz"):
        assert np.all(raw["vertex"][nm] == 0)


def test_ply_f_rest_is_channel_major(tmp_path):
    n, degree = 4, 2
    k = (degree + 1) ** 2
    sh = np.zeros((n, k, 3))
    for kk in range(k):
        for c in range(3):
            sh[:, kk, c] = 100 * c + kk + np.arange(n) * 1000
    g = _random_set(n, degree)
    g = GaussianSet(g.means, g.log_scales, g.quats, g.opacity_logits, sh)
    path = tmp_path / "g.ply"
    write_ply(path, g)
    v = PlyData.read(str(path))["vertex"]
    for c in range(3):
        assert np.array_equal(v[f"f_dc_{c}"], 100 * c + np.arange(n) * 1000)
        for kk in range(1, k):
            col = v[f"f_rest_{c * (k - 1) + (kk - 1)}"]
            assert np.array_equal(col, 100 * c + kk + np.arange(n) * 1000)
    # the other fields land where the INRIA layout puts them
    assert np.array_equal(v["opacity"], g.opacity_logits)
    assert np.array_equal(np.stack([v[f"rot_{i}"] for i in range(4)], 1), g.quats)
    assert np.array_equal(np.stack([v[f"scale_{i}"] for i in range(3)], 1), g.log_scales)
    assert np.array_equal(np.stack([v["x"], v["y"], v["z"]], 1), g.means)


@pytest.mark.parametrize("cap", [0, 1, 2, 3, 7])
def test_read_ply_sh_degree_cap(tmp_path, cap):
    g = _random_set(10, 3)
    write_ply(tmp_path / "g.ply", g)
    back = read_ply(tmp_path / "g.ply", sh_degree_cap=cap)
    d = min(cap, 3)
    assert back.sh.shape == (10, (d + 1) ** 2, 3) and back.sh_degree == d
    assert np.array_equal(back.sh, g.sh[:, : (d + 1) ** 2])


def _write_raw_ply(path: Path, columns: dict[str, np.ndarray]) -> None:
    n = len(next(iter(columns.values())))
    data = np.empty(n, dtype=[(k, "<f4") for k in columns])
    for k, col in columns.items():
        data[k] = col
    PlyData([PlyElement.describe(data, "vertex")], byte_order="<").write(str(path))


def _inria_columns(n: int, n_rest: int = 0) -> dict[str, np.ndarray]:
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += [f"f_rest_{i}" for i in range(n_rest)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    return {k: np.full(n, 0.25, np.float32) for k in names}


def test_read_ply_without_normals_and_with_extra_properties(tmp_path):
    cols = _inria_columns(3)
    cols["filter_3D"] = np.ones(3, np.float32)
    _write_raw_ply(tmp_path / "a.ply", cols)
    g = read_ply(tmp_path / "a.ply")
    assert len(g) == 3 and g.sh.shape == (3, 1, 3) and np.all(g.quats == 0.25)


def test_read_ply_errors(tmp_path):
    bad = tmp_path / "noise.ply"
    bad.write_bytes(np.random.default_rng(0).bytes(2048))
    with pytest.raises(ValueError, match="noise.ply"):
        read_ply(bad)

    cols = _inria_columns(3)
    del cols["opacity"]
    _write_raw_ply(tmp_path / "missing.ply", cols)
    with pytest.raises(ValueError, match=r"missing\.ply.*'opacity'"):
        read_ply(tmp_path / "missing.ply")

    cols = _inria_columns(3)
    cols["scale_1"][1] = np.nan
    _write_raw_ply(tmp_path / "nan.ply", cols)
    with pytest.raises(ValueError, match=r"nan\.ply.*'scale_1'.*non-finite"):
        read_ply(tmp_path / "nan.ply")

    _write_raw_ply(tmp_path / "rest.ply", _inria_columns(3, n_rest=12))
    with pytest.raises(ValueError, match=r"rest\.ply.*12 f_rest"):
        read_ply(tmp_path / "rest.ply")

    with pytest.raises(ValueError, match="absent.ply"):
        read_ply(tmp_path / "absent.ply")


def test_write_ply_rejects_non_finite_without_leaving_files(tmp_path):
    g = _random_set(4, 0)
    g.means[2, 1] = np.inf
    with pytest.raises(ValueError, match="means"):
        write_ply(tmp_path / "g.ply", g)
    assert list(tmp_path.iterdir()) == []


def test_write_ply_replaces_existing_file(tmp_path):
    path = tmp_path / "g.ply"
    write_ply(path, _random_set(5, 0, seed=1))
    g = _random_set(7, 1, seed=2)
    write_ply(path, g)
    _assert_sets_equal(read_ply(path), g)


# ---- surface initialisation: colours --------------------------------------------------------


def test_texture_colours_land_on_the_right_side_after_glb_round_trip():
    parts = _glb_round_trip(_textured_quad(_quadrant_texture()))
    g = init_from_mesh(parts, 4000, seed=3)
    assert len(g) == 4000 and g.sh.shape == (4000, 1, 3)
    inner = _interior(g.means)
    assert inner.sum() > 2000
    rgb = _rgb(g)
    assert np.allclose(rgb[inner], _expected_quadrant_colour(g.means[inner]), atol=1e-4)
    # each quadrant is populated: a U flip would swap red/blue, a V flip red/green
    top_left = inner & (g.means[:, 0] < 0) & (g.means[:, 1] > 0)
    assert top_left.sum() > 300 and np.allclose(rgb[top_left], RED, atol=1e-4)


def test_trimesh_flips_v_on_gltf_load_handmade_glb():
    """glTF puts v = 0 at the image top; check the whole chain against a hand-written GLB."""
    arr = np.zeros((16, 16, 3), np.uint8)
    arr[:8] = (255, 0, 0)  # top rows red
    arr[8:] = (0, 0, 255)  # bottom rows blue
    positions = [[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]]
    texcoords = [[0, 1], [1, 1], [1, 0], [0, 0]]  # glTF: top vertices (y = +1) at v = 0
    glb = _handmade_glb(positions, texcoords, [0, 1, 2, 0, 2, 3], _png_bytes(Image.fromarray(arr)))
    parts = load_mesh_parts(trimesh.load(io.BytesIO(glb), file_type="glb", force="scene"))
    g = init_from_mesh(parts, 2000, seed=0)
    rgb, y = _rgb(g), g.means[:, 1]
    inner = (np.abs(y) > 0.2) & (np.abs(y) < 0.8)
    assert np.allclose(rgb[inner & (y > 0)], RED, atol=1e-4)
    assert np.allclose(rgb[inner & (y < 0)], BLUE, atol=1e-4)


def test_texture_repeat_wrap():
    g0 = init_from_mesh([_textured_quad(_quadrant_texture())], 1000, seed=1)
    for offset in [(1.0, 0.0), (-2.0, 3.0)]:
        g1 = init_from_mesh([_textured_quad(_quadrant_texture(), uv_offset=offset)], 1000, seed=1)
        assert np.allclose(g0.sh, g1.sh, atol=1e-4)


def test_texture_bilinear_between_texel_centres():
    # 2x1 texture: black | white. u = 0.25 and 0.75 are texel centres; u = 0.5 is halfway.
    img = Image.fromarray(np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8), "RGB")
    v, f = _quad()
    uv = np.column_stack([(v[:, 0] + 1) / 4 + 0.25, np.full(4, 0.5)])  # u in [0.25, 0.75]
    mat = trimesh.visual.material.PBRMaterial(baseColorTexture=img)
    mesh = trimesh.Trimesh(v, f, visual=trimesh.visual.TextureVisuals(uv=uv, material=mat))
    g = init_from_mesh([mesh], 500, seed=0)
    expected = (g.means[:, 0] + 1) / 2  # linear ramp from black to white
    assert np.allclose(_rgb(g), expected[:, None], atol=1e-5)


@pytest.mark.parametrize("mode", ["P", "L", "RGB", "LA"])
def test_texture_pil_modes(mode):
    img = _quadrant_texture().convert("RGB")
    if mode == "P":
        img = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    elif mode in ("L", "LA"):
        img = img.convert(mode)
    g = init_from_mesh([_textured_quad(img)], 2000, seed=2)
    inner = _interior(g.means)
    expected = np.asarray(img.convert("RGB"), np.float64) / 255.0
    # compare against the texel colour at each sample's quadrant
    x, y = g.means[inner, 0], g.means[inner, 1]
    col = np.where(x < 0, 8, 56)
    row = np.where(y > 0, 8, 56)
    assert np.allclose(_rgb(g)[inner], expected[row, col], atol=1e-4)


def test_texture_times_base_colour_factor():
    factor = [0.5, 1.0, 1.0, 1.0]
    parts = _glb_round_trip(_textured_quad(_quadrant_texture(), baseColorFactor=factor))
    g = init_from_mesh(parts, 2000, seed=4)
    inner = _interior(g.means)
    quantised = np.round(np.array(factor[:3]) * 255) / 255  # trimesh stores factors as uint8
    assert np.allclose(
        _rgb(g)[inner], _expected_quadrant_colour(g.means[inner]) * quantised, atol=1e-4
    )


def test_vertex_colours_after_glb_round_trip():
    v, f = _quad()
    cols = np.array(
        [[255, 0, 0, 255], [0, 0, 255, 255], [0, 0, 255, 255], [255, 0, 0, 255]], np.uint8
    )
    parts = _glb_round_trip(trimesh.Trimesh(v, f, vertex_colors=cols, process=False))
    assert parts[0].visual.kind == "vertex"
    g = init_from_mesh(parts, 1000, seed=5)
    t = (g.means[:, 0] + 1) / 2  # colour is linear in x: red at x = -1, blue at x = +1
    expected = np.outer(1 - t, RED) + np.outer(t, BLUE)
    assert np.allclose(_rgb(g), expected, atol=1e-4)
    assert np.allclose(_opacity(g), 0.95, atol=1e-6)


def test_base_colour_factor_only_after_glb_round_trip():
    v, f = _quad()
    mat = trimesh.visual.material.PBRMaterial(baseColorFactor=[0.2, 0.4, 0.6, 1.0])
    mesh = trimesh.Trimesh(v, f, visual=trimesh.visual.TextureVisuals(material=mat))
    parts = _glb_round_trip(mesh)
    g = init_from_mesh(parts, 300)
    assert np.allclose(_rgb(g), np.round(np.array([0.2, 0.4, 0.6]) * 255) / 255, atol=1e-6)


def test_no_visual_is_half_grey():
    v, f = _quad()
    parts = _glb_round_trip(trimesh.Trimesh(v, f, process=False))
    g = init_from_mesh(parts, 300)
    assert np.allclose(g.sh, 0.0, atol=1e-6) and np.allclose(_rgb(g), 0.5, atol=1e-6)
    g2 = init_from_mesh([trimesh.Trimesh(v, f)], 300)  # not round-tripped either
    assert np.allclose(_rgb(g2), 0.5, atol=1e-6)


def test_simple_material_image_and_diffuse():
    v, f = _quad()
    img = _quadrant_texture()
    mat = trimesh.visual.material.SimpleMaterial(image=img, diffuse=[100, 100, 100, 255])
    mesh = trimesh.Trimesh(v, f, visual=trimesh.visual.TextureVisuals(uv=_quad_uv(), material=mat))
    g = init_from_mesh([mesh], 2000, seed=6)
    inner = _interior(g.means)
    assert np.allclose(_rgb(g)[inner], _expected_quadrant_colour(g.means[inner]), atol=1e-4)

    mat = trimesh.visual.material.SimpleMaterial(diffuse=[51, 102, 153, 255])
    mesh = trimesh.Trimesh(v, f, visual=trimesh.visual.TextureVisuals(material=mat))
    g = init_from_mesh([mesh], 100)
    assert np.allclose(_rgb(g), [0.2, 0.4, 0.6], atol=1e-6)


def test_each_part_keeps_its_own_visual():
    v, f = _quad()
    red = trimesh.Trimesh(v - [2, 0, 0], f, face_colors=[255, 0, 0, 255], process=False)
    mat = trimesh.visual.material.PBRMaterial(baseColorFactor=[0.0, 0.0, 1.0, 1.0])
    blue = trimesh.Trimesh(v + [2, 0, 0], f, visual=trimesh.visual.TextureVisuals(material=mat))
    g = init_from_mesh(_glb_round_trip(red, blue), 1000, seed=7)
    left = g.means[:, 0] < 0
    assert 0 < left.sum() < 1000
    assert np.allclose(_rgb(g)[left], RED, atol=1e-6)
    assert np.allclose(_rgb(g)[~left], BLUE, atol=1e-6)


# ---- surface initialisation: alpha ----------------------------------------------------------


def test_alpha_mask_drops_samples_after_glb_round_trip():
    img = _quadrant_texture(alpha=(0, 255, 0, 255))  # left half transparent
    parts = _glb_round_trip(_textured_quad(img, alphaMode="MASK"))
    assert parts[0].visual.material.alphaMode == "MASK"  # trimesh keeps alphaMode
    n = 4000
    g = init_from_mesh(parts, n, seed=8)
    assert 0.45 * n < len(g) < 0.55 * n
    x = g.means[:, 0]
    # kept: right half, plus at most the half-texel REPEAT blend at the far-left edge u = 0
    assert np.all((x > -0.05) | (x < -0.98))
    assert np.allclose(_opacity(g), 0.95, atol=1e-6)


def test_alpha_mask_uses_alpha_cutoff_and_factor_alpha():
    v, f = _quad()

    def mesh(alpha, cutoff):
        mat = trimesh.visual.material.PBRMaterial(
            baseColorFactor=[1.0, 1.0, 1.0, alpha], alphaMode="MASK", alphaCutoff=cutoff
        )
        return trimesh.Trimesh(v, f, visual=trimesh.visual.TextureVisuals(material=mat))

    assert len(init_from_mesh(_glb_round_trip(mesh(0.4, 0.3)), 100)) == 100
    assert len(init_from_mesh(_glb_round_trip(mesh(0.4, 0.5)), 100)) == 0
    # default cutoff 0.5 when alphaCutoff is unset
    assert len(init_from_mesh(_glb_round_trip(mesh(0.4, None)), 100)) == 0


def test_alpha_blend_scales_opacity_after_glb_round_trip():
    img = _quadrant_texture(alpha=(64, 255, 64, 255))
    parts = _glb_round_trip(_textured_quad(img, alphaMode="BLEND"))
    assert parts[0].visual.material.alphaMode == "BLEND"
    g = init_from_mesh(parts, 3000, seed=9)
    assert len(g) == 3000
    inner = _interior(g.means)
    expected = np.where(g.means[:, 0] < 0, 0.95 * 64 / 255, 0.95)
    assert np.allclose(_opacity(g)[inner], expected[inner], atol=1e-5)


def test_alpha_opaque_ignores_alpha():
    img = _quadrant_texture(alpha=(0, 0, 0, 0))
    g = init_from_mesh(_glb_round_trip(_textured_quad(img, alphaMode="OPAQUE")), 500)
    assert len(g) == 500 and np.allclose(_opacity(g), 0.95, atol=1e-6)
    g = init_from_mesh([_textured_quad(img)], 500)  # alphaMode unset
    assert len(g) == 500 and np.allclose(_opacity(g), 0.95, atol=1e-6)


def test_vertex_colour_alpha_with_blend_material():
    """COLOR_0 beside a material: load_mesh_parts keeps it (Scene.dump drops it)."""
    v, f = _quad()
    mat = trimesh.visual.material.PBRMaterial(baseColorFactor=[1, 1, 1, 1.0], alphaMode="BLEND")
    visual = trimesh.visual.TextureVisuals(material=mat)
    visual.vertex_attributes["color"] = np.array(
        [[255, 0, 0, 255], [0, 0, 255, 51], [0, 0, 255, 51], [255, 0, 0, 255]], np.uint8
    )
    parts = _glb_round_trip(trimesh.Trimesh(v, f, visual=visual, process=False))
    g = init_from_mesh(parts, 500, seed=10)
    t = (g.means[:, 0] + 1) / 2
    assert np.allclose(_rgb(g), np.outer(1 - t, RED) + np.outer(t, BLUE), atol=1e-4)
    assert np.allclose(_opacity(g), 0.95 * ((1 - t) + t * 0.2), atol=1e-4)


# ---- surface initialisation: geometry -------------------------------------------------------


def test_rotation_maps_local_z_to_face_normal_and_scales():
    rng = np.random.default_rng(11)
    tri = rng.normal(size=(3, 3))
    mesh = trimesh.Trimesh(tri, [[0, 1, 2]], process=False)
    normal = np.cross(tri[1] - tri[0], tri[2] - tri[0])
    area = 0.5 * np.linalg.norm(normal)
    normal /= np.linalg.norm(normal)
    n = 200
    g = init_from_mesh([mesh], n, scale=1.5)
    rot = _quat_to_rotmat(g.quats)
    assert np.allclose(np.linalg.norm(g.quats, axis=1), 1, atol=1e-6)
    assert np.allclose(rot[:, :, 2], normal, atol=1e-6)  # same sign: winding order
    assert np.allclose(np.linalg.det(rot), 1, atol=1e-5)
    sigma = 1.5 * math.sqrt(area / (math.pi * n))
    assert np.allclose(np.exp(g.log_scales), [sigma, sigma, 0.1 * sigma], rtol=1e-6)
    # samples lie on the triangle's plane
    assert np.allclose((g.means - tri[0]) @ normal, 0, atol=1e-5)


def test_box_normals_per_face():
    g = init_from_mesh([trimesh.creation.box(extents=(1, 1, 1))], 3000, seed=12)
    rot = _quat_to_rotmat(g.quats)
    on_face = np.abs(np.abs(g.means) - 0.5) < 1e-6  # which coordinate sits on ±0.5
    single = on_face.sum(axis=1) == 1
    assert single.mean() > 0.99
    axis = np.argmax(on_face[single], axis=1)
    expected = np.zeros((single.sum(), 3))
    expected[np.arange(len(axis)), axis] = np.sign(g.means[single][np.arange(len(axis)), axis])
    assert np.allclose(rot[single, :, 2], expected, atol=1e-6)  # outward normals


def test_sigma_formula_on_unit_square():
    v = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], float)
    mesh = trimesh.Trimesh(v, [[0, 1, 2], [0, 2, 3]])
    n = 1000
    g = init_from_mesh([mesh], n, scale=2.0)
    sigma = 2.0 * math.sqrt(1.0 / (math.pi * n))
    s = np.exp(g.log_scales.astype(np.float64))
    assert np.allclose(s[:, 0], sigma, rtol=1e-6) and np.allclose(s[:, 1], sigma, rtol=1e-6)
    assert np.allclose(s[:, 2], 0.1 * sigma, rtol=1e-6)
    assert np.allclose(_opacity(g), 0.95, atol=1e-6)
    assert np.all((g.means[:, :2] >= -1e-6) & (g.means[:, :2] <= 1 + 1e-6))


def test_area_weighting_across_parts():
    v, f = _quad(0.5)  # area 1
    small = trimesh.Trimesh(v - [5, 0, 0], f)
    big = trimesh.Trimesh(v * math.sqrt(3) + [5, 0, 0], f)  # area 3
    n = 20000
    g = init_from_mesh([small, big], n, seed=13)
    frac_big = np.mean(g.means[:, 0] > 0)
    assert abs(frac_big - 0.75) < 0.015
    # uniform within a part too: each quadrant of the big square gets a quarter of its samples
    big_pts = g.means[g.means[:, 0] > 0] - [5, 0, 0]
    quads = (big_pts[:, 0] > 0).astype(int) * 2 + (big_pts[:, 1] > 0)
    counts = np.bincount(quads, minlength=4) / len(big_pts)
    assert np.allclose(counts, 0.25, atol=0.02)


def test_degenerate_faces_never_sampled():
    v = np.array(
        [[0, 0, 0], [1, 0, 0], [0, 1, 0], [10, 10, 10], [11, 11, 11], [12, 12, 12], [9, 9, 9]],
        float,
    )
    f = np.array([[3, 4, 5], [0, 1, 2], [6, 6, 6]])  # collinear, real, repeated vertex
    g = init_from_mesh([trimesh.Trimesh(v, f, process=False)], 5000, seed=14)
    assert np.all(np.abs(g.means).max(axis=1) <= 1 + 1e-6)
    assert np.all(np.isfinite(g.quats))


def test_init_errors():
    v, f = _quad()
    flat = trimesh.Trimesh(np.zeros((3, 3)), [[0, 1, 2]], process=False)
    with pytest.raises(ValueError, match="zero total surface area"):
        init_from_mesh([flat], 10)
    bad = trimesh.Trimesh(v.copy(), f, process=False)
    bad.vertices[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        init_from_mesh([bad], 10)
    with pytest.raises(ValueError, match="n must be"):
        init_from_mesh([trimesh.Trimesh(v, f)], 0)
    with pytest.raises(ValueError, match="scale"):
        init_from_mesh([trimesh.Trimesh(v, f)], 10, scale=0.0)
    with pytest.raises(ValueError, match="no triangle meshes"):
        init_from_mesh([], 10)


def test_determinism():
    mesh = _textured_quad(_quadrant_texture())
    a = init_from_mesh([mesh], 500, seed=42)
    b = init_from_mesh([mesh], 500, seed=42)
    c = init_from_mesh([mesh], 500, seed=43)
    _assert_sets_equal(a, b)
    assert not np.array_equal(a.means, c.means)


def test_init_output_round_trips_through_ply(tmp_path):
    g = init_from_mesh([_textured_quad(_quadrant_texture())], 300, seed=1)
    write_ply(tmp_path / "init.ply", g)
    _assert_sets_equal(read_ply(tmp_path / "init.ply"), g)


def test_duck_is_yellow(khronos):
    parts = load_mesh_parts(khronos / "Duck.glb")
    g = init_from_mesh(parts, 20000, seed=0)
    assert len(g) == 20000
    mean = _rgb(g).mean(axis=0)
    assert mean[0] > 0.8 and mean[1] > 0.6 and mean[2] < 0.2


# ---- load_mesh_parts ------------------------------------------------------------------------


def test_load_mesh_parts_applies_node_transforms(tmp_path):
    v, f = _quad()
    scene = trimesh.Scene()
    scene.add_geometry(
        trimesh.Trimesh(v, f),
        node_name="a",
        transform=trimesh.transformations.translation_matrix([3, 0, 0]),
    )
    scene.add_geometry(
        trimesh.Trimesh(v, f),
        node_name="b",
        transform=trimesh.transformations.translation_matrix([-3, 0, 0]),
    )
    path = tmp_path / "two.glb"
    path.write_bytes(scene.export(file_type="glb"))
    parts = load_mesh_parts(path)
    centres = sorted(float(p.vertices[:, 0].mean()) for p in parts)
    assert np.allclose(centres, [-3, 3])
    with pytest.raises(ValueError, match="missing.glb"):
        load_mesh_parts(tmp_path / "missing.glb")


# ---- fitted 3DGS import ---------------------------------------------------------------------


def test_find_fitted_ply_picks_largest_iteration(tmp_path):
    obj = tmp_path / "obj_0"
    for k in (7000, 30000, 999):
        d = obj / "point_cloud" / f"iteration_{k}"
        d.mkdir(parents=True)
        (d / "point_cloud.ply").write_bytes(b"")
    (obj / "point_cloud" / "iteration_40000").mkdir()  # no PLY inside: ignored
    (obj / "point_cloud" / "iteration_x").mkdir()
    assert find_fitted_ply(obj) == obj / "point_cloud" / "iteration_30000" / "point_cloud.ply"
    direct = obj / "point_cloud" / "iteration_7000" / "point_cloud.ply"
    assert find_fitted_ply(direct) == direct


def test_find_fitted_ply_errors(tmp_path):
    empty = tmp_path / "obj_3"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"obj_3.*point_cloud/iteration_<k>/point_cloud\.ply"):
        find_fitted_ply(empty)
    with pytest.raises(ValueError, match="obj_9"):
        find_fitted_ply(tmp_path / "obj_9")
    txt = tmp_path / "notes.txt"
    txt.write_text("x")
    with pytest.raises(ValueError, match="notes.txt"):
        find_fitted_ply(txt)


def test_to_normalised():
    g = _random_set(20, 1)
    c, s = np.array([1.0, -2.0, 0.5]), 0.25
    h = to_normalised(g, c, s)
    assert np.allclose(h.means, (g.means - c) * s, atol=1e-6)
    assert np.allclose(h.log_scales, g.log_scales + math.log(s), atol=1e-6)
    assert np.allclose(np.exp(h.log_scales), np.exp(g.log_scales) * s, rtol=1e-5)
    for name in ("quats", "opacity_logits", "sh"):
        assert np.array_equal(getattr(h, name), getattr(g, name))
    assert h.means is not g.means
    with pytest.raises(ValueError, match="scale"):
        to_normalised(g, c, -1.0)
    with pytest.raises(ValueError, match="centre"):
        to_normalised(g, [0, 0], 1.0)


def test_concat_pads_sh():
    a, b = _random_set(3, 0, seed=1), _random_set(4, 2, seed=2)
    g = concat([a, b])
    assert len(g) == 7 and g.sh.shape == (7, 9, 3)
    assert np.array_equal(g.sh[:3, :1], a.sh) and np.all(g.sh[:3, 1:] == 0)
    assert np.array_equal(g.sh[3:], b.sh)
    assert np.array_equal(g.means, np.concatenate([a.means, b.means]))
    with pytest.raises(ValueError):
        concat([])
