"""Run by a Python that has Blender's module (bpy), not by pytest (tests/unit/gltf/test_skinned.py
starts it): import a GLB with Blender's own glTF importer at its default options (so "Guess
Original Bind Pose" on) and save the world vertex positions of every skinned mesh object, in
glTF's axes (Y up), at frames 0..F−1.

    python blender_import.py GLB FPS FRAMES OUT.npz

The scene's frame rate is set to the file's (an integer) before the import, so that the key at
k/fps lands on frame k; the importer's own options are not touched."""

import sys

import bpy
import numpy as np


def main(glb: str, fps: int, frames: int, out: str) -> None:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.render.fps, scene.render.fps_base = fps, 1.0
    bpy.ops.import_scene.gltf(filepath=glb)
    skinned = [
        o
        for o in scene.objects
        if o.type == "MESH" and any(m.type == "ARMATURE" for m in o.modifiers)
    ]
    positions: dict[str, list[np.ndarray]] = {o.name: [] for o in skinned}
    for k in range(frames):
        scene.frame_set(k)
        depsgraph = bpy.context.evaluated_depsgraph_get()
        for o in skinned:
            evaluated = o.evaluated_get(depsgraph)
            mesh = evaluated.to_mesh()
            co = np.empty(3 * len(mesh.vertices))
            mesh.vertices.foreach_get("co", co)
            M = np.array(evaluated.matrix_world)
            w = co.reshape(-1, 3) @ M[:3, :3].T + M[:3, 3]  # Blender's world, Z up
            positions[o.name].append(np.stack([w[:, 0], w[:, 2], -w[:, 1]], 1))  # glTF's
            evaluated.to_mesh_clear()
    np.savez(out, **{name: np.stack(p) for name, p in positions.items()})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
