"""Stage ``evaluate``: the metrics of a trained scene (``metrics.json``, defined in
docs/outputs.md), its loss curves, the frame-0 comparison with ref.png and the per-frame
interaction of its objects (interpenetration, floating)."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from chord.config import settings
from chord.config.result_keys import stage_config
from chord.core import media
from chord.core.atomic_files import write_json
from chord.core.errors import InputError
from chord.evaluation import interaction, metrics, metrics_file, plots, scripted_motion
from chord.export import trained_scene
from chord.render import cameras

logger = logging.getLogger(__name__)

PSNR_WARN = 40.0  # dB: below this, frame 0 does not reproduce the reference render


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
    arap = metrics.rigidity(scene, T)
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

    # interaction: objects passing into each other, or floating off what they stood on
    # (docs/outputs.md, "Interaction checks")
    start = time.perf_counter()
    samples = interaction.INTERACTION_SAMPLES
    pairs = interaction.pairs(scene_json, doc, scene, T, samples)
    inter = metrics.interaction_summary(pairs, rest_tolerance=interaction.REST_TOLERANCE)
    elapsed = time.perf_counter() - start
    logger.info(
        "%s: interaction of %d object pairs over %d frames (%d samples per dynamic object) in "
        "%.2f s (%.3f s per frame)",
        doc["scene"],
        len(pairs),
        T,
        samples,
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
        move = scripted_motion.mover(doc, Path(motion_json), T)
        scripted_pairs = interaction.pairs(scene_json, doc, scene, T, samples, move)
        summary = metrics.interaction_summary(
            scripted_pairs, rest_tolerance=interaction.REST_TOLERANCE
        )
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
        rec = metrics.recovery_error(X, scripted_motion.means(doc, scene, Path(motion_json), T))
        per_frame["recovery_error"] = rec.pop("recovery_per_frame")
        out.update(rec)
    else:
        out.update(recovery_error=None, recovery_max_error=None, recovery_relative=None)
    out["per_frame"] = per_frame
    out["interaction"] = {
        "samples": samples,
        "rest_tolerance": interaction.REST_TOLERANCE,
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
