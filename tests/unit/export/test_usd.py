"""scene.usda (chord.export.usd): pxr opens it, the stage metadata Isaac Sim's SimReady rules
ask for, the time codes of the frames, the ops in order, and at every time code each object's
points as pxr evaluates them (its Xform, and UsdSkel's skinning for a skinned object) equal
the project's deform() of the source mesh at that frame, in Z-up."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import trimesh
from pxr import Usd, UsdGeom, UsdSkel

from chord.export import trained_scene, trajectories, usd
from chord.gaussians.gaussian_set import GaussianSet
from tests.conftest import box
from tests.unit.export.test_trajectories import box_object, script_rigid, scripted, shake

F, FPS = 5, 10.0
F32 = float(np.finfo(np.float32).eps)
C, S = np.array([0.2, 0.35, -0.1]), 1.5  # the normalisation: x_n = (x_w − c)·s


def _source(folder, name, extents, centre_n) -> dict:
    """obj_<i>.glb: a box at ``centre_n`` (normalised) in world units; its scene.json entry."""
    mesh = box(extents, np.asarray(centre_n) / S + C)
    trimesh.Scene(mesh).export(folder / f"{name}.glb", file_type="glb")
    b = (mesh.bounds - C) * S
    return {"name": name, "source": str(folder / f"{name}.glb"), "bounds": b.tolist()}


@pytest.fixture
def scene(tmp_path):
    """obj_0 moves rigidly, obj_1 is static, obj_2 bends (one layer: skinned), obj_3 has a
    second layer (points)."""
    centres = {"obj_0": (0.3, 0.2, 0.0), "obj_2": (-0.3, 0.2, 0.0), "obj_3": (0.0, 0.2, 0.3)}
    objects = []
    for name, role in (("obj_0", "dynamic"), ("obj_1", "static"), ("obj_2", "dynamic"),
                       ("obj_3", "dynamic")):  # fmt: skip
        at = centres.get(name, (0.0, -0.1, 0.0))
        extents = (0.8, 0.05, 0.8) if role == "static" else (0.2, 0.25, 0.15)
        objects.append({**_source(tmp_path, name, np.asarray(extents) / S, at), "role": role})
    objects.append({"name": "obj_4", "role": "avoided", "source": "obj_4.glb", "bounds": []})
    dyn = {n: box_object(n, F, centre=at, extents=(0.2, 0.25, 0.15)) for n, at in centres.items()}
    R, t = scripted(F, seed=11)
    script_rigid(dyn["obj_0"], R * 1.0, t * 0.2)
    shake(dyn["obj_2"], seed=1)
    shake(dyn["obj_3"], seed=2)
    o3 = dyn["obj_3"]
    o3.add_second_layer(o3.layer1.centres + 0.01, o3.surface)
    with torch.no_grad():
        o3.layer2.cp_deform.normal_(0, 0.02, generator=torch.Generator().manual_seed(3))
    doc = {"scene": "four", "normalisation": {"centre": C.tolist(), "scale": S}, "objects": objects}
    sources = {o["name"]: tmp_path / f"{o['name']}.glb" for o in objects[:4]}
    gaussians = trained_gaussians(dyn, static={"obj_1": (0.0, -0.1, 0.0)})
    out = tmp_path / "scene.usda"
    summary = usd.write_usd(
        out, doc=doc, scene=SimpleNamespace(dynamic=dyn), sources=sources, gaussians=gaussians,
        frames=F, fps=FPS, out_splats=tmp_path / "splats.usd",
    )  # fmt: skip
    return SimpleNamespace(
        out=out, doc=doc, dyn=dyn, sources=sources, summary=summary, gaussians=gaussians
    )


def trained_gaussians(dyn: dict, static: dict, seed: int = 5) -> dict:
    """Gaussians of each object, normalised: a dynamic one's at its rest means with seeded
    rotations (also its rest_quats) and the static ones' in a box at their centre; seeded
    log-scales, opacity logits and SH of degrees 1, 2, 3 in turn (the axis change mixes
    every degree above 0)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, name in enumerate(sorted([*dyn, *static])):
        if name in dyn:
            means = dyn[name].rest_means.numpy()
        else:
            means = np.asarray(static[name]) + rng.uniform(-0.2, 0.2, (12, 3))
        q = rng.normal(size=(len(means), 4))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        if name in dyn:
            with torch.no_grad():
                dyn[name].rest_quats.copy_(torch.as_tensor(q, dtype=torch.float32))
        degree = 1 + i % 3
        out[name] = GaussianSet(
            means=means, log_scales=rng.normal(-3.0, 0.5, (len(means), 3)), quats=q,
            opacity_logits=rng.normal(0.0, 2.0, len(means)),
            sh=rng.normal(0.0, 0.5, (len(means), (degree + 1) ** 2, 3)),
        )  # fmt: skip
    return out


def _expected(scene, name: str) -> np.ndarray:
    """deform() of the source mesh's vertices at every frame, input units, Z-up [F, n, 3]."""
    v_w, _, _ = usd.source_mesh(scene.sources[name])
    X = v_w[None].repeat(F, 0)
    if name in scene.dyn:
        X = trained_scene.deformer(scene.dyn[name], F)((v_w - C) * S) / S + C
    return X @ usd.Y_UP_TO_Z_UP.T


def _world_points(stage, name: str, t: int) -> np.ndarray:
    """An object's mesh points at time code t as pxr evaluates them: skinned by UsdSkel
    where bound to a skeleton, then placed by the mesh's local-to-world transform."""
    prim = stage.GetPrimAtPath(f"/World/{name}")
    mesh = next(UsdGeom.Mesh(p) for p in Usd.PrimRange(prim) if p.IsA(UsdGeom.Mesh))
    points = mesh.GetPointsAttr().Get(t)
    skel_root = stage.GetPrimAtPath(f"/World/{name}/skin")
    if skel_root:
        cache = UsdSkel.Cache()
        root = UsdSkel.Root(skel_root)
        cache.Populate(root, Usd.PrimDefaultPredicate)
        (binding,) = cache.ComputeSkelBindings(root, Usd.PrimDefaultPredicate)
        (target,) = binding.GetSkinningTargets()
        query = cache.GetSkelQuery(binding.GetSkeleton())
        assert target.ComputeSkinnedPoints(query.ComputeSkinningTransforms(t), points, t)
    M = np.array(mesh.ComputeLocalToWorldTransform(t))  # row-vector convention
    p = np.asarray(points, dtype=np.float64)
    return p @ M[:3, :3] + M[3, :3]


def test_the_stage_opens_with_its_metadata_and_time_codes(scene):
    stage = Usd.Stage.Open(str(scene.out))
    assert UsdGeom.GetStageMetersPerUnit(stage) == 1.0
    assert UsdGeom.GetStageUpAxis(stage) == UsdGeom.Tokens.z
    assert stage.GetRootLayer().HasTimeCodesPerSecond()
    assert stage.GetTimeCodesPerSecond() == FPS and stage.GetFramesPerSecond() == FPS
    assert (stage.GetStartTimeCode(), stage.GetEndTimeCode()) == (0, F - 1)
    assert stage.GetDefaultPrim().GetPath() == "/World"
    text = scene.out.read_text()
    for authored in ("metersPerUnit = 1", 'upAxis = "Z"', f"timeCodesPerSecond = {FPS:g}"):
        assert authored in text
    assert scene.summary["objects"] == {
        "obj_0": "rigid", "obj_1": "static", "obj_2": "skinned", "obj_3": "points"
    }  # fmt: skip
    assert not stage.GetPrimAtPath("/World/obj_4")  # avoided
    for name, kind in scene.summary["objects"].items():
        xf = UsdGeom.Xformable(stage.GetPrimAtPath(f"/World/{name}"))
        assert xf.GetPrim().IsA(UsdGeom.Xform)
        assert [op.GetOpName() for op in xf.GetOrderedXformOps()] == [
            "xformOp:translate", "xformOp:orient", "xformOp:scale"
        ]  # fmt: skip
        translate, orient, scale = xf.GetOrderedXformOps()
        assert orient.GetPrecision() == UsdGeom.XformOp.PrecisionFloat  # quatf
        assert scale.GetNumTimeSamples() == 0
        want = [] if kind == "static" else list(range(F))
        assert translate.GetAttr().GetTimeSamples() == want, name
        assert orient.GetAttr().GetTimeSamples() == want, name
        assert xf.GetPrim().GetCustomDataByKey("chord:motion") == kind
    points = UsdGeom.Mesh(stage.GetPrimAtPath("/World/obj_3/mesh")).GetPointsAttr()
    assert points.GetTimeSamples() == list(range(F))
    for name in ("obj_0", "obj_1"):
        mesh = UsdGeom.Mesh(stage.GetPrimAtPath(f"/World/{name}/mesh"))
        assert mesh.GetPointsAttr().GetNumTimeSamples() == 0
    anim = UsdSkel.Animation(stage.GetPrimAtPath("/World/obj_2/skin/skeleton/motion"))
    assert anim.GetTranslationsAttr().GetTimeSamples() == list(range(F))
    assert len(anim.GetJointsAttr().Get()) == scene.summary["joints"]


def test_the_points_at_each_time_code_equal_deform(scene):
    """Exact (to float32) for the skinned, point-sampled and static objects; the rigid one
    moves by its pose, which is its scripted rigid motion."""
    stage = Usd.Stage.Open(str(scene.out))
    for name in ("obj_0", "obj_1", "obj_2", "obj_3"):
        want = _expected(scene, name)
        tol = 64 * F32 * max(1.0, np.abs(want).max())
        for t in range(F):
            got = _world_points(stage, name, t)
            np.testing.assert_allclose(got, want[t], rtol=0, atol=tol, err_msg=f"{name} {t}")
        if name != "obj_1":
            assert np.abs(want[-1] - want[0]).max() > 1e-3, name  # it moves


def test_the_xform_pose_is_the_trajectory(scene):
    """Each dynamic Xform's translate (double3) and orient (quatf: 16 float32 roundings of
    a unit quaternion) are trajectories.npz's pose, in Z-up."""
    stage = Usd.Stage.Open(str(scene.out))
    for name, obj in scene.dyn.items():
        poses = trajectories.to_original(trajectories.object_poses(obj, F), C, S)
        xf = UsdGeom.Xformable(stage.GetPrimAtPath(f"/World/{name}"))
        for t in range(F):
            M = np.array(xf.ComputeLocalToWorldTransform(t)).T  # column-vector convention
            A = usd.Y_UP_TO_Z_UP
            np.testing.assert_allclose(M[:3, 3], A @ poses.position[t], rtol=0, atol=1e-12)
            R = A @ poses.T[t, :3, :3] @ A.T
            np.testing.assert_allclose(M[:3, :3], R, rtol=0, atol=16 * F32)


def test_a_missing_source_is_an_input_error(scene, tmp_path):
    with pytest.raises(ValueError, match="no source GLB given for obj_1"):
        usd.write_usd(
            tmp_path / "x.usda", doc=scene.doc, scene=SimpleNamespace(dynamic=scene.dyn),
            sources={"obj_0": scene.sources["obj_0"]}, gaussians=scene.gaussians, frames=F,
            fps=FPS, out_splats=tmp_path / "x.usd",
        )  # fmt: skip
