"""Peak memory of one training iteration per memory tier (DESIGN §6, METHOD §15, §21).

:func:`estimate` is a pure function of the SDS size, frames, batch, Gaussian count and memory
flags; ``tier: auto`` uses :func:`fits` to skip tiers that would not fit the GPU before a job
starts. The model sums what is resident on the GPU in each phase of an iteration and takes the
largest phase:

- **weights**: one DiT expert in bf16 (its exact parameter count from the transformer
  configuration; with ``enable_mmgp`` only mmgp's streaming window: two slices of
  max(budget, a block's largest tensor) plus the modules outside the blocks), the Wan VAE in
  float32 (always: the image condition y uses it), the Tiny VAE and the cached text embeddings;
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
  geometry is detached);
- **contact terms** (:mod:`chord.motion.contact`): the static objects' distance grid, resident,
  and per frame and surface sample :data:`CONTACT_PER_POINT` + a_d bytes of graph.

Phases: the regularisers (weights + temporal and contact graphs); the default SDS (weights +
render graph + encoder graph + max(condition, DiT activations)); with ``split_sds_backward`` a
no-grad target pass (weights + max(no-grad render, no-grad encode, condition, DiT activations) +
the B stored targets) and a backward pass (render graph + encoder graph; with
``split_render_backward`` the larger of the encoder graph plus the video leaf and the render
graph of one ``split_render_chunk_size`` chunk). Without mmgp the active expert stays resident
through the backward (METHOD §15); with it, mmgp unloads it after the targets.

Calibration. a, b, a_d, c, c′, g, g′ and d are least-squares fits of CPU proxy measurements
(``python bench/scaling.py memory-fit``, linear in the counts; the renderer term is the torch
backend's, an upper bound for gsplat's); e, β_h and β_f are analytic (diffusers' Wan block:
bf16 states, float32 norm copies, float64 rotary temporaries). The faked run's trace at A14B's
shapes holds the model 1.01-1.21x above it on every tier (BENCHMARKS.md); the first GPU run's
``bench/gpu_check.py`` table settles the rest. Allocated bytes become reserved bytes with a
fragmentation factor, and :func:`fits` adds a CUDA context.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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

    @classmethod
    def from_folder(cls, ckpt_dir) -> ModelShape:
        """The shapes of a diffusers-format Wan folder: the experts' ``transformer/config.json``
        (diffusers ``WanTransformer3DModel`` arguments), the VAE's ``vae/config.json`` width
        and its parameter count from the weights' safetensors header. Components it cannot
        read keep A14B's values (a folder still being copied, say)."""
        folder = Path(ckpt_dir)
        t = read_json(folder / "transformer" / "config.json")
        if t is None:
            return A14B
        vae = read_json(folder / "vae" / "config.json") or {}
        heads = int(t.get("num_attention_heads", A14B.heads))
        return cls(
            layers=int(t.get("num_layers", A14B.layers)),
            heads=heads,
            head_dim=int(t.get("attention_head_dim", A14B.head_dim)),
            ffn=int(t.get("ffn_dim", A14B.ffn)),
            text_dim=int(t.get("text_dim", A14B.text_dim)),
            in_channels=int(t.get("in_channels", A14B.in_channels)),
            out_channels=int(t.get("out_channels", A14B.out_channels)),
            patch=tuple(int(p) for p in t.get("patch_size", A14B.patch)),
            freq_dim=int(t.get("freq_dim", A14B.freq_dim)),
            vae_base_dim=int(vae.get("base_dim", A14B.vae_base_dim)),
            vae_params=safetensors_numel(folder / "vae") or A14B.vae_params,
            experts=2 if (folder / "transformer_2").is_dir() else 1,
        )

    @property
    def dit(self) -> tuple:
        """The expert's shape alone (what makes a model A14B)."""
        return (self.layers, self.heads, self.head_dim, self.ffn, self.text_dim, self.patch)

    def describe(self) -> str:
        """E.g. "40 layers x 5120 (A14B), 14.3B parameters per expert"."""
        name = " (A14B)" if self.dit == A14B.dit else ""
        n = dit_params(self)
        count = next(
            f"{n / u:.3g}{s}" for u, s in ((1e9, "B"), (1e6, "M"), (1e3, "k"), (1, "")) if n >= u
        )
        return f"{self.layers} layers x {self.dim}{name}, {count} parameters per expert"


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


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def safetensors_numel(folder: Path) -> int | None:
    """Parameters stored in a folder's ``*.safetensors`` files, read from their headers only
    (no weights are loaded); None when there are none or a header is unreadable."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for d in entry["shape"]:
                    count *= int(d)
                total += count
    return total


def model_for(ckpt_dir) -> ModelShape:
    """The model a run uses: the Wan folder's shapes when one is configured, else A14B."""
    return ModelShape.from_folder(ckpt_dir) if ckpt_dir else A14B


def transformer_kwargs(shape: ModelShape, *, rope_max_seq_len: int = 1024) -> dict:
    """diffusers ``WanTransformer3DModel`` arguments of an expert of ``shape`` (those
    :meth:`ModelShape.from_folder` reads back) with Wan 2.2 I2V's fixed choices
    (transformer/config.json of the diffusers release: no image embedding, RMS norm across
    heads)."""
    return {
        "patch_size": tuple(shape.patch),
        "num_attention_heads": shape.heads,
        "attention_head_dim": shape.head_dim,
        "in_channels": shape.in_channels,
        "out_channels": shape.out_channels,
        "text_dim": shape.text_dim,
        "freq_dim": shape.freq_dim,
        "ffn_dim": shape.ffn,
        "num_layers": shape.layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": None,
        "rope_max_seq_len": rope_max_seq_len,
    }


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
#: The contact loss's grid (chord.motion.contact's GRID_CELLS and PAD_CELLS; a test keeps them
#: equal): cubic cells, CELLS along the longest side of the static objects' box, PAD more on
#: each side. An axis has at most CELLS + 2·PAD + 2 nodes (its ends, and a ceil that rounds
#: past CELLS + PAD), so a cube is any static scene's worst case: 138³ nodes, 10.5 MB.
CONTACT_GRID_CELLS, CONTACT_PAD_CELLS = 128, 4
#: Bytes per frame and point of the contact loss's graph at its peak, grid_sample's backward
#: (float32, analytic, from contact_loss's saved tensors): the points, grid_sample's copy of
#: them and its gradient w.r.t. them (12 each), the distance's gradient (4); the points'
#: deformation graph adds deform_per_gaussian (a Gaussian's, rotation included: a bound).
CONTACT_PER_POINT = 12 + 12 + 4 + 12


def contact_grid_bound(cells: int = CONTACT_GRID_CELLS, pad: int = CONTACT_PAD_CELLS) -> int:
    """The most nodes the contact loss's grid has, for any static objects: a cube's."""
    return (cells + 2 * pad + 2) ** 3


#: reserved / allocated: the caching allocator's margin (small with expandable segments,
#: which training sets, METHOD §15).
FRAGMENTATION = 1.05
#: CUDA context and library workspaces (cuBLAS, cuDNN), GiB.
CUDA_CONTEXT_GIB = 0.8
#: Host RAM besides the experts: the Python process, scene, videos, loaders (GiB).
HOST_BASE_GIB = 6.0


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


def memory_config(flags):
    """A MemoryConfig from one, or from a (partial) mapping of memory flags (validated, the
    schema's defaults filled: chord.config.settings holds the one list of flags)."""
    if isinstance(flags, Mapping):
        from chord.config import settings

        return settings.memory_from_mapping(dict(flags))
    return flags


def estimate(
    flags,
    *,
    width: int,
    height: int,
    frames: int,
    batch: int,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: str | ModelShape = "A14B",
    use_tiny_vae: bool = True,
    expert_bytes: int = 2,
    gpus: int = 1,
    contact_points: int = 0,
    contact_grid_nodes: int | None = None,
) -> dict:
    """Peak GPU memory and host RAM of one training iteration.

    Args:
        flags: the memory flags, a :class:`chord.config.settings.MemoryConfig` (or a mapping of
            some of them; the others take their defaults).
        width, height, frames, batch: the SDS size trained at, frame_num and the videos per
            GPU (batch_size on one GPU; batch_size / gpus on a multi-GPU tier).
        gaussians: all Gaussians of the scene (every frame renders them);
        dynamic_gaussians: those of the dynamic objects (temporal loss), default all.
        model: "A14B" or a :class:`ModelShape`.
        use_tiny_vae: the method's flag.
        expert_bytes: bytes per expert weight: 2 (bf16), 4 for the float32 fallback (which
            also doubles the DiT activations).
        gpus: the ranks of a data-parallel training (one process per GPU, METHOD §18): the
            GPU figures are per GPU, the host RAM is that of all ranks (each holds an expert).
        contact_points: the dynamic objects' surface samples the contact terms read, all
            together, once per iteration (``Trainer.regularisers``); 0: off, no contact parts.
        contact_grid_nodes: the nodes of the static objects' grid (a built one's
            ``values.numel()``); None: the worst case, :func:`contact_grid_bound`.

    Returns:
        {"gpu_bytes": peak allocated (per GPU), "reserved_bytes": with the fragmentation
        margin, "host_bytes": host RAM (all ranks), "phase": the phase that peaks, "phases":
        {phase: bytes}, "parts": {part: bytes}, "width", "height", "tokens", "batch": videos
        per GPU, "gpus"}.

    Example:
        >>> from chord.resources import peak_memory as m
        >>> e = m.estimate({}, width=832, height=480, frames=41, batch=4, gaussians=200_000)
        >>> e["gpu_bytes"] > 48 * m.GiB  # the default mode needs more than 48 GB
        True
    """
    s = MODELS[model] if isinstance(model, str) else model
    f = memory_config(flags)
    W, H = int(width), int(height)
    T, B, N = int(frames), int(batch), int(gaussians)
    Nd = N if dynamic_gaussians is None else int(dynamic_gaussians)
    if min(W, H, T, B, N, int(gpus)) <= 0:
        raise ValueError(
            f"expected positive sizes, got {W}x{H}, {T} frames, batch {B}, N {N}, gpus {gpus}"
        )
    c = CPU_PROXY
    px = W * H
    f4 = T + (-T % 4)
    L = tokens(W, H, T, s)
    fl, lh, lw = latent_shape(W, H, T)

    expert = dit_params(s) * expert_bytes
    window = dit_window(s, f, expert_bytes)
    parts = {
        "dit_weights": window,
        "vae_weights": s.vae_params * 4,
        "tiny_vae_weights": s.tiny_vae_params * 4 if use_tiny_vae else 0,
        "text": 2 * s.text_len * s.text_dim * 2,
        "render_graph": int(c["render_per_gaussian"] * T * N + c["render_per_pixel"] * T * px),
        "video": T * 3 * px * 4,
        "encoder_graph": int(
            (c["tiny_vae_ckpt_per_pixel"] if f.checkpoint_tiny_vae else c["tiny_vae_per_pixel"])
            * f4
            * px
            if use_tiny_vae
            else c["wan_vae_per_base_pixel"] * s.vae_base_dim * T * px
        ),
        "nograd_encode": int(  # the Wan VAE's no-grad encode is as large as the condition's
            (
                c[
                    "tiny_vae_ckpt_nograd_per_pixel"
                    if f.checkpoint_tiny_vae
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
            (2 if f.sds_cfg_batch else 1)
            * L
            * (DIT_PER_TOKEN_DIM * s.dim + DIT_PER_TOKEN_FFN * s.ffn)
            * expert_bytes
            / 2
        ),
        "targets": B * 16 * fl * lh * lw * 4,
        "temporal_graph": int(  # geometry detached: the deform graph and B·(T − 1) images
            c["deform_per_gaussian"] * T * Nd + B * c["render_per_pixel"] * (T - 1) * px
        ),
    }
    static = parts["vae_weights"] + parts["tiny_vae_weights"] + parts["text"]
    if contact_points > 0:  # the grid and each point's depth at rest, the loss's graph
        nodes = contact_grid_bound() if contact_grid_nodes is None else int(contact_grid_nodes)
        parts["contact_grid"] = 4 * (nodes + int(contact_points))
        per_point = CONTACT_PER_POINT + c["deform_per_gaussian"]  # the loss's, the deformation's
        parts["contact_graph"] = int(per_point * T * int(contact_points))
        static += parts["contact_grid"]
    resident = static + window  # the expert stays between iterations without mmgp
    between = static + (0 if f.enable_mmgp else window)
    nograd_render = parts["video"] * 2  # the output plus the compositor's buffers
    dit_phase = max(parts["condition"], parts["dit_activations"])
    phases = {"regularisers": between + parts["temporal_graph"] + parts.get("contact_graph", 0)}
    if not f.split_sds_backward:
        if f.split_render_backward:
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
        if f.split_render_backward:
            back = max(parts["video"] + parts["encoder_graph"], _chunk_graph(parts, f, T, N, px))
        else:
            back = parts["render_graph"] + parts["encoder_graph"]
        phases["sds_backward"] = between + parts["targets"] + back
    # one expert in host RAM: a switch drops the other before loading (chord.guidance.wan)
    host = expert + HOST_BASE_GIB * GiB
    if f.enable_mmgp:
        host += expert // 2  # mmgp's pinned staging of the active expert's blocks
    host *= int(gpus)  # one process per GPU, each with its expert, scene and loaders
    return summary(phases, parts, host, width=W, height=H, tokens=L, batch=B, gpus=int(gpus))


def dit_window(s: ModelShape, flags, expert_bytes: int = 2) -> int:
    """The expert's bytes on the GPU while it runs: all of it, or (``enable_mmgp``) two slices
    of max(budget, a block's largest tensor: its FFN's; the time projection is outside the
    blocks), at most the blocks, and the modules outside them (as chord.checks.fake_mmgp)."""
    expert = dit_params(s) * expert_bytes
    if not flags.enable_mmgp:
        return expert
    blocks = s.layers * dit_block_params(s) * expert_bytes
    largest = max(s.dim * s.dim, s.dim * s.ffn) * expert_bytes
    window = min(2 * max(int(flags.mmgp_transformer_budget) * MiB, largest), blocks)
    return window + expert - blocks


def summary(phases: dict, parts: dict, host: int, **shape) -> dict:
    """An estimate's mapping: the peak phase's GPU bytes (allocated and, with the allocator's
    margin, reserved), the host bytes, the phases and parts (bytes), then ``shape``."""
    phase = max(phases, key=phases.get)
    return {
        "gpu_bytes": int(phases[phase]),
        "reserved_bytes": int(phases[phase] * FRAGMENTATION),
        "host_bytes": int(host),
        "phase": phase,
        "phases": {k: int(v) for k, v in phases.items()},
        "parts": {k: int(v) for k, v in parts.items()},
        **shape,
    }


def _chunk_graph(parts: dict, f, T: int, N: int, px: int) -> int:
    """Render graph of one re-render chunk (split_render_backward) plus the video gradient."""
    chunk = T if int(f.split_render_chunk_size) == -1 else min(T, int(f.split_render_chunk_size))
    c = CPU_PROXY
    return (
        int(c["render_per_gaussian"] * chunk * N + c["render_per_pixel"] * chunk * px)
        + parts["video"]
    )


def fits(flags, gpu_mem_gb: float, *, host_mem_gb: float | None = None, **shape) -> bool:
    """Whether a training with the memory flags ``flags`` (as :func:`estimate` takes them)
    fits a GPU of ``gpu_mem_gb`` GB (read as GiB: reserved bytes plus a CUDA context must
    fit), and ``host_mem_gb`` of host RAM when given. ``shape``: the keyword arguments of
    :func:`estimate` (width, height, frames, batch, gaussians, ...)."""
    e = estimate(flags, **shape)
    if e["reserved_bytes"] + CUDA_CONTEXT_GIB * GiB > gpu_mem_gb * GiB:
        return False
    return host_mem_gb is None or e["host_bytes"] <= host_mem_gb * GiB


def describe(e: dict) -> str:
    """One line for logs: peak GiB, its phase and the largest parts."""
    top = sorted(e["parts"].items(), key=lambda kv: -kv[1])[:3]
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in top)
    gpus = e.get("gpus", 1)
    each = f" per GPU ({e['batch']} video(s) on each of {gpus})" if gpus > 1 else ""
    ranks = f" ({gpus} ranks)" if gpus > 1 else ""
    p = e["parts"]
    contact = (
        f"; contact loss {p['contact_grid'] / MiB:.1f} MiB resident (grid), "
        f"{p['contact_graph'] / MiB:.1f} MiB in the regularisers"
        if "contact_graph" in p
        else ""
    )
    return (
        f"{e['width']}x{e['height']}: peak {e['gpu_bytes'] / GiB:.1f} GiB allocated "
        f"({e['reserved_bytes'] / GiB:.1f} reserved){each} in {e['phase']}; {parts} GiB"
        f"{contact}; host {e['host_bytes'] / GiB:.0f} GiB{ranks}"
    )
