"""Live previews of a training (issue 37): every ``preview_every`` iterations the current
motion, every frame of the run, rendered from the reference camera into a small video,
``<folder>/it_<i>.mp4``, the newest also as ``latest.mp4`` (``chord status`` names it).

A preview reads the motion without gradient and draws nothing from the run's random streams
(the cameras of the reference view are fixed), so a run with previews trains exactly what one
without them does."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from chord.core import media
from chord.core.atomic_files import atomic_path
from chord.render import cameras
from chord.render.views import render_frames

logger = logging.getLogger(__name__)

WIDTH = 256  # pixels; the height follows the SDS size's aspect (even, for H.264)
LATEST = "latest.mp4"
PER_RUN = 10  # preview_every -1: about this many previews per run


def every(preview_every: int, iterations: int) -> int:
    """Iterations between previews: ``preview_every``, or for -1 about :data:`PER_RUN` per
    run (at least 1); 0: none."""
    if preview_every >= 0:
        return preview_every
    return max(iterations // PER_RUN, 1)


def view_keys(method, folder: Path) -> dict:
    """The live previews of a run of ``method`` (the scene's) into ``folder``: the view-only
    keys (folder, every, ref_azim, ref_cam_radius, fps) the training stage takes as its
    ``preview``, read by no training."""
    return {
        "folder": folder,
        "every": every(method.preview_every, method.iterations),
        "ref_azim": method.ref_azim,
        "ref_cam_radius": method.ref_cam_radius,
        "fps": method.save_fps,
    }


def size(width: int, height: int, target: int = WIDTH) -> tuple[int, int]:
    """(w, h) at most ``target`` wide with the aspect of ``width`` x ``height``, both even."""
    w = min(target, width) // 2 * 2
    h = max(round(height * w / width / 2) * 2, 2)
    return max(w, 2), h


class Previews:
    """Previews of ``trainer``'s motion into ``folder``: from ``viewmat`` (world to camera, the
    reference view) with the vertical field of view ``fovy``, on ``background``, at ``fps``."""

    def __init__(self, folder: Path, trainer, *, viewmat, fovy: float, background, fps: int):
        self.folder = Path(folder)
        self.trainer = trainer
        self.w, self.h = size(trainer.width, trainer.height)
        self.K = cameras.intrinsics(self.w, self.h, fovy)
        self.viewmat, self.background, self.fps = viewmat, background, fps
        self.seconds = 0.0  # spent on previews by this process

    def __call__(self, it: int) -> Path:
        """Render iteration ``it``'s motion; returns the video's path."""
        began = time.perf_counter()
        scene = self.trainer.scene
        with torch.no_grad():
            g = scene.frame_gaussians(self.trainer.frames)
        images = render_frames(
            g,
            self.viewmat.to(scene.means.device),
            self.K,
            self.w,
            self.h,
            self.background,
            chunk=len(self.trainer.frames),
            backend=self.trainer.backend,
        )
        path = self.folder / f"it_{it:06d}.mp4"
        self.folder.mkdir(parents=True, exist_ok=True)
        media.write_mp4(path, images, self.fps)
        with atomic_path(self.folder / LATEST, suffix=".mp4") as tmp:
            shutil.copyfile(path, tmp)
        self.seconds += time.perf_counter() - began
        logger.info("preview of iteration %d: %s (%.1f s)", it, path, time.perf_counter() - began)
        return path


def attach(watch, trainer, preview: dict) -> None:
    """Previews of ``trainer``'s motion from the reference camera on ``watch`` (rank 0's
    :class:`chord.training.progress.Progress`) every ``preview["every"]`` iterations
    (``preview``: :func:`view_keys`). A preview is for watching: without an MP4 encoder the run
    goes on without (a warning)."""
    off = media.mp4_unavailable_reason()
    if off is not None:
        logger.warning("live previews off: %s", off)
        return
    method = trainer.method
    view = cameras.reference_view(
        method.elev_l, method.elev_r, preview["ref_azim"], preview["ref_cam_radius"], trainer.target
    )
    watch.render_preview = Previews(
        preview["folder"],
        trainer,
        viewmat=view,
        fovy=method.fovy,
        background=cameras.background_for(method.invert_bg_prob),
        fps=preview["fps"],
    )
    watch.preview_every = preview["every"]
