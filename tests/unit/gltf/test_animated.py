"""The animated glTF writers (chord.gltf.morphed, chord.gltf.skinned): morph targets and the
skinned file reproduce the deformation (the skin by the glTF skinning formula evaluated from the
file), the files load back and pass the Khronos validator."""

from __future__ import annotations

import copy
import io
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import trimesh
from PIL import Image

from chord.gltf import container, morphed, skeleton
from chord.gltf.animated_scene import Skinning
from chord.gltf.skinned import dynamic_scene_skinned_glb
from tests.conftest import box, validate_glb

# --- a source GLB with a node hierarchy and one mesh placed twice ------------------------------


def _quat_xyzw(axis, angle) -> list[float]:
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return [*(axis * math.sin(angle / 2)).tolist(), math.cos(angle / 2)]


def instanced_glb(path: Path) -> None:
    """A parent node (translated, scaled) with two children (rotated) sharing one box mesh."""
    b = container.GltfBuilder("test")
    mesh = trimesh.creation.box(extents=(0.2, 0.4, 0.2))
    pos = b.add_accessor(mesh.vertices, "VEC3", target=container.ARRAY_BUFFER)
    idx = b.add_view(mesh.faces.astype(np.uint32).tobytes(), target=container.ELEMENT_ARRAY_BUFFER)
    ind = b.add(
        "accessors",
        {"bufferView": idx, "componentType": 5125, "count": mesh.faces.size, "type": "SCALAR"},
    )
    m = b.add("meshes", {"primitives": [{"attributes": {"POSITION": pos}, "indices": ind}]})
    a = b.add(
        "nodes", {"mesh": m, "rotation": _quat_xyzw([0, 1, 0], 0.7), "translation": [0.3, 0, 0]}
    )
    c = b.add("nodes", {"mesh": m, "matrix": np.eye(4).ravel().tolist()})
    root = b.add(
        "nodes", {"children": [a, c], "translation": [0, 0.2, 0.1], "scale": [1.5, 1.5, 1.5]}
    )
    b.doc["scenes"] = [{"nodes": [root]}]
    b.doc["scene"] = 0
    b.to_glb(path)


def scene_graph_world(doc: dict, blob: bytes) -> dict[int, np.ndarray]:
    """World matrices [4, 4] of the default scene's nodes by trimesh's own scene graph, not
    :func:`container.world_matrices` (the function under test): each node is named by its
    index, the file loaded with ``force="scene"`` and ``scene.graph.get`` asked per node (the
    nodes trimesh adds itself, one per primitive of a many-primitive mesh, left out)."""
    named = copy.deepcopy(doc)
    for i, node in enumerate(named["nodes"]):
        node["name"] = f"node_{i}"
    data = io.BytesIO(container.glb_bytes(named, blob))
    scene = trimesh.load(data, file_type="glb", force="scene")
    return {
        int(m[1]): np.asarray(scene.graph.get(n)[0], dtype=np.float64)
        for n in scene.graph.nodes
        if (m := re.fullmatch(r"node_(\d+)", str(n)))
    }


def test_world_matrices_compose_parent_then_child(tmp_path):
    """World = parent's world · the node's local transform (glTF's node hierarchy), against products
    written out here and trimesh's scene graph: the instanced scene's root (T·S) over a rotated,
    translated child and an identity-matrix child."""
    instanced_glb(tmp_path / "src.glb")
    doc, blob = container.read_glb(tmp_path / "src.glb")
    tf = trimesh.transformations
    x, y, z, w = _quat_xyzw([0, 1, 0], 0.7)
    root = tf.translation_matrix([0, 0.2, 0.1]) @ np.diag([1.5, 1.5, 1.5, 1.0])
    child = tf.translation_matrix([0.3, 0, 0]) @ tf.quaternion_matrix([w, x, y, z])
    expect = {2: root, 0: root @ child, 1: root}
    world = container.world_matrices(doc, doc["scenes"][0]["nodes"])
    assert sorted(world) == [0, 1, 2]
    for n, M in expect.items():
        np.testing.assert_allclose(world[n], M, rtol=0, atol=1e-12, err_msg=f"node {n}")
    graph = scene_graph_world(doc, blob)
    for n, M in expect.items():
        np.testing.assert_allclose(graph[n], M, rtol=0, atol=1e-12, err_msg=f"trimesh, node {n}")
    # the child's placement: 1.5·(0.3, 0, 0) + (0, 0.2, 0.1), not R·(0, 0.2, 0.1) + (0.3, 0, 0)
    np.testing.assert_allclose(world[0][:3, 3], [0.45, 0.2, 0.1], atol=1e-12)


def bend(frames: int):
    """A known non-rigid deformer: x shifts by 0.05·t·y² + 0.01·t and z by 0.04·t·x
    (normalised units; a vertex's move depends on its whole placement, x and z included)."""

    def apply(p: np.ndarray) -> np.ndarray:
        t = np.arange(frames, dtype=np.float64)[:, None]
        out = np.repeat(p[None], frames, 0)
        out[..., 0] += 0.05 * t * p[None, :, 1] ** 2 + 0.01 * t
        out[..., 2] += 0.04 * t * p[None, :, 0]
        return out

    return apply


@pytest.fixture
def glb_scene(tmp_path):
    instanced_glb(tmp_path / "obj_0.glb")
    slab = box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))
    trimesh.Scene(slab).export(tmp_path / "obj_1.glb", file_type="glb")
    F, fps = 6, 5.0
    centre, scale = np.array([0.1, -0.2, 0.05]), 0.8
    out = tmp_path / "dynamic_scene.glb"
    summary = morphed.dynamic_scene_glb(
        out,
        [("obj_0", tmp_path / "obj_0.glb", bend(F)), ("obj_1", tmp_path / "obj_1.glb", None)],
        centre=centre,
        scale=scale,
        frames=F,
        fps=fps,
    )
    return out, summary, F, fps, centre, scale


def test_glb_morph_targets_reproduce_the_deformation(glb_scene):
    out, summary, F, fps, centre, scale = glb_scene
    assert summary == {"nodes": 2, "targets": F - 1, "frames": F}
    doc, blob = container.read_glb(out)
    assert [doc["nodes"][r]["name"] for r in doc["scenes"][0]["nodes"]] == ["obj_0", "obj_1"]
    world = scene_graph_world(doc, blob)  # placements as a glTF reader composes them
    (anim,) = doc["animations"]
    animated = sorted(ch["target"]["node"] for ch in anim["channels"])
    assert all(ch["target"]["path"] == "weights" for ch in anim["channels"])
    meshes = [doc["nodes"][n]["mesh"] for n in animated]
    assert len(set(meshes)) == 2  # the shared mesh was duplicated per node
    for n in animated:
        mesh = doc["meshes"][doc["nodes"][n]["mesh"]]
        assert mesh["weights"] == [0.0] * (F - 1)
        (prim,) = mesh["primitives"]
        assert len(prim["targets"]) == F - 1
        base = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        M = world[n]
        to_n = lambda v, M=M: ((v @ M[:3, :3].T + M[:3, 3]) - centre) * scale  # noqa: E731
        expected = bend(F)(to_n(base))
        np.testing.assert_allclose(to_n(base), expected[0], atol=1e-12)  # frame 0 = the base
        for k, target in enumerate(prim["targets"], start=1):
            acc = doc["accessors"][target["POSITION"]]
            assert "min" in acc and "max" in acc
            moved = base + container.read_accessor(doc, blob, target["POSITION"])
            np.testing.assert_allclose(to_n(moved), expected[k], atol=1e-5)
    # the static slab is copied unanimated
    static = [n for n in world if "mesh" in doc["nodes"][n] and n not in animated]
    assert len(static) == 1 and "targets" not in doc["meshes"][doc["nodes"][static[0]]["mesh"]]
    # one STEP key per frame at k/fps, one-hot weights on target k (all zero at k = 0)
    for s in anim["samplers"]:
        assert s["interpolation"] == "STEP"
        times = container.read_accessor(doc, blob, s["input"])[:, 0]
        np.testing.assert_allclose(times, np.arange(F) / fps, rtol=1e-6)
        w = container.read_accessor(doc, blob, s["output"]).reshape(F, F - 1)
        np.testing.assert_array_equal(w, np.eye(F, F - 1, k=-1))


def test_glb_loads_back_with_trimesh(glb_scene, tmp_path):
    out, *_ = glb_scene
    scene = trimesh.load(out, force="scene")
    assert len(scene.graph.nodes_geometry) == 3  # two placements of the box, one slab
    # the base pose is the source meshes in their placements
    rows = lambda a: a[np.lexsort(np.round(a, 6).T)]  # noqa: E731
    src = [trimesh.load(tmp_path / f"obj_{i}.glb", force="scene").to_mesh() for i in (0, 1)]
    np.testing.assert_allclose(
        rows(scene.to_mesh().vertices), rows(np.concatenate([m.vertices for m in src])), atol=1e-6
    )


def test_glb_passes_the_khronos_validator(glb_scene, gltf_validator, tmp_path):
    out, *_ = glb_scene
    report = validate_glb(gltf_validator, out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_glb_copies_textures(tmp_path):
    textured = trimesh.creation.box(extents=(0.3, 0.3, 0.3))
    uv = np.random.default_rng(0).random((len(textured.vertices), 2))
    image = Image.fromarray(np.full((8, 8, 3), (200, 30, 30), np.uint8))
    textured.visual = trimesh.visual.TextureVisuals(uv=uv, image=image)
    trimesh.Scene(textured).export(tmp_path / "obj_0.glb", file_type="glb")
    out = tmp_path / "out.glb"
    morphed.dynamic_scene_glb(
        out, [("obj_0", tmp_path / "obj_0.glb", bend(3))], centre=[0, 0, 0], scale=1.0, frames=3,
        fps=10,
    )  # fmt: skip
    doc, _ = container.read_glb(out)
    assert len(doc["images"]) == 1 and len(doc["textures"]) == 1
    mat = doc["materials"][doc["meshes"][0]["primitives"][0]["material"]]
    assert mat["pbrMetallicRoughness"]["baseColorTexture"]["index"] == 0
    loaded = trimesh.load(out, force="scene")
    (geom,) = loaded.geometry.values()
    assert geom.visual.material.baseColorTexture.size == (8, 8)
    (tmp_path / "bad.glb").write_bytes(b"not a glb at all, clearly")
    with pytest.raises(ValueError, match="bad.glb: not a GLB file"):
        container.read_glb(tmp_path / "bad.glb")


def test_read_accessor_honours_stride_and_sparse():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    inter = np.zeros((4, 5), np.float32)  # 3 used + 2 padding floats per row: stride 20
    inter[:, :3] = rows
    sparse_idx = np.array([1, 3], np.uint16).tobytes() + b"\0" * 0
    sparse_val = np.array([[-1, -2, -3], [-4, -5, -6]], np.float32).tobytes()
    blob = inter.tobytes() + sparse_idx + sparse_val
    doc = {
        "bufferViews": [
            {"buffer": 0, "byteOffset": 0, "byteLength": 80, "byteStride": 20},
            {"buffer": 0, "byteOffset": 80, "byteLength": 4},
            {"buffer": 0, "byteOffset": 84, "byteLength": 24},
        ],
        "accessors": [
            {"bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3"},
            {
                "bufferView": 0, "componentType": 5126, "count": 4, "type": "VEC3",
                "sparse": {"count": 2, "indices": {"bufferView": 1, "componentType": 5123},
                           "values": {"bufferView": 2}},
            },
        ],
    }  # fmt: skip
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 0), rows)
    expect = rows.astype(np.float64)
    expect[[1, 3]] = [[-1, -2, -3], [-4, -5, -6]]
    np.testing.assert_array_equal(container.read_accessor(doc, blob, 1), expect)


def test_node_matrix_is_translation_rotation_scale():
    node = {"translation": [1, 2, 3], "rotation": _quat_xyzw([1, 2, 0.5], 0.9), "scale": [2, 3, 4]}
    x, y, z, w = node["rotation"]
    R = trimesh.transformations.quaternion_matrix([w, x, y, z])
    expect = trimesh.transformations.translation_matrix([1, 2, 3]) @ R @ np.diag([2, 3, 4, 1])
    np.testing.assert_allclose(container.node_matrix(node), expect, atol=1e-12)
    flat = np.arange(16.0)
    np.testing.assert_array_equal(
        container.node_matrix({"matrix": flat.tolist()}), flat.reshape(4, 4).T
    )


# --- the skinned scene: LBS on control-point joints ------------------------------------------

F32 = float(np.finfo(np.float32).eps)


def rotmats(q: np.ndarray) -> np.ndarray:
    """Rotation matrices [..., 3, 3] of unit quaternions [..., 4] (w, x, y, z)."""
    w, x, y, z = np.moveaxis(q, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def random_skinning(frames: int, centres, *, K: int = 3, seed: int = 0) -> Skinning:
    """Random rigid control-point motions (frame 0 the identity) and Gaussian weights on each
    point's K nearest centres."""
    rng = np.random.default_rng(seed)
    centres = np.asarray(centres, float)
    M = len(centres)
    q = np.concatenate([np.ones((frames, M, 1)), 0.4 * rng.normal(size=(frames, M, 3))], -1)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    q[1::2] *= -1.0  # q and -q alternate: the writer must keep the keys in one hemisphere
    tau = 0.05 * rng.normal(size=(frames, M, 3))
    q[0], tau[0] = (1.0, 0.0, 0.0, 0.0), 0.0

    def bind(points):
        d = ((points[:, None] - centres[None]) ** 2).sum(-1)  # [n, M]
        idx = np.argsort(d, 1)[:, :K]
        w = np.exp(-0.5 * np.take_along_axis(d, idx, 1) / 0.02) + 1e-7
        return idx, w / w.sum(1, keepdims=True)

    return Skinning(centres, q, tau, bind)


def lbs(sk: Skinning, points: np.ndarray) -> np.ndarray:
    """METHOD §5 by hand: x_t = Σ_k w_k·[R(q_{k,t})(x − c_k) + c_k + τ_{k,t}], [F, n, 3]."""
    idx, w = sk.bind(points)
    v = points[:, None] - sk.centres[idx]  # [n, K, 3]
    R = rotmats(sk.rotations)[:, idx]  # [F, n, K, 3, 3]
    moved = np.einsum("fnkij,nkj->fnki", R, v) + sk.centres[idx] + sk.translations[:, idx]
    return (w[None, :, :, None] * moved).sum(2)


def posed_world(doc: dict, blob: bytes, key: int) -> dict[int, np.ndarray]:
    """World matrices of every scene node with each animated TRS property at key ``key``."""
    doc = copy.deepcopy(doc)
    for anim in doc.get("animations", []):
        for ch in anim["channels"]:
            path = ch["target"]["path"]
            if path in ("translation", "rotation", "scale"):
                out = container.read_accessor(doc, blob, anim["samplers"][ch["sampler"]]["output"])
                doc["nodes"][ch["target"]["node"]][path] = out[key].tolist()
    return scene_graph_world(doc, blob)


def skinned_vertices(doc: dict, blob: bytes, node: int, key: int) -> list[np.ndarray]:
    """The glTF skinning formula from the file: per primitive of ``node``'s mesh, the world
    positions [n, 3] Σ_i w_i·J_{j_i}(key)·IBM_{j_i}·v at animation key ``key``."""
    world = posed_world(doc, blob, key)
    skin = doc["skins"][doc["nodes"][node]["skin"]]
    ibm = container.read_accessor(doc, blob, skin["inverseBindMatrices"]).reshape(-1, 4, 4)
    mats = np.stack([world[j] for j in skin["joints"]]) @ ibm.transpose(0, 2, 1)  # [J, 4, 4]
    out = []
    for prim in doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]:
        a = prim["attributes"]
        v = container.read_accessor(doc, blob, a["POSITION"])
        vh = np.concatenate([v, np.ones((len(v), 1))], 1)  # [n, 4]
        x = np.zeros((len(v), 3))
        for s in range(sum(k.startswith("JOINTS_") for k in a)):
            J = container.read_accessor(doc, blob, a[f"JOINTS_{s}"]).astype(np.int64)  # [n, 4]
            W = container.read_accessor(doc, blob, a[f"WEIGHTS_{s}"])  # [n, 4]
            for i in range(4):
                x += W[:, i, None] * np.einsum("nij,nj->ni", mats[J[:, i]], vh)[:, :3]
        out.append(x)
    return out


def float32_tolerance(*magnitudes) -> float:
    """What float32 storage allows on a chain of a few 4x4 products: 16 ulps of the largest
    coordinate magnitude involved (≈ 2e-6 relative; the writer's error is about 1e-7)."""
    return 16 * F32 * max(1.0, *magnitudes)


@pytest.fixture
def skinned_scene(tmp_path):
    instanced_glb(tmp_path / "obj_0.glb")
    slab = box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))
    trimesh.Scene(slab).export(tmp_path / "obj_1.glb", file_type="glb")
    F, fps = 6, 5.0
    centre, scale = np.array([0.1, -0.2, 0.05]), 0.8
    cps = np.random.default_rng(1).uniform(-0.4, 0.6, size=(7, 3))
    sk = random_skinning(F, cps)
    out = tmp_path / "dynamic_scene_skinned.glb"
    summary = dynamic_scene_skinned_glb(
        out,
        [("obj_0", tmp_path / "obj_0.glb", sk), ("obj_1", tmp_path / "obj_1.glb", None)],
        centre=centre,
        scale=scale,
        frames=F,
        fps=fps,
    )
    return SimpleNamespace(out=out, summary=summary, F=F, fps=fps, c=centre, s=scale, sk=sk,
                           source=tmp_path / "obj_0.glb")  # fmt: skip


def test_skinned_glb_reproduces_the_skinning(skinned_scene):
    S = skinned_scene
    assert S.summary == {"skinned": 2, "joints": 7, "morphed": 0, "targets": 0, "frames": S.F}
    doc, blob = container.read_glb(S.out)
    roots = doc["scenes"][0]["nodes"]
    scene_nodes = set(container.world_matrices(doc, roots))
    skinned = [n for n in roots if "skin" in doc["nodes"][n]]
    assert len(skinned) == 2 and len({doc["nodes"][n]["mesh"] for n in skinned}) == 2
    src, src_blob = container.read_glb(S.source)
    src_world = scene_graph_world(src, src_blob)
    src_placed = [src_world[n] for n in sorted(src_world) if "mesh" in src["nodes"][n]]
    (src_prim,) = src["meshes"][0]["primitives"]  # the one mesh both placements share
    v_l = container.read_accessor(src, src_blob, src_prim["attributes"]["POSITION"])
    (anim,) = doc["animations"]
    for s in anim["samplers"]:
        assert s["interpolation"] == "LINEAR"
        np.testing.assert_allclose(
            container.read_accessor(doc, blob, s["input"])[:, 0], np.arange(S.F) / S.fps, rtol=1e-6
        )
    for n, M in zip(skinned, src_placed, strict=True):
        node = doc["nodes"][n]
        assert not set(node) & set(container.TRS)  # glTF ignores a skinned node's transform
        skin = doc["skins"][node["skin"]]
        assert set(skin["joints"]) <= scene_nodes  # not NODE_SKIN_NO_SCENE
        assert doc["accessors"][skin["inverseBindMatrices"]]["count"] == 7
        (prim,) = doc["meshes"][node["mesh"]]["primitives"]
        assert doc["accessors"][prim["attributes"]["JOINTS_0"]]["componentType"] == 5121
        W = container.read_accessor(doc, blob, prim["attributes"]["WEIGHTS_0"])
        np.testing.assert_array_equal(W[:, 3], 0.0)  # K = 3, padded to 4
        v_w = v_l @ M[:3, :3].T + M[:3, 3]  # the source placement
        X = lbs(S.sk, (v_w - S.c) * S.s) / S.s + S.c  # [F, n, 3] world
        tol = float32_tolerance(np.abs(X).max(), np.abs(S.c).max())
        # the vertices are stored placed (world coordinates), the IBMs hold no M_node
        got_v = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        np.testing.assert_allclose(got_v, v_w, rtol=0, atol=F32 * max(1.0, np.abs(v_w).max()))
        for k in range(S.F):
            (got,) = skinned_vertices(doc, blob, n, k)
            np.testing.assert_allclose(got, X[k], rtol=0, atol=tol, err_msg=f"key {k}")
        (rest,) = skinned_vertices(doc, blob, n, 0)
        np.testing.assert_allclose(rest, v_w, rtol=0, atol=tol)  # frame 0 = the source mesh
    # the joints' rotation keys stay in one hemisphere (slerp takes the short way)
    for ch in anim["channels"]:
        if ch["target"]["path"] == "rotation":
            r = container.read_accessor(doc, blob, anim["samplers"][ch["sampler"]]["output"])
            assert ((r[1:] * r[:-1]).sum(1) >= 0).all()
    # the static slab is copied unanimated
    meshes = [n for n in scene_nodes if "mesh" in doc["nodes"][n] and n not in skinned]
    assert len(meshes) == 1 and "skin" not in doc["nodes"][meshes[0]]


def test_skinned_glb_passes_the_khronos_validator(skinned_scene, gltf_validator, tmp_path):
    report = validate_glb(gltf_validator, skinned_scene.out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_skinned_glb_keeps_morph_targets_for_a_deformer(tmp_path, request):
    instanced_glb(tmp_path / "obj_0.glb")
    trimesh.Scene(box([0.3, 0.3, 0.3], [0.5, 0, 0])).export(tmp_path / "obj_1.glb", "glb")
    F = 4
    sk = random_skinning(F, np.random.default_rng(2).uniform(0.2, 0.8, size=(5, 3)), K=2)
    out = tmp_path / "mixed.glb"
    summary = dynamic_scene_skinned_glb(
        out,
        [("obj_0", tmp_path / "obj_0.glb", bend(F)), ("obj_1", tmp_path / "obj_1.glb", sk)],
        centre=[0, 0, 0], scale=1.0, frames=F, fps=8,
    )  # fmt: skip
    assert summary == {"skinned": 1, "joints": 5, "morphed": 2, "targets": F - 1, "frames": F}
    doc, blob = container.read_glb(out)
    (anim,) = doc["animations"]
    weights = [ch for ch in anim["channels"] if ch["target"]["path"] == "weights"]
    assert len(weights) == 2
    assert {anim["samplers"][ch["sampler"]]["interpolation"] for ch in weights} == {"STEP"}
    world = scene_graph_world(doc, blob)
    for ch in weights:
        n = ch["target"]["node"]
        (prim,) = doc["meshes"][doc["nodes"][n]["mesh"]]["primitives"]
        assert "JOINTS_0" not in prim["attributes"] and len(prim["targets"]) == F - 1
        base = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        to_w = lambda v, M=world[n]: v @ M[:3, :3].T + M[:3, 3]  # noqa: E731
        moved = base + container.read_accessor(doc, blob, prim["targets"][-1]["POSITION"])
        np.testing.assert_allclose(to_w(moved), bend(F)(to_w(base))[-1], atol=1e-5)
    (skinned,) = [n for n in doc["scenes"][0]["nodes"] if "skin" in doc["nodes"][n]]
    src = trimesh.load(tmp_path / "obj_1.glb", force="mesh")
    (got,) = skinned_vertices(doc, blob, skinned, F - 1)
    (rest,) = skinned_vertices(doc, blob, skinned, 0)
    order = np.lexsort(np.round(rest, 5).T)
    expect = lbs(sk, rest)[F - 1]
    np.testing.assert_allclose(got[order], expect[order], atol=float32_tolerance(1.0))
    np.testing.assert_allclose(np.sort(rest, 0), np.sort(src.vertices, 0), atol=1e-6)
    # the validator last: without it (a skip) the geometry above is still checked
    report = validate_glb(request.getfixturevalue("gltf_validator"), out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_skinned_glb_is_smaller_than_morph_targets(tmp_path):
    sphere = trimesh.creation.icosphere(subdivisions=4, radius=0.3)  # 2,562 vertices
    trimesh.Scene(sphere).export(tmp_path / "obj_0.glb", file_type="glb")
    F = 21
    sk = random_skinning(F, np.random.default_rng(3).uniform(-0.3, 0.3, size=(60, 3)))
    kw = {"centre": [0, 0, 0], "scale": 1.0, "frames": F, "fps": 10}
    src = tmp_path / "obj_0.glb"
    morphed.dynamic_scene_glb(tmp_path / "morph.glb", [("obj_0", src, lambda p: lbs(sk, p))], **kw)
    dynamic_scene_skinned_glb(tmp_path / "skin.glb", [("obj_0", src, sk)], **kw)
    morph, skin = ((tmp_path / f).stat().st_size for f in ("morph.glb", "skin.glb"))
    assert len(sphere.vertices) == 2562 and skin < morph / 2, (skin, morph)  # 217 kB, 716 kB


def test_skin_weights_are_normalised_in_float32():
    w = np.random.default_rng(4).random((100_000, 3)) ** 4 + 1e-7
    w32 = skeleton.skin_weights_f32(w)
    running = np.zeros(len(w32), np.float32)
    for j in range(3):
        running += w32[:, j]  # the order the validator and a viewer add them in
    assert w32.dtype == np.float32 and np.abs(running - 1).max() <= F32
    np.testing.assert_allclose(w32, w / w.sum(1, keepdims=True), atol=2 * F32)
    with pytest.raises(ValueError, match="non-negative rows"):
        skeleton.skin_weights_f32(np.array([[0.5, -0.1]]))


def test_skinned_glb_moves_the_mesh_of_a_node_with_children(tmp_path, request):
    """A mesh node with a child keeps its place (and child); its mesh moves to a new root."""
    instanced_glb(tmp_path / "src.glb")
    doc, blob = container.read_glb(tmp_path / "src.glb")
    tip = len(doc["nodes"])
    doc["nodes"].append({"name": "tip", "translation": [0.0, 0.1, 0.0]})
    doc["nodes"][0]["children"] = [tip]  # node 0: the rotated placement of the box
    container.write_glb(tmp_path / "obj_0.glb", doc, blob)
    F = 3
    sk = random_skinning(F, np.random.default_rng(5).uniform(-0.3, 0.6, size=(4, 3)))
    out = tmp_path / "out.glb"
    summary = dynamic_scene_skinned_glb(
        out, [("obj_0", tmp_path / "obj_0.glb", sk)], centre=[0, 0, 0], scale=1.0, frames=F, fps=4
    )
    assert summary["skinned"] == 2
    got, got_blob = container.read_glb(out)
    names = [got["nodes"][n].get("name") for n in got["scenes"][0]["nodes"]]
    assert names[0] == "obj_0" and "obj_0_skinned" in names
    world = scene_graph_world(doc, blob)
    (src_prim,) = doc["meshes"][0]["primitives"]
    v_l = container.read_accessor(doc, blob, src_prim["attributes"]["POSITION"])
    for n, M in ((0, world[0]), (1, world[1])):  # the two placements, in node order
        moved = [r for r in got["scenes"][0]["nodes"] if "skin" in got["nodes"][r]][n]
        X = lbs(sk, v_l @ M[:3, :3].T + M[:3, 3])
        (x,) = skinned_vertices(got, got_blob, moved, F - 1)
        np.testing.assert_allclose(x, X[F - 1], atol=float32_tolerance(np.abs(X).max()))
    assert any(node.get("name") == "tip" for node in got["nodes"])
    report = validate_glb(request.getfixturevalue("gltf_validator"), out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]
