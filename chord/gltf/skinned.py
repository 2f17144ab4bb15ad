"""``dynamic_scene_skinned.glb`` (METHOD §20): the scene's glTF with each dynamic object skinned
on one joint per control point, with LINEAR translation/rotation keys (the control-point motion
is linear blend skinning, METHOD §5), keeping morph targets only for a motion one skin cannot
express. The merge of the sources and the shared writer are :mod:`chord.gltf.animated`'s."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.gltf.animated import (
    Deformer,
    Moving,
    key_times,
    merged_objects,
    morph_mesh,
    set_view_targets,
    weights_channels,
    write_glb,
)
from chord.gltf.container import (
    ARRAY_BUFFER,
    FLOAT,
    TRS,
    UNSIGNED_BYTE,
    UNSIGNED_SHORT,
    GltfBuilder,
    read_accessor,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Skinning:
    """Linear blend skinning by M rigid control-point transforms about fixed centres, in
    normalised scene space (METHOD §5): x_t = Σ_k w_k·[R(q_{k,t})(x − c_k) + c_k + τ_{k,t}].

    Fields:
        centres: c [M, 3].
        rotations: q [F, M, 4], unit quaternions (w, x, y, z); frame 0 the identity.
        translations: τ [F, M, 3]; frame 0 zero.
        bind: normalised rest points [n, 3] -> (joint indices [n, K] into the M centres,
            weights [n, K] ≥ 0 summing to 1 per point).
    """

    centres: np.ndarray
    rotations: np.ndarray
    translations: np.ndarray
    bind: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


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


def normalisation(centre: np.ndarray, scale: float) -> np.ndarray:
    """N [4, 4] = S(s)·T(−c), world to normalised scene space (x_n = (x_w − c)·s)."""
    N = np.diag([scale, scale, scale, 1.0])
    N[:3, 3] = -scale * np.asarray(centre, dtype=np.float64)
    return N


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


def _bind_mesh(
    out: GltfBuilder,
    mesh_index: int,
    M: np.ndarray,
    centre: np.ndarray,
    scale: float,
    skinning: Skinning,
    where: str,
) -> None:
    """JOINTS_j/WEIGHTS_j of every primitive of mesh ``mesh_index`` (placed by world matrix
    M): each vertex's K control points at v_n = (M·v_l − c)·s (:func:`skin_attributes`)."""
    mesh = out.doc["meshes"][mesh_index]
    cache: dict[int, dict[str, int]] = {}
    for p in mesh["primitives"]:
        if "POSITION" not in p["attributes"]:
            raise InputError(f"{where}: a primitive of mesh {mesh_index} has no POSITION")
        stale = [k for k in p["attributes"] if k.startswith(("JOINTS_", "WEIGHTS_"))]
        if stale:
            logger.warning(
                "%s: replacing the source's skin attributes of mesh %d", where, mesh_index
            )
            for k in stale:
                del p["attributes"][k]
        pos = p["attributes"]["POSITION"]
        if pos not in cache:
            if out.doc["accessors"][pos]["componentType"] != FLOAT:
                raise InputError(f"{where}: quantised POSITION in mesh {mesh_index}")
            v_l = read_accessor(out.doc, bytes(out.blob), pos)  # [n, 3]
            v_n = ((v_l @ M[:3, :3].T + M[:3, 3]) - centre) * scale  # [n, 3]
            cache[pos] = skin_attributes(out, v_n, skinning, where)
        p["attributes"].update(cache[pos])


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
    out: GltfBuilder, name: str, parent: int, centre: np.ndarray, scale: float, sk: Skinning
) -> tuple[int, list[int]]:
    """The skeleton of ``sk`` under node ``parent`` (which must have no transform): a node
    ``<name>_skeleton`` carrying the denormalisation A = T(c)·S(1/s), and under it one joint
    ``<name>_cp_<k>`` per control point at its bind pose T(c_k). Returns (skeleton, joints)."""
    cp = np.asarray(sk.centres, dtype=np.float64)  # [M, 3]
    skel = out.add(
        "nodes",
        {
            "name": f"{name}_skeleton",
            "translation": np.asarray(centre, dtype=np.float64).tolist(),
            "scale": [1.0 / scale] * 3,
        },
    )
    joints = [
        out.add("nodes", {"name": f"{name}_cp_{k}", "translation": cp[k].tolist()})
        for k in range(len(cp))
    ]
    out.doc["nodes"][skel]["children"] = joints
    out.doc["nodes"][parent].setdefault("children", []).append(skel)
    return skel, joints


def add_skin(
    out: GltfBuilder, name: str, skel: int, joints: list[int], sk: Skinning, bind: np.ndarray
) -> int:
    """A skin on ``joints`` for points placed by ``bind`` (the 4×4 map from the skinned
    mesh's POSITION space to normalised scene space): IBM_k = T(−c_k)·bind."""
    cp = np.asarray(sk.centres, dtype=np.float64)
    M = len(cp)
    ibm = np.repeat(np.asarray(bind, dtype=np.float64)[None], M, 0)  # [M, 4, 4]
    ibm[:, :3, 3] -= cp  # T(−c_k)·B only shifts B's translation
    ibm[:, 3] = (0.0, 0.0, 0.0, 1.0)
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


def joint_tracks(sk: Skinning, joints: list[int]) -> list:
    """(key values, channel target) of each joint: translation c_k + τ_{k,t} and rotation
    q_{k,t} (:func:`keyed_rotations`)."""
    cp = np.asarray(sk.centres, dtype=np.float64)
    tau = np.asarray(sk.translations, dtype=np.float64)
    r = keyed_rotations(sk.rotations)
    tracks = []
    for k, joint in enumerate(joints):
        tracks.append((cp[k] + tau[:, k], {"node": joint, "path": "translation"}))
        tracks.append((r[:, k], {"node": joint, "path": "rotation"}))
    return tracks


def joint_channels(out: GltfBuilder, tracks: list, times: int) -> list:
    """(sampler, target) of each joint track: LINEAR keys at the key times ``times``."""
    channels = []
    for values, target in tracks:
        kind = "VEC3" if target["path"] == "translation" else "VEC4"
        sampler = {"input": times, "interpolation": "LINEAR"}
        sampler["output"] = out.add_accessor(values, kind, bounds=False)
        channels.append((sampler, target))
    return channels


def motion_channels(out: GltfBuilder, tracks: list, morphed: list, frames: int, fps: float):
    """The animation's channels: every joint track's keys, then every morphed node's weights,
    on one key-time accessor (k / fps, k < frames)."""
    times = key_times(out, frames, fps)
    channels = joint_channels(out, tracks, times)
    if morphed:
        channels += weights_channels(out, morphed, frames, times)
    return channels


def _skin_object(
    out: GltfBuilder, obj: Moving, centre: np.ndarray, scale: float, frames: int
) -> tuple[list[int], list]:
    """Skin ``obj``'s mesh nodes on one joint per control point.

    The skeleton root (a child of the object's root, which has no transform) carries the
    denormalisation A = T(c)·S(1/s); joint k under it has the bind (rest) pose T(c_k) and is
    animated with T(c_k + τ_{k,t})·R(q_{k,t}). Each mesh node gets a skin on those joints with
    IBM_k = T(−c_k)·N·M_node (N = S(s)·T(−c), M_node its world matrix in the source), so
    J_k(t)·IBM_k·v_l = A·(R_k·(v_n − c_k) + c_k + τ_k) and Σ_k w_k of that is A·x_t, the
    deformed vertex in the source's world coordinates (A is affine and Σw = 1). glTF ignores a
    skinned mesh node's own transform, so the node becomes a scene root without one (a leaf
    itself; a node with children or a camera hands its mesh to a new root node).

    Returns (the skinned mesh nodes, to be scene roots; (key values, target) per joint
    channel).
    """
    sk, where = obj.motion, str(obj.path)
    check_skinning(obj.name, sk, frames)
    nodes = out.doc["nodes"]
    # 1. the skeleton: A = T(c)·S(1/s), one joint per control point at its bind pose T(c_k)
    skel, joints = add_skeleton(out, obj.name, obj.root, centre, scale, sk)
    # 2. per mesh node: a skin with IBM_k = T(−c_k)·N·M_node, the vertices' joints and weights
    N = normalisation(centre, scale)
    parents = {c: i for i, node in enumerate(nodes) for c in node.get("children", [])}
    skinned = []
    for n in obj.nodes:
        node = nodes[n]
        if "skin" in node:
            logger.warning("%s: replacing the source's skin of node %d", where, n)
        skin = add_skin(out, obj.name, skel, joints, sk, N @ obj.world[n])
        _bind_mesh(out, node["mesh"], obj.world[n], centre, scale, sk, where)
        if set(node) <= {"name", "mesh", "skin", "weights", *TRS}:  # a leaf: move it to the root
            parent = nodes[parents[n]]
            parent["children"].remove(n)
            if not parent["children"]:
                del parent["children"]
            for key in (*TRS, "skin"):
                node.pop(key, None)
            node["skin"] = skin
            skinned.append(n)
        else:  # it holds more (children, a camera): the mesh moves to a new root node
            new = {"name": f"{node.get('name') or obj.name}_skinned", "mesh": node.pop("mesh")}
            if "weights" in node:
                new["weights"] = node.pop("weights")
            node.pop("skin", None)
            new["skin"] = skin
            skinned.append(out.add("nodes", new))
    # 3. the joints' keys: translation c_k + τ_{k,t}, rotation q_{k,t} as (x, y, z, w)
    return skinned, joint_tracks(sk, joints)


def dynamic_scene_skinned_glb(
    out_path: Path | str,
    objects: list[tuple[str, Path, Deformer | Skinning | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """``dynamic_scene_skinned.glb``: the scene of :func:`dynamic_scene_glb`, an object with a
    :class:`Skinning` skinned on one joint per control point (translation and rotation keys
    per joint, LINEAR, so slerp between keys), an object with a deformer (a motion one skin
    cannot express, e.g. two control-point layers) morphed as in :func:`dynamic_scene_glb`.

    Args:
        objects: (name, source GLB, Skinning, deformer or None for an unanimated object) in
            id order.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F; key k (frame k) at k/fps, frame 0 the rest pose.

    Returns a summary: {"skinned": skinned mesh nodes, "joints": joints, "morphed": morphed
    nodes, "targets": morph targets per morphed mesh, "frames": F}.
    """
    if frames < 1:
        raise ValueError(f"frames: expected at least 1, got {frames}")
    if not objects:
        raise InputError(f"{out_path}: no objects to export")
    out = GltfBuilder()
    c = np.asarray(centre, dtype=np.float64)
    roots: list[int] = []
    skinned: list[int] = []
    morphed: list[int] = []
    tracks: list = []
    for obj in merged_objects(out, objects, frames, roots):
        if isinstance(obj.motion, Skinning):
            nodes, obj_tracks = _skin_object(out, obj, c, scale, frames)
            roots += nodes  # a skinned mesh node must be a scene root
            skinned += nodes
            tracks += obj_tracks
        else:
            for n in obj.nodes:
                mesh = out.doc["nodes"][n]["mesh"]
                morph_mesh(out, mesh, obj.world[n], c, scale, obj.motion, frames, str(obj.path))
            morphed += obj.nodes
    set_view_targets(out.doc)
    channels = motion_channels(out, tracks, morphed, frames, fps) if skinned or morphed else []
    write_glb(out, out_path, roots, channels)
    return {
        "skinned": len(skinned),
        "joints": len(tracks) // 2,
        "morphed": len(morphed),
        "targets": frames - 1 if morphed else 0,
        "frames": frames,
    }
