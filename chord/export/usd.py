"""``scene.usda`` (issue 40): the trained scene for USD tools (Isaac Sim, Omniverse, DCC), written
with ``usd-core`` (``pxr``) in the text format.

Stage: ``metersPerUnit = 1`` (the input glTF's metres; USD assumes centimetres when it is
missing), ``upAxis = "Z"``, ``timeCodesPerSecond = framesPerSecond = fps`` and time codes
0..F−1 (frame k at code k), ``/World`` the default prim. glTF is Y-up and USD robotics tools
want Z-up, so every position is rotated +90° about X: (x, y, z)_glTF -> (x, −z, y)_USD (a
proper rotation: handedness and face winding are kept).

Each object is an ``Xform`` ``/World/<name>`` with the ops ``xformOp:translate`` (double3),
``xformOp:orient`` (quatf, w x y z) and ``xformOp:scale`` (float3, 1), in that order (Isaac
Sim's SimReady rules), over a ``Mesh`` of its source GLB's triangles (world placement, the
glTF's metres, vertex ``displayColor`` as the Gaussians' initialisation samples it) in the
Xform's frame. A static object's Xform sits at its bounding-box centre, unanimated. A dynamic
object's Xform carries the time samples of its rigid pose from ``trajectories.npz``
(:mod:`chord.export.trajectories`, its body frame at the control points' rest centroid), so
every object's pose is readable the same way; then, by how rigid its motion is:

- *rigid*: its largest fit residual is at most :data:`RIGID_TOLERANCE` of its size (the longest
  side of its AABB): the pose is all of its motion, the mesh has no samples;
- *skinned*: otherwise, an object with one control-point layer: the rest of its motion as
  UsdSkel, under a ``SkelRoot`` in the Xform: one joint per control point (joint ``cp_<k>`` at
  rest at its centre), its K neighbours and weights per vertex, one translation and rotation
  sample per joint and frame relative to the Xform's pose: linear blend skinning of rigid
  joints, which is METHOD §5's deformation exactly (as ``dynamic_scene_skinned.glb``);
- *points*: an object with a second layer (two layers compose into no single skin): its
  points time-sampled per frame in the Xform's frame.

UsdSkel rather than point samples, by size: per frame a joint costs 7 numbers and a vertex 3,
and an object has tens of control points against thousands of vertices (in text, point
samples of the 100k-vertex benchmark object over 41 frames would be over 100 MB; its joints'
samples are under 1 MB, BENCHMARKS.md).

The objects' trained Gaussians are ``ParticleField3DGaussianSplat`` prims ``<Xform>/splats`` in
a layer of their own that the stage sublayers (:mod:`chord.export.usd_splats`, DESIGN §9).
Everything written relative to an Xform's pose uses the rotation pxr evaluates from the stored
quatf (through an axis and angle, up to 1e-5 off R(q) for a small turn), so pxr's composed
points, joints and splats are exact.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from chord.core import quaternion
from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError
from chord.export import trained_scene, trajectories, usd_splats
from chord.gaussians import mesh_colour
from chord.gltf.splats import srgb_to_linear  # USD's displayColor is linear, as COLOR_0
from chord.scene import ingestion

logger = logging.getLogger(__name__)

#: glTF's Y-up -> USD's Z-up: +90° about X, (x, y, z) -> (x, −z, y)
Y_UP_TO_Z_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
#: an object is written rigid when its largest RMS fit residual is at most this fraction of its
#: size: 0.5 mm on a 0.5 m object, under a pixel with the object 1000 pixels across
RIGID_TOLERANCE = 1e-3


def source_mesh(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The triangles of a source glTF as ingest reads it (world placement, its units): points
    [n, 3] float64, triangle indices [m, 3] and sRGB vertex colours [n, 3] (the colour
    the Gaussians' initialisation samples there: texture, vertex colours, base colour)."""
    _, parts = ingestion.load_source(Path(path))
    points, faces, colours, start = [], [], [], 0
    cache: dict[int, np.ndarray] = {}
    for i, part in enumerate(parts):
        f = np.asarray(part.faces, dtype=np.int64)
        n = len(part.vertices)
        first = np.full(n, -1)  # a face of each vertex (any: the colour is the vertex's)
        first[f.reshape(-1)] = np.repeat(np.arange(len(f)), 3)
        vid = np.flatnonzero(first >= 0)
        bary = np.zeros((len(vid), 3))  # the vertex's corner of that face, one-hot
        bary[np.arange(len(vid)), np.argmax(f[first[vid]] == vid[:, None], axis=1)] = 1.0
        rgb = np.full((n, 3), 0.5)
        if len(vid):
            label = f"{Path(path).name} part {i}"
            rgb[vid] = mesh_colour.part_colours(label, part, first[vid], bary, cache)[0]
        points.append(np.asarray(part.vertices, dtype=np.float64))
        faces.append(f + start)
        colours.append(rgb)
        start += n
    return np.concatenate(points), np.concatenate(faces), np.concatenate(colours)


def to_usd(v: np.ndarray) -> np.ndarray:
    """Points or vectors [..., 3] from glTF's Y-up into USD's Z-up."""
    return np.asarray(v, dtype=np.float64) @ Y_UP_TO_Z_UP.T


def rotations_to_usd(q: np.ndarray) -> np.ndarray:
    """Quaternions (w, x, y, z) [..., 4] of Y-up rotations as those of the same rotations in
    Z-up (A·R·Aᵀ: the vector part rotated)."""
    q = np.asarray(q, dtype=np.float64)
    return np.concatenate([q[..., :1], to_usd(q[..., 1:])], axis=-1)


def rotmat(q: np.ndarray) -> np.ndarray:
    """R(q) [..., 3, 3] of quaternions (w, x, y, z) [..., 4] (:mod:`chord.core.quaternion`)."""
    return quaternion.to_rotmat(torch.as_tensor(q, dtype=torch.float64)).numpy()


def object_size(entry: dict) -> float:
    """The longest side of an object's normalised AABB (scene.json's ``bounds``)."""
    return float(np.ptp(np.asarray(entry["bounds"], dtype=np.float64), axis=0).max())


def motion_kind(entry: dict, obj, poses) -> str:
    """How a dynamic object is written: "rigid", "skinned" or "points" (module docstring)."""
    size = object_size(entry)
    if float(poses.residual.max()) <= RIGID_TOLERANCE * size:
        return "rigid"
    return "skinned" if obj.layer2 is None else "points"


def _vec3(a: np.ndarray):
    """A float3 array attribute value of [n, 3] numbers."""
    from pxr import Vt

    return Vt.Vec3fArray.FromNumpy(np.ascontiguousarray(a, dtype=np.float32))


def _skin(stage, path, mesh, *, obj, v_n, frames, pose_R, pose_p, origin_w, c, s) -> int:
    """The UsdSkel of a one-layer object under its SkelRoot ``path``: joints at its control
    points, their samples relative to the object's pose (R_u, p_u: [F, 3, 3], [F, 3], USD
    frame); returns the joint count."""
    from pxr import Gf, UsdSkel, Vt

    sk = trained_scene.skinning(obj, frames)  # normalised, Y-up
    M = len(sk.centres)
    c_w = sk.centres / s + c  # joint centres, input units, Y-up
    bind = to_usd(c_w - origin_w)  # [M, 3], local rest positions
    R_k = rotmat(sk.rotations)  # [F, M, 3, 3]
    A = Y_UP_TO_Z_UP
    # joint k at frame t, in the Xform's frame: Q = R_uᵀ·A·R_k·Aᵀ, j = R_uᵀ·(A·(c_k + τ_k/s) − p_u)
    Q = np.einsum("fji,jk,fmkl,nl->fmin", pose_R, A, R_k, A)
    moved = to_usd(c_w[None] + sk.translations / s) - pose_p[:, None]
    j = np.einsum("fji,fmj->fmi", pose_R, moved)
    q = trajectories.continuous(trajectories.quaternion_from_matrix(Q))
    names = [f"cp_{k}" for k in range(M)]
    skel = UsdSkel.Skeleton.Define(stage, f"{path}/skeleton")
    skel.CreateJointsAttr(names)
    rest = Vt.Matrix4dArray([Gf.Matrix4d(1.0).SetTranslate(Gf.Vec3d(*b)) for b in bind.tolist()])
    skel.CreateBindTransformsAttr(rest)
    skel.CreateRestTransformsAttr(rest)
    anim = UsdSkel.Animation.Define(stage, f"{path}/skeleton/motion")
    anim.CreateJointsAttr(names)
    translations, rotations = anim.CreateTranslationsAttr(), anim.CreateRotationsAttr()
    for t in range(frames):
        translations.Set(_vec3(j[t]), t)
        rotations.Set(Vt.QuatfArray([Gf.Quatf(*v) for v in q[t].tolist()]), t)
    anim.CreateScalesAttr(Vt.Vec3hArray([Gf.Vec3h(1.0, 1.0, 1.0)] * M))
    UsdSkel.BindingAPI.Apply(skel.GetPrim()).CreateAnimationSourceRel().SetTargets([anim.GetPath()])
    binding = UsdSkel.BindingAPI.Apply(mesh.GetPrim())
    binding.CreateSkeletonRel().SetTargets([skel.GetPath()])
    idx, w = sk.bind(v_n)  # [n, K]
    K = idx.shape[1]
    binding.CreateJointIndicesPrimvar(False, K).Set(Vt.IntArray(idx.reshape(-1).tolist()))
    binding.CreateJointWeightsPrimvar(False, K).Set(
        Vt.FloatArray.FromNumpy(np.ascontiguousarray(w.reshape(-1), dtype=np.float32))
    )
    binding.CreateGeomBindTransformAttr(Gf.Matrix4d(1.0))
    return M


def _new_stage(frames: int, fps: float):
    """An empty stage with SimReady's metadata: metres, Z up, time codes 0..F−1 at ``fps``."""
    from pxr import Usd, UsdGeom

    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    stage.SetTimeCodesPerSecond(fps)
    stage.SetFramesPerSecond(fps)
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(frames - 1)
    stage.SetDefaultPrim(UsdGeom.Xform.Define(stage, "/World").GetPrim())
    return stage


def _mesh(stage, path: str, local: np.ndarray, faces: np.ndarray, srgb: np.ndarray):
    """A triangle Mesh of points ``local`` [n, 3] with vertex displayColor (linear)."""
    from pxr import UsdGeom, Vt

    mesh = UsdGeom.Mesh.Define(stage, path)
    mesh.CreatePointsAttr(_vec3(local))
    mesh.CreateFaceVertexCountsAttr(Vt.IntArray([3] * len(faces)))
    mesh.CreateFaceVertexIndicesAttr(Vt.IntArray(faces.reshape(-1).tolist()))
    mesh.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)
    mesh.CreateExtentAttr(_vec3(np.stack([local.min(0), local.max(0)])))
    mesh.CreateDisplayColorPrimvar(UsdGeom.Tokens.vertex).Set(_vec3(srgb_to_linear(srgb)))
    return mesh


def write_usd(
    out: Path,
    *,
    doc: dict,
    scene,
    sources: dict[str, Path],
    gaussians: dict,
    frames: int,
    fps: float,
    out_splats: Path,
) -> dict:
    """``scene.usda`` of every non-avoided object of ``doc`` (source GLBs ``sources``) over
    frames 0..F−1 at ``fps``, dynamic ones moved by ``scene``'s trained motion, and the
    layer ``out_splats`` it sublayers with their Gaussians ``gaussians`` {name: GaussianSet,
    normalised} (:mod:`chord.export.usd_splats`); returns a summary {"frames", "objects":
    {name: "static" | "rigid" | "skinned" | "points"}, "joints", "splats": {"gaussians",
    "sampled" (objects with per-frame splats), "numbers", "format" ("usda" | "usdc")}}."""
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdSkel
    except ImportError as exc:  # a dependency; an environment made before issue 40 lacks it
        raise RuntimeError(
            f"{out}: writing USD needs usd-core, a dependency of chord-pipeline: "
            "pip install 'usd-core>=24.8' (or reinstall the package)"
        ) from exc

    if frames < 1:
        raise ValueError(f"frames: expected at least 1, got {frames}")
    c = np.asarray(doc["normalisation"]["centre"], dtype=np.float64)
    s = float(doc["normalisation"]["scale"])
    stage = _new_stage(frames, fps)
    splat_layer = Sdf.Layer.CreateAnonymous(".usd")
    # its own time codes per second: else USD scales a sublayer's samples by 24/fps
    splat_layer.timeCodesPerSecond = splat_layer.framesPerSecond = fps
    stage.GetRootLayer().subLayerPaths.append(splat_layer.identifier)
    kinds, joints, numbers, sampled, count = {}, 0, 0, [], 0
    for entry in doc["objects"]:
        name = entry["name"]
        if entry["role"] == "avoided":
            continue
        if name not in sources:
            raise InputError(f"{out}: no source GLB given for {name}")
        if name not in gaussians:
            raise InputError(f"{out_splats}: no Gaussians given for {name}")
        points_w, faces, srgb = source_mesh(sources[name])
        obj = scene.dynamic[name] if name in scene.dynamic else None
        xf = UsdGeom.Xform.Define(stage, f"/World/{name}")
        translate, orient = xf.AddTranslateOp(), xf.AddOrientOp()
        xf.AddScaleOp().Set(Gf.Vec3f(1.0, 1.0, 1.0))
        prim = xf.GetPrim()
        prim.SetCustomDataByKey("chord:source", Path(entry["source"]).name)
        where = f"{out_splats}: {name}"
        if obj is None:
            kind = "static"
            origin_w = (points_w.min(0) + points_w.max(0)) / 2.0
            translate.Set(Gf.Vec3d(*to_usd(origin_w).tolist()))
            orient.Set(Gf.Quatf(1.0, 0.0, 0.0, 0.0))
            splat, pose = usd_splats.SplatFrames(gaussians[name], c, s, where=where), None
        else:
            poses_n = trajectories.object_poses(obj, frames)
            kind = motion_kind(entry, obj, poses_n)
            poses = trajectories.to_original(poses_n, c, s)
            origin_w = poses.origin
            pose_p = to_usd(poses.position)  # [F, 3]
            q_u = rotations_to_usd(poses.quaternion).astype(np.float32)  # [F, 4], as stored
            for t in range(frames):
                translate.Set(Gf.Vec3d(*pose_p[t].tolist()), t)
                orient.Set(Gf.Quatf(*q_u[t].tolist()), t)
            # the rotation pxr evaluates from the stored quatf (through an axis and angle: up
            # to 1e-5 from R(q) for small turns), so that what is relative to it is exact
            pose_R = np.stack([np.array(xf.GetLocalTransformation(t))[:3, :3].T
                               for t in range(frames)])  # fmt: skip
            size = max(object_size(entry), 1e-12)
            prim.SetCustomDataByKey("chord:residual_relative", float(poses_n.residual.max()) / size)
            X, Q = usd_splats.object_motion(obj, frames)
            if kind == "rigid":  # the pose is its motion: the rest values, unsampled
                X, Q = X[:1], Q[:1]
            else:
                sampled.append(name)
            splat = usd_splats.SplatFrames(gaussians[name], c, s, (X, Q), where=where)
            pose = (pose_R, pose_p)
        prim.SetCustomDataByKey("chord:motion", kind)
        with Usd.EditContext(stage, splat_layer):
            stage.OverridePrim(f"/World/{name}")
            numbers += usd_splats.add_splats(
                stage, f"/World/{name}/splats", splat, A=Y_UP_TO_Z_UP,
                origin=origin_w, pose=pose,
            )  # fmt: skip
        count += len(gaussians[name])
        local = to_usd(points_w - origin_w)  # [n, 3] in the Xform's frame
        if kind == "skinned":
            UsdSkel.Root.Define(stage, f"/World/{name}/skin")
            mesh = _mesh(stage, f"/World/{name}/skin/mesh", local, faces, srgb)
            joints += _skin(
                stage, f"/World/{name}/skin", mesh, obj=obj, v_n=(points_w - c) * s,
                frames=frames, pose_R=pose_R, pose_p=pose_p, origin_w=origin_w, c=c, s=s,
            )  # fmt: skip
        else:
            mesh = _mesh(stage, f"/World/{name}/mesh", local, faces, srgb)
        if kind == "points":
            X_w = trained_scene.deformer(obj, frames)((points_w - c) * s) / s + c  # [F, n, 3]
            moved = np.einsum("fji,fnj->fni", pose_R, to_usd(X_w) - pose_p[:, None])
            attr, extent = mesh.GetPointsAttr(), mesh.GetExtentAttr()
            for t in range(frames):
                attr.Set(_vec3(moved[t]), t)
                extent.Set(_vec3(np.stack([moved[t].min(0), moved[t].max(0)])), t)
        kinds[name] = kind
    stage.GetRootLayer().documentation = (
        f"chord-pipeline: scene {doc['scene']}, {frames} frames at {fps:g} fps; Z-up "
        "(glTF's Y-up rotated +90 degrees about X), metres"
    )
    fmt = "usda" if numbers <= usd_splats.TEXT_NUMBERS else "usdc"
    splat_layer.documentation = (
        f"chord-pipeline: the trained Gaussians of scene {doc['scene']} "
        "(UsdVol.ParticleField3DGaussianSplat), sublayered by scene.usda"
    )
    root = Sdf.Layer.CreateAnonymous(".usda")  # a copy outside the stage: nothing recomposes
    root.TransferContent(stage.GetRootLayer())
    root.subLayerPaths[0] = f"./{Path(out_splats).name}"  # beside it, found relatively
    # the splat layer first: scene.usda names it, so it is never there without it
    with atomic_path(out_splats, suffix=".usd") as tmp:
        splat_layer.Export(str(tmp), args={"format": fmt})
    with atomic_path(out, suffix=".usda") as tmp:
        root.Export(str(tmp))
    logger.info("%s: %d objects %s, %d joints, %d frames at %g fps; %s: %d Gaussians (%d "
                "numbers, %s), sampled per frame: %s", out, len(kinds), kinds, joints, frames,
                fps, out_splats, count, numbers, fmt, sampled or "none")  # fmt: skip
    splat_summary = {"gaussians": count, "sampled": sampled, "numbers": numbers, "format": fmt}
    return {"frames": frames, "objects": kinds, "joints": joints, "splats": splat_summary}
