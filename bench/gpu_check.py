"""GPU check: peak memory and time per memory tier at the real shapes, and renderer parity.

    python bench/gpu_check.py [--json gpu_check.json] [--tiers full,split,...]   # a GPU
    python bench/gpu_check.py --tiny                                            # CPU, CI

One command, no network, within 8 minutes on one H100/H200-class GPU (an estimate: the setup
takes about a minute, each tier two iterations; it has not run on a GPU yet). It builds,
with random weights: one Wan 2.2 I2V A14B-shaped DiT expert from the real transformer
configuration (40 layers, 40 heads of 128, FFN 13824, text dim 4096, 36 in / 16 out channels,
patch 1x2x2) in bf16, as the high-noise expert that iterations 1 and 2 use (t = 0.98); the
real-shaped Wan 2.1 VAE (float32, saved to and loaded from a temporary diffusers folder as
chord.guidance.wan loads it); the Tiny VAE encoder (TAEHV); random cached text embeddings
(512 x 4096); and a demo-like scene (a block skinned by 12 control points on a slab) of
100,000 Gaussians. Then, for each tier, two
training iterations (chord.train.Trainer.step, the real code path) at 832x480, 41 frames,
batch 4, Tiny VAE on:

    full        no memory flags
    split       split_sds_backward, split_render_backward, split_render_chunk_size 21,
                checkpoint_tiny_vae
    split_plain split without checkpoint_tiny_vae (what the checkpoints save)
    offload     split + enable_mmgp (profile 4.0, transformer budget 100 MB)
    lowres      offload at 576x320
    lowres_min  offload at 416x240

and prints one table: tier, peak torch.cuda.max_memory_allocated and max_memory_reserved, the
estimate of chord.memory for the same shapes, and the seconds of the second iteration split
into render (Gaussians to video, with the deformation), encode (Tiny VAE latents and the Wan
VAE image condition), DiT (the CFG-batched expert calls, with mmgp's transfers) and backward
(everything else: the SDS and regulariser backward passes, the regularisers, Adam). Each tier
fails soft: an out-of-memory error (or any other) is a row, not a crash. Then a renderer
parity figure: gsplat against the project's torch rasteriser on the same GPU tensors (one
view of 8 frames of the scene): mean and max |difference|, PSNR, and the cosine between the
two gradients of the means.

--tiny runs the same code on a CPU at tiny shapes (a one-block transformer of the tiny test
configuration, a base-width-8 Wan VAE, 2,000 Gaussians, 64x48 (lowres 48x32, 32x16), 9
frames, batch 2); peaks are then the process's RSS above its baseline, the mmgp tiers fail
soft (mmgp needs CUDA) and the parity figure is skipped. CI runs it
(tests/unit/test_gpu_check.py).

Dependencies on a machine without network. The GPU image needs, besides PyTorch with CUDA,
transformers, accelerate, safetensors, numpy, scipy and pillow (usually present): diffusers,
gsplat, mmgp (with its requirements, e.g. optimum-quanto), trimesh, plyfile, jsonschema and
pyyaml. Carry them as wheels: on a machine with pip access, from the repository root,

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl diffusers==0.35.2 gsplat==1.5.3 mmgp==3.8.2 optimum-quanto trimesh plyfile \\
        jsonschema jsonschema-specifications referencing rpds-py pyyaml ftfy
    # (list each wheel's Requires-Dist with: unzip -p .whl/NAME-*.whl '*/METADATA')

then on the GPU machine, before the check:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    python3 bench/gpu_check.py --json $OUT/gpu_check.json

gsplat compiles its CUDA kernels on first use (nvcc, one to a few minutes; cached in
TORCH_EXTENSIONS_DIR): run `python3 -c "import gsplat.cuda._backend"` once beforehand, or
carry a prebuilt gsplat wheel for the image's torch/CUDA, to keep the check inside its budget.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling import block_scene  # noqa: E402

from chord import config as cc  # noqa: E402
from chord import memory, train  # noqa: E402

SPLIT_PLAIN = {
    "split_sds_backward": True,
    "split_render_backward": True,
    "split_render_chunk_size": 21,
}
SPLIT = {**SPLIT_PLAIN, "checkpoint_tiny_vae": True}
MMGP = {**SPLIT, "enable_mmgp": True, "mmgp_profile": 4.0, "mmgp_transformer_budget": 100}
TIERS = {
    "full": ({}, None),
    "split": (SPLIT, None),
    "split_plain": (SPLIT_PLAIN, None),
    "offload": (MMGP, None),
    "lowres": (MMGP, (576, 320)),
    "lowres_min": (MMGP, (416, 240)),
}
TINY_LOWRES = {"lowres": (48, 32), "lowres_min": (32, 16)}

#: diffusers WanTransformer3DModel arguments of Wan2.2-I2V-A14B (transformer/config.json).
A14B_CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 36,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "rope_max_seq_len": 1024,
}
TINY_CONFIG = {
    **A14B_CONFIG,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "text_dim": 32,
    "freq_dim": 32,
    "ffn_dim": 32,
    "num_layers": 1,
    "rope_max_seq_len": 64,
}


# -- setup ------------------------------------------------------------------------------------
def random_expert(config: dict, device, dtype) -> torch.nn.Module:
    """A randomly initialised WanTransformer3DModel built directly in ``dtype`` on ``device``
    (no float32 copy: 14B parameters are 26.6 GiB in bf16)."""
    from diffusers import WanTransformer3DModel

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = WanTransformer3DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def write_folder(folder: Path, config: dict, *, tiny: bool) -> Path:
    """A diffusers-format Wan 2.2 I2V folder: model_index.json, a random Wan VAE (saved and
    later loaded like a real one) and the transformer configurations. The experts themselves
    are built on the device and injected (writing 2 x 28 GB of random weights would take most
    of the budget), so their folders hold an empty safetensors file for the folder check."""
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    from chord.guidance import tiny_models

    torch.manual_seed(0)
    vae = tiny_models.tiny_vae() if tiny else AutoencoderKLWan()
    vae.save_pretrained(folder / "vae")
    for name in ("transformer", "transformer_2"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        cfg = {"_class_name": "WanTransformer3DModel", **config, "patch_size": [1, 2, 2]}
        (folder / name / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file({}, str(folder / name / "injected-random-weights.safetensors"))
    index = {"_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9}
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def make_guidance(folder: Path, expert, device, *, mmgp: bool):
    from chord.guidance import wan
    from chord.guidance.tiny_vae import TinyVAEEncoder

    residency = None
    if mmgp:
        from chord.guidance.mmgp_residency import MMGPResidency

        residency = MMGPResidency(MMGP["mmgp_profile"], MMGP["mmgp_transformer_budget"])
    torch.manual_seed(0)
    guide = wan.WanGuidance(
        folder, device=device, sds_cfg_batch=True, tiny_vae=TinyVAEEncoder(), mmgp=residency
    )
    # t ≈ 0.98 at iterations 1 and 2: the high-noise expert serves both (METHOD §9)
    guide.experts = {"transformer": expert}
    return guide


def model_shape(config: dict, vae_base: int, vae_params: int) -> memory.ModelShape:
    """chord.memory's view of the models this check builds."""
    return memory.ModelShape(
        layers=config["num_layers"],
        heads=config["num_attention_heads"],
        head_dim=config["attention_head_dim"],
        ffn=config["ffn_dim"],
        text_dim=config["text_dim"],
        in_channels=config["in_channels"],
        out_channels=config["out_channels"],
        patch=tuple(config["patch_size"]),
        freq_dim=config["freq_dim"],
        vae_base_dim=vae_base,
        vae_params=vae_params,
    )


# -- measuring -----------------------------------------------------------------------------------
class Clock:
    """Wall seconds per named phase, synchronised on CUDA; wraps bound methods in place."""

    def __init__(self, cuda: bool):
        self.cuda, self.times = cuda, defaultdict(float)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.times[key] += time.perf_counter() - start

        setattr(obj, name, timed)


class Peak:
    """Peak allocated / reserved bytes since :meth:`reset`: the CUDA allocator's counters, or
    on a CPU the largest RSS above the RSS at reset, sampled every 2 ms by a thread (both
    columns then hold it). :meth:`read` returns None before the first reset of a tier."""

    def __init__(self, cuda: bool):
        self.cuda, self.armed, self._stop = cuda, False, None

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def disarm(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            self._stop = None
        self.armed = False

    def reset(self) -> None:
        self.disarm()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.base = self.high = self._rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.armed = True

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.high = max(self.high, self._rss())

    def read(self) -> tuple[int | None, int | None]:
        if not self.armed:
            return None, None
        if self.cuda:
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        self.high = max(self.high, self._rss())
        return self.high - self.base, self.high - self.base


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def run_tier(name, flags, size, ctx) -> dict:
    """Two training iterations of one tier; the second is timed."""
    W, H = size
    method = cc.method_from_mapping(
        {
            "size": f"{W}*{H}",
            "frame_num": ctx["frames"],
            "batch_size": ctx["batch"],
            "seed": 0,
            "use_tiny_vae": True,
            "iterations": 3000,
            **{k: v for k, v in flags.items() if k != "enable_mmgp"},
            "enable_mmgp": bool(flags.get("enable_mmgp")),
        }
    )
    guide = ctx["guidance"](bool(flags.get("enable_mmgp")))
    tr = train.Trainer(
        scene=ctx["scene"],
        guidance=guide,
        text=ctx["text"],
        method=method,
        width=W,
        height=H,
        memory=train.MemoryFlags.from_method(method),
    )
    clock = Clock(ctx["cuda"])
    clock.wrap(tr, "render", "render")
    clock.wrap(guide, "encode_video", "encode")
    clock.wrap(guide, "condition", "encode")
    clock.wrap(guide, "velocity", "dit")
    ctx["peak"].reset()
    tr.step(1)
    clock.times.clear()
    clock.sync()
    start = time.perf_counter()
    tr.step(2)
    clock.sync()
    total = time.perf_counter() - start
    allocated, reserved = ctx["peak"].read()
    t = dict(clock.times)
    other = total - sum(t.values())
    return {
        "status": "ok",
        "allocated": allocated,
        "reserved": reserved,
        "s_it": total,
        "render": t.get("render", 0.0),
        "encode": t.get("encode", 0.0),
        "dit": t.get("dit", 0.0),
        "backward": other,
    }


def tier_rows(ctx, names) -> list[dict]:
    rows = []
    for name in names:
        flags, size = TIERS[name]
        if ctx["tiny"]:
            size = TINY_LOWRES.get(name)
        size = size or (ctx["width"], ctx["height"])
        est = memory.estimate(
            flags,
            width=size[0],
            height=size[1],
            frames=ctx["frames"],
            batch=ctx["batch"],
            gaussians=ctx["gaussians"],
            dynamic_gaussians=ctx["gaussians"] // 2,
            model=ctx["shape"],
        )
        row = {"tier": name, "size": f"{size[0]}x{size[1]}", "estimate": est["gpu_bytes"]}
        ctx["peak"].disarm()
        if time.perf_counter() > ctx.get("deadline", math.inf):
            row["status"] = "skipped: over the --budget-s time budget"
            rows.append(row)
            print_row(row, ctx["cuda"], flush=True)
            continue
        try:
            row.update(run_tier(name, flags, size, ctx))
        except Exception as exc:  # fail soft: one tier's failure is a row
            allocated, reserved = ctx["peak"].read()
            row.update(allocated=allocated, reserved=reserved)
            if is_oom(exc):
                row["status"] = "out of memory"
            else:
                row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
                if ctx["verbose"]:
                    traceback.print_exc()
        finally:
            ctx["peak"].disarm()
            gc.collect()
            if ctx["cuda"]:
                torch.cuda.empty_cache()
        rows.append(row)
        print_row(row, ctx["cuda"], flush=True)
    return rows


def print_header(cuda: bool) -> None:
    unit = "GiB" if cuda else "MiB"
    print(
        f"{'tier':10s} {'size':>7s} {'alloc ' + unit:>10s} {'resvd ' + unit:>10s} "
        f"{'model ' + unit:>10s} {'s/it':>6s} {'render':>6s} {'encode':>6s} {'DiT':>6s} "
        f"{'backwd':>6s}  status"
    )


def print_row(row: dict, cuda: bool, flush: bool = False) -> None:
    div = memory.GiB if cuda else memory.MiB

    def mem(key):
        return f"{row[key] / div:10.2f}" if row.get(key) is not None else f"{'-':>10s}"

    def sec(key):
        return f"{row[key]:6.2f}" if key in row else f"{'-':>6s}"

    print(
        f"{row['tier']:10s} {row['size']:>7s} {mem('allocated')} {mem('reserved')} "
        f"{mem('estimate')} {sec('s_it')} {sec('render')} {sec('encode')} {sec('dit')} "
        f"{sec('backward')}  {row['status']}",
        flush=flush,
    )


# -- renderer parity -----------------------------------------------------------------------------
def parity(scene, width: int, height: int, device) -> dict:
    """gsplat vs the torch rasteriser on the same inputs: image difference and gradient
    cosine (8 frames, one orbit view, white background)."""
    from chord import cameras
    from chord.render import gsplat_backend, render_video

    if device.type != "cuda" or not gsplat_backend.available():
        return {"status": "skipped: gsplat needs CUDA and its extension"}
    K = cameras.intrinsics(width, height).to(device)
    vm = cameras.orbit_viewmats(torch.tensor(20.0), torch.tensor(45.0), 2.0).to(device)
    bg = torch.ones(3, device=device)
    frames = torch.arange(8, device=device)
    out = {}
    weights = None
    for backend in ("gsplat", "torch"):
        scene.zero_grad(set_to_none=True)
        video = render_video(
            scene.frame_gaussians(frames), vm, K, width, height, bg, backend=backend
        )
        if weights is None:
            weights = torch.rand(video.shape, generator=torch.Generator().manual_seed(0)).to(device)
        (video * weights).sum().backward()
        grad = torch.cat([p.grad.reshape(-1) for p in scene.parameters() if p.grad is not None])
        out[backend] = (video.detach(), grad)
    a, b = out["gsplat"][0], out["torch"][0]
    mse = float((a - b).square().mean())
    ga, gb = out["gsplat"][1], out["torch"][1]
    return {
        "status": "ok",
        "mean_abs": float((a - b).abs().mean()),
        "max_abs": float((a - b).abs().max()),
        "psnr_db": 10 * math.log10(1.0 / max(mse, 1e-20)),
        "grad_cosine": float(torch.nn.functional.cosine_similarity(ga, gb, dim=0)),
    }


# -- main ----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (CI)")
    p.add_argument("--tiers", default=",".join(TIERS), help="comma-separated subset")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--gaussians", type=int, default=None)
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed tiers")
    p.add_argument(
        "--budget-s", type=float, default=420.0, help="start no tier after this many seconds"
    )
    args = p.parse_args(argv)
    names = [n for n in args.tiers.split(",") if n]
    unknown = sorted(set(names) - set(TIERS))
    if unknown:
        p.error(f"--tiers: unknown {unknown}; choose from {list(TIERS)}")
    tiny = args.tiny
    cuda = torch.cuda.is_available() and not tiny
    if not tiny and not cuda:
        p.error("no CUDA GPU here: run with --tiny for the CPU check")
    device = torch.device("cuda" if cuda else "cpu")
    if tiny:
        torch.set_num_threads(1)
    config = TINY_CONFIG if tiny else A14B_CONFIG
    width, height, frames, batch = (64, 48, 9, 2) if tiny else (832, 480, 41, 4)
    gaussians = args.gaussians or (2000 if tiny else 100_000)
    dtype = torch.float32 if not cuda else torch.bfloat16
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(Path(tmp) / "wan", config, tiny=tiny)
        expert = random_expert(config, device, dtype)
        from diffusers import AutoencoderKLWan

        vae_cfg = AutoencoderKLWan.load_config(folder / "vae")
        with torch.device("meta"):
            vae_params = sum(p.numel() for p in AutoencoderKLWan.from_config(vae_cfg).parameters())
        scene = block_scene(gaussians, frames).to(device)
        text_dim = config["text_dim"]
        g = torch.Generator().manual_seed(0)
        text = {
            "prompt": torch.randn(512, text_dim, generator=g),
            "negative": torch.randn(512, text_dim, generator=g),
        }
        guides = {}

        def guidance(mmgp: bool):
            if mmgp not in guides:
                if mmgp and cuda:
                    guides.pop(False, None)
                    expert.to("cpu")  # mmgp streams it from host RAM
                    gc.collect()
                    torch.cuda.empty_cache()
                guides[mmgp] = make_guidance(folder, expert, device, mmgp=mmgp)
            return guides[mmgp]

        ctx = {
            "tiny": tiny,
            "cuda": cuda,
            "width": width,
            "height": height,
            "frames": frames,
            "batch": batch,
            "gaussians": gaussians,
            "scene": scene,
            "text": text,
            "guidance": guidance,
            "peak": Peak(cuda),
            "shape": model_shape(config, vae_cfg["base_dim"], vae_params),
            "verbose": args.verbose,
            "deadline": started + args.budget_s,
        }
        dev = torch.cuda.get_device_name() if cuda else "CPU (--tiny)"
        print(
            f"gpu_check on {dev}: {width}x{height}, {frames} frames, batch {batch}, "
            f"{gaussians} Gaussians, expert of {memory.dit_params(ctx['shape']) / 1e6:,.1f}M "
            f"parameters ({dtype}), setup {time.perf_counter() - started:.0f} s"
        )
        print_header(cuda)
        rows = tier_rows(ctx, names)
        guides.clear()
        with contextlib.suppress(Exception):
            expert.to("cpu")
        gc.collect()
        par = parity(scene, width, height, device)
    if par["status"] == "ok":
        print(
            f"renderer parity (gsplat vs torch, {width}x{height}, 8 frames): mean |diff| "
            f"{par['mean_abs']:.2e}, max |diff| {par['max_abs']:.2e}, PSNR {par['psnr_db']:.1f} "
            f"dB, gradient cosine {par['grad_cosine']:.4f}"
        )
    else:
        print(f"renderer parity: {par['status']}")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": dev, "rows": rows, "parity": par}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
