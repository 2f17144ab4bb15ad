"""``dynamic_splats_rigid.glb`` (chord.gltf.rigid_splats): each object's splats under a node of
its own at the object's centre; a dynamic node's translation and rotation keys, evaluated from
the file by glTF's node rule alone, move the splats by the given rigid poses; static nodes are
unanimated; the splat attributes are those of dynamic_splats.glb; no skin, no morph targets;
the Khronos validator finds nothing but the extension's attribute names it does not know."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from chord.core.errors import InputError
from chord.export import trajectories as tj
from chord.gltf import container, rigid_splats, splats
from tests.conftest import validate_glb
from tests.unit.export.test_trajectories import scripted
from tests.unit.gltf.test_animated import posed_world
from tests.unit.gltf.test_splats import EXT, F32, node_of, random_set, same_rotation, wxyz


@pytest.fixture(scope="module")
def rigid_file(tmp_path_factory):
    """obj_0 dynamic (SH degree 1) moved by a scripted rigid motion, obj_1 static, obj_2
    dynamic with poses about an origin away from its splats; world units x_n/s + c."""
    tmp = tmp_path_factory.mktemp("rigid_splats")
    rng = np.random.default_rng(8)
    F, fps, c, s = 7, 4.0, np.array([0.4, -0.3, 1.1]), 0.7
    sets = {
        "obj_0": random_set(rng, 60, 1, [-0.3, 0.1, 0.0]),
        "obj_1": random_set(rng, 40, 0, [0.0, -0.4, 0.0]),
        "obj_2": random_set(rng, 50, 0, [0.3, 0.1, 0.1]),
    }
    poses = {}
    for i, name in enumerate(("obj_0", "obj_2")):
        R, t = scripted(F, seed=10 + i)
        rest = sets[name].means[::5] / s + c  # control points in world units
        tracks = np.einsum("fij,kj->fki", R, rest) + t[:, None]
        if name == "obj_2":  # a bend on top: the fit leaves a residual
            tracks[:, :3] += np.linspace(0.0, 0.05, F)[:, None, None]
        poses[name] = tj.rigid_poses(rest, tracks, origin=rest.mean(0) + [0.5, 0.0, 0.0])
    objects = [(n, sets[n], poses.get(n)) for n in sets]
    out = tmp / "dynamic_splats_rigid.glb"
    summary = rigid_splats.rigid_splats_glb(out, objects, centre=c, scale=s, frames=F, fps=fps)
    doc, blob = container.read_glb(out)
    return SimpleNamespace(
        out=out, summary=summary, doc=doc, blob=blob, sets=sets, poses=poses, F=F, fps=fps,
        c=c, s=s,
    )  # fmt: skip


def splat_positions(doc: dict, blob: bytes, node: int) -> np.ndarray:
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    return container.read_accessor(doc, blob, prim["attributes"]["POSITION"])


def test_dynamic_nodes_play_the_rigid_poses(rigid_file):
    """The node rests at the pose's origin, its keys are the poses (rotation x, y, z, w,
    LINEAR, at k/fps), and the splats it carries sit at T_k·T_0⁻¹ of their world rest
    positions at every key."""
    S = rigid_file
    assert S.summary == {
        "gaussians": 150, "sh_degree": 1, "animated": 2, "frames": S.F,
        "residual_max": {n: float(p.residual.max()) for n, p in S.poses.items()},
    }  # fmt: skip
    assert S.summary["residual_max"]["obj_2"] > 0.001 and S.summary["residual_max"]["obj_0"] < 1e-9
    (anim,) = S.doc["animations"]
    for name, p in S.poses.items():
        node = node_of(S.doc, name)
        assert node in S.doc["scenes"][0]["nodes"]
        nd = S.doc["nodes"][node]
        assert set(nd) == {"name", "mesh", "translation", "extras"}  # no skin, no rotation
        np.testing.assert_allclose(nd["translation"], p.origin)
        assert nd["extras"]["CHORD_rigid_motion"]["residual_max"] == float(p.residual.max())
        (prim,) = S.doc["meshes"][nd["mesh"]]["primitives"]
        assert "targets" not in prim and "extras" not in prim
        assert not {k for k in prim["attributes"] if k.startswith(("JOINTS_", "WEIGHTS_"))}
        keyed = {}
        for ch in anim["channels"]:
            if ch["target"]["node"] == node:
                sampler = anim["samplers"][ch["sampler"]]
                assert sampler["interpolation"] == "LINEAR"
                times = container.read_accessor(S.doc, S.blob, sampler["input"])[:, 0]
                np.testing.assert_allclose(times, np.arange(S.F) / S.fps, rtol=F32)
                keyed[ch["target"]["path"]] = container.read_accessor(
                    S.doc, S.blob, sampler["output"]
                )
        assert set(keyed) == {"translation", "rotation"}
        mag = max(1.0, np.abs(p.position).max())
        np.testing.assert_allclose(keyed["translation"], p.position, rtol=0, atol=F32 * mag)
        assert same_rotation(wxyz(keyed["rotation"]), p.quaternion).max() <= 2 * F32
        assert (np.sum(keyed["rotation"][1:] * keyed["rotation"][:-1], 1) > 0).all()
        rest = S.sets[name].means.astype(np.float64) / S.s + S.c
        local = splat_positions(S.doc, S.blob, node)
        for k in range(S.F):
            M = posed_world(S.doc, S.blob, k)[node]
            got = local @ M[:3, :3].T + M[:3, 3]
            want = rest @ p.T[k, :3, :3].T + (p.T[k] @ np.linalg.inv(p.T[0]))[:3, 3]
            # each stored float32 (position, translation, rotation key) rounds by eps/2 of its
            # magnitude and the node rule adds a few products: 16·eps of the magnitude
            tol = 16 * F32 * max(mag, np.abs(want).max())
            np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"{name} {k}")
        assert np.abs(got - rest).max() > 0.01  # it moves


def test_static_nodes_rest_at_their_centre_unanimated(rigid_file):
    S = rigid_file
    node = node_of(S.doc, "obj_1")
    nd = S.doc["nodes"][node]
    assert set(nd) == {"name", "mesh", "translation"}
    world = S.sets["obj_1"].means.astype(np.float64) / S.s + S.c
    np.testing.assert_allclose(nd["translation"], (world.min(0) + world.max(0)) / 2)
    local = splat_positions(S.doc, S.blob, node)
    assert np.abs(local).max() < 0.5 * np.ptp(world, axis=0).max() + F32  # stored about it
    np.testing.assert_allclose(local + nd["translation"], world, rtol=0, atol=4 * F32)
    assert node not in {ch["target"]["node"] for ch in S.doc["animations"][0]["channels"]}


def test_splat_attributes_are_those_of_dynamic_splats(rigid_file):
    """Rotations, scales, opacities, SH and colours as chord.gltf.splats stores them; only the
    positions are relative to the node."""
    S = rigid_file
    assert S.doc["extensionsUsed"] == [EXT] and "skins" not in S.doc
    for name, g in S.sets.items():
        want = splats.splat_values(g, S.c, S.s, 1)
        node = S.doc["nodes"][node_of(S.doc, name)]
        (prim,) = S.doc["meshes"][node["mesh"]]["primitives"]
        assert prim["mode"] == 0 and prim["extensions"] == {EXT: splats.KERNEL}
        a = prim["attributes"]

        def read(key: str, a=a) -> np.ndarray:
            return container.read_accessor(S.doc, S.blob, a[key])

        np.testing.assert_array_equal(read(f"{EXT}:ROTATION"), want["rotation"].astype(np.float32))
        np.testing.assert_array_equal(read(f"{EXT}:SCALE"), want["scale"].astype(np.float32))
        for n in range(3):
            np.testing.assert_array_equal(
                read(f"{EXT}:SH_DEGREE_1_COEF_{n}"), want["sh"][:, 1 + n].astype(np.float32)
            )
        np.testing.assert_allclose(
            read("POSITION") + node["translation"], want["position"], rtol=0, atol=4 * F32
        )


def test_rigid_splats_pass_the_khronos_validator(rigid_file, gltf_validator, tmp_path):
    """As dynamic_splats.glb: the extension-prefixed attribute names are the only errors
    (KhronosGroup/glTF-Validator#252); renamed, the file has no error or warning."""
    report = validate_glb(gltf_validator, rigid_file.out, tmp_path)
    assert report["numWarnings"] == 0, report["messages"]
    errors = [m for m in report["messages"] if m["severity"] == 0]
    assert len(errors) == report["numErrors"] > 0
    assert {m["code"] for m in errors} == {"MESH_PRIMITIVE_INVALID_ATTRIBUTE"}
    doc, blob = container.read_glb(rigid_file.out)
    for mesh in doc["meshes"]:
        for p in mesh["primitives"]:
            p["attributes"] = {
                k.replace(f"{EXT}:", f"_{EXT}_"): v for k, v in p["attributes"].items()
            }
    plain = tmp_path / "plain.glb"
    plain.write_bytes(container.glb_bytes(doc, blob))
    report = validate_glb(gltf_validator, plain, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_rotation_keys_are_xyzw_in_one_hemisphere():
    q = np.array([[1.0, 0, 0, 0], [-0.9, 0.0, -0.1, 0.0], [0.0, 0.0, 0.0, 2.0]])
    r = rigid_splats.rotation_keys(q)
    np.testing.assert_allclose(r[0], [0, 0, 0, 1])
    np.testing.assert_allclose(r[1], np.array([0.0, 0.1, 0.0, 0.9]) / np.hypot(0.1, 0.9))
    np.testing.assert_allclose(np.abs(r[2]), [0, 0, 1, 0])


def test_a_single_frame_and_bad_input(rigid_file, tmp_path):
    S = rigid_file
    p = S.poses["obj_0"]
    one = tj.RigidPoses(p.T[:1], p.position[:1], p.quaternion[:1], p.residual[:1], p.origin)
    out = tmp_path / "one.glb"
    summary = rigid_splats.rigid_splats_glb(
        out, [("obj_0", S.sets["obj_0"], one)], centre=S.c, scale=S.s, frames=1, fps=S.fps
    )
    assert summary["animated"] == 0 and "animations" not in container.read_glb(out)[0]
    with pytest.raises(ValueError, match=r"obj_0: rigid motion of shapes"):
        rigid_splats.rigid_splats_glb(
            out, [("obj_0", S.sets["obj_0"], p)], centre=S.c, scale=S.s, frames=3, fps=S.fps
        )
    g = S.sets["obj_1"]
    empty = dataclasses.replace(
        g, means=g.means[:0], log_scales=g.log_scales[:0], quats=g.quats[:0],
        opacity_logits=g.opacity_logits[:0], sh=g.sh[:0],
    )  # fmt: skip
    with pytest.raises(InputError, match="obj_1 has no Gaussians"):
        rigid_splats.rigid_splats_glb(
            out, [("obj_1", empty, None)], centre=S.c, scale=S.s, frames=1, fps=S.fps
        )
