"""Peak memory of one training iteration per memory tier (DESIGN §6, METHOD §15, §21).

:func:`estimate` is a pure function of the SDS size, frames, batch, Gaussian count and memory
flags; ``tier: auto`` uses :func:`fits` to skip tiers that would not fit the GPU before a job
starts. The model sums what is resident on the GPU in each phase of an iteration and takes the
largest phase:

- **weights**: one DiT expert in bf16 (its exact parameter count from the transformer
  configuration; with ``enable_mmgp`` only mmgp's streaming window: two slices of
  max(budget, largest tensor) plus the modules outside the blocks), the Wan VAE in float32
  (always: the image condition y uses it), the Tiny VAE and the cached text embeddings;
- **render graph** of one video with gradients (deform, projection, rasteriser):
  a·F·N + b·F·H·W bytes;
- **encoder graph** with gradients: the Tiny VAE, c·F₄·H·W (F₄ = F padded to a multiple of 4;
  with ``checkpoint_tiny_vae`` the smaller c′, the peak of its checkpointed forward and
  backward), else the Wan VAE, d·base·F·H·W;
- **condition**: the Wan VAE's no-grad encode of [I₀, 0, …, 0], e·base·H·W (it runs causally,
  a few frames at a time);
- **no-grad encode** of the targets pass (``split_sds_backward``): the Tiny VAE's transient
  peak, g·F₄·H·W (a smaller g′ with ``checkpoint_tiny_vae``, which runs its head in 4-frame
  groups), else the Wan VAE's, e·base·H·W;
- **DiT activations** of inference: 2 (CFG batch) × tokens × (β_h·dim + β_f·ffn) bytes, with
  tokens = F'·(H/16)·(W/16), F' = (F − 1)/4 + 1;
- **temporal loss**: the deformation graph of the dynamic Gaussians, a_d·F·N_dyn, and the
  compositor's share of their displacement render into all B cameras, B·b·(F − 1)·H·W (its
  geometry is detached).

Phases: the regularisers (weights + temporal graph); the default SDS (weights + render graph +
encoder graph + max(condition, DiT activations)); with ``split_sds_backward`` a no-grad target
pass (weights + max(no-grad render, no-grad encode, condition, DiT activations) + the B stored
targets) and a backward pass (render graph + encoder graph; with ``split_render_backward`` the
larger of the encoder graph plus the video leaf and the render graph of one
``split_render_chunk_size`` chunk). Without mmgp the active expert stays resident through the
backward (METHOD §15); with it, mmgp unloads it after the targets.

Calibration. a, b, a_d, c, c′, g, g′ and d are least-squares fits of CPU proxy measurements
(``python bench/scaling.py memory-fit``: autograd-graph RSS and transient peaks of the torch
renderer, the deformation, the Tiny VAE and random-weight Wan VAEs at small shapes; they are
linear in the counts); the renderer term is the torch backend's, an upper bound for gsplat's,
which keeps per tile what the torch backend keeps per pixel. e is analytic (see
``CPU_PROXY``), and so are β_h and β_f, read off the diffusers Wan block (bf16 states, float32
norm copies, float64 rotary temporaries); they are to be replaced by the fit of
``bench/gpu_check.py``'s table once a GPU run exists (BENCHMARKS.md). Allocated bytes become
reserved bytes with a fragmentation factor, and :func:`fits` adds a CUDA context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class ModelShape:
    """The shapes that set weights and activations: the DiT expert (diffusers
    ``WanTransformer3DModel`` arguments), the Wan VAE width and the text length."""

    layers: int
    heads: int
    head_dim: int
    ffn: int
    text_dim: int
    in_channels: int
    out_channels: int
    patch: tuple[int, int, int]
    freq_dim: int
    vae_base_dim: int = 96
    vae_params: int = 126_892_531  # AutoencoderKLWan() (Wan 2.1 VAE), counted on the meta device
    tiny_vae_params: int = 1_470_928  # TAEHV encoder (lighttaew2_1 layout), float32
    text_len: int = 512
    experts: int = 2

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


#: Wan 2.2 I2V A14B (each expert): transformer/config.json of the diffusers release.
A14B = ModelShape(
    layers=40,
    heads=40,
    head_dim=128,
    ffn=13824,
    text_dim=4096,
    in_channels=36,
    out_channels=16,
    patch=(1, 2, 2),
    freq_dim=256,
)
MODELS = {"A14B": A14B}

#: CPU proxy coefficients in bytes (``python bench/scaling.py memory-fit``, BENCHMARKS.md).
CPU_PROXY = {
    "render_per_gaussian": 506.0,  # per frame and Gaussian: deform, SH and projection graph
    "render_per_pixel": 106.0,  # per frame and pixel: the rasteriser's pair lists and images
    "deform_per_gaussian": 136.0,  # per frame and Gaussian: the deformation alone
    "tiny_vae_per_pixel": 994.0,  # per (padded) frame and pixel: the Tiny VAE graph
    # ... with checkpoint_tiny_vae: the peak of its forward + backward (block inputs, one
    # block's recomputed graph, gradients); the fit's ~90 MB intercept (CPU workspaces) is left out
    "tiny_vae_ckpt_per_pixel": 366.0,
    # per (padded) frame and pixel: the transient peak of a no-grad Tiny VAE encode (the
    # targets pass of split_sds_backward), whole and with checkpoint_tiny_vae's 4-frame head
    "tiny_vae_nograd_per_pixel": 655.0,
    "tiny_vae_ckpt_nograd_per_pixel": 226.0,
    "wan_vae_per_base_pixel": 123.0,  # per unit of base width, frame and pixel: Wan VAE graph
    # Per unit of base width and pixel: the Wan VAE's no-grad encode (4-frame causal chunks,
    # 2-frame caches per convolution). Analytic: ~6 live full-resolution tensors of a chunk
    # plus the caches; the CPU measures 640-800 because its convolutions add im2col /
    # oneDNN workspaces that cuDNN does not need.
    "wan_vae_nograd_per_base_pixel": 130.0,
}
#: DiT inference activations per token (bytes per unit of dim / ffn width), analytic.
DIT_PER_TOKEN_DIM = 24.0
DIT_PER_TOKEN_FFN = 4.0
#: reserved / allocated: the caching allocator's margin (small with expandable segments,
#: which training sets, METHOD §15).
FRAGMENTATION = 1.05
#: CUDA context and library workspaces (cuBLAS, cuDNN), GiB.
CUDA_CONTEXT_GIB = 0.8
#: Host RAM besides the experts: the Python process, scene, videos, loaders (GiB).
HOST_BASE_GIB = 6.0

FLAG_DEFAULTS = {
    "split_sds_backward": False,
    "split_render_backward": False,
    "split_render_chunk_size": -1,
    "enable_mmgp": False,
    "mmgp_transformer_budget": 100,
    "checkpoint_tiny_vae": False,
}


def dit_block_params(s: ModelShape) -> int:
    """Parameters of one Wan transformer block: self- and cross-attention (q, k, v, out with
    biases, RMS norms of q and k), the affine cross-attention norm, the FFN and the
    modulation table."""
    d = s.dim
    attn = 4 * (d * d + d) + 2 * d
    return 2 * attn + 2 * d + (d * s.ffn + s.ffn) + (s.ffn * d + d) + 6 * d


def dit_params(s: ModelShape) -> int:
    """Parameters of one expert: the blocks plus patch embedding, time and text embedders,
    time projection, output projection and the output modulation table."""
    d = s.dim
    pt, ph, pw = s.patch
    patch = s.in_channels * pt * ph * pw * d + d
    time = (s.freq_dim * d + d) + (d * d + d) + (d * 6 * d + 6 * d)
    text = (s.text_dim * d + d) + (d * d + d)
    head = d * s.out_channels * pt * ph * pw + s.out_channels * pt * ph * pw
    return s.layers * dit_block_params(s) + patch + time + text + head + 2 * d


def latent_shape(width: int, height: int, frames: int) -> tuple[int, int, int]:
    """(F', h, w) of the video latents: F' = (T − 1)/4 + 1, h = H/8, w = W/8."""
    return (frames - 1) // 4 + 1, height // 8, width // 8


def tokens(width: int, height: int, frames: int, model: ModelShape = A14B) -> int:
    """DiT sequence length F'·h·w/(patch volume) (17,160 at 832×480, 41 frames)."""
    f, h, w = latent_shape(width, height, frames)
    pt, ph, pw = model.patch
    return (f // pt) * (h // ph) * (w // pw)


def _flags(tier_flags: Mapping | None) -> dict:
    out = dict(FLAG_DEFAULTS)
    for k, v in (tier_flags or {}).items():
        if k in FLAG_DEFAULTS:
            out[k] = v
    return out


def _parse_size(size: str) -> tuple[int, int]:
    w, h = size.lower().replace("x", "*").split("*")
    return int(w), int(h)


def effective_size(tier_flags: Mapping | None, width: int, height: int) -> tuple[int, int]:
    """The SDS size a tier trains at: its ``size`` when that is smaller than the method's."""
    size = (tier_flags or {}).get("size")
    if size:
        w, h = _parse_size(size)
        if w * h < width * height:
            return w, h
    return width, height


def estimate(
    tier_flags: Mapping | None,
    *,
    width: int,
    height: int,
    frames: int,
    batch: int,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: str | ModelShape = "A14B",
    use_tiny_vae: bool = True,
    sds_cfg_batch: bool = True,
) -> dict:
    """Peak GPU memory and host RAM of one training iteration.

    Args:
        tier_flags: memory flags (``split_sds_backward``, ``split_render_backward``,
            ``split_render_chunk_size``, ``enable_mmgp``, ``mmgp_transformer_budget``; missing
            ones take the defaults) and optionally a tier ``size`` ("W*H", used when smaller
            than width×height). Other keys are ignored, so a tier's mapping can be passed.
        width, height, frames, batch: the method's SDS size, frame_num and batch_size.
        gaussians: all Gaussians of the scene (every frame renders them);
        dynamic_gaussians: those of the dynamic objects (temporal loss), default all.
        model: "A14B" or a :class:`ModelShape`.
        use_tiny_vae, sds_cfg_batch: the method's flags of the same names.

    Returns:
        {"gpu_bytes": peak allocated, "reserved_bytes": with the fragmentation margin,
        "host_bytes": host RAM, "phase": the phase that peaks, "phases": {phase: bytes},
        "parts": {part: bytes}, "width", "height", "tokens"}.

    Example:
        >>> from chord import memory
        >>> e = memory.estimate({}, width=832, height=480, frames=41, batch=4,
        ...                     gaussians=200_000)
        >>> e["gpu_bytes"] > 48 * memory.GiB  # the default mode needs more than 48 GB
        True
    """
    s = MODELS[model] if isinstance(model, str) else model
    f = _flags(tier_flags)
    W, H = effective_size(tier_flags, width, height)
    T, B, N = int(frames), int(batch), int(gaussians)
    Nd = N if dynamic_gaussians is None else int(dynamic_gaussians)
    if min(W, H, T, B, N) <= 0:
        raise ValueError(f"expected positive sizes, got {W}x{H}, {T} frames, batch {B}, N {N}")
    c = CPU_PROXY
    px = W * H
    f4 = T + (-T % 4)
    L = tokens(W, H, T, s)
    fl, lh, lw = latent_shape(W, H, T)

    expert = dit_params(s) * 2  # bf16
    block = dit_block_params(s) * 2
    outside = expert - s.layers * block
    largest = max(s.dim * 6 * s.dim, s.dim * s.ffn) * 2
    if f["enable_mmgp"]:
        window = 2 * max(int(f["mmgp_transformer_budget"]) * MiB, largest) + outside
    else:
        window = expert
    parts = {
        "dit_weights": window,
        "vae_weights": s.vae_params * 4,
        "tiny_vae_weights": s.tiny_vae_params * 4 if use_tiny_vae else 0,
        "text": 2 * s.text_len * s.text_dim * 2,
        "render_graph": int(c["render_per_gaussian"] * T * N + c["render_per_pixel"] * T * px),
        "video": T * 3 * px * 4,
        "encoder_graph": int(
            (c["tiny_vae_ckpt_per_pixel"] if f["checkpoint_tiny_vae"] else c["tiny_vae_per_pixel"])
            * f4
            * px
            if use_tiny_vae
            else c["wan_vae_per_base_pixel"] * s.vae_base_dim * T * px
        ),
        "nograd_encode": int(  # the Wan VAE's no-grad encode is as large as the condition's
            (
                c[
                    "tiny_vae_ckpt_nograd_per_pixel"
                    if f["checkpoint_tiny_vae"]
                    else "tiny_vae_nograd_per_pixel"
                ]
                * f4
                if use_tiny_vae
                else c["wan_vae_nograd_per_base_pixel"] * s.vae_base_dim
            )
            * px
        ),
        "condition": int(c["wan_vae_nograd_per_base_pixel"] * s.vae_base_dim * px),
        "dit_activations": int(
            (2 if sds_cfg_batch else 1)
            * L
            * (DIT_PER_TOKEN_DIM * s.dim + DIT_PER_TOKEN_FFN * s.ffn)
        ),
        "targets": B * 16 * fl * lh * lw * 4,
        "temporal_graph": int(  # geometry detached: the deform graph and B·(T − 1) images
            c["deform_per_gaussian"] * T * Nd + B * c["render_per_pixel"] * (T - 1) * px
        ),
    }
    static = parts["vae_weights"] + parts["tiny_vae_weights"] + parts["text"]
    resident = static + window  # the expert stays between iterations without mmgp
    between = static + (0 if f["enable_mmgp"] else window)
    nograd_render = parts["video"] * 2  # the output plus the compositor's buffers
    dit_phase = max(parts["condition"], parts["dit_activations"])
    phases = {"regularisers": between + parts["temporal_graph"]}
    if not f["split_sds_backward"]:
        if f["split_render_backward"]:
            encode = parts["video"] + parts["encoder_graph"] + dit_phase
            phases["sds"] = resident + max(encode, _chunk_graph(parts, f, T, N, px))
        else:
            phases["sds"] = resident + parts["render_graph"] + parts["encoder_graph"] + dit_phase
    else:
        nograd_encode = parts["video"] + parts["nograd_encode"]
        phases["sds_targets"] = (
            resident
            + parts["targets"]
            + max(nograd_render, nograd_encode, parts["condition"], dit_phase)
        )
        if f["split_render_backward"]:
            back = max(parts["video"] + parts["encoder_graph"], _chunk_graph(parts, f, T, N, px))
        else:
            back = parts["render_graph"] + parts["encoder_graph"]
        phases["sds_backward"] = between + parts["targets"] + back
    phase = max(phases, key=phases.get)
    gpu = phases[phase]
    n_experts = s.experts
    host = n_experts * expert + HOST_BASE_GIB * GiB
    if f["enable_mmgp"]:
        host += expert // 2  # mmgp's pinned staging of the active expert's blocks
    return {
        "gpu_bytes": int(gpu),
        "reserved_bytes": int(gpu * FRAGMENTATION),
        "host_bytes": int(host),
        "phase": phase,
        "phases": {k: int(v) for k, v in phases.items()},
        "parts": {k: int(v) for k, v in parts.items()},
        "width": W,
        "height": H,
        "tokens": L,
    }


def _chunk_graph(parts: dict, f: dict, T: int, N: int, px: int) -> int:
    """Render graph of one re-render chunk (split_render_backward) plus the video gradient."""
    chunk = (
        T if int(f["split_render_chunk_size"]) == -1 else min(T, int(f["split_render_chunk_size"]))
    )
    c = CPU_PROXY
    return (
        int(c["render_per_gaussian"] * chunk * N + c["render_per_pixel"] * chunk * px)
        + parts["video"]
    )


def _tier_mapping(tier) -> dict:
    """Flags and size of a tier given as a mapping or an object with ``flags``/``size``."""
    if isinstance(tier, Mapping):
        return dict(tier)
    out = dict(getattr(tier, "flags", {}) or {})
    if getattr(tier, "size", None):
        out["size"] = tier.size
    return out


def fits(
    tier,
    gpu_mem_gb: float,
    *,
    host_mem_gb: float | None = None,
    base_flags: Mapping | None = None,
    **shape,
) -> bool:
    """Whether ``tier`` (a ``chord.tiers.Tier``, or a mapping of flags and ``size``) fits a
    GPU of ``gpu_mem_gb`` GB (read as GiB: reserved bytes plus a CUDA context must fit), and
    ``host_mem_gb`` of host RAM when given.

    ``base_flags``: the method's memory flags, which the tier's own flags override (a tier
    that leaves a flag out keeps the method's value). ``shape``: the keyword arguments of
    :func:`estimate` (width, height, frames, batch, gaussians, ...).
    """
    flags = {**(base_flags or {}), **_tier_mapping(tier)}
    e = estimate(flags, **shape)
    if e["reserved_bytes"] + CUDA_CONTEXT_GIB * GiB > gpu_mem_gb * GiB:
        return False
    return host_mem_gb is None or e["host_bytes"] <= host_mem_gb * GiB


def describe(e: dict) -> str:
    """One line for logs: peak GiB, its phase and the largest parts."""
    top = sorted(e["parts"].items(), key=lambda kv: -kv[1])[:3]
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in top)
    return (
        f"{e['width']}x{e['height']}: peak {e['gpu_bytes'] / GiB:.1f} GiB allocated "
        f"({e['reserved_bytes'] / GiB:.1f} reserved) in {e['phase']}; {parts} GiB; "
        f"host {e['host_bytes'] / GiB:.0f} GiB"
    )
