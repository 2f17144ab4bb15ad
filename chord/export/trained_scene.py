"""A trained scene: its motion loaded from a training state onto the stage files (scene.json,
Gaussians, voxels), sampled per frame, and written as the animated GLBs (morph targets, or a
skin on the control points) and the animated Gaussians' GLB (``dynamic_splats.glb``). The
export and evaluate stages and the run-folder commands (:mod:`chord.cli.upstream_train`) share
it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch

from chord.config import settings
from chord.core.errors import InputError
from chord.gaussians import ply
from chord.gltf import splats
from chord.gltf.animated_scene import Deformer, Skinning
from chord.gltf.morphed import dynamic_scene_glb
from chord.gltf.skinned import dynamic_scene_skinned_glb
from chord.motion import state
from chord.motion.model import build_scene
from chord.scene import ingestion
from chord.training import checkpoint

logger = logging.getLogger(__name__)


def video_fps(method) -> int:
    """METHOD §19: videos play at ``save_fps``, or 24 when T > 41."""
    return 24 if method.frame_num > 41 else method.save_fps


def export_size(method) -> tuple[int, int]:
    """(W, H) of the export's videos: ``export_size`` ("W*H", each even for H.264), or the
    SDS ``size`` when it is null."""
    if method.export_size is None:
        return settings.parse_size(method.size, where="method: size")
    match = re.fullmatch(r"(\d+)[*x](\d+)", str(method.export_size))
    w, h = (int(match[1]), int(match[2])) if match else (0, 0)
    if not w or not h or w % 2 or h % 2:
        raise settings.ConfigError(
            f"method: export_size: {method.export_size!r}: expected 'W*H' with W and H positive "
            "and even (H.264), e.g. '1664*960', or null for the SDS size"
        )
    return w, h


def frame_count(frame_num: int, lst_frame: int | None) -> int:
    """F = min(T, lst_frame) (METHOD §20); lst_frame None or −1 means T."""
    if lst_frame is None or lst_frame == -1:
        return frame_num
    if lst_frame < 1:
        raise InputError(
            f"--lst_frame: expected a frame count ≥ 1 (or -1 for all), got {lst_frame}"
        )
    return min(frame_num, lst_frame)


def load_trained(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    voxels: dict[str, Path],
    state_path: Path,
    frame_num: int | None = None,
    sh_degree: int = 3,
) -> tuple[dict, object, dict]:
    """(scene.json mapping, :class:`~chord.motion.model.MotionScene` with the trained motion, the
    checkpoint dict) from the stage files of one scene and a training state. The motion's
    shape (frames, neighbours) comes from the state; ``frame_num`` only matters for a scene
    without dynamic objects (default: the method default)."""
    doc = ingestion.read_scene_json(scene_json)
    ckpt = checkpoint.load_checkpoint(state_path)
    meta = ckpt["motion_meta"]
    names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
    dynamic = [o["name"] for o in doc["objects"] if o["role"] == "dynamic"]
    missing = sorted(set(names) - set(plys)) + sorted(set(dynamic) - set(voxels))
    if missing:
        raise InputError(f"{scene_json}: no Gaussians or voxels given for {missing}")
    infos = list(meta["objects"].values())
    shape = {} if frame_num is None else {"frame_num": frame_num}
    if infos:
        shape = {k: infos[0][k] for k in ("frame_num", "n_cp_num", "arap_sample_num")}
    shape = settings.method_from_mapping(shape, where=str(state_path))
    gsets = {n: ply.read_ply(plys[n], sh_degree_cap=sh_degree) for n in names}
    vox = {}
    for name in dynamic:
        with np.load(voxels[name]) as z:
            vox[name] = {k: z[k] for k in ("control_points", "surface")}
    scene = build_scene(doc, gsets, vox, shape)
    state.restore(scene, ckpt["motion"], meta, where=str(state_path))
    return doc, scene, ckpt


def deformer(obj, frames: int) -> Deformer:
    """Normalised rest points [n, 3] -> positions [F, n, 3] under ``obj``'s trained motion."""

    def apply(points: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(points, dtype=obj.rest_means.dtype)
        with torch.no_grad():
            X, _ = obj.deform(torch.arange(frames), x, with_rotations=False)
        return X.double().numpy()

    return apply


def skinning(obj, frames: int) -> Skinning:
    """``obj``'s first control-point layer as glTF skinning data (METHOD §5): its centres,
    the transforms of frames 0..F−1 (frame 0 pinned to the identity, as ``deform`` pins it)
    and the binding of rest points to their K neighbours with the sg weights. Exact for an
    object without a second layer (``deform`` is then this LBS)."""
    layer = obj.layer1
    with torch.no_grad():
        q, tau = layer.transforms(torch.arange(frames, device=layer.centres.device))
    q, tau = q.double().cpu().numpy(), tau.double().cpu().numpy()  # [F, M, 4], [F, M, 3]
    q[0], tau[0] = (1.0, 0.0, 0.0, 0.0), 0.0

    def bind(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = torch.as_tensor(points, dtype=layer.centres.dtype, device=layer.centres.device)
        with torch.no_grad():
            idx = layer.neighbours(x)  # [n, K]
            w = layer.weights(x, idx, detach=True)  # [n, K]
        return idx.cpu().numpy(), w.double().cpu().numpy()

    return Skinning(layer.centres.double().cpu().numpy(), q, tau, bind)


def splat_motion(obj, frames: int) -> Skinning | splats.SplatDeformer:
    """The motion of ``obj``'s Gaussians in ``dynamic_splats.glb``: its first layer's
    :func:`skinning` (exact without a second layer), else its Gaussians' positions and
    rotations of frames 0..F−1 from ``deform`` (the PLY sequence's values)."""
    if obj.layer2 is None:
        return skinning(obj, frames)

    def apply() -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            X, Q = obj.deform(torch.arange(frames, device=obj.rest_means.device))
        return X.double().cpu().numpy(), Q.double().cpu().numpy()

    return apply


def write_splats_glb(
    out: Path, *, doc: dict, scene, gaussians: dict, frames: int, fps: float
) -> dict:
    """``dynamic_splats.glb``: the Gaussians ``gaussians`` {name: GaussianSet, normalised} of
    every non-avoided object, static ones unanimated, dynamic ones skinned on their
    first-layer control points (the keys of ``dynamic_scene_skinned.glb``), an object with a
    second layer morphed per frame."""
    objects = []
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided":
            continue
        if name not in gaussians:
            raise InputError(f"{out}: no Gaussians given for {name}")
        dyn = scene.dynamic[name] if name in scene.dynamic else None
        if dyn is not None and dyn.layer2 is not None:
            logger.info(
                "%s: %s has a second control-point layer, a composition one skin cannot "
                "express: its splats keep morph targets",
                out,
                name,
            )
        motion = None if dyn is None else splat_motion(dyn, frames)
        objects.append((name, gaussians[name], motion))
    c, s = doc["normalisation"]["centre"], doc["normalisation"]["scale"]
    summary = splats.dynamic_splats_glb(out, objects, centre=c, scale=s, frames=frames, fps=fps)
    logger.info(
        "%s: %d Gaussians (SH degree %d) in %d objects, %d skinned on %d joints, %d morphed "
        "(%d targets), %d keys at %g fps",
        out,
        summary["gaussians"],
        summary["sh_degree"],
        len(objects),
        summary["skinned"],
        summary["joints"],
        summary["morphed"],
        summary["targets"],
        frames,
        fps,
    )
    return summary


def check_objects(doc: dict, names, flag: str) -> list[str]:
    """``names`` as a list, each an object of the scene (else a ValueError naming ``flag``)."""
    known = [o["name"] for o in doc["objects"]]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise InputError(f"{flag}: {unknown} are not objects of this scene {known}")
    return list(names)


def write_glb(
    out: Path,
    *,
    doc: dict,
    scene,
    sources: dict[str, Path],
    frames: int,
    fps: float,
    exclude_objs=(),
    static_objs=(),
    skinned: bool = False,
) -> dict:
    """``dynamic_scene.glb`` (morph targets) or, with ``skinned``,
    ``dynamic_scene_skinned.glb`` (one skin per dynamic object on its first-layer control
    points; an object with a second layer keeps morph targets) of every non-avoided,
    non-excluded object (source GLBs ``sources``); static objects (and ``static_objs``) are
    copied unanimated."""
    exclude = set(check_objects(doc, exclude_objs, "exclude_objs"))
    frozen = set(check_objects(doc, static_objs, "static_objs"))
    objects = []
    for o in doc["objects"]:
        name = o["name"]
        if o["role"] == "avoided" or name in exclude:
            continue
        if name not in sources:
            raise InputError(f"no source GLB given for {name}")
        motion = None
        if name in scene.dynamic and name not in frozen:
            obj = scene.dynamic[name]
            motion = deformer(obj, frames)
            if skinned and obj.layer2 is None:
                motion = skinning(obj, frames)
            elif skinned:
                logger.info(
                    "%s: %s has a second control-point layer, a composition one skin cannot "
                    "express: it keeps morph targets",
                    out,
                    name,
                )
        objects.append((name, sources[name], motion))
    c, s = doc["normalisation"]["centre"], doc["normalisation"]["scale"]
    if not skinned:
        summary = dynamic_scene_glb(out, objects, centre=c, scale=s, frames=frames, fps=fps)
        logger.info(
            "%s: %d objects, %d animated nodes, %d morph targets at %g fps",
            out,
            len(objects),
            summary["nodes"],
            summary["targets"],
            fps,
        )
        return summary
    summary = dynamic_scene_skinned_glb(out, objects, centre=c, scale=s, frames=frames, fps=fps)
    logger.info(
        "%s: %d objects, %d skinned nodes on %d joints, %d morphed nodes (%d targets), %d "
        "keys at %g fps",
        out,
        len(objects),
        summary["skinned"],
        summary["joints"],
        summary["morphed"],
        summary["targets"],
        frames,
        fps,
    )
    return summary


def scene_frames(scene, frames: int, *, objects: list[str], static_objs=()) -> dict:
    """Per-frame Gaussians of ``objects`` (``static_objs`` held at rest) over frames 0..F−1."""
    with torch.no_grad():
        g = scene.frame_gaussians(torch.arange(frames), objects=objects)
    start = 0
    for name in objects:  # frame_gaussians concatenates ``objects`` in the given order
        n = scene.slices[name].stop - scene.slices[name].start
        if name in static_objs:
            g["means"][:, start : start + n] = scene.means[scene.slices[name]]
            g["quats"][:, start : start + n] = scene.quats[scene.slices[name]]
        start += n
    return g


def scene_frame_num(scene, method) -> int:
    """T of the trained motion (the method's frame_num when nothing moves)."""
    objs = list(scene.dynamic.values())
    return objs[0].frame_num if objs else method.frame_num
