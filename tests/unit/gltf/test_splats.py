"""``dynamic_splats.glb`` (chord.gltf.splats): the trained Gaussians in one glTF file. Positions
and rotations evaluated from the file (glTF's skinning rule and our rotation convention, or the
morph targets) equal the package's own deformation, which the PLY sequence holds; static
objects are unanimated; the KHR_gaussian_splatting attributes read back the PLY's values; the
Khronos validator finds nothing but the extension's attribute names it does not know yet."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import trimesh

from chord.config import settings
from chord.core.errors import InputError
from chord.export import sequences, trained_scene
from chord.gaussians import gaussian_set as gs
from chord.gaussians import ply
from chord.gltf import container, splats
from chord.motion.model import build_scene
from tests.conftest import box, validate_glb
from tests.unit.gltf.test_animated import posed_world, random_skinning

F32 = float(np.finfo(np.float32).eps)
EXT = "KHR_gaussian_splatting"


def random_set(rng, n: int, degree: int, centre) -> gs.GaussianSet:
    """n Gaussians around ``centre`` with unnormalised rotations (as a user's PLY may hold)."""
    return gs.GaussianSet(
        means=np.asarray(centre) + rng.uniform(-0.15, 0.15, (n, 3)),
        log_scales=rng.normal(-4.0, 0.5, (n, 3)),
        quats=rng.normal(size=(n, 4)) * rng.uniform(0.5, 2.0, (n, 1)),
        opacity_logits=rng.normal(0.0, 2.0, n),
        sh=rng.normal(0.0, 0.5, (n, (degree + 1) ** 2, 3)),
    )


def shake(layer, generator, sigma: float = 0.02) -> None:
    """A trained-like motion: the layer's Fenwick table ~ N(0, σ²)."""
    with torch.no_grad():
        layer.cp_deform.normal_(0, sigma, generator=generator)


@pytest.fixture(scope="module")
def splat_scene(tmp_path_factory):
    """obj_0 dynamic (one layer, SH degree 1), obj_1 static (degree 0), obj_2 dynamic with a
    second layer; their PLYs, the PLY sequence and dynamic_splats.glb, as the export stage
    writes them."""
    tmp = tmp_path_factory.mktemp("splats")
    rng = np.random.default_rng(3)
    F, fps = 9, 8.0
    doc = {
        "scene": "toy",
        "normalisation": {"centre": [0.4, -0.3, 1.1], "scale": 0.7},
        "objects": [
            {"name": "obj_0", "role": "dynamic"},
            {"name": "obj_1", "role": "static"},
            {"name": "obj_2", "role": "dynamic"},
        ],
    }
    sets = {
        "obj_0": random_set(rng, 60, 1, [-0.3, 0.1, 0.0]),
        "obj_1": random_set(rng, 40, 0, [0.0, -0.4, 0.0]),
        "obj_2": random_set(rng, 50, 0, [0.3, 0.1, 0.1]),
    }
    plys = {}
    for name, g in sets.items():
        plys[name] = tmp / f"{name}.ply"
        ply.write_ply(plys[name], g)
    sets = {n: ply.read_ply(p) for n, p in plys.items()}  # what the export stage reads
    vox = {
        n: {
            "control_points": sets[n].means.mean(0) + rng.uniform(-0.15, 0.15, (m, 3)),
            "surface": sets[n].means[::3],
        }
        for n, m in (("obj_0", 6), ("obj_2", 5))
    }
    method = settings.method_from_mapping({"frame_num": F, "n_cp_num": 3})
    scene = build_scene(doc, sets, vox, method)
    gen = torch.Generator().manual_seed(0)
    shake(scene.dynamic["obj_0"].layer1, gen)
    obj2 = scene.dynamic["obj_2"]
    shake(obj2.layer1, gen)
    centres2 = torch.as_tensor(sets["obj_2"].means[::7].copy())
    obj2.add_second_layer(centres2, torch.as_tensor(sets["obj_2"].means[::2].copy()))
    shake(obj2.layer2, gen)
    g = trained_scene.scene_frames(scene, F, objects=scene.names)
    rest = gs.concat([sets[n] for n in scene.names])
    frames = sequences.write_ply_sequence(tmp / "ply", rest, g["means"], g["quats"])
    out = tmp / "dynamic_splats.glb"
    summary = trained_scene.write_splats_glb(
        out, doc=doc, scene=scene, gaussians=sets, frames=F, fps=fps
    )
    return SimpleNamespace(
        out=out, summary=summary, F=F, fps=fps, doc=doc, scene=scene, sets=sets, plys=plys,
        frames=frames, c=np.array(doc["normalisation"]["centre"]), s=0.7, tmp=tmp,
    )  # fmt: skip


def node_of(doc: dict, name: str) -> int:
    (i,) = [i for i, n in enumerate(doc["nodes"]) if n.get("name") == name]
    return i


def sequence_slice(S, name: str) -> slice:
    """The rows of ``name`` in the PLY sequence (objects concatenated in id order)."""
    start = 0
    for n in S.scene.names:
        if n == name:
            return slice(start, start + len(S.sets[n]))
        start += len(S.sets[n])
    raise KeyError(name)


def hamilton(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a ⊗ b of (w, x, y, z) quaternions [..., 4]."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


def wxyz(q_xyzw: np.ndarray) -> np.ndarray:
    return q_xyzw[..., [3, 0, 1, 2]]


def same_rotation(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance [n] between unit quaternions as rotations (q and −q are one rotation)."""
    want = want / np.linalg.norm(want, axis=-1, keepdims=True)
    return np.minimum(np.abs(got - want).max(-1), np.abs(got + want).max(-1))


def skinned_splats(doc: dict, blob: bytes, node: int, key: int):
    """From the file alone, at animation key ``key``: world positions [n, 3] by glTF's skinning
    rule Σ_i w_i·J_{j_i}·IBM_{j_i}·POSITION, rotations [n, 4] (w, x, y, z) by ours,
    N(Σ_i w_i·q_{j_i}) ⊗ ROTATION with q_j the joint's keyed local rotation, the smallest
    |Σ_i w_i·q_{j_i}| (how much normalising amplifies rounding) and the skin matrices."""
    world = posed_world(doc, blob, key)
    skin = doc["skins"][doc["nodes"][node]["skin"]]
    ibm = container.read_accessor(doc, blob, skin["inverseBindMatrices"]).reshape(-1, 4, 4)
    mats = np.stack([world[j] for j in skin["joints"]]) @ ibm.transpose(0, 2, 1)  # [J, 4, 4]
    local = {}  # each joint's rotation as keyed at ``key``
    for ch in doc["animations"][0]["channels"]:
        if ch["target"]["path"] == "rotation":
            sampler = doc["animations"][0]["samplers"][ch["sampler"]]
            local[ch["target"]["node"]] = container.read_accessor(doc, blob, sampler["output"])[key]
    q_joint = wxyz(np.stack([local[j] for j in skin["joints"]]))  # [J, 4]
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    a = prim["attributes"]
    v = container.read_accessor(doc, blob, a["POSITION"])
    vh = np.concatenate([v, np.ones((len(v), 1))], 1)
    J = container.read_accessor(doc, blob, a["JOINTS_0"]).astype(np.int64)  # [n, 4]
    W = container.read_accessor(doc, blob, a["WEIGHTS_0"])  # [n, 4]
    x = np.einsum("ni,nijk,nk->nj", W, mats[J], vh)[:, :3]
    b = np.einsum("ni,nik->nk", W, q_joint[J])  # [n, 4] the blend, unnormalised
    norm = np.linalg.norm(b, axis=1, keepdims=True)
    q_rest = wxyz(container.read_accessor(doc, blob, a[f"{EXT}:ROTATION"]))
    return x, hamilton(b / norm, q_rest), float(norm.min()), mats


def test_skinned_splats_reproduce_the_trained_deformation(splat_scene):
    S = splat_scene
    assert S.summary == {"gaussians": 150, "sh_degree": 1, "skinned": 1, "joints": 6,
                         "morphed": 1, "targets": S.F - 1, "frames": S.F}  # fmt: skip
    doc, blob = container.read_glb(S.out)
    node = node_of(doc, "obj_0_splats")
    assert node in doc["scenes"][0]["nodes"]
    assert not set(doc["nodes"][node]) & set(container.TRS)  # untransformed: see splats' doc
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    assert prim["extras"] == splats.SKINNING_EXTRAS
    rows = sequence_slice(S, "obj_0")
    (anim,) = doc["animations"]
    for s in anim["samplers"]:
        times = container.read_accessor(doc, blob, s["input"])[:, 0]
        np.testing.assert_allclose(times, np.arange(S.F) / S.fps, rtol=F32)
    for k in range(S.F):
        seq = ply.read_ply(S.frames[k])  # the package's deformation of frame k (normalised)
        want_x = seq.means[rows].astype(np.float64) / S.s + S.c  # in the file's world units
        x, q, blend, mats = skinned_splats(doc, blob, node, k)
        # Tolerance: each float32 value stored (POSITION, IBM, key translation and rotation,
        # weight) and each float32 operation of the trained deformation (difference, two
        # cross products, weighted sum over K = 3) rounds by at most eps/2 of the largest
        # magnitude in its chain; 16 such roundings on both sides together bound the error by
        # 8·eps·magnitude: 16·eps leaves a factor 2. Magnitudes: world coordinates and the
        # normalised ones taken to world units (÷ s).
        magnitude = max(1.0, np.abs(want_x).max(), np.abs(S.c).max(), np.abs(seq.means).max() / S.s)
        np.testing.assert_allclose(x, want_x, rtol=0, atol=16 * F32 * magnitude, err_msg=f"{k}")
        # Rotations are unit quaternions (magnitude 1); normalising the blend divides its
        # rounding by |blend| ≥ ``blend``.
        err = same_rotation(q, seq.quats[rows].astype(np.float64))
        assert err.max() <= 16 * F32 / blend, f"key {k}: {err.max()}"
        # the skin matrices are rigid (rotation and translation only): a splat keeps its scale
        lin = mats[:, :3, :3]
        eye = np.broadcast_to(np.eye(3), lin.shape)
        np.testing.assert_allclose(
            lin @ lin.transpose(0, 2, 1), eye, rtol=0, atol=16 * F32 * magnitude
        )
    assert k == S.F - 1 and np.abs(x - doc_rest(doc, blob, node)).max() > 100 * F32  # it moves


def doc_rest(doc: dict, blob: bytes, node: int) -> np.ndarray:
    """The rest positions as a viewer without skins places them: POSITION under the node's
    translation."""
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    at = np.array(doc["nodes"][node].get("translation", [0.0, 0.0, 0.0]))
    return container.read_accessor(doc, blob, prim["attributes"]["POSITION"]) + at


def test_morphed_splats_reproduce_the_second_layer(splat_scene):
    """An object with two control-point layers keeps one morph target per frame on POSITION
    and ROTATION, driven by STEP one-hot weights, as the skinned mesh file morphs it."""
    S = splat_scene
    doc, blob = container.read_glb(S.out)
    node = node_of(doc, "obj_2")
    assert "skin" not in doc["nodes"][node]
    assert set(doc["nodes"][node]) & set(container.TRS) == {"translation"}
    origin = np.array(doc["nodes"][node]["translation"])
    mesh = doc["meshes"][doc["nodes"][node]["mesh"]]
    (prim,) = mesh["primitives"]
    assert len(prim["targets"]) == S.F - 1 and mesh["weights"] == [0.0] * (S.F - 1)
    assert prim["extras"] == splats.MORPHING_EXTRAS
    (anim,) = doc["animations"]
    (ch,) = [c for c in anim["channels"] if c["target"] == {"node": node, "path": "weights"}]
    sampler = anim["samplers"][ch["sampler"]]
    assert sampler["interpolation"] == "STEP"
    weights = container.read_accessor(doc, blob, sampler["output"]).reshape(S.F, S.F - 1)
    a = prim["attributes"]
    base_x = container.read_accessor(doc, blob, a["POSITION"]) + origin  # the node's place
    base_q = container.read_accessor(doc, blob, a[f"{EXT}:ROTATION"])
    dx = [container.read_accessor(doc, blob, t["POSITION"]) for t in prim["targets"]]
    dq = [container.read_accessor(doc, blob, t[f"{EXT}:ROTATION"]) for t in prim["targets"]]
    rows = sequence_slice(S, "obj_2")
    for k in range(S.F):
        seq = ply.read_ply(S.frames[k])
        want_x = seq.means[rows].astype(np.float64) / S.s + S.c
        x = base_x + sum(w * d for w, d in zip(weights[k], dx, strict=True))
        q = base_q + sum(w * d for w, d in zip(weights[k], dq, strict=True))
        q = wxyz(q / np.linalg.norm(q, axis=1, keepdims=True))
        # the same bound as the skinned splats: base and delta each round by eps/2 of their
        # magnitude, the trained deformation's float32 chain by at most 14 more such roundings
        magnitude = max(1.0, np.abs(want_x).max(), np.abs(S.c).max(), np.abs(seq.means).max() / S.s)
        np.testing.assert_allclose(x, want_x, rtol=0, atol=16 * F32 * magnitude, err_msg=f"{k}")
        assert same_rotation(q, seq.quats[rows].astype(np.float64)).max() <= 16 * F32
    assert np.abs(dx[-1]).max() > 100 * F32 and np.abs(dq[-1]).max() > 100 * F32  # it moves


def test_static_splats_are_unanimated(splat_scene):
    S = splat_scene
    doc, blob = container.read_glb(S.out)
    node = node_of(doc, "obj_1")
    assert node in doc["scenes"][0]["nodes"]
    assert set(doc["nodes"][node]) == {"name", "mesh", "translation"}  # no skin
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    assert "targets" not in prim and "extras" not in prim
    assert not {k for k in prim["attributes"] if k.startswith(("JOINTS_", "WEIGHTS_"))}
    targets = [c["target"]["node"] for c in doc["animations"][0]["channels"]]
    assert node not in targets
    # the skins and channels belong to obj_0 alone: its splat node, its skeleton's joints
    (skin,) = doc["skins"]
    names = {doc["nodes"][j]["name"] for j in skin["joints"]}
    assert names == {f"obj_0_cp_{k}" for k in range(6)}
    assert {doc["nodes"][t].get("name") for t in targets} == names | {"obj_2"}
    want = S.sets["obj_1"].means.astype(np.float64) / S.s + S.c
    rows = sequence_slice(S, "obj_1")
    got = doc_rest(doc, blob, node)
    for k in (0, S.F - 1):  # the PLY sequence holds it still as well
        seq = ply.read_ply(S.frames[k]).means[rows].astype(np.float64) / S.s + S.c
        np.testing.assert_allclose(got, seq, rtol=0, atol=F32 * max(1.0, np.abs(want).max()))


def test_each_objects_node_is_at_its_centre(splat_scene):
    """Every unskinned object's node sits at the middle of its splats' world bounds (three.js
    sorts whole objects by their nodes' positions), its POSITION is relative to it, and node
    plus POSITION is the splat's world position, as stored before (x_n/s + c, then float32).
    A skinned object's node stays untransformed, its POSITION the world position (a viewer
    ignoring the skin, Babylon.js 9, ignores a skinned node's transform too)."""
    S = splat_scene
    doc, blob = container.read_glb(S.out)
    node = doc["nodes"][node_of(doc, "obj_0_splats")]
    assert not set(node) & set(container.TRS)
    (prim,) = doc["meshes"][node["mesh"]]["primitives"]
    world = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
    want = S.sets["obj_0"].means.astype(np.float64) / S.s + S.c
    np.testing.assert_array_equal(world, want.astype(np.float32))
    for name, node_name in (("obj_1", "obj_1"), ("obj_2", "obj_2")):
        node = doc["nodes"][node_of(doc, node_name)]
        want = S.sets[name].means.astype(np.float64) / S.s + S.c  # world rest positions
        centre = (want.min(0) + want.max(0)) / 2
        magnitude = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(node["translation"], centre, rtol=0, atol=F32 * magnitude)
        (prim,) = doc["meshes"][node["mesh"]]["primitives"]
        rel = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        half = (want.max(0) - want.min(0)) / 2
        np.testing.assert_allclose(np.abs(rel).max(0), half, rtol=0, atol=F32 * magnitude)
        # float32 storage of the world position rounded by eps/2 of its magnitude; of the
        # relative one by less, plus the sum's rounding: eps of the magnitude bounds both
        world32 = want.astype(np.float32).astype(np.float64)
        got = rel + node["translation"]
        np.testing.assert_allclose(got, world32, rtol=0, atol=F32 * magnitude)


def test_splat_attributes_read_back_the_ply(splat_scene):
    """KHR_gaussian_splatting's attributes (the newest spec text): SCALE linear, OPACITY
    linear, ROTATION unit (x, y, z, w), SH raw per degree and order, the trained degree."""
    S = splat_scene
    doc, blob = container.read_glb(S.out)
    assert doc["extensionsUsed"] == [EXT] and "extensionsRequired" not in doc
    for name in ("obj_0", "obj_1", "obj_2"):
        (mesh,) = [m for m in doc["meshes"] if m["name"] == name]
        (prim,) = mesh["primitives"]
        assert prim["mode"] == 0 and "material" not in prim and "indices" not in prim
        # the Release Candidate's text (the revision splats.py names): kernel and colorSpace
        # required, its one kernel, one of its two colour spaces, projection and
        # sortingMethod their defaults, no other property
        ext = prim["extensions"][EXT]
        assert set(ext) == {"kernel", "colorSpace", "projection", "sortingMethod"}
        assert ext["kernel"] == "ellipse"
        assert ext["colorSpace"] == "srgb_rec709_display"  # METHOD §2: sRGB colours
        assert (ext["projection"], ext["sortingMethod"]) == ("perspective", "cameraDistance")
        a = prim["attributes"]
        sh_names = {k for k in a if k.startswith(f"{EXT}:SH_")}
        # the trained (rendered) degree is 1: obj_0's; the degree-0 objects are zero-padded
        assert sh_names == {f"{EXT}:SH_DEGREE_0_COEF_0"} | {
            f"{EXT}:SH_DEGREE_1_COEF_{n}" for n in range(3)
        }
        for key, kind in [("POSITION", "VEC3"), (f"{EXT}:ROTATION", "VEC4"),
                          (f"{EXT}:SCALE", "VEC3"), (f"{EXT}:OPACITY", "SCALAR"),
                          *((k, "VEC3") for k in sh_names)]:  # fmt: skip
            acc = doc["accessors"][a[key]]
            assert (acc["componentType"], acc["type"]) == (container.FLOAT, kind), key
        g = ply.read_ply(S.plys[name])  # the object's PLY as the gaussians stage wrote it

        def read(key: str, a=a) -> np.ndarray:
            return container.read_accessor(doc, blob, a[key])

        # float32 storage of values computed in float64: eps/2 relative, eps absolute for
        # the unit quaternions (magnitude 1)
        exp_scale = np.exp(g.log_scales.astype(np.float64)) / S.s
        np.testing.assert_allclose(read(f"{EXT}:SCALE"), exp_scale, rtol=F32, atol=0)
        opacity = 1.0 / (1.0 + np.exp(-g.opacity_logits.astype(np.float64)))
        np.testing.assert_allclose(read(f"{EXT}:OPACITY")[:, 0], opacity, rtol=F32, atol=0)
        assert (read(f"{EXT}:OPACITY") >= 0).all() and (read(f"{EXT}:OPACITY") <= 1).all()
        q = read(f"{EXT}:ROTATION")
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=0, atol=2 * F32)
        assert same_rotation(wxyz(q), g.quats.astype(np.float64)).max() <= 2 * F32
        np.testing.assert_array_equal(read(f"{EXT}:SH_DEGREE_0_COEF_0"), g.sh[:, 0])
        for n in range(3):  # order m = n − 1, gsplat's basis order
            want = g.sh[:, 1 + n] if g.sh_degree >= 1 else np.zeros((len(g), 3))
            np.testing.assert_array_equal(read(f"{EXT}:SH_DEGREE_1_COEF_{n}"), want)
        # the fallback colour: linear RGB of the DC colour, alpha the opacity
        colour = doc["accessors"][a["COLOR_0"]]
        assert colour["componentType"] == container.UNSIGNED_BYTE and colour["normalized"]
        rgb = np.clip(0.5 + gs.C0 * g.sh[:, 0].astype(np.float64), 0, 1)
        want = np.concatenate([splats.srgb_to_linear(rgb), opacity[:, None]], 1)
        np.testing.assert_allclose(read("COLOR_0"), want, rtol=0, atol=0.5 / 255 + F32)


def test_the_docs_name_the_spec_revision_the_writer_follows():
    """The docs' "which splat file plays where" names the commit of the spec text that
    chord.gltf.splats says it follows (its docstring: the one place it is stated)."""
    import re
    from pathlib import Path

    (revision,) = re.findall(r"KhronosGroup/glTF commit ([0-9a-f]{40})", splats.__doc__)
    text = (Path(__file__).resolve().parents[3] / "docs/outputs.md").read_text()
    start = text.index("## Which splat file plays where")
    table = text[start : text.index("| viewer |", start)]
    assert f"KhronosGroup/glTF `{revision[:7]}`" in table
    assert "Release Candidate" in table


def test_splats_pass_the_khronos_validator(splat_scene, gltf_validator, tmp_path):
    """The validator (2.0.0-dev.3.10) rejects every extension-prefixed attribute name
    (KhronosGroup/glTF-Validator#252: glTF's core text allows them only after glTF#2514):
    those are its only errors. With the same attributes given application-specific names
    (``_...``), so that it checks their accessors too, the file has no other error and no
    warning."""
    report = validate_glb(gltf_validator, splat_scene.out, tmp_path)
    doc, blob = container.read_glb(splat_scene.out)
    skinned = [f"/nodes/{i}" for i, n in enumerate(doc["nodes"]) if "skin" in n]
    assert skinned == [f"/nodes/{node_of(doc, 'obj_0_splats')}"]
    no_warnings(report)
    errors = [m for m in report["messages"] if m["severity"] == 0]
    assert len(errors) == report["numErrors"] > 0
    for m in errors:
        assert m["code"] == "MESH_PRIMITIVE_INVALID_ATTRIBUTE", m
        assert m["pointer"].rsplit("/", 1)[1].startswith(f"{EXT}:"), m
    infos = [m["code"] for m in report["messages"] if m["severity"] == 2]
    assert infos == ["UNSUPPORTED_EXTENSION"]
    rename = lambda attrs: {k.replace(f"{EXT}:", f"_{EXT}_"): v for k, v in attrs.items()}  # noqa: E731
    for mesh in doc["meshes"]:
        for p in mesh["primitives"]:
            p["attributes"] = rename(p["attributes"])
            p["targets"] = [rename(t) for t in p.get("targets", [])] or p.pop("targets", [])
            if not p["targets"]:
                del p["targets"]
    plain = tmp_path / "plain.glb"
    plain.write_bytes(container.glb_bytes(doc, blob))
    report = validate_glb(gltf_validator, plain, tmp_path)
    assert report["numErrors"] == 0, report["messages"]
    no_warnings(report)


def no_warnings(report: dict) -> None:
    """The report has no warning (a skinned splat node is untransformed)."""
    assert report["numWarnings"] == 0, report["messages"]


def test_splats_share_the_skinned_glbs_joints_and_keys(splat_scene, tmp_path):
    """The splats' skeleton is dynamic_scene_skinned.glb's: the same joint nodes (names and
    rest translations), the same key times and the same key values."""
    S = splat_scene
    sources = {}
    for i, name in enumerate(("obj_0", "obj_1", "obj_2")):
        sources[name] = tmp_path / f"{name}.glb"
        mesh = box([0.2, 0.2, 0.2], [0.1 * i, 0.0, 0.0])
        trimesh.Scene(mesh).export(sources[name], file_type="glb")
    mesh_out = tmp_path / "dynamic_scene_skinned.glb"
    trained_scene.write_glb(mesh_out, doc=S.doc, scene=S.scene, sources=sources, frames=S.F,
                      fps=S.fps, skinned=True)  # fmt: skip

    def keys(path: Path) -> dict:
        doc, blob = container.read_glb(path)
        anim = doc["animations"][0]
        out = {}
        for ch in anim["channels"]:
            node = doc["nodes"][ch["target"]["node"]]
            if ch["target"]["path"] in ("translation", "rotation"):
                s = anim["samplers"][ch["sampler"]]
                out[node["name"], ch["target"]["path"]] = (
                    node.get("translation"),
                    container.read_accessor(doc, blob, s["input"]),
                    container.read_accessor(doc, blob, s["output"]),
                    s["interpolation"],
                )
        skel = doc["nodes"][node_of(doc, "obj_0_skeleton")]
        return out, {k: v for k, v in skel.items() if k != "children"}

    mesh_keys, mesh_skel = keys(mesh_out)
    splat_keys, splat_skel = keys(S.out)
    assert mesh_skel == splat_skel and not set(mesh_skel) & set(container.TRS)
    assert mesh_keys.keys() == splat_keys.keys() and len(mesh_keys) == 2 * 6
    for k, (rest, times, values, interp) in mesh_keys.items():
        rest2, times2, values2, interp2 = splat_keys[k]
        assert rest == rest2 and interp == interp2 == "LINEAR"
        np.testing.assert_array_equal(times, times2)
        np.testing.assert_array_equal(values, values2)


def test_bad_input_is_named(tmp_path, splat_scene):
    S = splat_scene
    g = S.sets["obj_1"]
    kw = {"centre": S.c, "scale": S.s, "frames": 3, "fps": 1.0}
    with pytest.raises(ValueError, match="obj_9: the deformer returned positions"):
        splats.dynamic_splats_glb(
            tmp_path / "a.glb", [("obj_9", g, lambda: (np.zeros((3, 1, 3)), np.zeros((3, 1, 4))))],
            **kw,
        )  # fmt: skip
    empty = gs.GaussianSet(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 4)), np.zeros(0),
                           np.zeros((0, 1, 3)))  # fmt: skip
    with pytest.raises(InputError, match="b.glb: obj_5 has no Gaussians"):
        splats.dynamic_splats_glb(tmp_path / "b.glb", [("obj_5", empty, None)], **kw)
    zero = gs.GaussianSet(g.means, g.log_scales, np.zeros_like(g.quats), g.opacity_logits, g.sh)
    with pytest.raises(InputError, match="e.glb: obj_1: Gaussian 0 has a zero rotation"):
        splats.dynamic_splats_glb(tmp_path / "e.glb", [("obj_1", zero, None)], **kw)
    sk = trained_scene.skinning(S.scene.dynamic["obj_0"], S.F)  # 9 frames of keys, not 3
    with pytest.raises(ValueError, match="obj_0: rotations"):
        splats.dynamic_splats_glb(tmp_path / "c.glb", [("obj_0", S.sets["obj_0"], sk)], **kw)
    with pytest.raises(InputError, match="no Gaussians given for obj_1"):
        only = {"obj_0": S.sets["obj_0"]}
        trained_scene.write_splats_glb(
            tmp_path / "d.glb", doc=S.doc, scene=S.scene, gaussians=only, frames=S.F, fps=S.fps
        )
    assert not any(tmp_path.glob("*.glb"))


def test_a_joint_keyed_in_the_other_hemisphere_is_named(tmp_path, caplog):
    """The joints' keys stay in one hemisphere; where that negates one joint of a frame and
    not the others, the keyed blend is not the trained one, and the writer says which frame."""
    rng = np.random.default_rng(0)
    g = random_set(rng, 30, 0, [0.0, 0.0, 0.0])
    sk = random_skinning(5, g.means[:4].astype(np.float64))  # every joint negated on odd frames
    kw = {"centre": [0.0, 0.0, 0.0], "scale": 1.0, "frames": 5, "fps": 5.0}
    with caplog.at_level(logging.WARNING, logger="chord.gltf.splats"):
        splats.dynamic_splats_glb(tmp_path / "a.glb", [("obj_0", g, sk)], **kw)
    assert "negated" not in caplog.text  # all joints of a frame at once: the same rotations
    sk.rotations[2, 0] *= -1.0  # one joint alone
    splats.dynamic_splats_glb(tmp_path / "b.glb", [("obj_0", g, sk)], **kw)
    assert "frames [2] are negated for some joints only" in caplog.text
