"""A :class:`~chord.gltf.animated_scene.Skinning` as glTF (METHOD §5, §20), for the skinned
writers (:mod:`chord.gltf.skinned`, :mod:`chord.gltf.splats`): the skeleton (one joint per
control point, in world coordinates), the skins' inverse bind matrices, the points'
JOINTS_j/WEIGHTS_j attributes and the joints' translation and rotation keys.

A control point's rigid motion x ↦ R_k·(x − c_k) + c_k + τ_k in normalised space (x_n =
(x_w − c)·s) is, in world units, x_w ↦ R_k·(x_w − p_k) + p_k + τ_k/s with p_k = c + c_k/s:
joint k rests at T(p_k) and is keyed T(p_k + τ_{k,t}/s)·R(q_{k,t}), no scale anywhere."""

from __future__ import annotations

import logging

import numpy as np

from chord.gltf.animated_scene import Skinning
from chord.gltf.container import ARRAY_BUFFER, UNSIGNED_BYTE, UNSIGNED_SHORT, GltfBuilder

logger = logging.getLogger(__name__)


def skin_weights_f32(w: np.ndarray) -> np.ndarray:
    """Skin weights [n, J] as float32 whose running float32 sum (the order a viewer and the
    glTF validator add them in) is 1 up to rounding: normalised in float64, rounded, and the
    largest weight of each row corrected by the float32 residual."""
    w = np.asarray(w, dtype=np.float64)
    total = w.sum(1, keepdims=True)
    if (w < 0).any() or not (total > 0).all():
        raise ValueError("skin weights: expected non-negative rows with a positive sum")
    w32 = (w / total).astype(np.float32)
    running = np.zeros(len(w32), dtype=np.float32)
    for j in range(w32.shape[1]):
        running += w32[:, j]
    rows, big = np.arange(len(w32)), w32.argmax(1)
    w32[rows, big] += np.float32(1.0) - running
    return w32


def joint_positions(sk: Skinning, centre: np.ndarray, scale: float):
    """The joints' world positions (x_w = x_n/s + c): at rest p_k = c + c_k/s [M, 3], and as
    keyed c + (c_k + τ_{k,t})/s [F, M, 3]."""
    c = np.asarray(centre, dtype=np.float64)
    cp = np.asarray(sk.centres, dtype=np.float64)  # [M, 3]
    tau = np.asarray(sk.translations, dtype=np.float64)  # [F, M, 3]
    return c + cp / scale, c + (cp[None] + tau) / scale


def skin_attributes(
    out: GltfBuilder, v_n: np.ndarray, skinning: Skinning, where: str
) -> dict[str, int]:
    """JOINTS_j/WEIGHTS_j accessors of points at normalised rest positions v_n [n, 3]: each
    point's K control points, padded with joint 0 at weight 0 to a multiple of 4 (one set
    per 4), weights normalised in float32 (:func:`skin_weights_f32`)."""
    J = len(skinning.centres)
    component = UNSIGNED_BYTE if J <= 256 else UNSIGNED_SHORT
    idx, w = skinning.bind(v_n)
    idx, w = np.asarray(idx, dtype=np.int64), np.asarray(w, dtype=np.float64)
    n, K = idx.shape
    if w.shape != (n, K) or n != len(v_n):
        raise ValueError(f"bind returned {idx.shape} and {w.shape} for {len(v_n)} points")
    if len(idx) and (idx.min() < 0 or idx.max() >= J):
        raise ValueError(f"bind: joint indices outside [0, {J})")
    sets = -(-K // 4)
    if sets > 1:
        logger.warning(
            "%s: %d influences per vertex need %d JOINTS/WEIGHTS sets; some viewers "
            "(three.js) read only the first 4",
            where,
            K,
            sets,
        )
    pad = 4 * sets - K  # padding: joint 0 at weight 0 (the validator's convention)
    idx = np.pad(idx, ((0, 0), (0, pad)))
    w32 = np.pad(skin_weights_f32(w), ((0, 0), (0, pad)))
    attrs = {}
    for j in range(sets):
        cols = slice(4 * j, 4 * j + 4)
        attrs[f"JOINTS_{j}"] = out.add_accessor(
            idx[:, cols], "VEC4", target=ARRAY_BUFFER, component=component, bounds=False
        )
        attrs[f"WEIGHTS_{j}"] = out.add_accessor(
            w32[:, cols], "VEC4", target=ARRAY_BUFFER, bounds=False
        )
    return attrs


def check_skinning(name: str, sk: Skinning, frames: int) -> None:
    """``sk`` holds F = ``frames`` transforms of each of its M control points."""
    M = len(sk.centres)
    q, tau = np.shape(sk.rotations), np.shape(sk.translations)
    if q != (frames, M, 4) or tau != (frames, M, 3):
        raise ValueError(
            f"{name}: rotations {q} and translations {tau}, expected "
            f"{(frames, M, 4)} and {(frames, M, 3)}"
        )


def add_skeleton(
    out: GltfBuilder, name: str, parent: int, rest: np.ndarray
) -> tuple[int, list[int]]:
    """The skeleton under node ``parent`` (which must have no transform): a node
    ``<name>_skeleton`` without a transform, and under it one joint ``<name>_cp_<k>`` per
    control point at its world rest position T(p_k) (:func:`joint_positions`). No node of
    the chain scales or rotates at rest: Blender's importer (its default "Guess Original Bind
    Pose") takes each inverse bind matrix for the inverse of its joint's rest transform in the
    skeleton's space, which then is the world. Returns (skeleton, joints)."""
    skel = out.add("nodes", {"name": f"{name}_skeleton"})
    joints = [
        out.add("nodes", {"name": f"{name}_cp_{k}", "translation": p.tolist()})
        for k, p in enumerate(np.asarray(rest, dtype=np.float64))
    ]
    out.doc["nodes"][skel]["children"] = joints
    out.doc["nodes"][parent].setdefault("children", []).append(skel)
    return skel, joints


def add_skin(
    out: GltfBuilder,
    name: str,
    skel: int,
    joints: list[int],
    rest: np.ndarray,
    origin: np.ndarray | None = None,
) -> int:
    """A skin on ``joints`` (at world rest positions ``rest`` [M, 3]) for points stored
    relative to ``origin`` (world coordinates: None): IBM_k = T(origin − p_k), with points in
    world coordinates the inverse of joint k's rest transform T(p_k)."""
    rest = np.asarray(rest, dtype=np.float64)
    M = len(rest)
    ibm = np.repeat(np.eye(4)[None], M, 0)  # [M, 4, 4]
    ibm[:, :3, 3] = -rest
    if origin is not None:
        ibm[:, :3, 3] += np.asarray(origin, dtype=np.float64)
    ibm_acc = out.add_accessor(ibm.transpose(0, 2, 1).reshape(M, 16), "MAT4", bounds=False)
    return out.add(
        "skins",
        {
            "name": f"{name}_skin",
            "inverseBindMatrices": ibm_acc,  # column-major, as glTF stores MAT4
            "skeleton": skel,
            "joints": joints,
        },
    )


def keyed_rotations(q: np.ndarray) -> np.ndarray:
    """The joints' rotation keys [F, M, 4] (x, y, z, w) of quaternions q [F, M, 4] (w, x, y,
    z): normalised, and each key negated where needed to stay in the previous key's
    hemisphere (q and −q are one rotation; slerp then takes the short way)."""
    q = np.asarray(q, dtype=np.float64)
    r = q[..., [1, 2, 3, 0]] / np.linalg.norm(q, axis=-1, keepdims=True)  # [F, M, 4]
    for t in range(1, len(r)):
        r[t][(r[t] * r[t - 1]).sum(-1) < 0] *= -1.0
    return r


def joint_tracks(sk: Skinning, keys: np.ndarray, joints: list[int]) -> list:
    """(key values, channel target) of each joint: translation ``keys`` [F, M, 3] (the world
    positions c + (c_k + τ_{k,t})/s, :func:`joint_positions`) and rotation q_{k,t}
    (:func:`keyed_rotations`)."""
    r = keyed_rotations(sk.rotations)
    tracks = []
    for k, joint in enumerate(joints):
        tracks.append((keys[:, k], {"node": joint, "path": "translation"}))
        tracks.append((r[:, k], {"node": joint, "path": "rotation"}))
    return tracks
