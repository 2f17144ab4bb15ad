"""A scene's :class:`~chord.training.trainer.Trainer` from the files of the stages before the
training (METHOD §7): scene.json, the objects' Gaussians (PLY) and voxels, the text condition,
and the teacher the guidance config names (the oracle, or Wan)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import trimesh

from chord.config import settings
from chord.gaussians import ply
from chord.guidance import oracle
from chord.guidance import text as text_cond
from chord.motion.model import build_scene
from chord.render import cameras
from chord.render.backend import resolve_backend
from chord.scene import ingestion
from chord.training.distributed import Group
from chord.training.trainer import Trainer


def build(
    *,
    scene_json: Path,
    plys: dict,
    voxels: dict,
    text_path: Path | None,
    data_dir: Path,
    method,
    guidance,
    memory=None,
    seed: int = 0,
    group: Group | None = None,
    device="cpu",
    render_backend: str = "auto",
) -> Trainer:
    """The Trainer of one scene from its stage outputs, with the memory flags ``memory`` (a
    MemoryConfig; None: the defaults); ``render_backend`` is resolved for ``device`` first (an
    error before anything loads when it cannot run)."""
    memory = memory or settings.memory_from_mapping({})
    backend = resolve_backend(render_backend, device)
    doc = ingestion.read_scene_json(scene_json)
    names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
    gsets = {n: ply.read_ply(plys[n], sh_degree_cap=method.sh_degree) for n in names}
    vox = {}
    for name, path in voxels.items():
        with np.load(path) as z:
            vox[name] = {k: z[k] for k in z.files}
    scene = build_scene(doc, gsets, vox, method, device=device)
    width, height = settings.parse_size(method.size, where="method: size")
    target = tuple(cameras.scene_target(method, doc))
    if guidance.backend == "oracle":
        teacher = oracle.for_scene(
            doc, gsets, data_dir, method, guidance, width, height, device, backend
        )
        text = None
    else:
        from chord.guidance import wan

        teacher = wan.from_config(guidance, method, memory, device=device)
        text = text_cond.read(text_path)[0]
    meshes = {  # the second layer's voxels are planned in each one
        name: trimesh.Trimesh(*ingestion.object_mesh(scene_json, doc, name), process=False)
        for name in method.add_cp_objs
    }
    ground = method.ground_level if method.ground_level is not None else doc["ground_level"]
    grid, points = None, {}
    static = [o["name"] for o in doc["objects"] if o["role"] == "static"]
    if (method.lambda_contact > 0 or method.lambda_support > 0) and static and scene.dynamic:
        from chord.motion import contact

        grid = contact.signed_distance_grid(
            [ingestion.object_mesh(scene_json, doc, n) for n in static]
        )
        ids = {o["name"]: o["id"] for o in doc["objects"]}
        points = {  # the evaluation's samples (seeded by the object's id): the metric's points
            n: contact.surface_samples(
                *ingestion.object_mesh(scene_json, doc, n), contact.CONTACT_SAMPLES, ids[n]
            )
            for n in scene.dynamic
        }
    return Trainer(
        scene=scene,
        guidance=teacher,
        text=text,
        method=method,
        width=width,
        height=height,
        target=target,
        memory=memory,
        seed=seed,
        group=group or Group(device=device),
        ground_level=ground,
        meshes=meshes,
        surface_voxel_size={n: float(v["surface_voxel_size"]) for n, v in vox.items()},
        backend=backend,
        contact_grid=grid,
        contact_points=points,
    )
