"""A scene's scripted motion (``motion.json``, what the oracle teacher renders) as the evaluation
measures a training against it: its objects' surface points moved (the interaction it causes by
itself) and its dynamic Gaussians' means (the ground truth of the recovery error)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from chord.motion import scripted


def mover(doc: dict, motion_json: Path, frames: int):
    """``move`` of :func:`chord.evaluation.interaction.pairs` for the scripted motion
    (motion.json, in world space, as the oracle teacher renders it): normalised rest points
    [n, 3] -> [T, n, 3]."""
    motion = scripted.load_motion(motion_json)
    c = np.asarray(doc["normalisation"]["centre"], dtype=np.float64)
    s = float(doc["normalisation"]["scale"])

    def move(name, points):
        spec = motion["objects"].get(name)
        if spec is None:  # unscripted: at rest
            return np.broadcast_to(points, (frames, *np.shape(points)))
        world = np.asarray(points, dtype=np.float64) / s + c
        return np.stack([(scripted.apply_motion(world, spec, t) - c) * s for t in range(frames)])

    return move


def means(doc: dict, scene, motion_json: Path, frames: int) -> torch.Tensor:
    """Ground-truth means [T, N_dyn, 3] of the dynamic Gaussians under motion.json."""
    from chord.guidance.oracle import scripted_gaussians

    motion = scripted.load_motion(motion_json)
    rest = {n: {"means": o.rest_means, "quats": o.rest_quats} for n, o in scene.dynamic.items()}
    return scripted_gaussians(doc, rest, motion, frames)[0]
