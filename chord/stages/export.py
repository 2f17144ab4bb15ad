"""Stage ``export`` (METHOD §19–§20): the trained scene as videos (reference view, orbit,
four fixed views) at ``export_size``, a GIF preview, the animated ``dynamic_scene.glb`` (morph
targets), ``dynamic_scene_skinned.glb`` (a skin on the control points), a per-frame 3DGS PLY
sequence, ``dynamic_splats.glb`` (the Gaussians, skinned on the same control points),
``dynamic_splats_rigid.glb`` (the Gaussians under nodes keyed with rigid poses), each dynamic
object's rigid pose per frame (``trajectories.npz`` and its ``trajectories.json``) and
the scene as USD (``scene.usda``, its Gaussians in the layer ``splats.usd``)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from chord.config.result_keys import stage_config
from chord.core import media
from chord.export import rigid_motion, sequences, trained_scene, trajectories, usd
from chord.gaussians import gaussian_set, ply
from chord.plan import results_layout
from chord.render import cameras
from chord.render.views import render_frames

logger = logging.getLogger(__name__)

# Pixels per rasterize call (frames x W x H): 4 frames at the default SDS size 832x480, fewer
# (down to one) for a larger export_size, so render memory stays that of the training renders.
RENDER_PIXELS = 4 * 832 * 480


def frames_per_chunk(width: int, height: int) -> int:
    """Frames per rasterize call at W×H: ⌊RENDER_PIXELS/(W·H)⌋, at least 1."""
    return max(1, RENDER_PIXELS // (width * height))


def run(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    voxels: dict[str, Path],
    state_path: Path,
    sources: dict[str, Path],
    method,
    out_ref_view: Path,
    out_orbit: Path,
    out_views: dict[str, Path],
    out_gif: Path,
    out_glb: Path,
    out_skinned_glb: Path,
    out_ply_dir: Path,
    out_splats_glb: Path,
    out_splats_rigid_glb: Path,
    out_trajectories: Path,
    out_trajectories_json: Path,
    out_usd: Path,
    out_usd_splats: Path,
) -> dict:
    """Render and write every export of a trained scene, the videos at ``export_size``
    (default: the SDS ``size``)."""
    method = stage_config(method, "export")  # only the keys it reads
    width, height = trained_scene.export_size(method)
    chunk = frames_per_chunk(width, height)
    doc, scene, ckpt = trained_scene.load_trained(
        scene_json=scene_json,
        plys=plys,
        voxels=voxels,
        state_path=state_path,
        frame_num=method.frame_num,
        sh_degree=method.sh_degree,
    )
    T, fps = trained_scene.scene_frame_num(scene, method), trained_scene.video_fps(method)
    g = trained_scene.scene_frames(scene, T, objects=scene.names)
    K = cameras.intrinsics(width, height, method.fovy)
    bg = cameras.background_for(method.invert_bg_prob)
    target = cameras.scene_target(method, doc)
    elev = (method.elev_l + method.elev_r) / 2.0

    def video(path: Path, viewmats: torch.Tensor) -> np.ndarray:
        images = media.to_uint8(render_frames(g, viewmats, K, width, height, bg, chunk=chunk))
        media.write_mp4(path, images, fps)
        logger.info("%s: %d frames", path, len(images))
        return images

    ref = cameras.method_reference_view(method, target)
    ref_images = video(out_ref_view, ref)
    sequences.write_gif(out_gif, ref_images, fps)
    azim = method.ref_azim + torch.arange(T, dtype=torch.float64) * 360.0 / T
    video(
        out_orbit,
        cameras.orbit_viewmats(torch.full_like(azim, elev), azim, method.cam_radius, target),
    )
    for name, path in out_views.items():
        if name not in results_layout.FIXED_VIEWS:
            raise ValueError(
                f"out_views: {name!r} is not one of {sorted(results_layout.FIXED_VIEWS)}"
            )
        video(
            path,
            cameras.orbit_viewmats(
                elev, results_layout.FIXED_VIEWS[name], method.cam_radius, target
            ),
        )
    sets = {n: ply.read_ply(plys[n], sh_degree_cap=method.sh_degree) for n in scene.names}
    rest = gaussian_set.concat([sets[n] for n in scene.names])
    sequences.write_ply_sequence(out_ply_dir, rest, g["means"], g["quats"])
    kw = {"doc": doc, "scene": scene, "sources": sources, "frames": T, "fps": method.save_fps}
    glb = trained_scene.write_glb(out_glb, **kw)
    skinned = trained_scene.write_glb(out_skinned_glb, skinned=True, **kw)
    splats = trained_scene.write_splats_glb(
        out_splats_glb, doc=doc, scene=scene, gaussians=sets, frames=T, fps=method.save_fps
    )
    splats_rigid = rigid_motion.write_rigid_splats_glb(
        out_splats_rigid_glb, doc=doc, scene=scene, gaussians=sets, frames=T, fps=method.save_fps
    )
    trajectories.write_trajectories(
        out_trajectories, out_trajectories_json, doc=doc, scene=scene, frames=T,
        fps=method.save_fps,
    )  # fmt: skip
    scene_usd = usd.write_usd(
        out_usd, doc=doc, scene=scene, sources=sources, gaussians=sets, frames=T,
        fps=method.save_fps, out_splats=out_usd_splats,
    )  # fmt: skip
    logger.info(
        "%s: iteration %d, %d frames at %dx%d (%d per render), %d fps; GLB with %d morph "
        "targets (%d bytes), skinned GLB on %d joints (%d bytes), splat GLB of %d Gaussians "
        "(%d bytes)",
        doc["scene"],
        ckpt["iteration"],
        T,
        width,
        height,
        chunk,
        fps,
        glb["targets"],
        out_glb.stat().st_size,
        skinned["joints"],
        out_skinned_glb.stat().st_size,
        splats["gaussians"],
        out_splats_glb.stat().st_size,
    )
    return {
        "frames": T,
        "iteration": ckpt["iteration"],
        **glb,
        "skinned": skinned,
        "splats": splats,
        "splats_rigid": splats_rigid,
        "usd": scene_usd,
    }
