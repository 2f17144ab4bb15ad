"""Stage ``reference`` (METHOD §8, §19): the static scene from the reference camera at the
SDS size (``ref.png``), and a full orbit of it (``static_orbit.mp4``) for judging prompts."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from chord.config import settings
from chord.config.result_keys import stage_config
from chord.core import media
from chord.core.errors import InputError
from chord.gaussians import gaussian_set, ply
from chord.render import cameras
from chord.render.rasterizer import splat_tensors
from chord.render.views import render_views
from chord.scene import ingestion

logger = logging.getLogger(__name__)

ORBIT_VIEWS = 50  # METHOD §19's orbit videos: 50 azimuths over 360° at 20 fps
ORBIT_FPS = 20


def scene_splats(scene_json: Path, plys: dict[str, Path], *, dtype=torch.float32) -> dict:
    """Every non-avoided object's Gaussians at rest, concatenated, as render tensors."""
    doc = ingestion.read_scene_json(scene_json)
    names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
    missing = sorted(set(names) - set(plys))
    if missing:
        raise InputError(f"{scene_json}: no Gaussians given for {missing}")
    return splat_tensors(gaussian_set.concat([ply.read_ply(plys[n]) for n in names]), dtype=dtype)


def run(*, scene_json: Path, plys: dict[str, Path], out_png: Path, out_orbit: Path, method) -> None:
    method = stage_config(method, "reference")  # only the keys it reads
    width, height = settings.parse_size(method.size, where="method: size")
    doc = ingestion.read_scene_json(scene_json)
    splats = scene_splats(scene_json, plys)
    target = cameras.scene_target(method, doc)
    K = cameras.intrinsics(width, height, method.fovy)
    ref = cameras.method_reference_view(method, target)
    image = render_views(splats, ref[None], K, width, height)[0]
    media.write_png(out_png, image)
    azim = method.ref_azim + torch.arange(ORBIT_VIEWS, dtype=torch.float64) * 360.0 / ORBIT_VIEWS
    elev = torch.full_like(azim, (method.elev_l + method.elev_r) / 2.0)
    views = cameras.orbit_viewmats(elev, azim, method.cam_radius, target)
    frames = render_views(splats, views, K, width, height)
    media.write_mp4(out_orbit, frames, ORBIT_FPS)
    logger.info(
        "%s: %d Gaussians, ref.png %dx%d, %d-view orbit",
        doc["scene"],
        len(splats["means"]),
        width,
        height,
        ORBIT_VIEWS,
    )
