"""The interaction of a trained scene's objects (docs/outputs.md, "Interaction checks"): per
frame and ordered pair, how deep each dynamic object's surface samples pass into another
object's mesh and the gap between objects resting on each other, the samples moved by the
trained deformation or by another motion (the scripted one:
:func:`chord.evaluation.scripted_motion.mover`)."""

from __future__ import annotations

from pathlib import Path

from chord.evaluation import metrics
from chord.export import trained_scene
from chord.scene import ingestion

# Surface samples per dynamic object, and the frame-0 distance (scene units) under which two
# objects rest on each other: 0.005 is about 1.3 pixels at the default reference camera and SDS
# size (radius 2, fovy 49.1°, 480 rows: 0.0038 units per pixel), so objects that look in
# contact count as resting.
INTERACTION_SAMPLES = 2048
REST_TOLERANCE = 0.005


def pairs(scene_json: Path, doc: dict, scene, frames: int, samples: int, move=None) -> list[dict]:
    """Per-frame :func:`chord.evaluation.metrics.pair_interaction` of every dynamic object's
    surface samples (``samples`` per object, area-uniform on its normalised mesh, seeded by its
    index, moved by its trained deformation) against every other non-avoided object's mesh (its
    vertices deformed per frame when it is dynamic, as the export's GLB moves them). One record
    per ordered pair (object, other), in scene order. ``move(name, points [n, 3])`` -> [T, n, 3]
    replaces the trained deformation (e.g. :func:`chord.evaluation.scripted_motion.mover`)."""
    if move is None:

        def move(name, points):
            return trained_scene.deformer(scene.dynamic[name], frames)(points)

    meshes = {name: ingestion.object_mesh(scene_json, doc, name) for name in scene.names}
    moved = {n: move(n, V) if n in scene.dynamic else V for n, (V, _) in meshes.items()}
    index = {o["name"]: o["id"] for o in doc["objects"]}
    records = []
    for name in scene.dynamic:
        S = metrics.surface_samples(*meshes[name], samples, seed=index[name])  # [S, 3]
        P = move(name, S)  # [T, S, 3]
        for other in scene.names:
            if other != name:
                r = metrics.pair_interaction(P, moved[other], meshes[other][1])
                records.append({"object": name, "other": other, **r})
    return records
