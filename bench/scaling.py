"""How one training iteration's cost grows on a CPU, and the CPU-proxy calibration of the
peak-memory model (``chord.resources.peak_memory``).

    python bench/scaling.py cost [--plot docs/scaling.png] [--repeat 2]
    python bench/scaling.py modes [--repeat 2]
    python bench/scaling.py memory-fit
    python bench/scaling.py profile --workdir DIR --scene hop [--iterations 3] [--ops]

cost: one training iteration of a synthetic two-object scene (a block skinned by 12 control
points over a slab) with the oracle teacher, as frames (9..41), size (64x48..256x160), batch
(1..4) and the Gaussian count (2k..16k) grow one at a time from a base of 41 frames, 128x80,
batch 1, 4,000 Gaussians. Each point runs in a fresh single-threaded process and reports the
best seconds per iteration (after one warm-up iteration) and the peak RSS above the
process's baseline; the table gives both, and --plot draws them against the growth factor.

modes: CPU time and peak memory of one training iteration per memory mode, as ratios to the
default mode: the tiny random Wan components with the Tiny VAE (random weights, real layout)
on the same synthetic scene (4,000 Gaussians, 128x80, 41 frames, batch 2), so that the
render and Tiny VAE graphs that the split modes stop overlapping are both there. Per mode
two fresh processes: CPU seconds (best of --repeat after a warm-up iteration) in one, the
peak RSS of an iteration above the RSS before it in the other (experts loaded first).

profile: CPU seconds per phase of chord.training.trainer.Trainer.step on a prepared demo workdir (a
copy
of config/ where ``snakemake --cores 2 --until voxelize`` has run), built as the training
stage builds it (chord.training.scene_trainer.build) from that folder's config (method, the scene's
overrides, guidance; --set overrides method keys), single-threaded unless --threads; the
mean CPU seconds per phase and per iteration over --iterations after a warm-up iteration, and
the wall seconds per iteration; --ops adds the torch profiler's operator table.

memory-fit: the CPU proxy measurements behind ``chord.resources.peak_memory``: the memory held by
the
autograd graph (current RSS above the baseline, after the forward pass) of the render of a
video (deform + projection + rasteriser, torch backend), of the deformation alone (what the
temporal loss keeps besides its pair lists), of the Tiny VAE encoder and of the
Wan VAE encoder (random weights, base widths 8 and 16), and the no-grad peak of the Wan VAE
encoder, at several shapes; then least-squares fits of the per-unit coefficients, printed
next to the constants ``chord.resources.peak_memory`` uses.

The memory-fit children run with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors go back to the
system and RSS follows the live memory (cost children do not: it would slow every
allocation). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__:
    from bench import fixtures
else:
    import fixtures

ROOT = fixtures.ROOT

BASE = {"frames": 41, "width": 128, "height": 80, "batch": 1, "gaussians": 4000}
AXES = {
    "frames": [9, 17, 25, 33, 41],
    "size": [(64, 48), (96, 64), (128, 80), (192, 112), (256, 160)],
    "batch": [1, 2, 3, 4],
    "gaussians": [2000, 4000, 8000, 16000],
}


# -- children ---------------------------------------------------------------------------------
def _rss_mb() -> float:
    return fixtures.rss_bytes() / 2**20


def oracle_trainer(frames: int, width: int, height: int, batch: int, gaussians: int):
    """A Trainer on :func:`fixtures.block_scene` whose oracle target is the same scene under a
    random table (the scripted motion)."""
    import torch

    from chord.config import settings
    from chord.guidance.oracle import OracleGuidance
    from chord.training import trainer

    method = settings.method_from_mapping(
        {"size": f"{width}*{height}", "frame_num": frames, "batch_size": batch, "seed": 0}
    )
    scripted = fixtures.block_scene(gaussians, frames, deform=0.02)
    with torch.no_grad():
        target = scripted.frame_gaussians(range(frames))
    guide = OracleGuidance(target, width=width, height=height, pool=4)
    return trainer.Trainer(
        scene=fixtures.block_scene(gaussians, frames),
        guidance=guide,
        text=None,
        method=method,
        width=width,
        height=height,
        backend="torch",
    )


def child_step(p: dict, repeat: int) -> dict:
    """CPU seconds (process time: other load on the machine does not count) and wall seconds
    per iteration, best of ``repeat`` after the first; peak RSS of the first iteration above
    the RSS before it."""
    tr = oracle_trainer(p["frames"], p["width"], p["height"], p["batch"], p["gaussians"])
    base = _rss_mb()
    tr.step(1)
    peak = fixtures.maxrss_mb() - base
    cpu, wall = [], []
    for it in range(2, 2 + repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        tr.step(it)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"s": min(cpu), "wall_s": min(wall), "peak_mb": peak}


def modes_trainer(p: dict, folder: Path):
    """The tiny random Wan (+ Tiny VAE) Trainer of the ``modes`` benchmark."""
    import torch

    from chord.config import settings
    from chord.guidance import wan
    from chord.guidance.tiny_vae import TinyVAEEncoder
    from chord.training import trainer

    torch.manual_seed(0)
    guide = wan.WanGuidance(folder, tiny_vae=TinyVAEEncoder())
    W, H = p["width"], p["height"]
    method = settings.method_from_mapping(
        {"size": f"{W}*{H}", "frame_num": p["frames"], "batch_size": p["batch"], "seed": 0}
    )
    tr = trainer.Trainer(
        scene=fixtures.block_scene(p["gaussians"], p["frames"], deform=0.02),
        guidance=guide,
        text=fixtures.tiny_text(folder),
        method=method,
        width=W,
        height=H,
        memory=settings.memory_from_mapping(dict(zip(MODE_FLAGS, p["mode"], strict=True))),
        backend="torch",
    )
    for name in ("transformer", "transformer_2"):  # load both experts before measuring
        guide._activate(name)
    return tr


def child_mode(p: dict, repeat: int) -> dict:
    import tempfile

    from chord.guidance import tiny_models

    with tempfile.TemporaryDirectory() as tmp:
        tr = modes_trainer(p, tiny_models.write_tiny_wan(Path(tmp) / "wan"))
        if p["measure"] == "peak":
            base = _rss_mb()
            tr.step(1)
            return {"peak_mb": fixtures.maxrss_mb() - base}
        tr.step(1)
        cpu = []
        for it in range(2, 2 + repeat):
            c0 = time.process_time()
            tr.step(it)
            cpu.append(time.process_time() - c0)
        return {"s": min(cpu)}


def child_render(p: dict) -> dict:
    """Graph memory of one training render with grad (before backward), torch backend."""
    import torch

    from chord.render import cameras
    from chord.render.views import render_video

    scene = fixtures.block_scene(p["gaussians"], p["frames"], deform=0.02)
    K = cameras.intrinsics(p["width"], p["height"])
    vm = cameras.orbit_viewmats(torch.tensor(20.0), torch.tensor(30.0), 2.0)
    bg = torch.ones(3)
    frames = torch.arange(p["frames"])
    with torch.no_grad():
        render_video(scene.frame_gaussians(frames), vm, K, p["width"], p["height"], bg)
    base = _rss_mb()
    video = render_video(
        scene.frame_gaussians(frames), vm, K, p["width"], p["height"], bg, backend="torch"
    )
    graph = _rss_mb() - base
    return {"graph_mb": graph, "out_mb": video.numel() * 4 / 2**20}


def child_deform(p: dict) -> dict:
    """Graph memory of the deformation of all frames with grad (the temporal loss's share)."""
    import torch

    scene = fixtures.block_scene(2 * p["gaussians"], p["frames"], deform=0.02)  # dynamic half: N
    obj = scene.dynamic["obj_0"]
    obj.deform(torch.arange(2))  # neighbour caches
    base = _rss_mb()
    means, quats = obj.deform(torch.arange(p["frames"]), detach_weights=True)
    return {"graph_mb": _rss_mb() - base, "out_mb": (means.numel() + quats.numel()) * 4 / 2**20}


def child_tiny_vae(p: dict) -> dict:
    import torch

    from chord.guidance.tiny_vae import TinyVAEEncoder

    enc = TinyVAEEncoder()
    video = torch.rand(1, p["frames"], 3, p["height"], p["width"], requires_grad=True)
    ck = p.get("checkpoint", False)
    base = _rss_mb()
    if p.get("nograd"):  # the targets pass of split_sds_backward: transients only
        with torch.no_grad():
            enc.encode(video, checkpoint=ck)
        return {"nograd_peak_mb": fixtures.maxrss_mb() - base}
    z = enc.encode(video, checkpoint=ck)
    graph = _rss_mb() - base
    z.backward(torch.ones_like(z))
    # peak of forward + backward (the gradients included): what checkpointing lowers
    return {
        "graph_mb": graph,
        "peak_mb": fixtures.maxrss_mb() - base,
        "out_mb": z.numel() * 4 / 2**20,
    }


def child_wan_vae(p: dict) -> dict:
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=p["base_dim"], z_dim=16).eval().requires_grad_(False)
    x = torch.rand(1, 3, p["frames"], p["height"], p["width"]) * 2 - 1
    with torch.no_grad():  # warm-up
        vae.encode(x[:, :, :1, :16, :16])
    base = _rss_mb()
    with torch.no_grad():
        vae.encode(x)
    nograd_peak = max(0.0, fixtures.maxrss_mb() - base)
    x.requires_grad_(True)
    base = _rss_mb()
    z = vae.encode(x).latent_dist.mean
    return {"graph_mb": _rss_mb() - base, "nograd_peak_mb": nograd_peak, "out_mb": z.numel() * 4}


def run_child(kind: str, params: dict, repeat: int = 2) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    timing = kind == "step" or params.get("measure") == "time"
    if not timing:  # exact RSS for the graphs; it would slow every allocation of a step
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(
        [sys.executable, __file__, "one", kind, json.dumps(params), "--repeat", str(repeat)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- cost ---------------------------------------------------------------------------------------
def cost_points():
    """(axis, growth factor, params) for every point, the base first on every axis."""
    for axis, values in AXES.items():
        for v in values:
            p = dict(BASE)
            if axis == "size":
                p["width"], p["height"] = v
                factor = v[0] * v[1] / (BASE["width"] * BASE["height"])
            else:
                p[axis] = v
                factor = v / BASE[axis]
            yield axis, factor, p


def cost(args) -> None:
    rows = []
    print(f"{'axis':9s} {'value':>9s} {'factor':>6s} {'cpu s':>6s} {'wall s':>6s} {'peak MB':>8s}")
    for axis, factor, p in cost_points():
        r = run_child("step", p, args.repeat)
        value = f"{p['width']}x{p['height']}" if axis == "size" else str(p[axis])
        rows.append((axis, factor, r["s"], r["peak_mb"]))
        print(
            f"{axis:9s} {value:>9s} {factor:6.2f} {r['s']:6.2f} {r['wall_s']:6.2f}"
            f" {r['peak_mb']:8.0f}",
            flush=True,
        )
    if args.plot:
        plot(rows, Path(args.plot))


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for axis in AXES:
        pts = sorted((f, s, m) for a, f, s, m in rows if a == axis)
        f = [x[0] for x in pts]
        axes[0].plot(f, [x[1] for x in pts], "o-", label=axis)
        axes[1].plot(f, [x[2] for x in pts], "o-", label=axis)
    titles = ("CPU seconds per iteration", "peak RSS above baseline (MB)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xlabel("growth factor (1 = 41 frames, 128x80, batch 1, 4k Gaussians)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("One oracle training iteration on a CPU (1 thread)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


# -- profile ------------------------------------------------------------------------------------
def profile(args) -> None:
    import torch

    from chord.motion import regularisers
    from chord.training import scene_trainer

    torch.set_num_threads(args.threads)
    root = Path(args.workdir)
    res = root / "results" / args.scene
    method, guidance = fixtures.scene_config(args.scene, root, json.loads(args.set))
    tr = scene_trainer.build(
        scene_json=res / "scene" / "scene.json",
        plys={p.stem: p for p in (res / "gaussians").glob("*.ply")},
        voxels={p.stem: p for p in (res / "voxels").glob("*.npz")},
        text_path=None,
        data_dir=root / "resources" / "demo" / args.scene,
        method=method,
        guidance=guidance,
        seed=0,
    )
    clock = fixtures.MethodTimer(time.process_time)  # CPU seconds
    cpu, wrap = clock.times, clock.wrap
    wrap(tr.guidance, "condition", "oracle target render")
    wrap(tr, "render", "training render (forward)")
    wrap(regularisers, "temporal_loss", "temporal loss (forward)")
    wrap(regularisers, "arap_energy", "ARAP energy (forward)")
    wrap(tr, "regularisers", "regularisers (forward + backward)")
    wrap(tr, "sds", "SDS (forward + backward)")
    tr.step(1)
    cpu.clear()
    c0, w0 = time.process_time(), time.perf_counter()
    if args.ops:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for it in range(2, 2 + args.iterations):
                tr.step(it)
    else:
        for it in range(2, 2 + args.iterations):
            tr.step(it)
    total = (time.process_time() - c0) / args.iterations
    wall = (time.perf_counter() - w0) / args.iterations
    n = tr.scene.means.shape[0]
    print(
        f"{args.scene}: {n} Gaussians, {method.size}, {method.frame_num} frames, "
        f"batch {method.batch_size}, oracle pool {guidance.oracle_pool}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"{'phase':36s} {'CPU s/it':>8s}")
    for key, v in cpu.items():
        print(f"{key:36s} {v / args.iterations:8.3f}")
    print(f"{'iteration':36s} {total:8.3f}  (wall {wall:.3f} s/it)")
    if args.ops:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


# -- memory modes ---------------------------------------------------------------------------------
MODE_FLAGS = (
    "split_sds_backward",
    "split_render_backward",
    "split_render_chunk_size",
    "checkpoint_tiny_vae",
)
MODES = [
    (False, False, -1, False),
    (False, True, -1, False),
    (False, True, 21, False),
    (True, False, -1, False),
    (True, True, -1, False),
    (True, True, 21, False),
    (True, True, 1, False),
    (False, False, -1, True),
    (True, True, 21, True),  # the split tier
]
MODES_BASE = {"frames": 41, "width": 128, "height": 80, "batch": 2, "gaussians": 4000}


def modes(args) -> None:
    rows = []
    for mode in MODES:
        p = {**MODES_BASE, "mode": list(mode)}
        t = run_child("mode", {**p, "measure": "time"}, args.repeat)
        m = run_child("mode", {**p, "measure": "peak"})
        rows.append((mode, t["s"], m["peak_mb"]))
        print(f"  {mode}: {t['s']:.2f} CPU s, {m['peak_mb']:.0f} MB", flush=True)
    ref_s, ref_mb = rows[0][1], rows[0][2]
    print(
        "tiny Wan + Tiny VAE, 41 frames, 128x80, batch 2, 4000 Gaussians, 1 thread; "
        "ratios to the default mode"
    )
    print(
        f"{'split_sds':>9s} {'split_render':>12s} {'chunk':>5s} {'ckpt_vae':>8s} "
        f"{'CPU time':>8s} {'peak RSS':>8s}"
    )
    for (s_, r, c, k), sec, mb in rows:
        print(f"{s_!s:>9s} {r!s:>12s} {c:>5d} {k!s:>8s} {sec / ref_s:8.2f} {mb / ref_mb:8.2f}")
    print(f"(default: {ref_s:.2f} CPU s per iteration, {ref_mb:.0f} MB above the baseline)")


# -- memory fit ---------------------------------------------------------------------------------
def _lstsq(features, values):
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.asarray(features, float), np.asarray(values, float), rcond=None)
    return coef


def memory_fit(args) -> None:
    from chord.resources import peak_memory

    MB = 2**20
    out = {}
    # render graph: a·F·N + b·F·H·W bytes
    pts = [
        (n, f, w, h)
        for n, f, (w, h) in [
            (4000, 41, (128, 80)),
            (8000, 41, (128, 80)),
            (16000, 41, (128, 80)),
            (4000, 21, (128, 80)),
            (4000, 41, (256, 160)),
            (8000, 21, (192, 112)),
        ]
    ]
    feats, vals = [], []
    print("render graph (torch backend), MB:")
    for n, f, w, h in pts:
        r = run_child("render", {"gaussians": n, "frames": f, "width": w, "height": h})
        print(f"  N={n:6d} F={f:3d} {w}x{h}: {r['graph_mb']:8.1f}", flush=True)
        feats.append([f * n, f * w * h])
        vals.append(r["graph_mb"] * MB)
    a, b = _lstsq(feats, vals)
    out["render"] = (a, b)
    # deform graph alone (the temporal loss keeps it, not the projection): a_d·F·N bytes
    feats, vals = [], []
    print("deform graph, MB:")
    for n, f in [(2000, 41), (8000, 41), (8000, 21)]:
        r = run_child("deform", {"gaussians": n, "frames": f})
        print(f"  N={n:6d} F={f:3d}: {r['graph_mb']:8.1f}", flush=True)
        feats.append([f * n])
        vals.append(r["graph_mb"] * MB)
    out["deform"] = _lstsq(feats, vals)[0]
    # tiny VAE graph: c·F_pad·H·W bytes
    feats, vals = [], []
    print("Tiny VAE graph, MB:")
    for f, w, h in [(41, 64, 48), (41, 128, 80), (21, 128, 80), (41, 192, 112)]:
        r = run_child("tiny_vae", {"frames": f, "width": w, "height": h})
        fp = f + (-f % 4)
        print(f"  F={f:3d} {w}x{h}: {r['graph_mb']:8.1f}", flush=True)
        feats.append([fp * w * h])
        vals.append(r["graph_mb"] * MB)
    out["tiny_vae"] = _lstsq(feats, vals)[0]
    # checkpointed Tiny VAE (checkpoint_tiny_vae): peak of forward + backward, c'·F_pad·H·W;
    # no-grad transient peaks (the targets pass), g·F_pad·H·W plain and g'·F_pad·H·W lean
    feats, vals, nvals, nvals_ck = [], [], [], []
    print("Tiny VAE peaks, MB: checkpointed forward + backward (plain); no-grad plain / lean:")
    for f, w, h in [(41, 64, 48), (41, 128, 80), (21, 128, 80), (41, 192, 112)]:
        shape = {"frames": f, "width": w, "height": h}
        r = run_child("tiny_vae", {**shape, "checkpoint": True})
        plain = run_child("tiny_vae", shape)
        ng = run_child("tiny_vae", {**shape, "nograd": True})
        ng_ck = run_child("tiny_vae", {**shape, "nograd": True, "checkpoint": True})
        fp = f + (-f % 4)
        print(
            f"  F={f:3d} {w}x{h}: {r['peak_mb']:8.1f} ({plain['peak_mb']:.1f});"
            f"  {ng['nograd_peak_mb']:.1f} / {ng_ck['nograd_peak_mb']:.1f}",
            flush=True,
        )
        feats.append([fp * w * h, 1.0])
        vals.append(r["peak_mb"] * MB)
        nvals.append(ng["nograd_peak_mb"] * MB)
        nvals_ck.append(ng_ck["nograd_peak_mb"] * MB)
    # with an intercept: the CPU's fixed checkpoint/oneDNN workspaces (~90 MB) are no graph
    out["tiny_vae_ckpt"] = _lstsq(feats, vals)[0]
    out["tiny_vae_nograd"] = _lstsq(feats, nvals)[0]
    out["tiny_vae_ckpt_nograd"] = _lstsq(feats, nvals_ck)[0]
    # Wan VAE: graph c·base·F·H·W, no-grad peak d·base·H·W
    feats, vals, nfeats, nvals = [], [], [], []
    print("Wan VAE (random weights), MB:")
    for bd, f, w, h in [(8, 9, 64, 48), (8, 17, 64, 48), (16, 9, 64, 48), (8, 9, 128, 80)]:
        r = run_child("wan_vae", {"base_dim": bd, "frames": f, "width": w, "height": h})
        print(
            f"  base={bd:3d} F={f:3d} {w}x{h}: graph {r['graph_mb']:8.1f}"
            f"  no-grad peak {r['nograd_peak_mb']:8.1f}",
            flush=True,
        )
        feats.append([bd * f * w * h])
        vals.append(r["graph_mb"] * MB)
        nfeats.append([bd * w * h])
        nvals.append(r["nograd_peak_mb"] * MB)
    out["wan_vae"] = _lstsq(feats, vals)[0]
    out["wan_vae_nograd"] = _lstsq(nfeats, nvals)[0]
    c = peak_memory.CPU_PROXY
    rows = [
        ("render bytes / (frame·Gaussian)", out["render"][0], "render_per_gaussian"),
        ("render bytes / (frame·pixel)", out["render"][1], "render_per_pixel"),
        ("deform bytes / (frame·Gaussian)", out["deform"], "deform_per_gaussian"),
        ("Tiny VAE bytes / (frame·pixel)", out["tiny_vae"], "tiny_vae_per_pixel"),
        ("Tiny VAE ckpt peak / (frame·pixel)", out["tiny_vae_ckpt"], "tiny_vae_ckpt_per_pixel"),
        ("Tiny VAE no-grad / (frame·pixel)", out["tiny_vae_nograd"], "tiny_vae_nograd_per_pixel"),
        (
            "Tiny VAE lean no-grad / (frame·pixel)",
            out["tiny_vae_ckpt_nograd"],
            "tiny_vae_ckpt_nograd_per_pixel",
        ),
        ("Wan VAE bytes / (base·frame·pixel)", out["wan_vae"], "wan_vae_per_base_pixel"),
        ("Wan VAE no-grad / (base·pixel)", out["wan_vae_nograd"], "wan_vae_nograd_per_base_pixel"),
    ]
    print(f"\n{'coefficient':36s} {'fit':>9s} {'chord.resources.peak_memory':>12s}")
    for name, fit, key in rows:
        print(f"{name:36s} {fit:9.2f} {c[key]:12.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--plot", default=None, help="write the plot here (e.g. docs/scaling.png)")
    c.add_argument("--repeat", type=int, default=2)
    sub.add_parser("memory-fit")
    m = sub.add_parser("modes")
    m.add_argument("--repeat", type=int, default=2)
    pr = sub.add_parser("profile")
    pr.add_argument("--workdir", required=True, help="a folder where the demo DAG has run")
    pr.add_argument("--scene", default="hop")
    pr.add_argument("--set", default="{}", help='method overrides as JSON, e.g. {"frame_num": 41}')
    pr.add_argument("--iterations", type=int, default=3)
    pr.add_argument("--ops", action="store_true", help="add the torch profiler's table")
    pr.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    o = sub.add_parser("one")
    o.add_argument("kind")
    o.add_argument("params")
    o.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    if args.what == "cost":
        cost(args)
    elif args.what == "memory-fit":
        memory_fit(args)
    elif args.what == "modes":
        modes(args)
    elif args.what == "profile":
        profile(args)
    else:
        import torch

        torch.set_num_threads(1)
        params = json.loads(args.params)
        if args.kind == "step":
            res = child_step(params, args.repeat)
        elif args.kind == "mode":
            res = child_mode(params, args.repeat)
        else:
            kinds = {
                "render": child_render,
                "deform": child_deform,
                "tiny_vae": child_tiny_vae,
                "wan_vae": child_wan_vae,
            }
            res = kinds[args.kind](params)
        print(json.dumps(res))


if __name__ == "__main__":
    main()
