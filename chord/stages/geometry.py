"""The three geometry stages for one scene in a row: ``ingest``, ``gaussians`` and
``voxelize``, into the results layout. The workflow runs them as separate rules; ``chord
train``, the benchmarks and the tests use this."""

from __future__ import annotations

from pathlib import Path

from chord import paths
from chord.stages import gaussians, ingest, voxelize


def run(
    *,
    data: Path,
    results: Path,
    scene: str,
    method,
    fitted: Path | None = None,
    name: str | None = None,
) -> dict:
    """Outputs go to results/<scene>/...; ``name`` is the scene name recorded in scene.json
    (default ``scene``). Returns {"doc": the scene.json mapping, "plys": {obj: path},
    "voxels": {obj: path}, "stats": {obj: voxelize summary}}."""
    scene_json = paths.scene_json(results, scene)
    doc = ingest.run(
        data=data,
        out_json=scene_json,
        out_meshes=paths.meshes_dir(results, scene),
        method=method,
        scene=name or scene,
    )
    plys, voxels, stats = {}, {}, {}
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided":
            continue
        plys[name] = paths.gaussians_ply(results, scene, name)
        gaussians.run(scene_json=scene_json, obj=name, out=plys[name], method=method, fitted=fitted)
        if o["role"] == "dynamic":
            voxels[name] = paths.voxels_npz(results, scene, name)
            stats[name] = voxelize.run(
                scene_json=scene_json,
                obj=name,
                gaussians=plys[name],
                out=voxels[name],
                method=method,
            )
    return {"doc": doc, "plys": plys, "voxels": voxels, "stats": stats}
