"""``dynamic_splats_rigid.glb``: the trained Gaussians of a scene with node animation only, for
any ``KHR_gaussian_splatting`` viewer (issue 40). Splats take their node's global transform
(the extension's README), so translation and rotation channels play in every conforming
viewer, while the skins and morph targets of ``dynamic_splats.glb`` (:mod:`chord.gltf.splats`)
lie outside the extension and standard viewers draw its rest pose.

Each object's Gaussians are one POINTS primitive (the attributes of :mod:`chord.gltf.splats`)
under a node of its own that rests at the object's centre, the splat positions relative to it
(viewers that sort per object then sort the objects right). A dynamic object's node is keyed
per frame with a rigid pose, LINEAR translation and rotation (x, y, z, w) keys at k/fps: what
that pose leaves out of the trained motion (its fit residual) is stated in the node's
``extras.CHORD_rigid_motion``. Static objects are unanimated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from chord.core.errors import InputError
from chord.gaussians.gaussian_set import GaussianSet
from chord.gltf.animated_scene import joint_channels, key_times, write_glb
from chord.gltf.splats import add_splat_mesh, open_splat_scene, splat_values


class RigidMotion(Protocol):
    """An object's rigid poses in the file's (world) units, as
    :class:`chord.export.trajectories.RigidPoses` holds them: the body origin at rest [3]
    (where the node rests), its position per frame [F, 3] (the node's translation keys), the
    rotation per frame [F, 4] (w, x, y, z; identity at frame 0) and the fit residual [F]."""

    origin: np.ndarray
    position: np.ndarray
    quaternion: np.ndarray
    residual: np.ndarray


def centre_of(values: dict) -> np.ndarray:
    """The middle of the bounding box of splat positions [n, 3]: where a static node rests."""
    p = values["position"]
    return (p.min(0) + p.max(0)) / 2.0


def rotation_keys(q: np.ndarray) -> np.ndarray:
    """glTF rotation keys [F, 4] (x, y, z, w) of quaternions [F, 4] (w, x, y, z): unit, each in
    the hemisphere of the key before it (LINEAR slerp then takes the short way)."""
    r = np.asarray(q, dtype=np.float64)[:, [1, 2, 3, 0]]
    r = r / np.linalg.norm(r, axis=1, keepdims=True)
    for t in range(1, len(r)):
        if np.dot(r[t], r[t - 1]) < 0:
            r[t] = -r[t]
    return r


def check_motion(name: str, m: RigidMotion, frames: int) -> None:
    shapes = tuple(np.shape(a) for a in (m.origin, m.position, m.quaternion, m.residual))
    want = ((3,), (frames, 3), (frames, 4), (frames,))
    if shapes != want:
        raise ValueError(f"{name}: rigid motion of shapes {shapes}, expected {want}")


def rigid_splats_glb(
    out_path: Path | str,
    objects: list[tuple[str, GaussianSet, RigidMotion | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """``dynamic_splats_rigid.glb``: the Gaussians of every listed object, each under its own
    node, a dynamic object's node animated with its rigid poses.

    Args:
        objects: (name, its Gaussians in normalised space, its rigid motion in world units
            or None for a static object) in id order.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F; key k (frame k) at k/fps, frame 0 the rest pose.

    A dynamic node rests at its motion's origin, a static one at the centre of its splats'
    bounding box; the splats are stored relative to it, in the world's axes (the node is
    unrotated at rest). Every object is written at the highest SH degree among them.

    Returns a summary: {"gaussians", "sh_degree", "animated", "frames", "residual_max"
    ({name: the largest residual of each animated object, world units})}.
    """
    out, c, degree = open_splat_scene(out_path, objects, frames, centre, scale)
    roots: list[int] = []
    tracks: list = []
    residuals: dict[str, float] = {}
    total = 0
    for name, g, motion in objects:
        if len(g) == 0:
            raise InputError(f"{out_path}: {name} has no Gaussians")
        total += len(g)
        values = splat_values(g, c, scale, degree, f"{out_path}: {name}")
        if motion is None:
            origin = centre_of(values)
        else:
            check_motion(name, motion, frames)
            origin = np.asarray(motion.origin, dtype=np.float64)
        values["position"] = values["position"] - origin
        node = {"name": name, "mesh": add_splat_mesh(out, name, values, {})}
        node["translation"] = origin.tolist()
        if motion is not None:
            res = float(np.max(motion.residual))
            residuals[name] = res
            node["extras"] = {
                "CHORD_rigid_motion": {
                    "residual_max": res,
                    "residual": "RMS distance (file units) of the object's control points "
                    "from this rigid pose, the largest over the frames: the part of the "
                    "trained motion this node animation leaves out (dynamic_splats.glb has it)",
                }
            }
        root = out.add("nodes", node)
        roots.append(root)
        if motion is not None and frames >= 2:
            position = np.asarray(motion.position, dtype=np.float64)
            tracks.append((position, {"node": root, "path": "translation"}))
            tracks.append((rotation_keys(motion.quaternion), {"node": root, "path": "rotation"}))
    channels = joint_channels(out, tracks, key_times(out, frames, fps)) if tracks else []
    write_glb(out, out_path, roots, channels)
    return {
        "gaussians": total,
        "sh_degree": degree,
        "animated": len(tracks) // 2,
        "frames": frames,
        "residual_max": residuals,
    }
