"""GPU check: memory and time per tier, the float32 fallback, expert reload, gsplat vs torch.

At the real shapes: peak memory and seconds per memory tier, the float32 fallback's peak, the
expert reload of a switch, and gsplat against the torch rasteriser (parity and timing).

    python bench/gpu_check.py [--json gpu_check.json] [--tiers full,split,...]   # a GPU
        [--extras reload,float32,render_timing] [--float32-size 416x240]
    python bench/gpu_check.py --tiny                                            # CPU, CI

One command, no network, within 8 minutes on one H100/H200-class GPU, gsplat's build aside
(the device machine's calls last at most 600 s, so there bench/gpu_device.sh splits it in two
by sections). Estimates, none measured yet: the setup about a minute (half of it saving the
expert), the tiers two iterations each, the extras about 3 minutes (2.5 to 4) after them. The
work is in sections (tiers without mmgp, the mmgp tiers, reload, float32, render), each
starting rows only within its own budget
(--budget SECTION=S, defaults in BUDGETS), so a long section never costs a later one its rows;
a row left out says so, and the JSON is rewritten after every row. gsplat's kernels are built
first (outside the budgets); --render-backend torch measures without them. The production
allocator (expandable segments) is set before CUDA starts.
It builds, with random weights: one Wan 2.2 I2V
A14B-shaped DiT expert from the real transformer configuration (chord.resources.peak_memory.A14B: 40
layers, 40 heads of 128, FFN 13824, text dim 4096, 36 in / 16 out channels, patch 1x2x2) in
bf16, as the high-noise expert that iterations 1 and 2 use (t = 0.98); the real-shaped Wan 2.1
VAE (float32, saved to and loaded from a temporary diffusers folder as chord.guidance.wan loads
it); the Tiny VAE encoder (TAEHV); random cached text embeddings (512 x 4096); and the faked
trace's scene (chord.checks.fake_iteration.block_on_slab: a block skinned by 8 control points
resting on a slab, with its contact points and the slab's distance grid) of 100,000 Gaussians.
Then, for each tier, two training iterations (chord.training.trainer.Trainer.step, the real code
path) of the workflow's method (config/config.yaml's ``method:``, the contact loss on) at 832x480,
41 frames, batch 4. Each row holds, beside the measured peaks, the peak the faked trace of the
same tier, flags and scene read (``traced``, from bench/gpu_trace.json: ``python
bench/gpu_trace.py --json bench/gpu_trace.json``), so a device run settles the trace's margin
(``allocated / trace``). The tiers are config/config.yaml's ``tiers:``
(chord.resources.tiers.parse), each applied by chord.resources.tiers.apply over the config's
``memory`` values,
plus split_plain derived from split (the shipped config's rows):

    full        no memory flags
    split       split_sds_backward, split_render_backward, split_render_chunk_size 21,
                checkpoint_tiny_vae
    split_plain split without checkpoint_tiny_vae (what the checkpoints save)
    offload     split + enable_mmgp (the config's profile 4.0, transformer budget 100 MB)
    lowres      offload at 576x320
    lowres_min  offload at 416x240

and prints one table: tier, peak torch.cuda.max_memory_allocated and max_memory_reserved, the
estimate of chord.resources.peak_memory for the same shapes, and the seconds of the second
iteration split
into render (Gaussians to video, with the deformation), encode (Tiny VAE latents and the Wan
VAE image condition), DiT (the CFG-batched expert calls, with mmgp's transfers) and backward
(everything else: the SDS and regulariser backward passes, the regularisers, Adam). Each tier
fails soft: an out-of-memory error (or any other) is a row, not a crash. The tiers' expert is
injected into WanGuidance.experts (its _activate then only moves it to the device or hands it
to mmgp). Then the extras (--extras), each failing soft the same way:

    reload         the expert, saved once in the setup with save_pretrained (bf16, 28.6 GB on
                   disk, as transformer_2; transformer hard-links its files), loaded the way a
                   high -> low noise switch loads it: the high-noise expert loaded and resident,
                   then _activate("transformer_2"): release (gc, CUDA cache), wan_folder.load_expert
                   to the CPU, .to(device). Seconds of the save, the first load and each part
                   of the switch, the host RSS peak above its level before the switch, and the
                   GPU's allocated bytes before the switch and at its peak (one expert's worth
                   when the old one goes first). The files were just written, so the reads come
                   mostly from the page cache (a cold read adds 28.6 GB / the disk's
                   bandwidth). About 1 minute: save 15-40 s (setup), two loads of 15-25 s.
    float32        row split_fp32 of a second table: the split tier after
                   guidance.use_float32() (the bf16 expert dropped, reloaded from the folder
                   in float32; weights and arithmetic in float32, no autocast) at 416x240
                   (--float32-size), its peaks beside chord.resources.peak_memory.estimate(...,
                   expert_bytes=4), and that estimate at 832x480. Without bf16 tensor cores an
                   iteration takes about 25-35 s at 416x240: 60-90 s for the row. At 832x480
                   about 3 minutes an iteration: a run of its own (--tiers "" --extras float32
                   --float32-size 832x480 --budget float32=300, about 7 minutes).
    render_timing  gsplat and the torch rasteriser on the parity view (8 frames): seconds
                   (median of up to 3 after a warm-up, CUDA-synchronised; a mode's runs stop
                   after 15 s) and the peak allocated above the resident, without grad (the
                   split tiers' target renders) and forward+backward to the per-frame Gaussians
                   (the deformation outside the timing). Under a minute; gsplat milliseconds.

Last, a renderer parity figure: gsplat against the project's torch rasteriser on the same GPU
tensors (one view of 8 frames of the scene): mean and max |difference|, PSNR, and the cosine
between the two gradients of the means. --json writes every part (keys device, rows, reload,
float32, parity, render_timing) after each part, so a run cut short keeps what it measured.

--tiny runs the same code on a CPU at tiny shapes (a one-block transformer of the tiny test
configuration, a base-width-8 Wan VAE, 2,000 Gaussians, 64x48 (lowres 48x32, 32x16; the
float32 row 32x16), 9 frames, batch 2); peaks are then the process's RSS above its baseline,
the mmgp tiers fail soft (mmgp needs CUDA), the reload row saves and loads the tiny expert,
and the parity figure and the renderer timing are skipped. CI runs it
(tests/processes/test_gpu_check_run.py). The temporary folder is under TMPDIR: on a GPU it
needs about 30 GB free (else the reload and float32 rows are skipped and say so).

Dependencies on a machine without network (the device machine): its image has PyTorch with
CUDA, transformers, accelerate, safetensors, numpy, scipy, pillow, pyyaml, pandas and more
(bench/gpu_image_packages.txt); every other wheel that this check and the training import is
pinned in bench/gpu_wheels.txt (diffusers at CI's version, gsplat, mmgp and optimum-quanto,
trimesh, libigl, plyfile, jsonschema, ftfy, wcwidth, ...), and CI runs --tiny and a training
iteration with everything else blocked (bench/gpu_imports.py), so a missing wheel fails CI
here. bench/gpu_device.sh fills .whl/ here (--fetch-wheels), and there installs it, records
the GPU, torch, CUDA and torch.cuda.get_arch_list(), builds gsplat's kernels and runs this
check in two calls of at most 540 s of budgets each (--part 1, --part 2; --dry-run prints
the plan); BENCHMARKS.md gives the commands. By hand, with the wheels installed:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    python3 bench/gpu_check.py --json $OUT/gpu_check.json

gsplat compiles its CUDA kernels on first use (its wheel holds the CUDA sources; nvcc, one to
a few minutes): the check builds them first, outside the section budgets, as the training
does (chord.render.gsplat_backend: under a lock, in TORCH_EXTENSIONS_DIR/chord-gsplat/<build>/
sm_<cc>, for this card only), so a second run finds them; `python3 -c "from chord.cli.main import
main; main(['build-kernels'])"` builds them ahead (gpu_device.sh does, within a budget), and
--render-backend torch measures without them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

from chord.checks import fake_iteration
from chord.config import settings
from chord.resources import peak_memory, tiers
from chord.training import trainer

if __package__:
    from bench import fixtures
else:
    import fixtures

CONFIG = fixtures.ROOT / "config" / "config.yaml"
#: the faked trace of the same runs (``python bench/gpu_trace.py --json bench/gpu_trace.json``):
#: its peaks go beside the measured ones, so one device call settles the trace's margin
TRACE = fixtures.ROOT / "bench" / "gpu_trace.json"
#: a tiny size's rows (--tiny): the lowres tiers and the float32 row at sizes below 64x48
TINY_LOWRES = {"lowres": (48, 32), "lowres_min": (32, 16), "split_fp32": (32, 16)}
EXTRAS = ("reload", "float32", "render_timing")
PLACEHOLDER = "injected-random-weights.safetensors"
#: the --tiny expert: the one-block shape of chord.guidance.tiny_models.tiny_transformer
TINY = dataclasses.replace(
    peak_memory.A14B, layers=1, heads=2, head_dim=8, ffn=32, text_dim=32, freq_dim=32
)


def workflow_method(width: int, height: int, frames: int, batch: int, config: Path = CONFIG):
    """The workflow's method (``config``'s ``method:``, the contact loss included) at the
    check's size, frames and batch, seed 0."""
    conf = settings.validate_config(settings.read_yaml(config))
    over = {"size": f"{width}*{height}", "frame_num": frames, "batch_size": batch, "seed": 0}
    return settings.method_from_mapping({**conf["method"], **over}, where=f"{config}: method")


def traced_peaks(path: Path, frames: int, batch: int, gaussians: int) -> dict:
    """``{(tier, "WxH", flags): traced peak bytes}`` of the faked trace at ``path`` for runs of
    these frames, batch and Gaussians; {} when there is none, and {} with one line naming the
    file when it cannot be read as a trace."""
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        print(f"gpu_check: {path}: not read ({exc}); no trace beside the rows")
        return {}
    peaks = {}
    try:
        for r in report["tiers"]:
            if r.get("ok") and (r["frames"], r["batch"], r.get("gaussians")) == (
                frames, batch, gaussians,
            ):  # fmt: skip
                flags = json.dumps(r["flags"], sort_keys=True)
                peaks[r["tier"], r["size"].replace("*", "x"), flags] = int(r["traced_peak_bytes"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        print(f"gpu_check: {path}: not a trace ({type(exc).__name__}: {exc}); no trace column")
        return {}
    return peaks


def tier_table(width: int, height: int, config: Path = CONFIG) -> dict[str, tuple]:
    """``{row: (MemoryConfig, (W, H))}`` of the check: each tier of ``config``'s ``tiers:``
    (chord.resources.tiers.parse) as a training of ``width`` x ``height`` runs it
    (chord.resources.tiers.apply over
    the config's ``memory`` values: the lowres tiers lower the size), in the config's order,
    with ``split_plain`` (split without checkpoint_tiny_vae: what the checkpoints save) after
    ``split``. The config is validated (the schema's defaults filled) without its scene sheet,
    which would need pandas on the GPU image."""
    conf = settings.validate_config(settings.read_yaml(config))
    memory = settings.memory_from_mapping(conf["memory"])
    method = settings.method_from_mapping({"size": f"{width}*{height}"})
    rows = {}
    for name, tier in tiers.parse(conf["tiers"]).items():
        m, mem = tiers.apply(method, memory, tier)
        rows[name] = (mem, settings.parse_size(m.size))
        if name == "split":
            plain = dataclasses.replace(mem, checkpoint_tiny_vae=False)
            rows["split_plain"] = (plain, rows[name][1])
    return rows


# -- setup ------------------------------------------------------------------------------------
def random_expert(config: dict, device, dtype) -> torch.nn.Module:
    """A randomly initialised WanTransformer3DModel built directly in ``dtype`` on ``device``
    (no float32 copy: 14B parameters are 26.6 GiB in bf16), its ``_keep_in_fp32_modules``
    parameters in float32 as ``from_pretrained`` leaves them."""
    from diffusers import WanTransformer3DModel

    from chord.guidance.mmgp_residency import kept_in_float32

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = WanTransformer3DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    for name, p in model.named_parameters():
        if kept_in_float32(model, name):
            p.data = p.data.float()
    return model.eval().requires_grad_(False)


def write_folder(folder: Path, config: dict, *, tiny: bool) -> Path:
    """A diffusers-format Wan 2.2 I2V folder: model_index.json, a random Wan VAE (saved and
    later loaded like a real one) and the transformer configurations. The tiers' expert is
    built on the device and injected, so the expert folders hold an empty safetensors file
    for the folder check until :func:`save_expert` writes real weights."""
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    from chord.guidance import tiny_models

    torch.manual_seed(0)
    vae = tiny_models.tiny_vae() if tiny else AutoencoderKLWan()
    vae.save_pretrained(folder / "vae")
    for name in ("transformer", "transformer_2"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        cfg = {"_class_name": "WanTransformer3DModel", **config}
        cfg["patch_size"] = list(config["patch_size"])
        (folder / name / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file({}, str(folder / name / PLACEHOLDER))
    index = {"_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9}
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def save_expert(expert, folder: Path) -> dict:
    """Write the random expert once (save_pretrained, bf16 on a GPU) as the low-noise expert
    ``transformer_2``; ``transformer`` gets hard links to the same files (no second copy), so
    WanGuidance can load either from disk. Skipped when the disk lacks the room."""
    need = sum(p.numel() * p.element_size() for p in expert.parameters())
    free = shutil.disk_usage(folder).free
    if free < need + peak_memory.GiB:
        return {
            "status": f"skipped: {free / peak_memory.GiB:.1f} GiB free in {folder.parent}, the "
            f"expert needs {need / peak_memory.GiB:.1f} GiB (point TMPDIR at a larger disk)"
        }
    high, low = folder / "transformer", folder / "transformer_2"
    start = time.perf_counter()
    expert.save_pretrained(low)
    save_s = time.perf_counter() - start
    for f in [*high.iterdir(), low / PLACEHOLDER]:
        f.unlink()
    for f in low.iterdir():
        try:
            os.link(f, high / f.name)
        except OSError:  # a file system without hard links
            (high / f.name).symlink_to(f)
    return {"status": "ok", "save_s": save_s, "weights_bytes": need}


def make_guidance(folder: Path, expert, device, mem=None):
    """WanGuidance as chord.guidance.wan.from_config builds it for the memory flags ``mem``
    (None: the defaults, no mmgp), with a random Tiny VAE and ``expert`` injected."""
    from chord.guidance import wan
    from chord.guidance.tiny_vae import TinyVAEEncoder

    residency = None
    if mem is not None and mem.enable_mmgp:
        from chord.guidance.mmgp_residency import MMGPResidency

        residency = MMGPResidency(mem.mmgp_profile, mem.mmgp_transformer_budget)
    torch.manual_seed(0)
    cfg_batch = True if mem is None else mem.sds_cfg_batch
    guide = wan.WanGuidance(
        folder, device=device, sds_cfg_batch=cfg_batch, tiny_vae=TinyVAEEncoder(), mmgp=residency
    )
    if expert is not None:  # else _activate loads from the folder
        # t ≈ 0.98 at iterations 1 and 2: the high-noise expert serves both (METHOD §9);
        # _activate finds it loaded (no load) and moves it to the device or hands it to mmgp
        guide.experts = {"transformer": expert}
    return guide


# -- measuring -----------------------------------------------------------------------------------
def timer(cuda: bool) -> fixtures.MethodTimer:
    """Wall seconds per wrapped method, synchronised on CUDA."""
    return fixtures.MethodTimer(sync=torch.cuda.synchronize if cuda else None)


class Peak:
    """Peak allocated / reserved bytes since :meth:`reset`: the CUDA allocator's counters, or
    on a CPU the largest RSS above the RSS at reset, sampled every 2 ms by a thread (both
    columns then hold it). :meth:`read` returns None before the first reset of a tier."""

    def __init__(self, cuda: bool):
        self.cuda, self.armed, self._stop = cuda, False, None

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
            self.base = self.high = fixtures.rss_bytes()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.armed = True

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.high = max(self.high, fixtures.rss_bytes())

    def read(self) -> tuple[int | None, int | None]:
        if not self.armed:
            return None, None
        if self.cuda:
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        self.high = max(self.high, fixtures.rss_bytes())
        return self.high - self.base, self.high - self.base


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def failure(exc: BaseException, verbose: bool = False) -> str:
    """A failed part's status: "out of memory" or the error's first line."""
    if is_oom(exc):
        return "out of memory"
    if verbose:
        traceback.print_exc()
    return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"


def soft(fn, *args, verbose: bool = False) -> dict:
    """``fn(*args)``, a row, failing soft: an out-of-memory error (or any other) is its status."""
    try:
        return fn(*args)
    except Exception as exc:
        return {"status": failure(exc, verbose)}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


#: seconds in which each section of the check may start its rows (--budget SECTION=S; 0 skips
#: the section), so that one section running long (the tiers, say) never costs another its rows
BUDGETS = {"tiers": 100.0, "mmgp": 100.0, "reload": 75.0, "float32": 100.0, "render": 45.0}


def start_section(ctx, name: str) -> None:
    """Section ``name`` begins: its rows may start until its budget (``ctx["budgets"]``) ends."""
    ctx["section"] = name
    ctx["deadline"] = time.perf_counter() + ctx.get("budgets", BUDGETS)[name]


def over_budget(ctx) -> bool:
    return time.perf_counter() >= ctx.get("deadline", math.inf)


def budget_skip(ctx) -> str:
    """The status of a row its section's budget left out."""
    name = ctx.get("section", "?")
    budget = ctx.get("budgets", BUDGETS).get(name, math.inf)
    return f"skipped: over the {name} section's {budget:.0f} s budget (--budget {name}=S)"


def kept_float32(expert) -> tuple[int, int] | None:
    """(float32, all) of the parameters diffusers keeps in float32 in a bf16 expert
    (``_keep_in_fp32_modules``): all of them still float32 after mmgp's hand-over is what the
    offload tiers check; None for a model without such modules."""
    from chord.guidance.mmgp_residency import kept_in_float32

    kept = [p for n, p in expert.named_parameters() if kept_in_float32(expert, n)]
    if not kept:
        return None
    return sum(p.dtype == torch.float32 for p in kept), len(kept)


def run_tier(name, mem, size, ctx) -> dict:
    """Two training iterations of one tier (the workflow's method, its contact loss on the
    scene's block and slab); the second is timed."""
    W, H = size
    method = dataclasses.replace(ctx["method"], size=f"{W}*{H}")
    meshes, grid, points = ctx["contact"]
    guide = ctx["guidance"](mem)
    tr = trainer.Trainer(
        scene=ctx["scene"],
        guidance=guide,
        text=ctx["text"],
        method=method,
        width=W,
        height=H,
        memory=mem,
        backend=ctx.get("render_backend", "auto"),
        meshes=meshes,
        surface_voxel_size={"obj_0": 0.05},
        contact_grid=grid,
        contact_points=points,
    )
    clock = timer(ctx["cuda"])
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
    kept = kept_float32(guide.experts["transformer"]) if "transformer" in guide.experts else None
    return {
        "status": "ok",
        "kept_float32": None if kept is None else f"{kept[0]}/{kept[1]}",
        "allocated": allocated,
        "reserved": reserved,
        "s_it": total,
        "render": t.get("render", 0.0),
        "encode": t.get("encode", 0.0),
        "dit": t.get("dit", 0.0),
        "backward": other,
    }


def tier_rows(ctx, names, table=None, on_row=None) -> list[dict]:
    """One row per tier of ``names`` in ``table`` (default ``ctx["tiers"]``, see
    :func:`tier_table`), failing soft; none starts after its section's budget. ``on_row(row)``
    after each (the JSON is written there). On CUDA a row also holds the host RSS peak above
    its start (``host_peak``: mmgp's and the float32 fallback's host RAM) beside the model's."""
    rows = []
    host = Peak(False) if ctx["cuda"] else None
    for name in names:
        mem, size = (table or ctx["tiers"])[name]
        if ctx["tiny"]:
            size = TINY_LOWRES.get(name, size)
        est = peak_memory.estimate(
            mem,
            width=size[0],
            height=size[1],
            frames=ctx["frames"],
            batch=ctx["batch"],
            gaussians=ctx["gaussians"],
            dynamic_gaussians=ctx["gaussians"] // 2,
            model=ctx["shape"],
            expert_bytes=ctx.get("expert_bytes", 2),
            use_tiny_vae=ctx["method"].use_tiny_vae,
            contact_points=sum(len(p) for p in ctx["contact"][2].values()),
        )
        row = {"tier": name, "size": f"{size[0]}x{size[1]}", "estimate": est["gpu_bytes"]}
        flags = json.dumps(dataclasses.asdict(mem), sort_keys=True)
        row["traced"] = ctx.get("traced", {}).get((name, row["size"], flags))
        row["estimate_reserved"] = est["reserved_bytes"]
        row["estimate_host"] = est["host_bytes"]
        ctx["peak"].disarm()
        if over_budget(ctx):
            row["status"] = budget_skip(ctx)
            rows.append(row)
            print_row(row, ctx["cuda"], flush=True)
            if on_row is not None:
                on_row(row)
            continue
        if host is not None:
            host.reset()
        try:
            row.update(run_tier(name, mem, size, ctx))
        except Exception as exc:  # fail soft: one tier's failure is a row
            allocated, reserved = ctx["peak"].read()
            row.update(allocated=allocated, reserved=reserved, status=failure(exc, ctx["verbose"]))
        finally:
            if host is not None:
                row["host_peak"] = host.read()[0]
                host.disarm()
            ctx["peak"].disarm()
            gc.collect()
            if ctx["cuda"]:
                torch.cuda.empty_cache()
        rows.append(row)
        print_row(row, ctx["cuda"], flush=True)
        if on_row is not None:
            on_row(row)
    return rows


def print_header(cuda: bool) -> None:
    unit = "GiB" if cuda else "MiB"
    print(
        f"{'tier':10s} {'size':>7s} {'alloc ' + unit:>10s} {'resvd ' + unit:>10s} "
        f"{'model ' + unit:>10s} {'s/it':>6s} {'render':>6s} {'encode':>6s} {'DiT':>6s} "
        f"{'backwd':>6s}  status"
    )


def print_row(row: dict, cuda: bool, flush: bool = False) -> None:
    div = peak_memory.GiB if cuda else peak_memory.MiB

    def mem(key):
        return f"{row[key] / div:10.2f}" if row.get(key) is not None else f"{'-':>10s}"

    def sec(key):
        return f"{row[key]:6.2f}" if key in row else f"{'-':>6s}"

    extra = ""  # the host RAM (CUDA runs) and the float32 parameters kept (mmgp's check)
    if row.get("host_peak") is not None and cuda:
        extra += f"; host +{row['host_peak'] / div:.1f} of {row['estimate_host'] / div:.1f} GiB"
    if row.get("kept_float32"):
        extra += f"; kept float32 {row['kept_float32']}"
    if row.get("traced") and row.get("allocated"):
        ratio = row["allocated"] / row["traced"]
        extra += f"; trace {row['traced'] / div:.2f} (allocated / trace {ratio:.3f})"

    print(
        f"{row['tier']:10s} {row['size']:>7s} {mem('allocated')} {mem('reserved')} "
        f"{mem('estimate')} {sec('s_it')} {sec('render')} {sec('encode')} {sec('dit')} "
        f"{sec('backward')}  {row['status']}{extra}",
        flush=flush,
    )


# -- expert reload and the float32 fallback ------------------------------------------------------
def reload_row(ctx, keep: dict) -> dict:
    """A high -> low noise switch as WanGuidance makes it: the high-noise expert loaded from
    the folder and resident, then ``_activate("transformer_2")`` drops it (``release``: gc and
    the CUDA cache) and loads the other (``wan_folder.load_expert`` to the CPU, then
    ``.to(device)``).
    Seconds of each, the host RSS peak above its level before the switch, the GPU's allocated
    bytes before and at the peak of the switch (one expert's worth: the old one is gone
    first). The loaded expert goes to ``keep["model"]`` for the float32 row."""
    from chord.guidance import wan_folder

    clock = timer(ctx["cuda"])
    guide = make_guidance(ctx["folder"], None, ctx["device"])
    clock.sync()
    start = time.perf_counter()
    guide._activate("transformer")
    clock.sync()
    first = time.perf_counter() - start
    host, original = Peak(False), wan_folder.load_expert
    clock.wrap(wan_folder, "load_expert", "load")
    clock.wrap(guide, "release", "release")
    try:
        host.reset()
        if ctx["cuda"]:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        clock.sync()
        start = time.perf_counter()
        guide._activate("transformer_2")
        clock.sync()
        switch = time.perf_counter() - start
        host_peak, _ = host.read()
    finally:
        wan_folder.load_expert = original
        host.disarm()
    t = clock.times
    keep["model"] = guide.experts["transformer_2"]
    return {
        "status": "ok",
        "first_load_s": first,
        "switch_s": switch,
        "release_s": t["release"],
        "load_s": t["load"],
        "to_device_s": switch - t["release"] - t["load"],
        "host_peak": host_peak,
        "gpu_before": before if ctx["cuda"] else None,
        "gpu_peak": torch.cuda.max_memory_allocated() if ctx["cuda"] else None,
        "loads": guide.loads,
    }


def float32_guidance(ctx, keep: dict):
    """The float32 row's guidance factory: the expert the reload row loaded (else loaded from
    the folder here), resident in bf16 as in training, then ``use_float32()``: dropped, and
    reloaded from the folder in float32 by the first pass, computing without autocast.
    ``keep["guide"]`` holds it until the caller drops it."""

    def guidance(_mem):
        if "guide" not in keep:
            if ctx["saved"].get("status") != "ok":  # use_float32 reloads it from there
                raise RuntimeError(f"no expert on disk: save {ctx['saved'].get('status')}")
            guide = make_guidance(ctx["folder"], keep.pop("model", None), ctx["device"])
            guide._activate("transformer")
            log = logging.getLogger(guide.__module__)
            level = log.level
            log.setLevel(logging.ERROR)  # its warning speaks of non-finite steps: none here
            try:
                guide.use_float32()
            finally:
                log.setLevel(level)
            keep["guide"] = guide
        return keep["guide"]

    return guidance


def print_reload(row: dict, cuda: bool) -> None:
    unit, div = ("GiB", peak_memory.GiB) if cuda else ("MiB", peak_memory.MiB)
    if row.get("status") != "ok":
        print(f"expert reload: {row.get('status')}")
        return
    dev = "cuda" if cuda else "device (CPU: none)"
    gpu = (
        f"; GPU allocated {row['gpu_before'] / div:.1f} {unit} before, peak "
        f"{row['gpu_peak'] / div:.1f} {unit} during the switch"
        if cuda
        else ""
    )
    print(
        f"expert reload (high -> low noise switch, {row['weights_bytes'] / div:.2f} {unit} of "
        f"weights on disk): save {row['save_s']:.3f} s, first load {row['first_load_s']:.3f} s; "
        f"switch {row['switch_s']:.3f} s = release {row['release_s']:.3f} + load to CPU "
        f"{row['load_s']:.3f} + to {dev} {row['to_device_s']:.3f}; host RSS peak "
        f"+{row['host_peak'] / div:.2f} {unit}{gpu}; {row['loads']} loads"
    )


# -- renderer parity -----------------------------------------------------------------------------
def parity(scene, width: int, height: int, device) -> dict:
    """gsplat vs the torch rasteriser on the same inputs: image difference and gradient
    cosine (8 frames, one orbit view, white background)."""
    from chord.render import cameras, gsplat_backend
    from chord.render.views import render_video

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


def time_render(render, backward: bool, leaves: list, runs: int, limit_s: float = 15.0) -> dict:
    """Median seconds of ``runs`` renders after one warm-up (CUDA-synchronised; fewer once
    they pass ``limit_s``) and the peak allocated above what was resident before: without
    grad, or forward and backward."""
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(runs + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if backward:
            render().backward()
        else:
            with torch.no_grad():
                render()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        for leaf in leaves:
            leaf.grad = None
        if len(times) > 1 and sum(times) > limit_s:
            break
    return {
        "s": statistics.median(times[1:]),
        "runs": len(times) - 1,
        "peak": torch.cuda.max_memory_allocated() - base,
    }


def render_timing(
    scene, width: int, height: int, device, runs: int = 3, backends=("gsplat", "torch")
) -> dict:
    """gsplat vs the torch rasteriser on the GPU: time and peak memory of the parity view (8
    frames, white background) without grad (the split tiers' target renders) and forward
    plus backward (a weighted sum's gradient to the per-frame Gaussians, as leaves: the
    deformation is outside the timing)."""
    from chord.render import cameras, gsplat_backend
    from chord.render.views import render_video

    if "gsplat" in backends and device.type != "cuda":
        return {"status": "skipped: gsplat needs CUDA (this run is on the CPU)"}
    if "gsplat" in backends and not gsplat_backend.available():
        return {"status": f"skipped: {gsplat_backend.unavailable_reason()}"}
    K = cameras.intrinsics(width, height).to(device)
    vm = cameras.orbit_viewmats(torch.tensor(20.0), torch.tensor(45.0), 2.0).to(device)
    bg = torch.ones(3, device=device)
    with torch.no_grad():
        frames = scene.frame_gaussians(torch.arange(8, device=device))
    leaves = {
        k: v.detach().clone().requires_grad_(True)
        for k, v in frames.items()
        if torch.is_tensor(v) and v.is_floating_point()
    }
    inputs = {**frames, **leaves}
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(8, 3, height, width, generator=g).to(device)
    out = {"status": "ok", "size": f"{width}x{height}", "frames": 8, "runs": runs}
    for backend in backends:

        def render(backend=backend):
            video = render_video(inputs, vm, K, width, height, bg, backend=backend)
            return (video * weights).sum()

        out[backend] = {
            mode: soft(time_render, render, mode == "backward", list(leaves.values()), runs)
            for mode in ("forward", "backward")
        }
    return out


def print_render_timing(row: dict) -> None:
    if row["status"] != "ok":
        print(f"renderer timing: {row['status']}")
        return
    print(
        f"renderer timing (gsplat vs torch, {row['size']}, {row['frames']} frames, median of "
        f"up to {row['runs']} after a warm-up; peak allocated above the resident):"
    )
    for backend in ("gsplat", "torch"):
        if backend not in row:
            continue
        parts = []
        for mode, label in (("forward", "forward (no grad)"), ("backward", "forward+backward")):
            r = row[backend][mode]
            parts.append(
                f"{label} {r['s']:.4f} s, {r['peak'] / peak_memory.GiB:.2f} GiB"
                if "s" in r
                else f"{label} {r['status']}"
            )
        print(f"  {backend:6s} " + "; ".join(parts))


# -- main ----------------------------------------------------------------------------------------
def parse_budgets(values: list[str]) -> dict[str, float]:
    """:data:`BUDGETS` with ``--budget SECTION=SECONDS`` overrides; a ValueError names a bad one."""
    budgets = dict(BUDGETS)
    for value in values:
        name, _, seconds = value.partition("=")
        if name not in BUDGETS:
            raise ValueError(f"--budget {value}: the sections are {', '.join(BUDGETS)}")
        try:
            budgets[name] = float(seconds)
        except ValueError:
            raise ValueError(f"--budget {value}: expected SECTION=SECONDS") from None
    return budgets


def build_gsplat(backend: str, cuda: bool) -> dict:
    """gsplat's kernels built (or found) for this card before anything is timed
    (chord.render.gsplat_backend.load_kernels, under its lock): the build's seconds and the
    extension's file, or why not (--render-backend torch, a CPU, no toolkit)."""
    from chord.render import gsplat_backend

    if backend == "torch" or not cuda:
        why = "--render-backend torch" if backend == "torch" else "no CUDA GPU"
        return {"status": f"skipped: {why}"}
    start = time.perf_counter()
    reason = gsplat_backend.unavailable_reason()
    seconds = time.perf_counter() - start
    if reason is not None:
        return {"status": f"error: {reason}", "s": seconds}
    return {"status": "ok", "s": seconds, "kernels": gsplat_backend.kernels_file()}


def main(argv=None) -> int:
    from chord.resources import cuda_settings

    # the production allocator (expandable segments), before anything starts CUDA
    allocator = cuda_settings.configure_allocator(os.environ)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (CI)")
    p.add_argument(
        "--tiers",
        default=None,
        help="comma-separated subset of config/config.yaml's tiers and split_plain (default: all)",
    )
    p.add_argument(
        "--extras", default=",".join(EXTRAS), help=f"comma-separated subset of {','.join(EXTRAS)}"
    )
    p.add_argument("--float32-size", default=None, help="WxH of the float32 row (416x240)")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument(
        "--gaussians",
        type=int,
        default=None,
        help="the scene's Gaussians, both objects (default 100,000; --tiny 2,000)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=TRACE,
        help="the faked trace whose peaks go beside the measured ones (bench/gpu_trace.py)",
    )
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed parts")
    p.add_argument(
        "--render-backend",
        choices=("auto", "gsplat", "torch"),
        default="auto",
        help="the training's renderer (auto: gsplat on CUDA); torch measures without gsplat",
    )
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="SECTION=S",
        help="seconds in which a section may start rows (repeatable; default "
        + ", ".join(f"{k}={v:.0f}" for k, v in BUDGETS.items())
        + ")",
    )
    args = p.parse_args(argv)
    try:
        budgets = parse_budgets(args.budget)
    except ValueError as exc:
        p.error(str(exc))
    tiny = args.tiny
    width, height, frames, batch = (64, 48, 9, 2) if tiny else (832, 480, 41, 4)
    table = tier_table(width, height)
    names = list(table) if args.tiers is None else [n for n in args.tiers.split(",") if n]
    unknown = sorted(set(names) - set(table))
    if unknown:
        p.error(f"--tiers: unknown {unknown}; choose from {list(table)}")
    extras = [n for n in args.extras.split(",") if n]
    if sorted(set(extras) - set(EXTRAS)):
        p.error(f"--extras: unknown {sorted(set(extras) - set(EXTRAS))}; choose from {EXTRAS}")
    # the float32 fallback row: split's flags at lowres_min's size (float32 has no bf16 tensor
    # cores: at 832x480 its two iterations alone would take about 6 minutes)
    split = table["split"][0]
    float32_tier = {"split_fp32": (split, table["lowres_min"][1])}
    if args.float32_size:
        w, _, h = args.float32_size.partition("x")
        if not (w.isdigit() and h.isdigit()):
            p.error(f"--float32-size: expected WxH, got {args.float32_size!r}")
        float32_tier["split_fp32"] = (split, (int(w), int(h)))
    cuda = torch.cuda.is_available() and not tiny
    if not tiny and not cuda:
        p.error("no CUDA GPU here: run with --tiny for the CPU check")
    device = torch.device("cuda" if cuda else "cpu")
    if tiny:
        torch.set_num_threads(1)
    shape = TINY if tiny else peak_memory.A14B
    config = peak_memory.transformer_kwargs(shape, rope_max_seq_len=64 if tiny else 1024)
    gaussians = args.gaussians or (2000 if tiny else 2 * fake_iteration.CHECK_GAUSSIANS)
    dtype = torch.float32 if not cuda else torch.bfloat16
    dev = torch.cuda.get_device_name() if cuda else "CPU (--tiny)"
    report = {"device": dev, "allocator": allocator, "render_backend": args.render_backend}

    def dump():  # after every row: a run cut short still leaves what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")

    report["gsplat"] = build_gsplat(args.render_backend, cuda)
    print(f"gsplat kernels: {report['gsplat']}")
    dump()
    started = time.perf_counter()  # the build (minutes once per card) is not in the budgets
    skipped = {"status": "skipped: not in --extras"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(Path(tmp) / "wan", config, tiny=tiny)
        expert = random_expert(config, device, dtype)
        saved = skipped
        if {"reload", "float32"} & set(extras):  # both load the expert from disk
            saved = soft(save_expert, expert, folder, verbose=args.verbose)
        from diffusers import AutoencoderKLWan

        vae_cfg = AutoencoderKLWan.load_config(folder / "vae")
        with torch.device("meta"):
            vae_params = sum(p.numel() for p in AutoencoderKLWan.from_config(vae_cfg).parameters())
        method = workflow_method(width, height, frames, batch)
        scene, *contact = fake_iteration.block_on_slab(method, gaussians=gaussians // 2)
        scene = scene.to(device)
        text_dim = shape.text_dim
        g = torch.Generator().manual_seed(0)
        text = {
            "prompt": torch.randn(512, text_dim, generator=g),
            "negative": torch.randn(512, text_dim, generator=g),
        }
        guides = {}

        def guidance(mem):  # one WanGuidance without mmgp, one with, for every tier
            mmgp = mem.enable_mmgp
            if mmgp not in guides:
                if mmgp and cuda:
                    guides.pop(False, None)
                    expert.to("cpu")  # mmgp streams it from host RAM
                    gc.collect()
                    torch.cuda.empty_cache()
                guides[mmgp] = make_guidance(folder, expert, device, mem)
            return guides[mmgp]

        ctx = {
            "tiny": tiny,
            "cuda": cuda,
            "device": device,
            "folder": folder,
            "saved": saved,
            "width": width,
            "height": height,
            "frames": frames,
            "batch": batch,
            "gaussians": gaussians,
            "scene": scene,
            "method": method,
            "contact": contact,
            "traced": traced_peaks(args.trace, frames, batch, gaussians),
            "text": text,
            "guidance": guidance,
            "peak": Peak(cuda),
            "shape": dataclasses.replace(
                shape, vae_base_dim=vae_cfg["base_dim"], vae_params=vae_params
            ),
            "tiers": table,
            "verbose": args.verbose,
            "budgets": budgets,
            "render_backend": args.render_backend,
        }
        print(
            f"gpu_check on {dev}: {width}x{height}, {frames} frames, batch {batch}, "
            f"{gaussians} Gaussians, expert of {peak_memory.dit_params(ctx['shape']) / 1e6:,.1f}M "
            f"parameters ({dtype}), setup {time.perf_counter() - started:.0f} s"
        )
        print_header(cuda)
        report["rows"] = []

        def add_row(row):
            report["rows"].append(row)
            dump()

        # the tiers without mmgp, then those with (item 4: mmgp keeps the float32 modules),
        # each section within its own budget
        for section, mmgp in (("tiers", False), ("mmgp", True)):
            start_section(ctx, section)
            part = [n for n in names if table[n][0].enable_mmgp == mmgp]
            tier_rows(ctx, part, on_row=add_row)
        # the tiers' injected expert goes: the extras load theirs from the folder
        for guide in guides.values():
            with contextlib.suppress(Exception):
                guide.release()
        guides.clear()
        expert = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        keep = {}
        reload = skipped
        start_section(ctx, "reload")
        if "reload" in extras:
            if saved.get("status") != "ok":
                reload = {"status": f"save {saved.get('status')}"}
            elif over_budget(ctx):
                reload = {"status": budget_skip(ctx)}
            else:
                reload = soft(reload_row, ctx, keep, verbose=args.verbose)
            reload = {**saved, **reload}
        report["reload"] = reload
        print_reload(reload, cuda)
        dump()
        report["float32"] = skipped
        start_section(ctx, "float32")
        if "float32" in extras:
            print("float32 fallback (split flags, after guidance.use_float32(): the expert's")
            print(
                "weights and arithmetic in float32;"
                " model = chord.resources.peak_memory with expert_bytes=4):"
            )
            print_header(cuda)
            f32 = {**ctx, "guidance": float32_guidance(ctx, keep), "expert_bytes": 4}
            (row,) = tier_rows(f32, ["split_fp32"], float32_tier)
            main_size = peak_memory.estimate(
                split,
                width=width,
                height=height,
                frames=frames,
                batch=batch,
                gaussians=gaussians,
                dynamic_gaussians=gaussians // 2,
                model=ctx["shape"],
                expert_bytes=4,
                use_tiny_vae=method.use_tiny_vae,
                contact_points=sum(len(p) for p in contact[2].values()),
            )
            row["estimate_main_size"] = main_size["gpu_bytes"]
            div, unit = (peak_memory.GiB, "GiB") if cuda else (peak_memory.MiB, "MiB")
            print(f"  (model at {width}x{height}: {main_size['gpu_bytes'] / div:.2f} {unit})")
            report["float32"] = row
            dump()
        keep.clear()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        start_section(ctx, "render")
        if args.render_backend == "torch":
            par = {"status": "skipped: --render-backend torch"}
        elif over_budget(ctx):
            par = {"status": budget_skip(ctx)}
        else:
            par = soft(parity, scene, width, height, device, verbose=args.verbose)
        report["parity"] = par
        dump()
        timing = skipped
        if "render_timing" in extras:
            backends = ("torch",) if args.render_backend == "torch" else ("gsplat", "torch")
            if not cuda:
                timing = {"status": "skipped: the renderer timing needs CUDA (a CPU run)"}
            elif over_budget(ctx):
                timing = {"status": budget_skip(ctx)}
            else:
                timing = soft(
                    render_timing, scene, width, height, device, 3, backends, verbose=args.verbose
                )
    if par["status"] == "ok":
        print(
            f"renderer parity (gsplat vs torch, {width}x{height}, 8 frames): mean |diff| "
            f"{par['mean_abs']:.2e}, max |diff| {par['max_abs']:.2e}, PSNR {par['psnr_db']:.1f} "
            f"dB, gradient cosine {par['grad_cosine']:.4f}"
        )
    else:
        print(f"renderer parity: {par['status']}")
    print_render_timing(timing)
    print(f"total {time.perf_counter() - started:.0f} s")
    report.update(parity=par, render_timing=timing)
    dump()
    return 0


if __name__ == "__main__":
    # the imports' objects (torch, diffusers, transformers: half a million) live as long as the
    # process: frozen out of the collections, so each of the run's gc.collect() (about 20)
    # scans what the check made since, not them again (0.3 s each on a CPU)
    gc.collect()
    gc.freeze()
    sys.exit(main())
