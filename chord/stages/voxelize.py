"""Stage ``voxelize`` (METHOD §3–§4): solid and surface voxel sets and pruned control points
for one dynamic object."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import trimesh

from chord.config.result_keys import stage_config
from chord.core.atomic_files import atomic_path
from chord.core.errors import InputError
from chord.gaussians import ply
from chord.motion import control_points
from chord.motion import voxels as vx
from chord.scene import ingestion

logger = logging.getLogger(__name__)


def run(*, scene_json: Path, obj: str, gaussians: Path, out: Path, method) -> dict:
    """Write ``out`` (npz: solid, surface, control_points, voxel_size, surface_voxel_size)."""
    method = stage_config(method, "voxelize")  # only the keys it reads
    doc = ingestion.read_scene_json(scene_json)
    entry = next(o for o in doc["objects"] if o["name"] == obj)
    if entry["role"] != "dynamic":
        raise InputError(f"{scene_json}: {obj} is {entry['role']}; only dynamic objects voxelize")
    index = entry["id"]
    parts = ingestion.load_parts(ingestion.mesh_path(scene_json, doc, obj))
    mesh = trimesh.util.concatenate(
        [trimesh.Trimesh(p.vertices, p.faces, process=False) for p in parts]
    )

    v_solid = method.init_voxel_size * entry["scale_factor"]
    solid = vx.solid_voxels(mesh, v_solid)
    surface, v_surface = vx.bisect_surface_voxel_size(
        mesh, v_solid, method.surface_target_num, br_range=method.br_range
    )
    cp_num = method.cp_nums[index] if index < len(method.cp_nums) else method.cp_num
    if obj in method.cp_surface_only_objs:
        centres = control_points.surface_control_points(mesh, cp_num, seed=index)
    else:
        centres = control_points.place_control_points(solid, cp_num)
    means = ply.read_ply(gaussians).means
    keep = control_points.prune_control_points(centres, means, surface, method.n_cp_num)
    where = f"{scene_json.parent.parent.name}/{obj}"
    control_points.check_control_point_count(int(keep.sum()), obj=where)
    centres = centres[keep]
    logger.info(
        "%s: %d solid voxels at %.5f, %d surface voxels at %.5f, %d/%d control points kept",
        obj,
        len(solid),
        v_solid,
        len(surface),
        v_surface,
        len(centres),
        len(keep),
    )
    arrays = {
        "solid": solid.astype(np.float32),
        "surface": surface.astype(np.float32),
        "control_points": centres.astype(np.float32),
        "voxel_size": np.float64(v_solid),
        "surface_voxel_size": np.float64(v_surface),
    }
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return {k: (len(v) if np.ndim(v) else float(v)) for k, v in arrays.items()}
