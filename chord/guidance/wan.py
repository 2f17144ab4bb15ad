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
import logging
from pathlib import Path

import torch
from torch import Tensor

from chord.core.errors import InputError
from chord.guidance import wan_float32, wan_folder
from chord.resources import cuda_settings

logger = logging.getLogger(__name__)

NUM_TRAIN_TIMESTEPS = 1000


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
        index = wan_folder.check_folder(self.folder, ("transformer", "transformer_2", "vae"))
        self.boundary_ratio = float(index.get("boundary_ratio") or 0.9)
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.sds_cfg_batch = sds_cfg_batch
        self.vae = wan_folder.load_vae(self.folder, device=self.device)
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
        """The experts' shapes from the folder's configs (:mod:`chord.resources.peak_memory`'s
        model)."""
        from chord.resources import peak_memory

        return peak_memory.ModelShape.from_folder(self.folder)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The precision the experts compute in: their weights' dtype, under autocast to it
        when it is a half type (METHOD §9: bf16 autocast)."""
        return self.dtype

    @contextlib.contextmanager
    def autocast(self):
        """Autocast to the compute dtype on this device; in float32 (the fallback) autocast
        off and TF32 off for the call (:func:`chord.guidance.wan_float32.ieee_float32`), so it
        is float32 throughout."""
        if self.compute_dtype in (torch.bfloat16, torch.float16):
            with torch.autocast(self.device.type, dtype=self.compute_dtype):
                yield
        else:
            with torch.autocast(self.device.type, enabled=False), wan_float32.ieee_float32():
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
            self.experts[name] = wan_folder.load_expert(self.folder, name, dtype=self.dtype)
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
        cuda_settings.empty_cache(self.device)

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
        first (:func:`chord.training.float32_fallback.problem`). The log line says what
        it costs (:func:`chord.guidance.wan_float32.float32_slowdown`).

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
            wan_float32.TF32_DECISION,
            wan_float32.float32_slowdown(),
        )

    def unload(self) -> None:
        """After the DiT passes: let mmgp unload the active expert (no-op otherwise)."""
        if self.mmgp is not None:
            self.mmgp.unload()
