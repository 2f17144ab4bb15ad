"""Wan 2.2 I2V A14B guidance from a diffusers-format folder (METHOD §9–§11, §15).

The folder is what ``Wan2.2-I2V-A14B-Diffusers`` holds: ``model_index.json`` (with
``boundary_ratio``), ``transformer`` (the high-noise expert), ``transformer_2`` (the
low-noise expert), ``vae`` (AutoencoderKLWan), ``text_encoder`` (UMT5) and ``tokenizer``.
Everything loads with ``local_files_only``: nothing is ever fetched from a hub.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from chord import runtime
from chord.errors import InputError

logger = logging.getLogger(__name__)

NUM_TRAIN_TIMESTEPS = 1000
#: Public dense peak TFLOPS of data-centre GPUs: (bf16 on tensor cores, float32 without them,
#: which is what the float32 fallback runs on with TF32 off), from NVIDIA's H100/H200 SXM and
#: A100 SXM datasheets.
DENSE_TFLOPS = {"H100/H200 SXM": (989.0, 67.0), "A100 SXM": (312.0, 19.5)}
#: The float32 fallback's TF32 decision (:func:`ieee_float32`), for its log line.
TF32_DECISION = (
    "TF32 off (matmuls and convolutions in IEEE float32, torch's 'highest'): the fallback is "
    "there because bf16 gave non-finite values, and TF32's 10-bit mantissa would bring back "
    "part of that rounding"
)
COMPONENTS = ("transformer", "transformer_2", "vae", "text_encoder", "tokenizer")
_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER = ("tokenizer.json", "spiece.model", "tokenizer_config.json")


def check_folder(ckpt_dir: Path | str, components=COMPONENTS) -> dict:
    """Validate a diffusers-format Wan 2.2 I2V folder; return its model_index.json.

    A missing folder, index or component (config or weights) is a ValueError that names the
    folder and lists everything missing.
    """
    folder = Path(ckpt_dir)
    if not folder.is_dir():
        raise InputError(
            f"guidance.ckpt_dir {folder}: folder not found (expected a "
            "diffusers-format Wan2.2-I2V-A14B-Diffusers folder)"
        )
    missing = []
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        missing.append("model_index.json")
    for comp in components:
        sub = folder / comp
        if comp == "tokenizer":
            if not any((sub / f).is_file() for f in _TOKENIZER):
                missing.append("tokenizer/ (tokenizer.json or spiece.model)")
            continue
        if not (sub / "config.json").is_file():
            missing.append(f"{comp}/config.json")
        if not any(any(sub.glob(p)) for p in _WEIGHTS):
            missing.append(f"{comp}/ weights (*.safetensors)")
    if missing:
        raise InputError(
            f"guidance.ckpt_dir {folder}: incomplete Wan 2.2 I2V folder; missing: "
            + ", ".join(missing)
        )
    return json.loads(index_path.read_text())


def load_text_encoder(ckpt_dir: Path | str, *, device="cpu", dtype=torch.float32):
    """(tokenizer, UMT5 encoder) from the folder, local files only."""
    from transformers import AutoTokenizer, UMT5EncoderModel

    folder = Path(ckpt_dir)
    check_folder(folder, ("text_encoder", "tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    encoder = UMT5EncoderModel.from_pretrained(
        folder / "text_encoder", local_files_only=True, torch_dtype=dtype
    )
    return tokenizer, encoder.to(device).eval().requires_grad_(False)


def load_vae(ckpt_dir: Path | str, *, device="cpu"):
    """The Wan 2.1 VAE (float32, frozen)."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(
        Path(ckpt_dir) / "vae", local_files_only=True, torch_dtype=torch.float32
    )
    return vae.to(device).eval().requires_grad_(False)


def load_expert(ckpt_dir: Path | str, name: str, *, dtype):
    """One DiT expert on the CPU (frozen, eval mode)."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(
        Path(ckpt_dir) / name, local_files_only=True, torch_dtype=dtype
    )
    return model.eval().requires_grad_(False)


def from_config(guidance, method, memory, *, device="cpu") -> WanGuidance:
    """WanGuidance as the config asks: the Tiny VAE (``method.use_tiny_vae``), mmgp and CFG
    batching (the memory flags ``enable_mmgp``, ``sds_cfg_batch``)."""
    tiny = None
    if method.use_tiny_vae:
        if not guidance.tiny_vae_path:
            raise InputError(
                "method.use_tiny_vae: set guidance.tiny_vae_path to the lighttaew2_1 weights"
            )
        from chord.guidance.tiny_vae import load_tiny_vae

        tiny = load_tiny_vae(guidance.tiny_vae_path, device=device)
    mmgp = None
    if memory.enable_mmgp:
        from chord.guidance.mmgp_residency import MMGPResidency

        mmgp = MMGPResidency(memory.mmgp_profile, memory.mmgp_transformer_budget)
    return WanGuidance(
        guidance.ckpt_dir,
        device=device,
        sds_cfg_batch=memory.sds_cfg_batch,
        tiny_vae=tiny,
        tiny_vae_normalize=guidance.tiny_vae_normalize,
        mmgp=mmgp,
    )


def float32_slowdown() -> str:
    """The float32 fallback's cost from :data:`DENSE_TFLOPS`, e.g. "roughly 15-16x slower DiT
    passes (...)": the DiT's matmuls leave the bf16 tensor cores for float32 arithmetic."""
    ratios = [bf16 / fp32 for bf16, fp32 in DENSE_TFLOPS.values()]
    lo, hi = round(min(ratios)), round(max(ratios))
    specs = ", ".join(f"{gpu} {b:g} vs {f:g}" for gpu, (b, f) in DENSE_TFLOPS.items())
    n = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"roughly {n}x slower DiT passes (dense bf16 vs float32 TFLOPS: {specs})"


def _tf32_switches() -> tuple:
    """(object, attribute, IEEE value) of torch's TF32 switches for CUDA matmuls and cuDNN
    convolutions: the ``fp32_precision`` settings where torch has them (2.9+, where reading
    the legacy flags raises once both kinds were set), else the ``allow_tf32`` flags."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    conv = getattr(cudnn, "conv", None)
    if conv is not None and hasattr(matmul, "fp32_precision"):
        return ((matmul, "fp32_precision", "ieee"), (conv, "fp32_precision", "ieee"))
    return ((matmul, "allow_tf32", False), (cudnn, "allow_tf32", False))


@contextlib.contextmanager
def ieee_float32():
    """TF32 off inside the block (:data:`TF32_DECISION`): float32 matmuls and cuDNN
    convolutions (the DiT's patch embedding; cuDNN's default is TF32) in IEEE float32. These
    are process-wide torch settings, so each is restored on exit: nothing outside the block
    sees a change."""
    switches = _tf32_switches()
    old = [getattr(obj, name) for obj, name, _ in switches]
    try:
        for obj, name, value in switches:
            setattr(obj, name, value)
        yield
    finally:
        for (obj, name, _), value in zip(switches, old, strict=True):
            setattr(obj, name, value)


def first_frame_mask(
    frame_num: int, h: int, w: int, *, dtype=torch.float32, device="cpu"
) -> Tensor:
    """METHOD §9 step 3: [4, F', h, w], ones in latent frame 0 (frame 0 repeated 4 times,
    viewed as F'×4 and transposed), zeros elsewhere."""
    mask = torch.zeros(1, frame_num, h, w, dtype=dtype, device=device)
    mask[:, 0] = 1.0
    mask = torch.cat([mask[:, :1].repeat_interleave(4, dim=1), mask[:, 1:]], dim=1)  # [1, T+3]
    return mask.view(-1, 4, h, w).transpose(0, 1)  # [4, F', h, w]


class WanGuidance:
    """The Wan 2.2 I2V A14B teacher: video latents, image conditioning and the CFG velocity.

    Experts are bf16 on CUDA (float32 on a CPU, for tiny test models), in eval mode, without
    gradient, and run under autocast to their dtype (none in float32). Only the expert a
    timestep needs is in memory: a switch drops the other (its mmgp offload object released)
    before loading the next from the folder, so host RAM holds one 14B expert, not two, and
    an expert needed again after a roll-back is reloaded fresh (``mmgp``: a
    :class:`MMGPResidency` manages its GPU residency).
    """

    def __init__(
        self,
        ckpt_dir: Path | str,
        *,
        device="cpu",
        dtype=None,
        sds_cfg_batch: bool = True,
        tiny_vae=None,
        tiny_vae_normalize: bool = True,
        mmgp=None,
    ):
        self.folder = Path(ckpt_dir)
        index = check_folder(self.folder, ("transformer", "transformer_2", "vae"))
        self.boundary_ratio = float(index.get("boundary_ratio") or 0.9)
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.sds_cfg_batch = sds_cfg_batch
        self.vae = load_vae(self.folder, device=self.device)
        cfg = self.vae.config
        self.latents_mean = torch.tensor(cfg.latents_mean, device=self.device)[:, None, None, None]
        self.latents_std = torch.tensor(cfg.latents_std, device=self.device)[:, None, None, None]
        self.tiny_vae = tiny_vae
        self.tiny_vae_normalize = tiny_vae_normalize
        if tiny_vae is not None:  # normalise with this VAE's own latent statistics
            tiny_vae.set_latent_stats(cfg.latents_mean, cfg.latents_std)
            tiny_vae.to(self.device)
        self.mmgp = mmgp
        self.experts: dict[str, torch.nn.Module] = {}  # at most one: the active expert
        self.active: str | None = None
        self.loads = 0  # experts loaded from the folder so far (a switch costs one)

    @functools.cached_property
    def model_shape(self):
        """The experts' shapes from the folder's configs (:mod:`chord.peak_memory`'s model)."""
        from chord import peak_memory

        return peak_memory.ModelShape.from_folder(self.folder)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The precision the experts compute in: their weights' dtype, under autocast to it
        when it is a half type (METHOD §9: bf16 autocast)."""
        return self.dtype

    @contextlib.contextmanager
    def autocast(self):
        """Autocast to the compute dtype on this device; in float32 (the fallback) autocast
        off and TF32 off for the call (:func:`ieee_float32`), so it is float32 throughout."""
        if self.compute_dtype in (torch.bfloat16, torch.float16):
            with torch.autocast(self.device.type, dtype=self.compute_dtype):
                yield
        else:
            with torch.autocast(self.device.type, enabled=False), ieee_float32():
                yield

    # -- latents ---------------------------------------------------------------------------
    def _vae_latents(self, video: Tensor) -> Tensor:
        """Normalised posterior mean [16, F', h, w] of a video [T, 3, H, W] in [0, 1]."""
        x = (video * 2.0 - 1.0).permute(1, 0, 2, 3)[None]  # [1, 3, T, H, W] in [-1, 1]
        z = self.vae.encode(x.to(self.device, torch.float32)).latent_dist.mean[0]
        return (z - self.latents_mean) / self.latents_std

    def encode_video(self, video: Tensor, *, checkpoint: bool = False) -> Tensor:
        """METHOD §10–§11: latents z [16, F', h, w] (float32) of a rendered video [T, 3, H, W]
        in [0, 1], differentiable; the Tiny VAE when configured, else the full VAE.
        ``checkpoint``: the Tiny VAE's activation checkpoints (``checkpoint_tiny_vae``; the full
        VAE has none, diffusers does not support them for its encoder)."""
        if self.tiny_vae is not None:
            x = video[None].to(self.device, torch.float32)
            return self.tiny_vae.encode(
                x, normalize=self.tiny_vae_normalize, checkpoint=checkpoint
            )[0]
        return self._vae_latents(video)

    @torch.no_grad()
    def condition(self, video: Tensor, **_camera) -> Tensor:
        """METHOD §9: y [20, F', h, w] = concat(mask, VAE latent of [sg(frame 0), 0, …, 0]),
        always with the full VAE."""
        T = video.shape[0]
        cond = torch.zeros_like(video)
        cond[0] = video[0].detach()
        x = cond * 2.0 - 1.0
        x[1:] = 0.0  # zeros in the VAE's [-1, 1] space, as the release does
        x = x.permute(1, 0, 2, 3)[None].to(self.device, torch.float32)
        latent = self.vae.encode(x).latent_dist.mean[0]
        latent = (latent - self.latents_mean) / self.latents_std
        _, F, h, w = latent.shape
        mask = first_frame_mask(T, h, w, dtype=latent.dtype, device=latent.device)
        if mask.shape[1] != F:
            raise ValueError(f"frame_num {T}: mask has {mask.shape[1]} latent frames, VAE {F}")
        return torch.cat([mask, latent], dim=0)

    # -- the DiT ---------------------------------------------------------------------------
    def expert_name(self, t: float) -> str:
        """The high-noise expert when 1000·t ≥ boundary·1000, else the low-noise one."""
        high = NUM_TRAIN_TIMESTEPS * t >= self.boundary_ratio * NUM_TRAIN_TIMESTEPS
        return "transformer" if high else "transformer_2"

    def _activate(self, name: str) -> torch.nn.Module:
        """The expert ``name`` resident where it computes. A switch first drops the other
        expert (mmgp: releases its offload object), returns its memory, then loads ``name``
        from the folder; the same expert again costs nothing."""
        if name not in self.experts:
            self.release()
            self.experts[name] = load_expert(self.folder, name, dtype=self.dtype)
            self.loads += 1
            logger.info("loaded expert %s (%s)", name, self.dtype)
        model = self.experts[name]
        if self.mmgp is not None:
            self.mmgp.activate(name, model)
        elif self.active != name:
            model.to(self.device)
        self.active = name
        return model

    def release(self) -> None:
        """Drop every loaded expert (mmgp's offload object released first), then return the
        memory: gc, and the CUDA cache on a GPU."""
        if self.mmgp is not None:
            self.mmgp.release()
        self.experts.clear()
        self.active = None
        gc.collect()
        runtime.empty_cache(self.device)

    @torch.no_grad()
    def velocity(
        self, z_t: Tensor, t: float, conds: list[Tensor], text: dict[str, Tensor], cfg_scale: float
    ) -> Tensor:
        """METHOD §11 step 2: v̂ = v_u + s·(v_c − v_u) [B, 16, F', h, w] (float32).

        z_t [B, 16, F', h, w]; conds: B image conditions y [20, F', h, w]; text: "prompt" and
        "negative" embeddings [512, D]. One DiT call of batch 2B with ``sds_cfg_batch``, else
        the conditional and unconditional passes one after the other.
        """
        model = self._activate(self.expert_name(t))
        B = z_t.shape[0]
        x = torch.cat([z_t, torch.stack(conds)], dim=1).to(self.device, self.dtype)  # [B, 36]
        prompt = text["prompt"].to(self.device, self.dtype)[None].expand(B, -1, -1)
        negative = text["negative"].to(self.device, self.dtype)[None].expand(B, -1, -1)

        def dit(inp, ctx):
            # float64: mmgp casts float32 arguments to bf16, which would quantise 1000·t
            # (907.2 -> 908); the time embedding takes it to float32 itself
            ts = torch.full(
                (inp.shape[0],), NUM_TRAIN_TIMESTEPS * t, dtype=torch.float64, device=self.device
            )
            with self.autocast():
                return model(
                    hidden_states=inp, timestep=ts, encoder_hidden_states=ctx, return_dict=False
                )[0].float()

        if self.sds_cfg_batch:
            v_c, v_u = dit(torch.cat([x, x]), torch.cat([prompt, negative])).chunk(2)
        else:
            v_c, v_u = dit(x, prompt), dit(x, negative)
        return v_u + cfg_scale * (v_c - v_u)

    def use_float32(self) -> None:
        """The non-finite fallback: compute in float32 from now on (weights and arithmetic:
        no autocast, no TF32), with twice the expert's memory; the caller checks that it fits
        first (:func:`chord.float32_fallback.problem`). The log line says what
        it costs (:func:`float32_slowdown`).

        The resident expert is dropped, and the next pass loads it from the folder in float32,
        as every later load is: an upcast of its bf16 copy would keep bf16-rounded weights
        where the folder holds float32 ones, and a resumed run (which loads them from the
        folder) would then compute differently from this one."""
        if self.mmgp is not None:
            raise RuntimeError(
                "the float32 fallback is not available with enable_mmgp (mmgp converts the "
                "weights to bf16); set guidance.nonfinite_fallback: none, or train on a tier "
                "without mmgp"
            )
        if self.dtype == torch.float32:
            logger.warning("guidance already computes in float32: the fallback changes nothing")
            return
        self.dtype = torch.float32
        self.release()
        logger.warning(
            "guidance switched to float32 (weights and arithmetic, twice the expert's memory); "
            "%s; expect %s",
            TF32_DECISION,
            float32_slowdown(),
        )

    def unload(self) -> None:
        """After the DiT passes: let mmgp unload the active expert (no-op otherwise)."""
        if self.mmgp is not None:
            self.mmgp.unload()


# -- the teacher preview: an image-to-video sample from the reference render -------------------


def load_scheduler(ckpt_dir: Path | str):
    """The folder's sampling scheduler (``scheduler/scheduler_config.json``: its class and
    settings); without one, Wan 2.2 A14B's: UniPC over flow sigmas with shift 5.0."""
    import diffusers

    folder = Path(ckpt_dir) / "scheduler"
    config = folder / "scheduler_config.json"
    if config.is_file():
        cls = getattr(diffusers, json.loads(config.read_text())["_class_name"])
        return cls.from_pretrained(folder, local_files_only=True)
    logger.warning("%s: no scheduler; using UniPC flow sampling with shift 5.0", folder)
    return diffusers.UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    )


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
        model = load_expert(self.folder, name, dtype=self.dtype)
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
        runtime.empty_cache(self.device)
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
    (:func:`chord.job_memory.preview_estimate`). No diffusers offload hooks: model CPU
    offload would move the whole expert as we do, its hooks are set once for the components
    present then, and the mmgp tiers' training already streams with mmgp (its profile, budget
    and the memory model's window). Returns frames [F, H, W, 3] uint8."""
    from diffusers import WanImageToVideoPipeline

    folder = Path(ckpt_dir)
    index = check_folder(folder, ("transformer", "transformer_2", "vae"))
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if boundary_ratio is None:
        boundary_ratio = float(index.get("boundary_ratio") or 0.9)
    scheduler = load_scheduler(folder)
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
        vae=load_vae(folder, device=device),
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
