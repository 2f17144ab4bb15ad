"""``dynamic_scene_skinned.glb`` (METHOD §20): the scene's glTF with each dynamic object skinned
on one joint per control point, with LINEAR translation/rotation keys (the control-point motion
is linear blend skinning, METHOD §5), keeping morph targets only for a motion one skin cannot
express. The sources' merge and morph targets are :mod:`chord.gltf.mesh_scene`'s, the skeleton
and skins :mod:`chord.gltf.skeleton`'s, the animation and the writing
:mod:`chord.gltf.animated_scene`'s."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.gltf.animated_scene import (
    Deformer,
    Skinning,
    motion_channels,
    open_scene,
    write_glb,
)
from chord.gltf.container import (
    ARRAY_BUFFER,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    TRS,
    UNSIGNED_INT,
    UNSIGNED_SHORT,
    GltfBuilder,
    read_accessor,
)
from chord.gltf.mesh_scene import Moving, merged_objects, morph_object, set_view_targets
from chord.gltf.skeleton import (
    add_skeleton,
    add_skin,
    check_skinning,
    joint_positions,
    joint_tracks,
    skin_attributes,
)

logger = logging.getLogger(__name__)


def _triangle_list(indices: np.ndarray, mode: int) -> np.ndarray:
    """The triangles [t, 3] of a TRIANGLES (4), TRIANGLE_STRIP (5) or TRIANGLE_FAN (6)
    primitive's vertex indices, each in the winding the primitive gives it."""
    if mode == 4:
        return indices[: len(indices) // 3 * 3].reshape(-1, 3)
    i = np.arange(max(len(indices) - 2, 0))
    if mode == 5:  # strip: every other triangle has its first two vertices swapped
        odd = i % 2
        return np.stack([indices[i + odd], indices[i + 1 - odd], indices[i + 2]], 1)
    return np.stack([np.full_like(i, indices[0]), indices[i + 1], indices[i + 2]], 1)


class _Baked:
    """Accessors of one mesh node's vertex data taken to world coordinates by its world matrix
    M (A its linear part): a point by M, a direction by A, a normal by A⁻ᵀ, renormalised where
    a unit vector is stored; each source accessor baked once (primitives share them)."""

    def __init__(self, out: GltfBuilder, M: np.ndarray):
        self.out, self.M, self.A = out, M, M[:3, :3]
        self.normal = np.linalg.inv(self.A).T
        self.mirror = bool(np.linalg.det(self.A) < 0)
        self.done: dict[tuple[str, int], int] = {}

    def __call__(self, kind: str, index: int) -> int:
        if (kind, index) not in self.done:
            v = read_accessor(self.out.doc, bytes(self.out.blob), index)
            if kind == "point":
                v = v @ self.A.T + self.M[:3, 3]
            elif kind == "direction":  # a delta of a point or of a tangent
                v = v @ self.A.T
            elif kind == "normal delta":
                v = v @ self.normal.T
            elif kind == "normal":
                v = _unit(v @ self.normal.T)
            else:  # tangent (x, y, z, handedness w): w flips with a mirror
                xyz = _unit(v[:, :3] @ self.A.T)
                v = np.concatenate([xyz, v[:, 3:] * (-1.0 if self.mirror else 1.0)], 1)
            shape = "VEC4" if kind == "tangent" else "VEC3"
            bounds = kind in ("point", "direction")  # POSITION and its deltas need min/max
            self.done[kind, index] = self.out.add_accessor(
                v, shape, target=ARRAY_BUFFER, bounds=bounds
            )
        return self.done[kind, index]


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norm > 0, norm, 1.0)


ATTRIBUTE_KINDS = {"POSITION": "point", "NORMAL": "normal", "TANGENT": "tangent"}
TARGET_KINDS = {"POSITION": "direction", "NORMAL": "normal delta", "TANGENT": "direction"}


def _bake_mesh(out: GltfBuilder, mesh_index: int, M: np.ndarray) -> None:
    """Store every primitive of mesh ``mesh_index`` (placed by world matrix M) in world
    coordinates: POSITION, NORMAL and TANGENT and the source's morph-target deltas of them
    (:class:`_Baked`; the source's own accessors stay in the buffer, unused). Under a mirror
    (det M < 0) the triangles' winding is reversed too: glTF takes the winding's sense from
    the node's transform, which it ignores for a skinned node, so the baked mirror must carry
    it."""
    bake = _Baked(out, M)
    for p in out.doc["meshes"][mesh_index]["primitives"]:
        a = p["attributes"]
        for key, kind in ATTRIBUTE_KINDS.items():
            if key in a:
                a[key] = bake(kind, a[key])
        for t in p.get("targets", []):
            for key, kind in TARGET_KINDS.items():
                if key in t:
                    t[key] = bake(kind, t[key])
        mode = p.get("mode", 4)
        if bake.mirror and mode in (4, 5, 6):
            if "indices" in p:
                idx = read_accessor(out.doc, bytes(out.blob), p["indices"])[:, 0]
            else:
                idx = np.arange(out.doc["accessors"][a["POSITION"]]["count"])
            tri = _triangle_list(idx.astype(np.int64), mode)[:, [0, 2, 1]]  # reversed
            component = UNSIGNED_INT if len(idx) and idx.max() > 65535 else UNSIGNED_SHORT
            p["indices"] = out.add_accessor(
                tri.reshape(-1), "SCALAR", target=ELEMENT_ARRAY_BUFFER, component=component,
                bounds=False,
            )  # fmt: skip
            p["mode"] = 4


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


def _skin_object(
    out: GltfBuilder, obj: Moving, centre: np.ndarray, scale: float, frames: int
) -> tuple[list[int], list]:
    """Skin ``obj``'s mesh nodes on one joint per control point.

    The skeleton (a child of the object's root, which has no transform) holds joint k at its
    world rest position T(p_k), p_k = c + c_k/s, keyed T(p_k + τ_{k,t}/s)·R(q_{k,t})
    (:mod:`chord.gltf.skeleton`). One skin on those joints has IBM_k = T(−p_k), the inverse of
    joint k's rest transform, and each mesh node's vertex data is taken to the source's world
    coordinates v_w = M_node·v_l (:func:`_bake_mesh`), so J_k(t)·IBM_k·v_w = R_k·(v_w − p_k) +
    p_k + τ_k/s = (R_k·(v_n − c_k) + c_k + τ_k)/s + c, and Σ_k w_k of that (Σw = 1) is the
    deformed vertex x_t/s + c in the source's world coordinates. No IBM holds a rotation or a
    scale: Blender's importer by default ("Guess Original Bind Pose") rebuilds the rest pose
    from the IBMs in the skeleton's space, and played the file off by up to a few percent of
    an object's size while M_node and the denormalisation were in them. glTF ignores a skinned
    mesh node's own transform, so the node becomes a scene root without one (a leaf itself; a
    node with children or a camera hands its mesh to a new root node).

    Returns (the skinned mesh nodes, to be scene roots; (key values, target) per joint
    channel).
    """
    sk, where = obj.motion, str(obj.path)
    check_skinning(obj.name, sk, frames)
    nodes = out.doc["nodes"]
    # 1. the skeleton: one joint per control point at its world rest position T(p_k)
    rest, keys = joint_positions(sk, centre, scale)
    skel, joints = add_skeleton(out, obj.name, obj.root, rest)
    # 2. one skin with IBM_k = T(−p_k); per mesh node its vertices' joints and weights, then its
    # vertex data in world coordinates
    skin = add_skin(out, obj.name, skel, joints, rest)
    parents = {c: i for i, node in enumerate(nodes) for c in node.get("children", [])}
    skinned = []
    for n in obj.nodes:
        node = nodes[n]
        if "skin" in node:
            logger.warning("%s: replacing the source's skin of node %d", where, n)
        _bind_mesh(out, node["mesh"], obj.world[n], centre, scale, sk, where)
        if not np.array_equal(obj.world[n], np.eye(4)):  # (placed by the identity: as it is)
            _bake_mesh(out, node["mesh"], obj.world[n])
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
    # 3. the joints' keys: translation p_k + τ_{k,t}/s, rotation q_{k,t} as (x, y, z, w)
    return skinned, joint_tracks(sk, keys, joints)


def dynamic_scene_skinned_glb(
    out_path: Path | str,
    objects: list[tuple[str, Path, Deformer | Skinning | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """``dynamic_scene_skinned.glb``: the scene of :func:`~chord.gltf.morphed.dynamic_scene_glb`,
    an object with a :class:`Skinning` skinned on one joint per control point (translation and
    rotation keys per joint, LINEAR, so slerp between keys), an object with a deformer (a
    motion one skin cannot express, e.g. two control-point layers) morphed as there.

    Args:
        objects: (name, source GLB, Skinning, deformer or None for an unanimated object) in
            id order.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F; key k (frame k) at k/fps, frame 0 the rest pose.

    Returns a summary: {"skinned": skinned mesh nodes, "joints": joints, "morphed": morphed
    nodes, "targets": morph targets per morphed mesh, "frames": F}.
    """
    out = open_scene(out_path, objects, frames)
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
            morphed += morph_object(out, obj, c, scale, frames)
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
