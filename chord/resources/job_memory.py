"""The peak memory of the jobs around a training, from the same model as
:mod:`chord.resources.peak_memory`: the teacher preview (one Wan expert at a time, the sampler's
latent
state, the Wan VAE's decode) and the ``condition`` job (the UMT5 text encoder in float32)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from chord.resources.peak_memory import (
    CPU_PROXY,
    DIT_PER_TOKEN_DIM,
    DIT_PER_TOKEN_FFN,
    HOST_BASE_GIB,
    MODELS,
    GiB,
    MiB,
    ModelShape,
    dit_params,
    dit_window,
    latent_shape,
    memory_config,
    read_json,
    safetensors_numel,
    summary,
    tokens,
)

#: The Wan VAE's no-grad decode per unit of base width and pixel, analytic like its encode
#: (``CPU_PROXY``): the decoder runs one latent frame at a time into 4 output frames; its
#: full-resolution stage (base channels) keeps ~6 live float32 tensors of those 4 frames
#: (16 bytes per base·pixel each: 96) and 2-frame caches for 7 causal convolutions, the
#: half-resolution stage (2·base channels at a quarter of the pixels) 6 more (8 each: 80).
WAN_VAE_DECODE_PER_BASE_PIXEL = 176.0
#: Float32 channels of the sampler's latent state per latent voxel: latents (16), the image
#: condition (20), the DiT input (36 in bf16: 18), the two CFG outputs (16 in bf16 each: 16)
#: and UniPC's history of two model outputs and the last sample (48).
PREVIEW_LATENT_CHANNELS = 118


def preview_host_bytes(flags, *, model: str | ModelShape = "A14B", expert_bytes: int = 2) -> int:
    """Host RAM of the teacher preview: one expert (:class:`chord.guidance.wan_preview.
    PreviewExperts` releases one before loading the other) and the process, as for a training;
    with ``enable_mmgp`` mmgp's pinned staging of the expert's blocks besides."""
    s = MODELS[model] if isinstance(model, str) else model
    expert = dit_params(s) * expert_bytes
    host = expert + HOST_BASE_GIB * GiB
    if memory_config(flags).enable_mmgp:
        host += expert // 2
    return int(host)


def preview_estimate(
    flags,
    *,
    width: int,
    height: int,
    frames: int,
    model: str | ModelShape = "A14B",
    expert_bytes: int = 2,
) -> dict:
    """Peak GPU memory and host RAM of the teacher preview (:func:`chord.guidance.
    wan_preview.sample_video`): diffusers' ``WanImageToVideoPipeline`` at the SDS size and
    ``frame_num``, inference only, one expert resident at a time.

    Weights: the expert whole (bf16), or with ``enable_mmgp`` mmgp's streaming window as in
    :func:`estimate`; the Wan VAE (float32) and the two text embeddings. Phases, each on top
    of the weights: ``condition`` (the VAE's no-grad encode of [I₀, 0, …, 0] and that video),
    ``denoise`` (the sampler's latent state and the DiT activations of one pass: the pipeline
    runs the conditional and unconditional passes one after the other, batch 1 each) and
    ``decode`` (the VAE decode of the latents into the video, with the expert already
    released, so without its weights; the output and its copy).

    Returns {"gpu_bytes", "reserved_bytes", "host_bytes", "phase", "phases", "parts",
    "width", "height", "tokens", "mode"}, ``mode`` "mmgp" or "gpu" (where the expert lives).
    """
    s = MODELS[model] if isinstance(model, str) else model
    f = memory_config(flags)
    W, H, T = int(width), int(height), int(frames)
    if min(W, H, T) <= 0:
        raise ValueError(f"expected positive sizes, got {W}x{H}, {T} frames")
    px = W * H
    L = tokens(W, H, T, s)
    fl, lh, lw = latent_shape(W, H, T)
    window = dit_window(s, f, expert_bytes)
    video = 3 * T * px * 4  # float32 [1, 3, T, H, W]
    parts = {
        "dit_weights": window,
        "vae_weights": s.vae_params * 4,
        "text": 2 * s.text_len * s.text_dim * expert_bytes,
        "condition": int(CPU_PROXY["wan_vae_nograd_per_base_pixel"] * s.vae_base_dim * px) + video,
        "latents": PREVIEW_LATENT_CHANNELS * fl * lh * lw * 4,
        "dit_activations": int(
            L * (DIT_PER_TOKEN_DIM * s.dim + DIT_PER_TOKEN_FFN * s.ffn) * expert_bytes / 2
        ),
        "decode": int(WAN_VAE_DECODE_PER_BASE_PIXEL * s.vae_base_dim * px) + 2 * video,
    }
    static = parts["vae_weights"] + parts["text"]
    phases = {
        "condition": static + window + parts["condition"],
        "denoise": static + window + parts["latents"] + parts["dit_activations"],
        "decode": static + parts["latents"] + parts["decode"],
    }
    host = preview_host_bytes(f, model=s, expert_bytes=expert_bytes)
    mode = "mmgp" if f.enable_mmgp else "gpu"
    return summary(phases, parts, host, width=W, height=H, tokens=L, mode=mode)


def preview_mem_mb(flags, *, ceiling_mb: int, model: str | ModelShape = "A14B") -> int:
    """``mem_mb`` of the teacher preview's job: :func:`preview_host_bytes` with a 10% margin,
    the tier's host RAM (``ceiling_mb``) the ceiling, as a training job asks
    (:func:`chord.resources.job_size.job_request`)."""
    host = preview_host_bytes(flags, model=model)
    return min(int(ceiling_mb), int(math.ceil(host * 1.1 / MiB)))


#: UMT5-XXL, Wan 2.2's text encoder (text_encoder/config.json of the diffusers release).
UMT5_XXL = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "num_heads": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "relative_attention_num_buckets": 32,
}
#: Host RAM of the condition job besides the encoder's weights: Python, tokenizer, loaders.
CONDITION_BASE_MB = 2048


def text_encoder_params(config: Mapping) -> int:
    """Parameters of a UMT5 encoder from its config: the shared embedding, per layer the
    self-attention (q, k, v, o and its own relative position bias) and the gated FFN with
    two layer norms, and the final norm (5.68e9 for UMT5-XXL)."""
    c = {**UMT5_XXL, **{k: v for k, v in config.items() if k in UMT5_XXL}}
    d, inner = int(c["d_model"]), int(c["num_heads"]) * int(c["d_kv"])
    attn = 4 * d * inner + int(c["relative_attention_num_buckets"]) * int(c["num_heads"])
    layer = attn + 3 * d * int(c["d_ff"]) + 2 * d
    return int(c["vocab_size"]) * d + int(c["num_layers"]) * layer + d


def condition_mem_mb(ckpt_dir, backend: str) -> int:
    """Host RAM (MB) of the ``condition`` job: the text encoder in float32 on a CPU node
    (UMT5-XXL: ~23 GB), counted from the folder's weights, else its config, else UMT5-XXL's
    (the folder may not be visible where the DAG is built). The oracle's tiny encoder needs
    little."""
    if backend != "wan" or not ckpt_dir:
        return CONDITION_BASE_MB
    folder = Path(ckpt_dir) / "text_encoder"
    params = safetensors_numel(folder)
    if params is None:
        params = text_encoder_params(read_json(folder / "config.json") or {})
    return int(params * 4 * 1.1 / MiB) + CONDITION_BASE_MB
