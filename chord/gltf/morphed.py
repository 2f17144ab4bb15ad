"""``dynamic_scene.glb`` (METHOD §20): the scene's glTF with each mesh node of a dynamic object
given one morph target per frame k ≥ 1 and a STEP animation of its weights. The sources' merge
and morph targets are :mod:`chord.gltf.mesh_scene`'s, the animation and the writing
:mod:`chord.gltf.animated_scene`'s."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chord.gltf.animated_scene import Deformer, motion_channels, open_scene, write_glb
from chord.gltf.mesh_scene import merged_objects, morph_object, set_view_targets


def dynamic_scene_glb(
    out_path: Path | str,
    objects: list[tuple[str, Path, Deformer | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """METHOD §20: write the animated glTF of a scene.

    Args:
        objects: (name, source GLB, deformer or None for an unanimated object) in id order;
            excluded objects are simply not listed.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F = min(T, lst_frame) frames; frame k ≥ 1 is morph target k.
        fps: key k sits at k/fps; STEP interpolation.

    Returns a summary: {"nodes": animated node count, "targets": F − 1, "frames": F}.
    """
    out = open_scene(out_path, objects, frames)
    c = np.asarray(centre, dtype=np.float64)
    roots: list[int] = []
    animated: list[int] = []
    for obj in merged_objects(out, objects, frames, roots):
        animated += morph_object(out, obj, c, scale, frames)
    set_view_targets(out.doc)
    channels = motion_channels(out, [], animated, frames, fps) if animated else []
    write_glb(out, out_path, roots, channels)
    return {"nodes": len(animated), "targets": frames - 1 if animated else 0, "frames": frames}
