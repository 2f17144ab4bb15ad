"""Stage ``ingest`` (METHOD §1): scene.glb + obj_<i>.glb -> scene.json and normalised meshes."""

from __future__ import annotations

import logging
from pathlib import Path

import trimesh

from chord.config import settings as cfg
from chord.config.result_keys import stage_config
from chord.core.atomic_files import atomic_dir, write_json
from chord.scene import ingestion

logger = logging.getLogger(__name__)


def run(
    *, data: Path, out_json: Path, out_meshes: Path, method, scene: str, mem_mb: int | None = None
) -> dict:
    """Read the scene folder ``data``; write ``out_json`` and ``out_meshes/obj_<i>.glb``.

    Every file is read through :func:`chord.gltf.reader.read` (compressed, quantised,
    instanced or KTX2-textured glTF made plain); what cannot be read is an input error naming
    the file, and what is read but not rendered (material extensions) a warning, in the log
    and in scene.json. A file whose estimated peak memory exceeds ``mem_mb`` (the job's
    resources.mem_mb; default ``$CHORD_MEM_MB``, else the rule's) is refused, naming the
    figure. Every file is read before anything is written: a refused scene leaves nothing.
    Avoided objects are recorded but get no mesh. Returns the scene.json mapping.
    """
    method = stage_config(method, "ingest")  # only the keys it reads
    data = Path(data)
    paths = ingestion.discover_objects(data, method.obj_num)
    roles = cfg.scene_roles(method, len(paths))
    scene_path = ingestion.scene_file(data)
    scene_source, scene_parts = ingestion.load_source(scene_path, mem_mb)
    centre, scale = ingestion.normalisation(ingestion.bounds_of(scene_parts), scene_path)
    logger.info("%s: %d objects, centre %s, scale %.6g", scene, len(paths), centre, scale)
    warnings = list(scene_source.warnings)

    objects, meshes, read = [], {}, {}
    for i, path in enumerate(paths):
        name = f"obj_{i}"
        source, parts = ingestion.load_source(path, mem_mb)
        parts = ingestion.normalise_parts(parts, centre, scale)
        warnings.extend(source.warnings)
        read[name] = {"extensions": list(source.decoded), "warnings": list(source.warnings)}
        bounds = ingestion.bounds_of(parts)
        info = ingestion.ObjectInfo(
            name=name,
            index=i,
            role=roles[name],
            source=str(path),
            scale_factor=ingestion.object_scale_factor(bounds),
            bounds=bounds.tolist(),
            n_vertices=int(sum(len(p.vertices) for p in parts)),
            n_faces=int(sum(len(p.faces) for p in parts)),
        )
        objects.append(info)
        if info.role != "avoided":
            meshes[name] = parts
        logger.info(
            "%s: %s, %d faces, s_obj %.4f", name, info.role, info.n_faces, info.scale_factor
        )

    for message in warnings:
        logger.warning("%s", message)
    static = objects[method.static_id]
    ground = method.ground_level if method.ground_level is not None else static.bounds[0][1]
    doc = {
        "format": ingestion.SCENE_FORMAT,
        "scene": scene,
        "source": str(data),
        "normalisation": {"centre": [float(c) for c in centre], "scale": float(scale)},
        "static_id": method.static_id,
        "ground_level": float(ground),
        "objects": [
            {**o.to_json(f"meshes/{o.name}.glb" if o.name in meshes else None), **read[o.name]}
            for o in objects
        ],
        "warnings": warnings,
    }
    with atomic_dir(out_meshes) as tmp:
        for name, parts in meshes.items():
            trimesh.Scene(parts).export(Path(tmp) / f"{name}.glb", file_type="glb")
    write_json(out_json, doc)
    return doc
