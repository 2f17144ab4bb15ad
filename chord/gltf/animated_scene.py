"""What the animated-scene writers share (METHOD §20): the motions they take (a
:data:`Deformer`, a :class:`Skinning`), the checks and empty document they open with, the
animation's key times and channels, and the file's writing. The writers are
:mod:`chord.gltf.morphed` (``dynamic_scene.glb``), :mod:`chord.gltf.skinned`
(``dynamic_scene_skinned.glb``) and :mod:`chord.gltf.splats` (``dynamic_splats.glb``); each
imports this module, none another writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chord.core.errors import InputError
from chord.gltf.container import GltfBuilder

# A deformer maps normalised rest points [n, 3] to their positions [F, n, 3] in frames
# 0..F-1 (frame 0 the rest points themselves).
Deformer = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Skinning:
    """Linear blend skinning by M rigid control-point transforms about fixed centres, in
    normalised scene space (METHOD §5): x_t = Σ_k w_k·[R(q_{k,t})(x − c_k) + c_k + τ_{k,t}].

    Fields:
        centres: c [M, 3].
        rotations: q [F, M, 4], unit quaternions (w, x, y, z); frame 0 the identity.
        translations: τ [F, M, 3]; frame 0 zero.
        bind: normalised rest points [n, 3] -> (joint indices [n, K] into the M centres,
            weights [n, K] ≥ 0 summing to 1 per point).
    """

    centres: np.ndarray
    rotations: np.ndarray
    translations: np.ndarray
    bind: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def open_scene(out_path: Path | str, objects: list, frames: int) -> GltfBuilder:
    """The empty document of a scene of ``objects`` over F = ``frames`` frames, once F ≥ 1
    and there is an object."""
    if frames < 1:
        raise ValueError(f"frames: expected at least 1, got {frames}")
    if not objects:
        raise InputError(f"{out_path}: no objects to export")
    return GltfBuilder()


def key_times(out: GltfBuilder, frames: int, fps: float) -> int:
    """The animation input: key k at k/fps for k = 0..F−1."""
    return out.add_accessor(np.arange(frames, dtype=np.float64) / fps, "SCALAR")


def weights_channels(out: GltfBuilder, nodes: list[int], frames: int, times: int) -> list:
    """(sampler, target) of each morphed node: STEP keys of one-hot weights on target k at key
    k (all zeros at key 0)."""
    onehot = np.zeros((frames, frames - 1))
    onehot[np.arange(1, frames), np.arange(frames - 1)] = 1.0
    w_acc = out.add_accessor(onehot.reshape(-1), "SCALAR")
    sampler = {"input": times, "output": w_acc, "interpolation": "STEP"}
    return [(dict(sampler), {"node": n, "path": "weights"}) for n in nodes]


def joint_channels(out: GltfBuilder, tracks: list, times: int) -> list:
    """(sampler, target) of each joint track (key values, target): LINEAR keys at the key
    times ``times``."""
    channels = []
    for values, target in tracks:
        kind = "VEC3" if target["path"] == "translation" else "VEC4"
        sampler = {"input": times, "interpolation": "LINEAR"}
        sampler["output"] = out.add_accessor(values, kind, bounds=False)
        channels.append((sampler, target))
    return channels


def motion_channels(out: GltfBuilder, tracks: list, morphed: list, frames: int, fps: float):
    """The animation's channels: every joint track's keys, then every morphed node's weights,
    on one key-time accessor (k / fps, k < frames)."""
    times = key_times(out, frames, fps)
    channels = joint_channels(out, tracks, times)
    if morphed:
        channels += weights_channels(out, morphed, frames, times)
    return channels


def write_glb(out: GltfBuilder, out_path: Path | str, roots: list[int], channels: list) -> None:
    """The scene of ``roots``, one animation "motion" of ``channels`` ((sampler, target)
    pairs; none: no animation), written as a GLB."""
    out.doc["scenes"] = [{"nodes": roots}]
    out.doc["scene"] = 0
    if channels:
        anim = {"name": "motion", "samplers": [], "channels": []}
        for sampler, target in channels:
            anim["samplers"].append(sampler)
            anim["channels"].append({"sampler": len(anim["samplers"]) - 1, "target": target})
        out.doc["animations"] = [anim]
    for key in [k for k, v in out.doc.items() if v == []]:
        del out.doc[key]
    out.to_glb(out_path)
