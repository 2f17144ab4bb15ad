"""Stage ``gaussians`` (METHOD §2): one standard 3DGS PLY per non-avoided object, either
surface-initialised from the normalised mesh or imported from the user's fitted 3DGS."""

from __future__ import annotations

import logging
from pathlib import Path

from chord.config.result_keys import stage_config
from chord.gaussians import gaussian_set as gs
from chord.gaussians import ply
from chord.scene import ingestion

logger = logging.getLogger(__name__)


def run(*, scene_json: Path, obj: str, out: Path, method, fitted: Path | None = None) -> None:
    """Write ``out`` for object ``obj``; ``fitted`` is the sheet's ``gaussians`` folder or None."""
    method = stage_config(method, "gaussians")  # only the keys it reads
    doc = ingestion.read_scene_json(scene_json)
    index = int(obj.split("_")[1])
    if fitted is not None:
        path = ply.find_fitted_ply(Path(fitted) / obj)
        g = ply.read_ply(path, sh_degree_cap=method.sh_degree)
        if method.ply_space == "world":
            norm = doc["normalisation"]
            g = gs.to_normalised(g, norm["centre"], norm["scale"])
        logger.info(
            "%s: imported %d Gaussians (SH degree %d) from %s", obj, len(g), g.sh_degree, path
        )
    else:
        parts = ingestion.load_parts(ingestion.mesh_path(scene_json, doc, obj))
        n = method.gs_init_nums.get(obj, method.gs_init_num)
        g = gs.init_from_mesh(parts, n, scale=method.gs_init_scale, seed=index)
        logger.info("%s: %d surface-initialised Gaussians", obj, len(g))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    ply.write_ply(out, g)
