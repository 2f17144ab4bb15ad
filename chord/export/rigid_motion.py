"""The rigid part of a trained scene's motion as node animation (issue 40): each dynamic
object's rigid poses (:mod:`chord.export.trajectories`, the fit of ``trajectories.npz``) about
the centre of its Gaussians, written with the Gaussians as ``dynamic_splats_rigid.glb``
(:mod:`chord.gltf.rigid_splats`), which any ``KHR_gaussian_splatting`` viewer plays, and how
much of each object's motion those poses leave out."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.export import trajectories
from chord.gltf import rigid_splats

logger = logging.getLogger(__name__)


def write_rigid_splats_glb(
    out: Path, *, doc: dict, scene, gaussians: dict, frames: int, fps: float
) -> dict:
    """``dynamic_splats_rigid.glb``: the Gaussians ``gaussians`` {name: GaussianSet,
    normalised} of every non-avoided object, each under a node at the centre of its Gaussians'
    bounding box, a dynamic object's node keyed with the rigid poses of its control points
    (the fit of ``trajectories.npz``, same rotations, with the body origin at that centre).

    Logs and returns, per dynamic object, what the rigid poses leave out of its motion: the
    fit's largest residual (RMS over the control points) in the input's units and relative to
    the object's size (its Gaussians' longest extent). Returns the writer's summary with
    ``residual_relative`` {name: fraction} added."""
    c, s = doc["normalisation"]["centre"], doc["normalisation"]["scale"]
    objects, relative = [], {}
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided":
            continue
        if name not in gaussians:
            raise InputError(f"{out}: no Gaussians given for {name}")
        motion = None
        if name in scene.dynamic:
            m = gaussians[name].means.astype(np.float64)
            lo, hi = m.min(0), m.max(0)
            poses = trajectories.object_poses(scene.dynamic[name], frames, (lo + hi) / 2.0)
            size = float((hi - lo).max())
            relative[name] = float(poses.residual.max()) / size if size > 0 else 0.0
            motion = trajectories.to_original(poses, c, s)
        objects.append((name, gaussians[name], motion))
    summary = rigid_splats.rigid_splats_glb(out, objects, centre=c, scale=s, frames=frames, fps=fps)
    summary["residual_relative"] = relative
    left_out = ", ".join(
        f"{n} {summary['residual_max'][n]:.4g} ({100.0 * r:.2f}% of its size)"
        for n, r in relative.items()
    )
    logger.info(
        "%s: %d Gaussians in %d objects, %d animated by their nodes (rigid poses, %d keys at "
        "%g fps); the motion a rigid pose leaves out (largest residual, input units): %s",
        out,
        summary["gaussians"],
        len(objects),
        summary["animated"],
        frames,
        fps,
        left_out or "none",
    )
    return summary
