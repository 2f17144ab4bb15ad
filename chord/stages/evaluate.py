"""Stage ``evaluate``: the metrics of a trained scene (``metrics.json``, defined in the
README's "Outputs and metrics"), its loss curves, the frame-0 comparison with ref.png and the
per-frame interaction of its objects (interpenetration, floating)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import trimesh
from PIL import Image

from chord.config import settings
from chord.config.result_keys import stage_config
from chord.core import media
from chord.core.atomic_files import write_json
from chord.core.errors import InputError
from chord.evaluation import metrics, metrics_file, plots
from chord.export import trained_scene
from chord.motion import regularisers, scripted
from chord.render import cameras
from chord.scene import ingestion as sc

logger = logging.getLogger(__name__)

PSNR_WARN = 40.0  # dB: below this, frame 0 does not reproduce the reference render
# Interaction checks (README "Outputs and metrics"): surface samples per dynamic object, and
# the frame-0 distance (scene units) under which two objects rest on each other: 0.005 is
# about 1.3 pixels at the default reference camera and SDS size (radius 2, fovy 49.1°, 480
# rows: 0.0038 units per pixel), so objects that look in contact count as resting.
INTERACTION_SAMPLES = 2048
REST_TOLERANCE = 0.005


def _clean(value):
    """NaN -> None (JSON null); floats rounded to 9 significant digits."""
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def read_png(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except OSError as exc:
        raise InputError(f"{path}: unreadable image ({exc})") from exc


def rigidity(scene, frames: int) -> list[float]:
    """Per-frame ARAP residual of every dynamic object's surface voxels together."""
    Xs, nbrs, masks, offset = [], [], [], 0
    with torch.no_grad():
        for obj in scene.dynamic.values():
            X, _ = obj.deform(torch.arange(frames), "surface", with_rotations=False)
            nbr, mask = regularisers.arap_connectivity(obj.surface)
            Xs.append(X)
            nbrs.append(nbr + offset)
            masks.append(mask)
            offset += X.shape[1]
    if not Xs:
        return [0.0] * frames
    k = max(n.shape[1] for n in nbrs)  # objects with fewer voxels have fewer neighbours
    nbr = torch.cat([torch.nn.functional.pad(n, (0, k - n.shape[1])) for n in nbrs])
    mask = torch.cat([torch.nn.functional.pad(m, (0, k - m.shape[1])) for m in masks])
    return metrics.arap_residual(torch.cat(Xs, 1), nbr, mask)


def object_mesh(scene_json: Path, doc: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """An object's normalised mesh from the ingest stage, its parts as one triangle soup:
    vertices [V, 3] (float64) and faces [F, 3]."""
    parts = sc.load_parts(sc.mesh_path(scene_json, doc, name))
    mesh = trimesh.util.concatenate(
        [trimesh.Trimesh(p.vertices, p.faces, process=False) for p in parts]
    )
    return np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int64)


def interaction(
    scene_json: Path, doc: dict, scene, frames: int, samples: int, move=None
) -> list[dict]:
    """Per-frame :func:`chord.evaluation.metrics.pair_interaction` of every dynamic object's surface
    samples (``samples`` per object, area-uniform on its normalised mesh, seeded by its index,
    moved by its trained deformation) against every other non-avoided object's mesh (its
    vertices deformed per frame when it is dynamic, as the export's GLB moves them). One
    record per ordered pair (object, other), in scene order. ``move(name, points [n, 3])`` ->
    [T, n, 3] replaces the trained deformation (e.g. :func:`scripted_mover`)."""
    if move is None:

        def move(name, points):
            return trained_scene.deformer(scene.dynamic[name], frames)(points)

    meshes = {name: object_mesh(scene_json, doc, name) for name in scene.names}
    moved = {n: move(n, V) if n in scene.dynamic else V for n, (V, _) in meshes.items()}
    index = {o["name"]: o["id"] for o in doc["objects"]}
    pairs = []
    for name in scene.dynamic:
        S = metrics.surface_samples(*meshes[name], samples, seed=index[name])  # [S, 3]
        P = move(name, S)  # [T, S, 3]
        for other in scene.names:
            if other != name:
                r = metrics.pair_interaction(P, moved[other], meshes[other][1])
                pairs.append({"object": name, "other": other, **r})
    return pairs


def scripted_mover(doc: dict, motion_json: Path, frames: int):
    """``move`` of :func:`interaction` for the scripted motion (motion.json, in world space, as
    the oracle teacher renders it): normalised rest points [n, 3] -> [T, n, 3]."""
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


def scripted_means(doc: dict, scene, motion_json: Path, frames: int) -> torch.Tensor:
    """Ground-truth means [T, N_dyn, 3] of the dynamic Gaussians under motion.json."""
    from chord.guidance.oracle import scripted_gaussians

    motion = scripted.load_motion(motion_json)
    rest = {n: {"means": o.rest_means, "quats": o.rest_quats} for n, o in scene.dynamic.items()}
    return scripted_gaussians(doc, rest, motion, frames)[0]


def run(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    voxels: dict[str, Path],
    state_path: Path,
    ref_png: Path,
    loss_logs: dict[str, Path],
    motion_json: Path | None,
    method,
    out_json: Path,
    out_frame0: Path,
    out_losses: Path,
    out_interaction: Path,
) -> dict:
    """Compute and write the metrics of one trained scene; returns them."""
    method = stage_config(method, "evaluate")  # only the keys it reads
    doc, scene, ckpt = trained_scene.load_trained(
        scene_json=scene_json,
        plys=plys,
        voxels=voxels,
        state_path=state_path,
        frame_num=method.frame_num,
        sh_degree=method.sh_degree,
    )
    T = trained_scene.scene_frame_num(scene, method)
    dynamic = list(scene.dynamic)
    with torch.no_grad():
        X = (
            scene.frame_gaussians(torch.arange(T), objects=dynamic)["means"].double()
            if dynamic
            else torch.zeros(T, 0, 3, dtype=torch.float64)
        )  # [T, N_dyn, 3]
    out = {
        "format": metrics_file.FORMAT,
        "scene": doc["scene"],
        "stage": settings.final_stage(method),
        "iteration": ckpt["iteration"],
        "seed": ckpt["seed"],
        "frames": T,
        "gaussians": int(scene.means.shape[0]),
        "dynamic_gaussians": int(X.shape[1]),
        # the memory tier(s) the stages trained on (coarse,fine where they differ) and where
        "tier": ",".join(dict.fromkeys(t for t in ckpt.get("tiers", [ckpt.get("tier")]) if t)),
        "device": ckpt.get("device", ""),
    }
    out.update(metrics.displacement(X))
    # the "it did not move" failure (reported of low-memory runs of comparable tools)
    out["static_warning"] = bool(dynamic) and out["mean_displacement"] < method.static_threshold
    if out["static_warning"]:
        logger.warning(
            "%s: the dynamic objects barely move (mean displacement %.3g < static_threshold "
            "%.3g scene units): check the prompt, the teacher and the memory tier",
            doc["scene"],
            out["mean_displacement"],
            method.static_threshold,
        )
    out.update(metrics.smoothness(X))
    arap = rigidity(scene, T)
    out["arap_residual_mean"] = float(np.mean(arap[1:])) if T > 1 else 0.0
    out["arap_residual_max"] = float(np.max(arap[1:])) if T > 1 else 0.0

    # frame-0 fidelity: the rest pose rendered from the reference camera against ref.png, at
    # the SDS size as ref.png is (export_size only sizes the export stage's videos)
    width, height = settings.parse_size(method.size, where="method: size")
    ref = read_png(ref_png)
    if ref.shape[:2] != (height, width):
        raise InputError(
            f"{ref_png}: {ref.shape[1]}x{ref.shape[0]}, but method size is {width}x{height}; "
            "rerun the reference stage"
        )
    g0 = trained_scene.scene_frames(scene, 1, objects=scene.names)
    view = cameras.method_reference_view(method, cameras.scene_target(method, doc))
    from chord.render.views import render_frames

    bg = cameras.background_for(method.invert_bg_prob)
    frame0 = media.to_uint8(render_frames(g0, view, cameras.intrinsics(width, height, method.fovy),
                                          width, height, bg)[0])  # fmt: skip
    out["psnr_frame0"] = metrics.psnr(frame0, ref)
    out["ssim_frame0"] = metrics.ssim(frame0, ref)
    if out["psnr_frame0"] < PSNR_WARN:
        logger.warning(
            "%s: frame 0 differs from %s (PSNR %.1f dB): the rest pose should reproduce it",
            doc["scene"],
            ref_png,
            out["psnr_frame0"],
        )
    plots.frame0_comparison(
        out_frame0, ref, frame0, psnr=out["psnr_frame0"], ssim=out["ssim_frame0"]
    )

    ground = method.ground_level if method.ground_level is not None else doc["ground_level"]
    out["ground_level"] = float(ground)
    out.update(metrics.ground_penetration(X[..., 1], float(ground)))

    # interaction: interpenetration and floating between objects (README "Outputs and metrics")
    start = time.perf_counter()
    pairs = interaction(scene_json, doc, scene, T, INTERACTION_SAMPLES)
    inter = metrics.interaction_summary(pairs, rest_tolerance=REST_TOLERANCE)
    elapsed = time.perf_counter() - start
    logger.info(
        "%s: interaction of %d object pairs over %d frames (%d samples per dynamic object) in "
        "%.2f s (%.3f s per frame)",
        doc["scene"],
        len(pairs),
        T,
        INTERACTION_SAMPLES,
        elapsed,
        elapsed / T,
    )
    inter_frames = inter.pop("per_frame")
    out.update(inter)
    # the "passes through" failure: the motion drives a surface deeper into another object
    # than the rest pose holds it
    out["penetration_warning"] = bool(inter["penetration_excess"] > method.penetration_threshold)
    if out["penetration_warning"]:
        worst = max(pairs, key=lambda p: max(p["depth"][1:], default=0.0) - p["depth"][0])
        logger.warning(
            "%s: %s passes into %s, %.3g scene units deeper than at rest "
            "(> penetration_threshold %.3g): see %s",
            doc["scene"],
            worst["object"],
            worst["other"],
            inter["penetration_excess"],
            method.penetration_threshold,
            out_interaction,
        )
    scripted_pairs = None
    if motion_json is not None and Path(motion_json).is_file():
        # the scripted motion's own interaction (what the oracle teacher renders): whether a
        # penetration is the motion's or the training's doing (issue 36)
        move = scripted_mover(doc, Path(motion_json), T)
        scripted_pairs = interaction(scene_json, doc, scene, T, INTERACTION_SAMPLES, move)
        summary = metrics.interaction_summary(scripted_pairs, rest_tolerance=REST_TOLERANCE)
        out["scripted_penetration_excess"] = summary["penetration_excess"]
    else:
        out["scripted_penetration_excess"] = None
    plots.interaction(
        out_interaction,
        pairs,
        threshold=method.penetration_threshold,
        title=doc["scene"],
        scripted=scripted_pairs,
    )

    per_frame = {
        "mean_displacement": [float(d) for d in (X - X[:1]).norm(dim=-1).mean(1)]
        if X.shape[1]
        else [0.0] * T,
        "arap_residual": arap,
        **inter_frames,
    }
    if motion_json is not None and Path(motion_json).is_file():
        rec = metrics.recovery_error(X, scripted_means(doc, scene, Path(motion_json), T))
        per_frame["recovery_error"] = rec.pop("recovery_per_frame")
        out.update(rec)
    else:
        out.update(recovery_error=None, recovery_max_error=None, recovery_relative=None)
    out["per_frame"] = per_frame
    out["interaction"] = {
        "samples": INTERACTION_SAMPLES,
        "rest_tolerance": REST_TOLERANCE,
        "contact_band": metrics.CONTACT_BAND,
        "pairs": pairs,
    }
    out = _clean(out)
    write_json(out_json, out)
    plots.loss_curves(out_losses, loss_logs, title=doc["scene"])
    logger.info(
        "%s: displacement %.4g (max %.4g), ARAP %.3g, PSNR %.2f dB, recovery %s",
        doc["scene"],
        out["mean_displacement"],
        out["max_displacement"],
        out["arap_residual_mean"],
        out["psnr_frame0"],
        out["recovery_error"],
    )
    return out
