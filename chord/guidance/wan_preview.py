"""The teacher preview (METHOD §9): an image-to-video sample of Wan 2.2 from the reference
render, one expert resident at a time."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from chord.guidance import wan_folder
from chord.resources import cuda_settings

logger = logging.getLogger(__name__)


def preview_schedule(scheduler, steps: int, boundary_ratio: float) -> list[str]:
    """The expert each of the ``steps`` sampling steps runs, as diffusers'
    ``WanImageToVideoPipeline`` picks it: ``transformer`` (high noise) while the step's timestep
    is at least ``boundary_ratio``·num_train_timesteps, ``transformer_2`` after. Read off a
    copy of ``scheduler``, so the pipeline's own is untouched."""
    import copy

    sched = copy.deepcopy(scheduler)
    sched.set_timesteps(steps)
    boundary = boundary_ratio * sched.config.num_train_timesteps
    return ["transformer" if float(t) >= boundary else "transformer_2" for t in sched.timesteps]


class PreviewExperts:
    """The experts of the teacher preview, one resident at a time: the pipeline's
    ``callback_on_step_end``, which after each step makes the next step's expert the one in
    memory (the previous one released first) and releases the last before the VAE decode.

    ``schedule``: the expert of each step (:func:`preview_schedule`). Residency per the tier:
    ``mmgp`` (an :class:`MMGPResidency`, ``enable_mmgp``) keeps the expert's weights in host
    RAM and streams its blocks to the GPU; without it the expert moves whole to ``device``.
    A released expert's weights are freed in place (moved to the meta device): the pipeline's
    loop still holds the module it last ran until its next step."""

    def __init__(self, folder: Path, schedule: list[str], *, dtype, device, mmgp=None):
        self.folder = Path(folder)
        self.schedule = list(schedule)
        self.dtype = dtype
        self.device = torch.device(device)
        self.mmgp = mmgp
        self.pipe = None
        self.active: str | None = None
        self.model: torch.nn.Module | None = None
        self.loads = 0

    def load(self, name: str) -> torch.nn.Module:
        """Load ``name`` from the folder (no other expert may be resident), place it as the
        tier says and set it as the pipeline's component of that name."""
        if self.model is not None:
            raise RuntimeError(f"expert {self.active} still resident while loading {name}")
        model = wan_folder.load_expert(self.folder, name, dtype=self.dtype)
        self.loads += 1
        if self.mmgp is not None:
            self.mmgp.activate(name, model)
        else:
            model.to(self.device)
        self.active, self.model = name, model
        if self.pipe is not None:
            setattr(self.pipe, name, model)
        logger.info("preview: loaded expert %s (%s)", name, "mmgp" if self.mmgp else self.device)
        return model

    def release(self) -> None:
        """Drop the resident expert: out of the pipeline, mmgp's offload object released, its
        weights freed in place; then gc and the CUDA cache."""
        if self.model is None:
            return
        name, model = self.active, self.model
        self.active = self.model = None
        if self.pipe is not None:
            setattr(self.pipe, name, None)
        if self.mmgp is not None:
            self.mmgp.release()
        model.to(torch.device("meta"))
        del model
        gc.collect()
        cuda_settings.empty_cache(self.device)
        logger.info("preview: released expert %s", name)

    def __call__(self, pipe, step: int, timestep, callback_kwargs: dict) -> dict:
        """After step ``step``: the next step's expert resident (none after the last)."""
        following = self.schedule[step + 1] if step + 1 < len(self.schedule) else None
        if following != self.active:
            self.release()
            if following is not None:
                self.load(following)
        return {}


@torch.no_grad()
def sample_video(
    ckpt_dir: Path | str,
    image,
    text: dict[str, Tensor],
    *,
    frames: int,
    steps: int,
    guidance_scale: float,
    guidance_scale_2: float | None = None,
    boundary_ratio: float | None = None,
    seed: int = 0,
    device="cpu",
    mmgp=None,
) -> np.ndarray:
    """A short image-to-video sample of Wan 2.2 through diffusers' ``WanImageToVideoPipeline``
    with our experts (``transformer`` high noise, ``transformer_2`` low noise), the folder's
    VAE and scheduler, and the cached text conditioning ``text`` ("prompt", "negative":
    [512, D]); ``image``: a PIL image at the sample size (W×H).

    One expert is in memory at a time (:class:`PreviewExperts`): the first step's is loaded
    before the call, the pipeline's step callback swaps it for the other at the boundary and
    releases it before the VAE decode, so host RAM holds one 14B expert. On a GPU the VAE
    sits there; the expert moves there whole, or with ``mmgp`` (an :class:`MMGPResidency`,
    the tier's ``enable_mmgp``) stays in host RAM with mmgp streaming its blocks
    (:func:`chord.resources.job_memory.preview_estimate`). No diffusers offload hooks: model CPU
    offload would move the whole expert as we do, its hooks are set once for the components
    present then, and the mmgp tiers' training already streams with mmgp (its profile, budget
    and the memory model's window). Returns frames [F, H, W, 3] uint8."""
    from diffusers import WanImageToVideoPipeline

    folder = Path(ckpt_dir)
    index = wan_folder.check_folder(folder, ("transformer", "transformer_2", "vae"))
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if boundary_ratio is None:
        boundary_ratio = float(index.get("boundary_ratio") or 0.9)
    scheduler = wan_folder.load_scheduler(folder)
    experts = PreviewExperts(
        folder,
        preview_schedule(scheduler, steps, boundary_ratio),
        dtype=dtype,
        device=device,
        mmgp=mmgp,
    )
    pipe = WanImageToVideoPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=wan_folder.load_vae(folder, device=device),
        scheduler=scheduler,
        transformer=None,
        transformer_2=None,
        boundary_ratio=boundary_ratio,
    )
    experts.pipe = pipe
    width, height = image.size
    try:
        experts.load(experts.schedule[0])
        out = pipe(
            image=image,
            prompt_embeds=text["prompt"][None].to(device, dtype),
            negative_prompt_embeds=text["negative"][None].to(device, dtype),
            height=height,
            width=width,
            num_frames=frames,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            guidance_scale_2=guidance_scale_2,
            generator=torch.Generator().manual_seed(seed),
            output_type="np",
            callback_on_step_end=experts,
        ).frames[0]  # [F, H, W, 3] in [0, 1]
    finally:
        experts.release()
    return (np.clip(out, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
