"""``dynamic_splats.glb``: the trained Gaussians of a scene in one glTF file, each object's
Gaussians one POINTS primitive with ``KHR_gaussian_splatting``. Static objects are unanimated;
a dynamic object is skinned on the same joints and keys as ``dynamic_scene_skinned.glb``
(:mod:`chord.gltf.skeleton`), or, for a motion one skin cannot express (a second control-point
layer), keeps one morph target per frame on POSITION and ROTATION, as the skinned mesh file
keeps morph targets.

The attribute names and encodings follow the KHR_gaussian_splatting README at
KhronosGroup/glTF commit 77b44be7bef26e01fb0b140e3d5bb1716421c5e9 (the extension's text last
changed in 63770cc70a3709cf101a42cece0bdf602b37e2e7, "Editorial review"): ROTATION a unit
quaternion (x, y, z, w), SCALE linear (not log), OPACITY linear in [0, 1] (not a logit),
SH_DEGREE_l_COEF_n the raw coefficients of degree l and order m = n − l (DC without the 0.5).

The spec leaves skinned splats undefined; ours (docs/outputs.md, "dynamic_splats.glb") is
named in each skinned primitive's ``extras.CHORD_splat_skinning``: the glTF skinning rule moves the
position, the rotation is N(Σ_i w_i·q_{j_i}(t)) ⊗ q with q_j(t) joint j's animated local
rotation (the trained blend, METHOD §5), the scale is kept (the skin matrices here are rigid)
and the SH are not rotated.

Each unskinned object's node sits at the object's centre, its splats relative to it
(:func:`centred`), so that a viewer sorting objects by their nodes (three.js) orders them right.
A skinned object's splats stay in world coordinates under an untransformed node: glTF's
skinning ignores a skinned node's transform, and so does Babylon.js 9, which ignores the skin
of splats too, so a translated node would draw its rest pose out of place there
(tests/browser/test_splat_viewers.py). ``dynamic_splats_rigid.glb`` is the file for viewers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.gaussians.gaussian_set import C0, GaussianSet
from chord.gltf.animated_scene import Skinning, motion_channels, open_scene, write_glb
from chord.gltf.container import ARRAY_BUFFER, UNSIGNED_BYTE, GltfBuilder
from chord.gltf.skeleton import (
    add_skeleton,
    add_skin,
    check_skinning,
    joint_positions,
    joint_tracks,
    keyed_rotations,
    skin_attributes,
)

logger = logging.getLogger(__name__)

EXTENSION = "KHR_gaussian_splatting"
ROTATION = f"{EXTENSION}:ROTATION"
SCALE = f"{EXTENSION}:SCALE"
OPACITY = f"{EXTENSION}:OPACITY"
#: The primitive's extension object: the spec's one kernel; our colours are sRGB in [0, 1]
#: (METHOD §2) and gsplat's projection and sorting are the defaults.
KERNEL = {
    "kernel": "ellipse",
    "colorSpace": "srgb_rec709_display",
    "projection": "perspective",
    "sortingMethod": "cameraDistance",
}
#: Our conventions where the spec says nothing (docs/outputs.md, "dynamic_splats.glb").
SKINNING_EXTRAS = {
    "CHORD_splat_skinning": {
        "rotation": "normalised_blend_of_joint_rotations",
        "scale": "rigid",
        "sphericalHarmonics": "unrotated",
    }
}
MORPHING_EXTRAS = {
    "CHORD_splat_morphing": {
        "rotation": "morphed_then_normalised",
        "scale": "unchanged",
        "sphericalHarmonics": "unrotated",
    }
}

# A splat deformer gives an object's Gaussians' positions [F, n, 3] and rotations [F, n, 4]
# (w, x, y, z) in normalised space for frames 0..F−1 (frame 0 the rest pose): a motion one
# skin cannot express (e.g. two control-point layers, METHOD §7).
SplatDeformer = Callable[[], tuple[np.ndarray, np.ndarray]]


def sh_semantic(degree: int, n: int) -> str:
    """The attribute of SH coefficient n (order m = n − degree) of ``degree``."""
    return f"{EXTENSION}:SH_DEGREE_{degree}_COEF_{n}"


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """The sRGB transfer function inverted (IEC 61966-2-1), for COLOR_0 (linear in glTF)."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def splat_values(
    g: GaussianSet, centre: np.ndarray, scale: float, degree: int, where: str = "Gaussians"
) -> dict:
    """The stored values of Gaussians ``g`` (normalised space, raw 3DGS parameters) placed in
    world coordinates x_w = x_n/s + c: positions [n, 3], rotations [n, 4] (x, y, z, w, unit),
    linear scales exp(log-scale)/s [n, 3], linear opacities sigmoid(logit) [n], SH
    [n, (degree+1)², 3] (zero-padded above g's own degree) and the fallback COLOR_0 [n, 4]
    (uint8: linear RGB of the clamped DC colour, alpha the opacity)."""
    q = g.quats.astype(np.float64)
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    if not (norm > 0).all():
        bad = int(np.flatnonzero(~(norm[:, 0] > 0))[0])
        raise InputError(f"{where}: Gaussian {bad} has a zero rotation quaternion")
    opacity = 1.0 / (1.0 + np.exp(-g.opacity_logits.astype(np.float64)))
    sh = np.zeros((len(g), (degree + 1) ** 2, 3))
    sh[:, : g.sh.shape[1]] = g.sh
    rgb = np.clip(0.5 + C0 * sh[:, 0], 0.0, 1.0)
    colour = np.concatenate([srgb_to_linear(rgb), opacity[:, None]], 1)
    return {
        "position": g.means.astype(np.float64) / scale + centre,
        "rotation": (q / norm)[:, [1, 2, 3, 0]],
        "scale": np.exp(g.log_scales.astype(np.float64)) / scale,
        "opacity": opacity,
        "sh": sh,
        "colour": np.round(colour * 255.0).astype(np.uint8),
    }


def open_splat_scene(out_path, objects, frames: int, centre, scale: float):
    """The splat writers' start: the scene (:func:`open_scene`) with KHR_gaussian_splatting
    used, the normalisation centre as float64 and the highest SH degree among the objects
    (every object is written at it); a non-positive ``scale`` is a ValueError."""
    out = open_scene(out_path, objects, frames)
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected a positive normalisation scale, got {scale}")
    out.doc["extensionsUsed"] = [EXTENSION]
    degree = max(g.sh_degree for _, g, _ in objects)
    return out, np.asarray(centre, dtype=np.float64), degree


def centred(values: dict) -> tuple[np.ndarray, dict]:
    """An object's node goes to its centre o (the middle of its splats' bounds, world): o and
    ``values`` (:func:`splat_values`) with the positions relative to it. KHR_gaussian_splatting
    splats take their node's transform, and three.js (r187) sorts whole objects by their
    nodes' positions before sorting each one's splats: with every node at the origin it drew
    one object over another (hop's slab over the block's lower half)."""
    p = values["position"]
    o = (p.min(0) + p.max(0)) / 2.0
    return o, {**values, "position": p - o}


def add_splat_mesh(out: GltfBuilder, name: str, values: dict, extra: dict) -> int:
    """A mesh ``name`` with one POINTS primitive holding ``values`` (:func:`splat_values`)
    as KHR_gaussian_splatting attributes plus ``extra`` attributes (skin); returns it."""
    add = out.add_accessor
    attrs = {"POSITION": add(values["position"], "VEC3", target=ARRAY_BUFFER)}
    attrs[ROTATION] = add(values["rotation"], "VEC4", target=ARRAY_BUFFER, bounds=False)
    attrs[SCALE] = add(values["scale"], "VEC3", target=ARRAY_BUFFER, bounds=False)
    attrs[OPACITY] = add(values["opacity"], "SCALAR", target=ARRAY_BUFFER, bounds=False)
    sh = values["sh"]
    degree = int(round(np.sqrt(sh.shape[1]))) - 1
    for lv in range(degree + 1):
        for n in range(2 * lv + 1):
            attrs[sh_semantic(lv, n)] = add(
                sh[:, lv * lv + n], "VEC3", target=ARRAY_BUFFER, bounds=False
            )
    colour = add(
        values["colour"], "VEC4", target=ARRAY_BUFFER, component=UNSIGNED_BYTE, bounds=False
    )
    out.doc["accessors"][colour]["normalized"] = True
    attrs["COLOR_0"] = colour
    attrs.update(extra)
    prim = {"attributes": attrs, "mode": 0, "extensions": {EXTENSION: dict(KERNEL)}}
    return out.add("meshes", {"name": name, "primitives": [prim]})


def _morph(
    out: GltfBuilder,
    mesh: int,
    name: str,
    motion: SplatDeformer,
    values: dict,
    centre: np.ndarray,
    scale: float,
    F: int,
    origin: np.ndarray,
) -> None:
    """Morph targets k = 1..F−1 of ``mesh``'s primitive (positions relative to its node at
    ``origin``): POSITION deltas in world units and ROTATION deltas (x, y, z, w) to frame k's
    unit quaternion; with one-hot weights, target k gives frame k exactly (up to the float32
    sum)."""
    X, Q = (np.asarray(a, dtype=np.float64) for a in motion())
    n = len(values["position"])
    if X.shape != (F, n, 3) or Q.shape != (F, n, 4):
        raise ValueError(
            f"{name}: the deformer returned positions {X.shape} and rotations {Q.shape}, "
            f"expected {(F, n, 3)} and {(F, n, 4)}"
        )
    # deltas against the stored (float32) base values, so base + delta rounds to frame k
    pos32 = values["position"].astype(np.float32).astype(np.float64)
    rot32 = values["rotation"].astype(np.float32).astype(np.float64)
    rot = Q[..., [1, 2, 3, 0]] / np.linalg.norm(Q, axis=-1, keepdims=True)  # [F, n, 4] xyzw
    targets = []
    for k in range(1, F):
        d_pos = (X[k] / scale + centre - origin) - pos32
        targets.append(
            {
                "POSITION": out.add_accessor(d_pos, "VEC3", target=ARRAY_BUFFER),
                ROTATION: out.add_accessor(
                    rot[k] - rot32, "VEC4", target=ARRAY_BUFFER, bounds=False
                ),
            }
        )
    prim = out.doc["meshes"][mesh]["primitives"][0]
    prim["targets"] = targets
    prim["extras"] = MORPHING_EXTRAS
    out.doc["meshes"][mesh]["weights"] = [0.0] * (F - 1)


def _blend_signs(name: str, sk: Skinning) -> None:
    """Warn where the keyed rotations (kept in one hemisphere) flip some joints' quaternions
    but not all in a frame: the normalised blend of those keys is then not the trained blend
    (which adds the quaternions as trained, METHOD §5)."""
    q = np.asarray(sk.rotations, dtype=np.float64)
    sign = np.sign((keyed_rotations(q)[..., [3, 0, 1, 2]] * q).sum(-1))  # [F, M]
    mixed = np.flatnonzero((sign > 0).any(1) & (sign < 0).any(1))
    if len(mixed):
        logger.warning(
            "%s: the joints' rotation keys of frames %s are negated for some joints only (a "
            "joint turns by more than 180 degrees between frames); splat rotations there "
            "follow the keys, not the trained blend",
            name,
            mixed.tolist(),
        )


def dynamic_splats_glb(
    out_path: Path | str,
    objects: list[tuple[str, GaussianSet, Skinning | SplatDeformer | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """``dynamic_splats.glb``: the Gaussians of every listed object, each object one mesh
    with one KHR_gaussian_splatting POINTS primitive under a node at its centre.

    Args:
        objects: (name, its Gaussians in normalised space, its motion) in id order; the
            motion is None (static: unanimated), a
            :class:`~chord.gltf.animated_scene.Skinning` (the first control-point layer:
            skinned on one joint per control point, with the keys of
            ``dynamic_scene_skinned.glb``) or a :data:`SplatDeformer` (morph targets).
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F; key k (frame k) at k/fps, frame 0 the rest pose.

    Every object is written at the highest SH degree among them (the degree the scene was
    trained and rendered at; lower degrees zero-padded, as in the PLY sequence).

    Returns a summary: {"gaussians", "sh_degree", "skinned", "joints", "morphed", "targets",
    "frames"}.
    """
    out, c, degree = open_splat_scene(out_path, objects, frames, centre, scale)
    roots: list[int] = []
    skinned: list[int] = []
    morphed: list[int] = []
    tracks: list = []
    total = 0
    for name, g, motion in objects:
        n = len(g)
        if n == 0:
            raise InputError(f"{out_path}: {name} has no Gaussians")
        total += n
        where = f"{out_path}: {name}"
        world = splat_values(g, c, scale, degree, where)
        o, values = centred(world)
        at = {"translation": o.tolist()}  # the node at the object's centre (:func:`centred`)
        if motion is None or frames < 2:
            mesh = add_splat_mesh(out, name, values, {})
            roots.append(out.add("nodes", {"name": name, "mesh": mesh, **at}))
        elif isinstance(motion, Skinning):
            check_skinning(name, motion, frames)
            _blend_signs(where, motion)
            root = out.add("nodes", {"name": name, "children": []})
            rest, keys = joint_positions(motion, c, scale)
            skel, joints = add_skeleton(out, name, root, rest)
            # in world coordinates, its node untransformed: a viewer that honours the skin
            # ignores a skinned node's transform, one that ignores the skin (Babylon.js 9)
            # does too, so only an untransformed node draws the rest pose in place in both
            skin = add_skin(out, name, skel, joints, rest)
            bound = g.means.astype(np.float64)  # the rest points the trained weights bind
            mesh = add_splat_mesh(out, name, world, skin_attributes(out, bound, motion, where))
            out.doc["meshes"][mesh]["primitives"][0]["extras"] = SKINNING_EXTRAS
            node = {"name": f"{name}_splats", "mesh": mesh, "skin": skin}
            node = out.add("nodes", node)
            roots += [root, node]  # a skinned mesh node is a scene root
            skinned.append(node)
            tracks += joint_tracks(motion, keys, joints)
        else:
            mesh = add_splat_mesh(out, name, values, {})
            _morph(out, mesh, name, motion, values, c, scale, frames, o)
            node = out.add("nodes", {"name": name, "mesh": mesh, **at})
            roots.append(node)
            morphed.append(node)
    channels = motion_channels(out, tracks, morphed, frames, fps) if skinned or morphed else []
    write_glb(out, out_path, roots, channels)
    return {
        "gaussians": total,
        "sh_degree": degree,
        "skinned": len(skinned),
        "joints": len(tracks) // 2,
        "morphed": len(morphed),
        "targets": frames - 1 if morphed else 0,
        "frames": frames,
    }
