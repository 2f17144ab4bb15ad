"""Procedural demo scenes with scripted ground-truth motion.

Each demo scene is a small, textured multi-object scene in CHORD's input layout::

    <outdir>/<name>/scene.glb     all objects together (used only to normalise the scene)
    <outdir>/<name>/obj_0.glb     dynamic object (textured)
    <outdir>/<name>/obj_1.glb     the static ground slab (static_id = 1)
    <outdir>/<name>/obj_2.glb     optional second dynamic object
    <outdir>/<name>/motion.json   scripted ground-truth motion of the dynamic objects

Every ``obj_<i>.glb`` holds one object in its world placement (world units of roughly metres,
Y up, glTF convention). Some placements live in node transforms rather than in the vertices, so
loaders must apply node world transforms (``trimesh.load(path, force="scene")`` does).
The ground slab's top face is the plane ``y = SLAB_TOP_Y``; dynamic objects rest on it.

``motion.json`` is the scripted ground-truth motion of the dynamic objects in the format of
:mod:`chord.motion.scripted` (what an oracle teacher renders and training should recover).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where used, not here: the DAG build imports this module
    import trimesh

from chord.core.errors import InputError
from chord.motion.scripted import MOTION_FORMAT, UP, quat_axis_angle, quat_mul, validate_motion
from chord.scene.demo_meshes import (
    BOX_FACES,
    SLAB_TOP_Y,
    block_texture,
    box_part,
    checker_texture,
    column_part,
    column_texture,
    join_parts,
    slab_part,
    textured_mesh,
)

logger = logging.getLogger(__name__)

DEFAULT_FRAME_NUM = 41
DEFAULT_FPS = 10
STATIC_ID = 1

DEMO_SCENES: dict[str, dict] = {
    "hop": {
        "objects": 2,
        "prompt": (
            "a toy block with a painted face hops once to the right along a gentle curve "
            "across a grey table, turning towards the way it hops and leaning into the hop"
        ),
        "description": (
            "obj_0: a striped toy block (0.30 x 0.50 x 0.30) with a face on its front that makes "
            "one hop along a short arc (0.25 along +x, bulging 0.08 towards +z, 0.12 high), "
            "yawing 35 degrees about +y towards +x and leaning towards +x while airborne "
            "(rigid motion); "
            "obj_1: a static grey table slab (2.0 x 1.4, factor colour only)."
        ),
    },
    "sway": {
        "objects": 3,
        "prompt": (
            "a green plant stalk leans over in the wind and straightens again while a "
            "colourful block next to it twists and untwists and slides a little backward and "
            "back on a checkered table"
        ),
        "description": (
            "obj_0: a tapered, banded green column (0.9 tall) that bends sideways and back "
            "(height-weighted bend about the z axis through its base: 0.6 sin^2(pi s) rad, "
            "top towards -x); obj_1: a static checkered slab (2.0 x 1.4); obj_2: a "
            "vertex-coloured square block (0.6 tall) that twists about its vertical axis "
            "(0.8 sin^2(pi s) rad at the top) while sliding 0.15 towards -z and back."
        ),
    },
    "slide": {
        "objects": 2,
        "prompt": (
            "a toy block with a painted face slides straight back across a checkered table "
            "and stops against the wall behind it"
        ),
        "description": (
            "obj_0: a striped toy block (0.28 x 0.36 x 0.28) with a face on its front that "
            "slides along -z towards a wall; obj_1: a static checkered slab (2.0 x 1.4) with a "
            "checkered wall (0.7 wide, 0.45 tall, 0.20 thick) standing on it behind the block, "
            "one static object. The block "
            "touches the wall after 0.22; motion.json, what the oracle teacher renders, "
            "overshoots by SLIDE_OVERSHOOT (0.06) into the wall and stays there, as a video "
            "model lets a box pass into a wall (issue 36: the contact loss's scene)."
        ),
    },
}

# The slide scene: how far the block travels before it touches the wall, and how far the
# teacher's scripted motion pushes it on through the wall (world units; the scene's
# normalisation scale is 0.6, so 0.06 is 0.036 scene units, 3.6x the penetration threshold).
SLIDE_CONTACT = 0.22
SLIDE_OVERSHOOT = 0.06

_ROUND = 9  # decimals kept in motion.json


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def demo_files(name: str) -> list[str]:
    """Relative file names of scene ``name``: ``scene.glb``, ``obj_<i>.glb``.., ``motion.json``."""
    spec = _scene_spec(name)
    return ["scene.glb", *[f"obj_{i}.glb" for i in range(spec["objects"])], "motion.json"]


def write_demo_scene(name: str, outdir: Path, *, frame_num: int = DEFAULT_FRAME_NUM) -> Path:
    """Write demo scene ``name`` to ``<outdir>/<name>/`` and return that folder.

    Writes the files listed by :func:`demo_files`, each to a temporary name in the same folder
    followed by ``os.replace``. The bytes are deterministic for the same ``name`` and
    ``frame_num``. ``frame_num`` must be >= 5 with ``(frame_num - 1) % 4 == 0``.
    """
    _scene_spec(name)
    _check_frame_num(frame_num)
    objects, motion = _BUILDERS[name](frame_num)
    validate_motion(motion, f"<generated motion of {name!r}>")
    folder = Path(outdir) / name
    folder.mkdir(parents=True, exist_ok=True)

    blobs: dict[str, bytes] = {"scene.glb": _export_glb(objects)}
    for obj in objects:
        blobs[f"{obj.name}.glb"] = _export_glb([obj])
    blobs["motion.json"] = (json.dumps(motion, indent=1) + "\n").encode("utf-8")
    if sorted(blobs) != sorted(demo_files(name)):
        raise RuntimeError(
            f"demo scene {name!r} produced {sorted(blobs)}, expected {sorted(demo_files(name))}"
        )
    for fname in demo_files(name):
        _write_atomic(folder / fname, blobs[fname])
    logger.info(
        "wrote demo scene %r (%d objects, %d frames) to %s", name, len(objects), frame_num, folder
    )
    return folder


def write_demo_scenes(
    outdir: Path, names: list[str] | None = None, *, frame_num: int = DEFAULT_FRAME_NUM
) -> list[Path]:
    """Write several demo scenes (all of :data:`DEMO_SCENES` by default); return their folders."""
    if names is None:
        names = list(DEMO_SCENES)
    if isinstance(names, str):
        raise InputError(f"names must be a list of scene names, got the string {names!r}")
    for n in names:
        _scene_spec(n)
    return [write_demo_scene(n, outdir, frame_num=frame_num) for n in names]


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _scene_spec(name: str) -> dict:
    if name not in DEMO_SCENES:
        raise InputError(f"unknown demo scene name {name!r}; known: {sorted(DEMO_SCENES)}")
    return DEMO_SCENES[name]


def _check_frame_num(frame_num: int) -> None:
    if isinstance(frame_num, bool) or not isinstance(frame_num, (int, np.integer)):
        raise InputError(f"frame_num must be an int, got {frame_num!r}")
    if frame_num < 5 or (frame_num - 1) % 4 != 0:
        raise InputError(f"frame_num must be >= 5 with (frame_num - 1) % 4 == 0, got {frame_num}")


# --------------------------------------------------------------------------------------------
# Rotation helpers
# --------------------------------------------------------------------------------------------


def _yaw_matrix(angle: float, translation: Sequence[float]) -> np.ndarray:
    """Homogeneous ``[4, 4]`` transform: rotation about +Y by ``angle``, then ``translation``."""
    m = np.eye(4)
    c, s = math.cos(angle), math.sin(angle)
    m[:3, :3] = [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
    m[:3, 3] = translation
    return m


# --------------------------------------------------------------------------------------------
# Scenes
# --------------------------------------------------------------------------------------------


@dataclass
class _DemoObject:
    name: str
    mesh: trimesh.Trimesh  # local vertices
    transform: np.ndarray  # [4, 4] node transform (local -> world)


def _r(x: Any) -> Any:
    """Round floats for JSON (also maps -0.0 to 0.0)."""
    return (np.round(np.asarray(x, dtype=np.float64), _ROUND) + 0.0).tolist()


def _motion_doc(frame_num: int, objects: dict[str, dict]) -> dict:
    return {
        "format": MOTION_FORMAT,
        "frame_num": frame_num,
        "fps": DEFAULT_FPS,
        "space": "world",
        "up": list(UP),
        "objects": objects,
    }


def _rigid(base: np.ndarray, height: float, rots: np.ndarray, trans: np.ndarray) -> dict:
    """An object's motion.json entry for a rigid motion about ``base``: no deformation."""
    return {
        "deformation": {
            "kind": "none",
            "pivot": _r(base),
            "axis": [0.0, 0.0, 1.0],
            "height": height,
            "angles": [0.0] * len(rots),
        },
        "rigid": {"pivot": _r(base), "rotations": _r(rots), "translations": _r(trans)},
    }


def _ease(s: np.ndarray) -> np.ndarray:
    """Smooth 0 -> 1 ramp with zero velocity at both ends."""
    return s - np.sin(2.0 * np.pi * s) / (2.0 * np.pi)


def _build_hop(frame_num: int) -> tuple[list[_DemoObject], dict]:
    import trimesh

    ext = (0.30, 0.50, 0.30)
    image, rects = block_texture()
    subdiv = {
        "+z": (6, 10),
        "-z": (6, 10),
        "+x": (6, 10),
        "-x": (6, 10),
        "+y": (6, 6),
        "-y": (6, 6),
    }
    block = textured_mesh(box_part(ext, subdiv, rects), image, "block")
    base = np.array([-0.35, SLAB_TOP_Y, 0.05])
    block_tf = _yaw_matrix(math.radians(20.0), base)  # placement lives in the node transform

    slab_mesh = slab_part()
    slab = trimesh.Trimesh(slab_mesh.vertices, slab_mesh.faces, process=False)
    slab.visual = trimesh.visual.TextureVisuals(
        material=trimesh.visual.material.PBRMaterial(
            name="slab_material",
            baseColorFactor=[150, 150, 160, 255],
            metallicFactor=0.0,
            roughnessFactor=1.0,
        )
    )

    s = np.linspace(0.0, 1.0, frame_num)
    # One slow hop: the demo trains a few hundred iterations, not CHORD's 3000, so its motion
    # is smooth in time and of moderate size (faster, larger motions need the longer run).
    hops, hop_h, lean = 1, 0.12, 0.20
    air = np.sin(np.pi * hops * s) ** 2  # 0 on the ground, 1 at the top of the hop
    # Leaning by lean * air about the base centre lowers a base corner by at most
    # half_diagonal * lean * air (~0.042 air), less than the lift hop_h * air: no penetration.
    trans = np.stack([0.25 * _ease(s), hop_h * air, 0.08 * np.sin(np.pi * s)], -1)
    yaw = math.radians(35.0) * _ease(s)  # turns towards +x, the way it hops
    rots = np.stack(
        [
            quat_mul(quat_axis_angle((0, 0, 1), -lean * a), quat_axis_angle((0, 1, 0), y))
            for a, y in zip(air, yaw, strict=True)
        ]
    )
    trans[0] = 0.0
    rots[0] = [1.0, 0.0, 0.0, 0.0]
    motion = _motion_doc(frame_num, {"obj_0": _rigid(base, ext[1], rots, trans)})
    objects = [_DemoObject("obj_0", block, block_tf), _DemoObject("obj_1", slab, np.eye(4))]
    return objects, motion


def _build_sway(frame_num: int) -> tuple[list[_DemoObject], dict]:
    import trimesh

    height = 0.9
    stalk = textured_mesh(column_part(height, 0.12, 0.07, 24, 18), column_texture(), "stalk")
    stalk_base = np.array([-0.35, SLAB_TOP_Y, -0.10])
    stalk_tf = _yaw_matrix(0.0, stalk_base)

    slab = textured_mesh(slab_part(), checker_texture(), "slab")

    # twisting block: square prism with vertex colours per side and per height band
    b_ext = (0.28, 0.60, 0.28)
    n_rings = 12
    subdiv = {
        "+z": (4, n_rings),
        "-z": (4, n_rings),
        "+x": (4, n_rings),
        "-x": (4, n_rings),
        "+y": (4, 4),
        "-y": (4, 4),
    }
    part = box_part(b_ext, subdiv, {f: (0.0, 0.0, 1.0, 1.0) for f in BOX_FACES})
    side_colours = np.array(
        [
            [230, 60, 50],
            [60, 90, 220],
            [250, 200, 40],
            [40, 170, 90],
            [240, 240, 240],
            [70, 60, 60],
        ],
        dtype=np.float64,
    )
    band = (np.floor(part.vertices[:, 1] / b_ext[1] * 4 - 1e-9).clip(0, 3) % 2)[:, None]
    rgb = side_colours[part.tag] * (1.0 - 0.35 * band)
    colours = np.concatenate([np.round(rgb), np.full((len(rgb), 1), 255.0)], 1)
    block = trimesh.Trimesh(part.vertices, part.faces, process=False)
    block.visual = trimesh.visual.ColorVisuals(block, vertex_colors=colours.astype(np.uint8))
    block_base = np.array([0.45, SLAB_TOP_Y, 0.15])
    block_tf = _yaw_matrix(math.radians(30.0), block_base)

    s = np.linspace(0.0, 1.0, frame_num)
    bend = 0.60 * np.sin(np.pi * s) ** 2  # leans over and back
    twist = 0.80 * np.sin(np.pi * s) ** 2
    slide = np.stack([np.zeros_like(s), np.zeros_like(s), -0.15 * np.sin(np.pi * s) ** 2], -1)
    identity = np.tile([1.0, 0.0, 0.0, 0.0], (frame_num, 1))
    zeros = np.zeros((frame_num, 3))
    bend[0] = twist[0] = 0.0
    slide[0] = 0.0
    motion = _motion_doc(
        frame_num,
        {
            "obj_0": {
                "deformation": {
                    "kind": "bend",
                    "pivot": _r(stalk_base),
                    "axis": [0.0, 0.0, 1.0],
                    "height": height,
                    "angles": _r(bend),
                },
                "rigid": {
                    "pivot": _r(stalk_base),
                    "rotations": _r(identity),
                    "translations": _r(zeros),
                },
            },
            "obj_2": {
                "deformation": {
                    "kind": "twist",
                    "pivot": _r(block_base),
                    "axis": list(UP),
                    "height": b_ext[1],
                    "angles": _r(twist),
                },
                "rigid": {
                    "pivot": _r(block_base),
                    "rotations": _r(identity),
                    "translations": _r(slide),
                },
            },
        },
    )
    objects = [
        _DemoObject("obj_0", stalk, stalk_tf),
        _DemoObject("obj_1", slab, np.eye(4)),
        _DemoObject("obj_2", block, block_tf),
    ]
    return objects, motion


def _build_slide(frame_num: int) -> tuple[list[_DemoObject], dict]:

    ext = (0.28, 0.36, 0.28)
    image, rects = block_texture()
    subdiv = {f: (6, 8) for f in BOX_FACES}
    block = textured_mesh(box_part(ext, subdiv, rects), image, "block")
    base = np.array([0.0, SLAB_TOP_Y, 0.15])
    block_tf = _yaw_matrix(0.0, base)

    # the wall: a box on the slab behind the block (-z, away from the reference camera at
    # azimuth 60°, so it hides nothing), its +z face SLIDE_CONTACT beyond the block's -z face;
    # one static object with the slab (static_id 1), so one mesh and one checker texture
    wall_ext = (0.70, 0.45, 0.20)  # thicker than twice the overshoot: its depth is the nearer face
    wall_z = base[2] - ext[2] / 2 - SLIDE_CONTACT - wall_ext[2] / 2
    quarter = {f: (0.0, 0.0, 0.5, 0.5) for f in BOX_FACES}
    wall = box_part(wall_ext, {f: (4, 3) for f in BOX_FACES}, quarter)
    wall.vertices = wall.vertices + [base[0], SLAB_TOP_Y, wall_z]
    ground = textured_mesh(join_parts([slab_part(), wall]), checker_texture(), "slab_and_wall")

    s = np.linspace(0.0, 1.0, frame_num)
    # the teacher's slide: eased to SLIDE_CONTACT + SLIDE_OVERSHOOT by s = 0.7, then held; it
    # crosses the contact at s ~ 0.55, so the last 40 % of the frames are inside the wall
    travel = (SLIDE_CONTACT + SLIDE_OVERSHOOT) * _ease(np.minimum(s / 0.7, 1.0))
    trans = np.stack([np.zeros_like(s), np.zeros_like(s), -travel], -1)
    rots = np.tile([1.0, 0.0, 0.0, 0.0], (frame_num, 1))
    motion = _motion_doc(frame_num, {"obj_0": _rigid(base, ext[1], rots, trans)})
    objects = [_DemoObject("obj_0", block, block_tf), _DemoObject("obj_1", ground, np.eye(4))]
    return objects, motion


_BUILDERS: dict[str, Callable[[int], tuple[list[_DemoObject], dict]]] = {
    "hop": _build_hop,
    "sway": _build_sway,
    "slide": _build_slide,
}


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def _export_glb(objects: list[_DemoObject]) -> bytes:
    """GLB bytes of ``objects`` in their world placement (node transforms kept as nodes)."""
    import trimesh

    scene = trimesh.Scene(base_frame="world")
    for obj in objects:
        scene.add_geometry(
            obj.mesh.copy(), node_name=obj.name, geom_name=obj.name, transform=obj.transform
        )
    return bytes(scene.export(file_type="glb"))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
