"""Rule ``teacher_preview`` (``snakemake preview``): what the teacher makes of a scene before a
long run, to screen prompts. An image-to-video sample from the reference render with the
scene's prompt (its cached text conditioning), at the SDS size and ``frame_num``: Wan 2.2
through diffusers' pipeline, on the memory tier of the scene's training, with one expert in
memory at a time (mmgp streaming it on an ``enable_mmgp`` tier); the oracle's scripted target
video. Writes ``preview/teacher.mp4`` and a strip of its first, middle and last frames."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from chord.config import settings as config
from chord.config.result_keys import stage_config
from chord.core import media
from chord.core.atomic_files import atomic_path
from chord.export import trained_scene
from chord.gaussians import ply
from chord.guidance import oracle
from chord.guidance import text as text_cond
from chord.render import cameras
from chord.resources import tiers
from chord.scene import ingestion

logger = logging.getLogger(__name__)


def frames_strip(frames: np.ndarray) -> np.ndarray:
    """The first, middle and last frames [F, H, W, 3] side by side -> [H, 3W, 3]."""
    F = len(frames)
    return np.concatenate([frames[0], frames[F // 2], frames[F - 1]], axis=1)


def run(
    *,
    scene_json: Path,
    plys: dict[str, Path],
    ref_png: Path,
    text_path: Path,
    data_dir: Path,
    method,
    guidance,
    settings,
    out_mp4: Path,
    out_png: Path,
    device="cpu",
    memory=None,
) -> dict:
    """Write the teacher preview of one scene; ``settings``: the config's ``preview``;
    ``memory``: the memory flags of the scene's tier (its ``enable_mmgp`` makes mmgp keep the
    Wan expert's weights in host RAM, :func:`chord.guidance.wan_preview.sample_video`)."""
    method = stage_config(method, "preview")  # only the keys it reads
    width, height = config.parse_size(method.size, where="method: size")
    T = method.frame_num
    if guidance.backend == "oracle":
        doc = ingestion.read_scene_json(scene_json)
        names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
        gsets = {n: ply.read_ply(plys[n], sh_degree_cap=method.sh_degree) for n in names}
        teacher = oracle.for_scene(doc, gsets, data_dir, method, guidance, width, height)
        view = cameras.method_reference_view(method, cameras.scene_target(method, doc))
        K = cameras.intrinsics(width, height, method.fovy)
        video = teacher.render_target(view, K, torch.ones(3))  # [T, 3, H, W], white
        frames = media.to_uint8(video.permute(0, 2, 3, 1))
        source = "the oracle's scripted target video"
    else:
        from chord.guidance import wan_preview
        from chord.resources import job_memory, peak_memory

        image = Image.open(ref_png).convert("RGB")
        if image.size != (width, height):
            raise config.ConfigError(
                f"{ref_png}: {image.size[0]}x{image.size[1]}, but method size is "
                f"{width}x{height}; rerun the reference stage"
            )
        e = job_memory.preview_estimate(
            memory or {},
            width=width,
            height=height,
            frames=T,
            model=peak_memory.model_for(guidance.ckpt_dir),
        )
        logger.info(
            "preview memory model (expert %s): peak %.1f GiB on the GPU in %s, host %.0f GiB",
            "streamed by mmgp" if e["mode"] == "mmgp" else "on the GPU",
            e["reserved_bytes"] / peak_memory.GiB,
            e["phase"],
            e["host_bytes"] / peak_memory.GiB,
        )
        frames = wan_preview.sample_video(
            guidance.ckpt_dir,
            image,
            text_cond.read(text_path)[0],
            frames=T,
            steps=settings.steps,
            guidance_scale=settings.guidance_scale,
            guidance_scale_2=settings.guidance_scale_2,
            boundary_ratio=settings.boundary_ratio,
            seed=settings.seed,
            device=device,
            mmgp=mmgp_residency(memory),
        )
        source = f"Wan 2.2 from {guidance.ckpt_dir}, {settings.steps} steps"
    fps = trained_scene.video_fps(method)
    media.write_mp4(out_mp4, frames, fps)
    with atomic_path(out_png, suffix=".png") as tmp:
        Image.fromarray(frames_strip(frames)).save(tmp, format="PNG")
    logger.info(
        "%s: %d frames at %dx%d, %d fps: %s", out_mp4, len(frames), width, height, fps, source
    )
    return {"frames": len(frames), "width": width, "height": height, "source": source}


def mmgp_residency(memory):
    """The tier's mmgp residency for the preview's expert (``enable_mmgp``: its profile and
    transformer budget, as the training uses them), else None. Without CUDA it raises, naming
    the flag (:class:`chord.guidance.mmgp_residency.MMGPResidency`)."""
    if memory is None or not memory.enable_mmgp:
        return None
    from chord.guidance import mmgp_residency as mr

    return mr.MMGPResidency(memory.mmgp_profile, memory.mmgp_transformer_budget)


def run_job(*, conf, scene: str, tier: str, inputs: dict, out_mp4: Path, out_png: Path, env):
    """The rule's job: :func:`run` on the scene's memory tier (its size and memory flags), on
    a GPU of its own where there are several (:func:`chord.resources.gpus.job_gpu`)."""
    from chord.resources import gpus

    spec = conf.scenes[scene]
    job = tiers.training_job(spec.method, conf.memory, tiers.parse(conf.tiers)[tier], scene=scene)
    method, memory = job.method, job.memory
    with gpus.job_gpu(env):
        return run(
            **inputs,
            data_dir=spec.data,
            method=method,
            guidance=conf.guidance,
            settings=conf.preview,
            out_mp4=out_mp4,
            out_png=out_png,
            device="cuda" if torch.cuda.is_available() else "cpu",
            memory=memory,
        )
