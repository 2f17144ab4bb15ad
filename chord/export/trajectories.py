"""Object trajectories (issue 40): per dynamic object and frame, the best-fit rigid pose of its
control points, written as ``trajectories.npz`` (numpy alone reads it: no pickles) and a JSON
sidecar ``trajectories.json`` that says what every array holds.

The fit is Kabsch's without scale (Umeyama's with the scale fixed at 1): for rest points p_k
and their frame-t positions x_k, the rotation R (a proper one: det R = +1, the reflection that
an unconstrained fit may return is flipped out) and translation t minimising
Σ_k ‖R·p_k + t − x_k‖². The residual is the RMS of R·p_k + t − x_k over k: zero for a rigid
motion, the size of what a rigid pose leaves out otherwise.

A pose is that of a body frame whose origin rests at ``origin`` (by default the rest centroid
of the control points) with the world's axes at rest: T_t = [R_t | R_t·origin + t_t], so the
pose's position is where the origin has moved (the centroid of the tracks, for the default
origin), frame 0 is [I | origin] and a rest point p moves to T_t·T_0⁻¹·p. Quaternions are
(w, x, y, z), the project's order (:mod:`chord.core.quaternion`), each frame's in the
hemisphere of the frame before it (frame 0: w = 1).

The tracks are the object's trained deformation (``DynamicObject.deform``, both layers, stop-
gradient weights) of its first-layer control-point centres: where the object's material at
each control point goes, in the project's own motion, so the pose of an object follows what
its videos and GLBs show. Units: normalised scene units (METHOD §1: x_n = (x_w − c)·s) and the
input files' units (glTF's metres), x_w = x_n/s + c: a pose maps as T_w = N·T_n·S with
N = [I/s | c] and S = diag(s, s, s, 1) (positions as points, rotations unchanged, residuals
and tracks' offsets divided by s). Y is up in both, as in glTF (the scene is not rotated).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from chord.core.atomic_files import atomic_path, write_json

logger = logging.getLogger(__name__)

FORMAT = "chord-trajectories/1"


class RigidPoses(NamedTuple):
    """Per-frame rigid poses of one body: T [F, 4, 4] (body frame -> world), position [F, 3]
    (T's translation), quaternion [F, 4] (w, x, y, z; T's rotation), residual [F] (RMS of the
    fit, in the poses' units) and the body origin at rest [3]; float64."""

    T: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    residual: np.ndarray
    origin: np.ndarray


def fit_rigid(rest: np.ndarray, moved: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best-fit proper rotations R [F, 3, 3] and translations t [F, 3] with moved[f] ≈
    R[f]·rest + t[f], and the RMS residuals [F], for rest points [K, 3] and their positions
    [F, K, 3] (float64 throughout). With fewer than three non-collinear points the rotation
    about their line is not determined; the fit then returns one of the minimisers."""
    p = np.asarray(rest, dtype=np.float64)
    x = np.asarray(moved, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 3 or x.shape[1:] != p.shape or len(p) == 0:
        raise ValueError(f"rest points [K, 3] and tracks [F, K, 3] expected: {p.shape}, {x.shape}")
    p_bar, x_bar = p.mean(0), x.mean(1)  # [3], [F, 3]
    H = np.einsum("ki,fkj->fij", p - p_bar, x - x_bar[:, None])  # [F, 3, 3] = Σ p̃ x̃ᵀ
    U, _, Vt = np.linalg.svd(H)
    V = np.swapaxes(Vt, 1, 2)
    # d = det(V·Uᵀ): −1 where the unconstrained optimum is a reflection; flip the weakest axis
    d = np.sign(np.linalg.det(V @ np.swapaxes(U, 1, 2)))
    d[d == 0] = 1.0
    D = np.zeros_like(H)
    D[:, 0, 0] = D[:, 1, 1] = 1.0
    D[:, 2, 2] = d
    R = V @ D @ np.swapaxes(U, 1, 2)
    t = x_bar - np.einsum("fij,j->fi", R, p_bar)
    fitted = np.einsum("fij,kj->fki", R, p) + t[:, None]
    residual = np.sqrt(np.mean(np.sum((fitted - x) ** 2, axis=-1), axis=-1))
    return R, t, residual


def quaternion_from_matrix(R: np.ndarray) -> np.ndarray:
    """Unit quaternions (w, x, y, z) [..., 4] of rotation matrices [..., 3, 3] (the largest of
    4w², 4x², 4y², 4z² picks the stable formula), sign w ≥ 0."""
    R = np.asarray(R, dtype=np.float64)
    m = R.reshape(-1, 3, 3)
    tr = np.trace(m, axis1=1, axis2=2)
    diag = np.stack([tr, m[:, 0, 0], m[:, 1, 1], m[:, 2, 2]], axis=1)
    k = np.argmax(diag, axis=1)
    q = np.empty((len(m), 4))
    for i in range(4):
        s = k == i
        a = m[s]
        if not s.any():
            continue
        if i == 0:
            r = np.sqrt(1.0 + tr[s]) * 2.0  # 4w
            q[s] = np.stack(
                [0.25 * r, (a[:, 2, 1] - a[:, 1, 2]) / r, (a[:, 0, 2] - a[:, 2, 0]) / r,
                 (a[:, 1, 0] - a[:, 0, 1]) / r], 1)  # fmt: skip
        else:
            j, l = i % 3, (i + 1) % 3  # the other two axes (0-based) of axis i−1
            c = i - 1
            r = np.sqrt(1.0 + a[:, c, c] - a[:, j, j] - a[:, l, l]) * 2.0  # 4·(x|y|z)
            out = np.empty((s.sum(), 4))
            out[:, 0] = (a[:, l, j] - a[:, j, l]) / r
            out[:, 1 + c] = 0.25 * r
            out[:, 1 + j] = (a[:, j, c] + a[:, c, j]) / r
            out[:, 1 + l] = (a[:, l, c] + a[:, c, l]) / r
            q[s] = out
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[q[:, 0] < 0] *= -1.0
    return q.reshape(*R.shape[:-2], 4)


def continuous(q: np.ndarray) -> np.ndarray:
    """Quaternions [F, ...,  4] with each frame's in the hemisphere of the frame before it
    (the same rotations; interpolating consecutive keys then takes the short way)."""
    q = np.array(q, dtype=np.float64)
    for f in range(1, len(q)):
        flip = np.sum(q[f] * q[f - 1], axis=-1) < 0
        q[f][flip] *= -1.0
    return q


def rigid_poses(
    rest: np.ndarray, tracks: np.ndarray, origin: np.ndarray | None = None
) -> RigidPoses:
    """The rigid poses of a body whose points rest at ``rest`` [K, 3] and move along
    ``tracks`` [F, K, 3] (frame 0 the rest pose: its pose is [I | origin] exactly): per frame
    the best-fit proper rotation R_t and translation t_t (:func:`fit_rigid`), as the pose of a
    body frame at ``origin`` [3] (default: the rest centroid) with the world's axes at rest,
    T_t = [R_t | R_t·origin + t_t]. Units are those of the inputs."""
    rest = np.asarray(rest, dtype=np.float64)
    tracks = np.asarray(tracks, dtype=np.float64)
    o = rest.mean(0) if origin is None else np.asarray(origin, dtype=np.float64).reshape(3)
    R, t, residual = fit_rigid(rest, tracks)
    R[0], t[0], residual[0] = np.eye(3), 0.0, 0.0  # frame 0 is the rest pose (deform pins it)
    T = np.zeros((len(tracks), 4, 4))
    T[:, :3, :3] = R
    T[:, :3, 3] = np.einsum("fij,j->fi", R, o) + t
    T[:, 3, 3] = 1.0
    q = continuous(quaternion_from_matrix(R))
    return RigidPoses(T, T[:, :3, 3].copy(), q, residual, o)


def to_original(poses: RigidPoses, centre, scale: float) -> RigidPoses:
    """``poses`` in normalised units as poses in the input files' units (x_w = x_n/s + c):
    T_w = N·T_n·S with N = [I/s | c], S = diag(s, s, s, 1)."""
    c = np.asarray(centre, dtype=np.float64)
    T = poses.T.copy()
    T[:, :3, 3] = T[:, :3, 3] / scale + c
    return RigidPoses(
        T, T[:, :3, 3].copy(), poses.quaternion.copy(), poses.residual / scale,
        poses.origin / scale + c,
    )  # fmt: skip


def control_point_tracks(obj, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """(rest [K, 3], tracks [F, K, 3]) of ``obj``'s first-layer control-point centres under
    its trained deformation (``deform``, both layers, sg weights), frames 0..F−1, normalised
    units, float64."""
    centres = obj.layer1.centres
    with torch.no_grad():
        X, _ = obj.deform(
            torch.arange(frames, device=centres.device), centres, with_rotations=False,
            detach_weights=True,
        )  # fmt: skip
    return centres.double().cpu().numpy(), X.double().cpu().numpy()


def object_poses(obj, frames: int, origin: np.ndarray | None = None) -> RigidPoses:
    """The rigid poses of the trained object ``obj`` (a ``DynamicObject``) over frames
    0..F−1 in normalised units: :func:`rigid_poses` of its :func:`control_point_tracks`, the
    body origin at ``origin`` (normalised; default the control points' rest centroid)."""
    rest, tracks = control_point_tracks(obj, frames)
    return rigid_poses(rest, tracks, origin)


def normalised_to_original(centre, scale: float) -> np.ndarray:
    """N = [I/s | c] [4, 4]: x_w = N·x_n for homogeneous points."""
    N = np.eye(4)
    N[:3, :3] /= scale
    N[:3, 3] = np.asarray(centre, dtype=np.float64)
    return N


def scene_trajectories(doc: dict, scene, frames: int) -> dict:
    """Every dynamic object's tracks and poses over frames 0..F−1: {name: {"normalised":
    RigidPoses, "original": RigidPoses, "tracks": [F, K, 3] normalised}} in scene order."""
    c, s = doc["normalisation"]["centre"], doc["normalisation"]["scale"]
    out = {}
    for o in doc["objects"]:
        if o["name"] not in scene.dynamic:
            continue
        rest, tracks = control_point_tracks(scene.dynamic[o["name"]], frames)
        poses = rigid_poses(rest, tracks)
        out[o["name"]] = {
            "normalised": poses,
            "original": to_original(poses, c, s),
            "tracks": tracks,
        }
    return out


def _arrays(trajs: dict, c: np.ndarray, s: float, frames: int, fps: float) -> dict:
    arrays = {
        "names": np.array(list(trajs), dtype=np.str_),
        "fps": np.float64(fps),
        "time": np.arange(frames, dtype=np.float64) / fps,
        "up": np.array([0.0, 1.0, 0.0]),
        "centre": np.asarray(c, dtype=np.float64),
        "scale": np.float64(s),
        "normalised_to_original": normalised_to_original(c, s),
    }
    for name, tr in trajs.items():
        for units, suffix in (("original", ""), ("normalised", "_normalised")):
            p: RigidPoses = tr[units]
            arrays[f"{name}/T{suffix}"] = p.T
            arrays[f"{name}/position{suffix}"] = p.position
            arrays[f"{name}/residual{suffix}"] = p.residual
            arrays[f"{name}/origin{suffix}"] = p.origin
        arrays[f"{name}/quaternion"] = tr["normalised"].quaternion
        arrays[f"{name}/tracks_normalised"] = tr["tracks"]
        arrays[f"{name}/tracks"] = tr["tracks"] / s + np.asarray(c, dtype=np.float64)
    return arrays


ARRAYS = {
    "names": "[D] the dynamic objects, in scene order (obj_<i>: the input file obj_<i>.glb)",
    "fps": "frames per second (save_fps): frame k plays at time k / fps",
    "time": "[F] seconds of each frame",
    "up": "[3] the up axis, (0, 1, 0): glTF's +Y, in both unit systems",
    "centre": "[3] c of the normalisation, input units",
    "scale": "s of the normalisation: x_n = (x_w - c) * s",
    "normalised_to_original": "[4, 4] N = [I/s | c]: x_w = N x_n; T = N T_normalised S, "
    "S = diag(s, s, s, 1)",
    "<name>/T": "[F, 4, 4] pose (body frame -> input-file world), input units; T[0] = [I | "
    "origin], a rest point p moves to T[t] T[0]^-1 p",
    "<name>/position": "[F, 3] T's translation: the body origin's position, input units",
    "<name>/quaternion": "[F, 4] T's rotation, (w, x, y, z), each frame in the hemisphere of "
    "the one before; the same in both unit systems",
    "<name>/residual": "[F] RMS distance of the control points from the rigid fit, input units "
    "(0: rigid)",
    "<name>/origin": "[3] the body origin at rest (the control points' rest centroid), input units",
    "<name>/tracks": "[F, K, 3] the control points' positions, input units",
    "<name>/T_normalised, /position_normalised, /residual_normalised, /origin_normalised, "
    "/tracks_normalised": "the same in normalised scene units",
}


def write_trajectories(
    out_npz: Path, out_json: Path, *, doc: dict, scene, frames: int, fps: float
) -> dict:
    """``trajectories.npz`` and its sidecar ``trajectories.json`` of the trained ``scene``
    over frames 0..F−1 at ``fps``; returns the sidecar's mapping."""
    trajs = scene_trajectories(doc, scene, frames)
    c = np.asarray(doc["normalisation"]["centre"], dtype=np.float64)
    s = float(doc["normalisation"]["scale"])
    arrays = _arrays(trajs, c, s, frames, fps)
    with atomic_path(out_npz, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    objects = []
    for o in doc["objects"]:
        entry = {"name": o["name"], "source": Path(o["source"]).name, "role": o["role"]}
        if o["name"] in trajs:
            tr = trajs[o["name"]]
            size = float(np.ptp(np.asarray(o["bounds"], dtype=np.float64), axis=0).max())
            res = float(tr["normalised"].residual.max())
            entry.update(
                control_points=int(tr["tracks"].shape[1]),
                residual_max=res / s,
                residual_max_normalised=res,
                residual_relative=res / size if size > 0 else 0.0,
            )
        objects.append(entry)
    sidecar = {
        "format": FORMAT,
        "scene": doc["scene"],
        "frames": frames,
        "fps": fps,
        "up_axis": "+Y (glTF's; the scene is not rotated); scene.usda is Z-up",
        "units": {
            "original": "the input files' units: glTF's metres (arrays without a suffix)",
            "normalised": "scene units: centred, longest side 1.2 (arrays *_normalised)",
        },
        "normalisation": {
            "centre": c.tolist(),
            "scale": s,
            "normalised_to_original": normalised_to_original(c, s).tolist(),
            "points": "x_w = x_n / s + c",
            "poses": "T = N T_normalised S, N = [I/s | c], S = diag(s, s, s, 1): positions "
            "map as points, quaternions are the same, residuals divide by s",
        },
        "quaternion_order": "wxyz (w first, as chord.core.quaternion)",
        "pose": "best-fit rigid motion of the control points (Kabsch without scale, proper "
        "rotations), as the pose of a body frame at the control points' rest centroid with "
        "the world's axes at rest; residual: RMS of the control points after the fit",
        "tracks": "DynamicObject.deform (both layers) of the first-layer control-point centres",
        "objects": objects,
        "arrays": ARRAYS,
        "read": "numpy.load('trajectories.npz', allow_pickle=False)",
    }
    write_json(out_json, sidecar)
    logger.info(
        "%s: %d dynamic objects over %d frames; residual max %s",
        out_npz,
        len(trajs),
        frames,
        {o["name"]: round(o["residual_max"], 6) for o in objects if "residual_max" in o},
    )
    return sidecar
