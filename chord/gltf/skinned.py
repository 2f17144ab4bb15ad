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
from chord.gltf.container import FLOAT, TRS, GltfBuilder, read_accessor
from chord.gltf.mesh_scene import Moving, merged_objects, morph_object, set_view_targets
from chord.gltf.skeleton import (
    add_skeleton,
    add_skin,
    check_skinning,
    joint_tracks,
    normalisation,
    skin_attributes,
)

logger = logging.getLogger(__name__)


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
