"""The GPU run's training iteration, executed on a faked ``cuda:0`` (:mod:`chord.checks.fake_cuda`)
for each memory tier's flags: the trainer's own ``step``, not a copy of it.

Per tier of the config (its memory flags and size applied as a training on that tier gets
them: :func:`chord.resources.tiers.apply`), a Trainer on the faked device runs one iteration
for each expert the timestep schedule picks (the high-noise expert early, the low-noise one
late): the cameras, the regularisers and the contact loss with their backward, the render
(split into chunks where the tier says so), the VAE encode with gradients (the Tiny VAE,
checkpointed where the tier says so), the image condition, the DiT forward with CFG batched,
the SDS gradient and its backward (split where the tier says so), and Adam's step. A tensor
made on the CPU inside the step, or a matrix product of bf16 and float32, fails here as it
would on the GPU, naming the op.

The teacher is the tiny random Wan folder (:func:`chord.guidance.tiny_models.write_tiny_wan`:
the A14B's interface, small widths) and a Tiny VAE fitted to it, so the real loading, routing,
conditioning and CFG code runs; the scene is a block resting on a slab (one dynamic, one static
object). Sizes cost nothing on fake tensors, so the check runs at the config's own size, frames
and batch.

What does not run faked, and how it is taken instead (listed in the report's ``modelled``):

- the renderer: gsplat's CUDA kernels have no fake implementation; the torch rasteriser, the
  same math, renders (``render_backend: torch``), its projection and colours as they are, its
  compositor by a dense stand-in (:func:`chord.checks.fake_standins.composite_standin`): the
  real one's pair list is as long as the pixels each Gaussian covers, which fake tensors do
  not know;
- nearest neighbours (the control points', ARAP's edges): scipy's KD-tree on the host needs the
  points' values; indices of the right shape and device stand in;
- weights are read from disk on the host, outside the fake modes, then moved to the device;
- ``enable_mmgp``: mmgp moves real weights between host and device; its ``offload`` is taken
  by :mod:`chord.checks.fake_mmgp`, which streams the expert as the memory model counts mmgp's
  window (slices of ``mmgp_transformer_budget``, the next one prefetched); the rest of the mmgp
  path (the residency, the expert switches, the unload after the DiT) runs as it is.

    python -m chord.checks.fake_iteration [--config config/config.yaml] [--configfile F]...
        [--tier NAME]... [--preset NAME | --scene NAME] [--experts tiny|a14b] [--wan FOLDER]
        [--gaussians N] [--json OUT]

Exit 0 when every tier's iteration ran, 1 when one failed (the report names the op).
Nothing here imports torch before :func:`chord.checks.cuda_shim.load` (see there why).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO_CONFIG = Path("config/config.yaml")
#: Gaussians per object, control points and contact samples of the check's scene: the graph's
#: ops, not its sizes, are what a faked run exercises
SCENE_GAUSSIANS = 400
SCENE_CONTROL_POINTS = 8
#: Gaussians per object of the GPU check's scene (bench/gpu_check.py, 100,000 in all): the
#: trace of its shapes (bench/gpu_trace.py) builds the same scene
CHECK_GAUSSIANS = 50_000


def block_on_slab(method, seed: int = 0, gaussians: int = SCENE_GAUSSIANS):
    """(MotionScene, {name: mesh}, DistanceGrid, {name: contact points}) on the CPU: a block
    (obj_0, dynamic) resting on a slab (obj_1, static), ``gaussians`` each. The GPU check
    (bench/gpu_check.py) measures on this scene, so its peaks and the trace's are of one run."""
    import numpy as np
    import torch
    import trimesh

    from chord.gaussians import gaussian_set
    from chord.motion import contact
    from chord.motion.model import DynamicObject, MotionScene
    from chord.render.rasterizer import splat_tensors

    def box(extents, centre, colour_seed):
        mesh = trimesh.creation.box(extents=extents)
        mesh.apply_translation(centre)
        mesh.visual.face_colors = (200, 90 + 40 * colour_seed, 40, 255)
        g = gaussian_set.init_from_mesh([mesh], gaussians, seed=colour_seed)
        return mesh, splat_tensors(g)

    block, dyn = box((0.3, 0.5, 0.3), (0.0, 0.25, 0.0), 0)
    slab, stat = box((1.2, 0.05, 1.0), (0.0, -0.025, 0.0), 1)
    g = torch.Generator().manual_seed(seed)
    centres = dyn["means"][torch.randperm(len(dyn["means"]), generator=g)[:SCENE_CONTROL_POINTS]]
    obj = DynamicObject(
        "obj_0",
        dyn["means"],
        dyn["quats"],
        centres,
        dyn["means"][::2],
        frame_num=method.frame_num,
        n_cp_num=method.n_cp_num,
        arap_sample_num=min(method.arap_sample_num, len(dyn["means"]) // 2),
    )
    scene = MotionScene(["obj_0", "obj_1"], [dyn, stat], {"obj_0": obj})
    arrays = lambda m: (np.asarray(m.vertices, float), np.asarray(m.faces, np.int64))  # noqa: E731
    grid = contact.signed_distance_grid([arrays(slab)])
    points = {"obj_0": contact.surface_samples(*arrays(block), contact.CONTACT_SAMPLES, 0)}
    return scene, {"obj_0": block}, grid, points


def expert_iterations(method, boundary_ratio: float) -> dict[str, int]:
    """{expert: the first iteration whose timestep picks it} (iteration 1 onwards)."""
    from chord.guidance import rfsds, wan

    found: dict[str, int] = {}
    for it in range(1, method.iterations + 1):
        t, _ = rfsds.timestep_at(it, method.iterations, resample=method.resample_timestep)
        high = wan.NUM_TRAIN_TIMESTEPS * t >= boundary_ratio * wan.NUM_TRAIN_TIMESTEPS
        found.setdefault("transformer" if high else "transformer_2", it)
        if len(found) == 2:
            break
    return found


class Teacher:
    """The tiny Wan folder, its Tiny VAE and the text condition, made once on the CPU.

    ``experts="a14b"``: the folder routes and conditions as before, but the experts, the Wan
    VAE and the Tiny VAE are built at Wan 2.2 I2V A14B's shapes on the fake device
    (:func:`chord.checks.fake_standins.a14b_components`: no weight is read or materialised),
    and the text condition is
    UMT5-XXL's [512, 4096]; ``shape`` (a :class:`ModelShape`, e.g. a Wan folder's) in place of
    A14B's."""

    def __init__(self, folder: Path, experts: str = "tiny", shape=None):
        import torch

        from chord.guidance import text, tiny_models, wan_folder
        from chord.resources import peak_memory

        self.experts = experts
        self.folder = tiny_models.write_tiny_wan(folder / "wan")
        self.tiny_vae_path = tiny_models.write_tiny_vae(folder / "taew.safetensors", self.folder)
        if experts == "a14b":
            self.shape = shape or peak_memory.A14B
            e = torch.zeros(2, self.shape.text_len, self.shape.text_dim)
        else:
            self.shape = peak_memory.ModelShape.from_folder(self.folder)
            tok, enc = wan_folder.load_text_encoder(self.folder)
            e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
        self.text = {"prompt": e[0], "negative": e[1]}

    def guidance(self, method, memory, device):
        from chord.config import settings
        from chord.guidance import wan

        folders = {"ckpt_dir": str(self.folder), "tiny_vae_path": str(self.tiny_vae_path)}
        cfg = settings.guidance_from_mapping({"backend": "wan", **folders})
        return wan.from_config(cfg, method, memory, device=device)


def run_tier(
    name: str, method, memory, teacher: Teacher, budget_bytes: int, gaussians=SCENE_GAUSSIANS
) -> dict:
    """One tier's iterations on the faked device: a report row (``ok``, and ``error`` and
    ``where`` when an op was refused)."""
    import dataclasses

    from chord.checks import fake_cuda, fake_mmgp, fake_standins
    from chord.config import settings
    from chord.training.trainer import Trainer

    width, height = settings.parse_size(method.size, where=f"tier {name}: size")
    scene, meshes, grid, points = block_on_slab(method, gaussians=gaussians)
    row = {
        "tier": name,
        "size": method.size,
        "frames": method.frame_num,
        "batch": method.batch_size,
        "gaussians": 2 * gaussians,
        "flags": dataclasses.asdict(memory),
        "modelled": [
            "render_backend: torch (gsplat's CUDA kernels have no fake implementation)",
            "nearest neighbours (control points, ARAP edges): scipy's KD-tree on the host needs "
            "data; index 0 for each neighbour, on the points' device",
            "the torch rasteriser's compositor: its pair list follows the pixels each Gaussian "
            "covers (data); a dense stand-in of the same inputs and output shapes composites",
        ],
        "iterations": {},
    }
    if memory.enable_mmgp:
        row["modelled"].append(
            "enable_mmgp: mmgp streams real weights; chord.checks.fake_mmgp streams the expert "
            f"as the model counts it (slices of {memory.mmgp_transformer_budget} MiB, the next "
            "prefetched; the modules outside the blocks on the device during a forward)"
        )
    start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            rules = stack.enter_context(fake_cuda.fake_cuda(budget_bytes))
            host_knn = stack.enter_context(fake_standins.modelled_parts())
            if teacher.experts == "a14b":
                stack.enter_context(fake_standins.a14b_components(teacher.shape))
            if memory.enable_mmgp:
                streamed = stack.enter_context(fake_mmgp.fake_mmgp(fake_cuda.DEVICE)).streamed
            scene = scene.to(fake_cuda.DEVICE)
            guidance = teacher.guidance(method, memory, fake_cuda.DEVICE)
            trainer = Trainer(
                scene=scene,
                guidance=guidance,
                text=teacher.text,
                method=method,
                width=width,
                height=height,
                memory=memory,
                backend="torch",
                meshes=meshes,
                surface_voxel_size={"obj_0": 0.05},
                contact_grid=grid,
                contact_points=points,
            )
            rules.memory.reset_peak()
            phases = PhasePeaks(rules)
            owners = {"trainer": trainer, "guidance": guidance}
            for owner, name in PHASES:
                phases.wrap(owners[owner], name)
            iterations = expert_iterations(method, guidance.boundary_ratio)
            rules.flops.clear()
            for expert, it in iterations.items():
                phases.peaks["resident"] = max(phases.peaks["resident"], rules.memory.live)
                rec = trainer.step(it)
                row["iterations"][expert] = {"it": it, "t": rec["t"], "cfg": rec["cfg"]}
            row["traced_peak_bytes"] = rules.memory.peak
            row["phases"] = dict(phases.peaks)
            row["flops_per_iteration"] = flop_parts(rules.flops, len(iterations))
            estimate = model_estimate(method, memory, teacher.shape, scene, points)
            row["model_peak_bytes"] = estimate["gpu_bytes"]
            row["model_phases"] = estimate["phases"]
            row["model_parts"] = estimate["parts"]
            left = [
                f"{obj}.{p}: {t.device}"
                for obj, o in trainer.scene.dynamic.items()
                for p, t in o.param_groups().items()
                if t.device != fake_cuda.DEVICE
            ]
            if left:
                raise fake_cuda.DeviceRuleError(f"parameters left the device: {left}")
            row["experts_loaded"] = guidance.loads
            if memory.enable_mmgp:
                row["mmgp_slices"] = [
                    {"slices": len(s.slices), "largest_bytes": max(s.slice_bytes),
                     "outside_bytes": s.outside_bytes}
                    for s in streamed
                ]  # fmt: skip
            row["host_knn_calls"] = len(host_knn)
            row["host_reads"] = sum(rules.readbacks.host.values())
            row["host_reads_by_line"] = dict(rules.readbacks.host.most_common())
            row["data_shaped_ops"] = dict(rules.readbacks.shapes)
        row["ok"] = True
    except Exception as exc:  # the report names it; the exit status says it
        frames = [
            f"{f.filename.split('/chord/')[-1]}:{f.lineno} {f.name}"
            for f in traceback.extract_tb(exc.__traceback__)
            if "/chord/" in f.filename
        ]
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}", where=frames[-6:])
        row["traceback"] = traceback.format_exception(exc)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


#: the calls traced as phases, (owner, method) -> what their FLOPs count as (the innermost
#: call counts; what runs outside every phase, cameras and Adam, is "other")
PHASES = {
    ("guidance", "velocity"): "dit",  # the DiT forwards, CFG batched
    ("guidance", "condition"): "wan_vae",  # the image condition's Wan VAE encode
    ("trainer", "encode"): "vae_encode",  # the video latents' encoder (the Tiny VAE by default)
    ("trainer", "render"): "render",  # the SDS renders, forward (the stand-in compositor)
    ("trainer", "regularisers"): "regularisers",  # forward and backward
    ("trainer", "sds"): "backward",  # the SDS backward through encoder and render
}


def flop_parts(flops, iterations: int) -> dict[str, int]:
    """FLOPs per iteration by part (torch's formulas per op: matrix products, convolutions,
    attention; elementwise ops count nothing), and their total."""
    out = {part: int(flops.get(name, 0)) // iterations for (_, name), part in PHASES.items()}
    out["other"] = int(flops.get("other", 0)) // iterations
    out["total"] = sum(out.values())
    return out


class PhasePeaks:
    """The traced peak of live device bytes within each call of some methods (nested calls
    included in their callers'), and ``resident``: what is live when an iteration starts
    (weights, optimiser state, the scene); the calls also name the phase the device's FLOPs
    are counted under (the innermost)."""

    def __init__(self, rules):
        self.rules = rules
        self.memory = rules.memory
        self.peaks = collections.Counter(resident=0)

    def wrap(self, owner, *names: str) -> None:
        for name in names:
            setattr(owner, name, self._traced(name, getattr(owner, name)))

    def _traced(self, name, method):
        def call(*args, **kwargs):
            before = self.memory.reset_peak()  # this call's peak starts at the live bytes
            self.rules.phase.append(name)
            try:
                return method(*args, **kwargs)
            finally:
                self.rules.phase.pop()
                inside = self.memory.peak
                self.peaks[name] = max(self.peaks[name], inside)
                self.memory.peak = max(before, inside)

        return call


def model_estimate(method, memory, shape, scene, points) -> dict:
    """:mod:`chord.resources.peak_memory`'s estimate for the same run (the experts' ``shape``,
    this scene's Gaussians and contact points), to set beside the trace."""
    from chord.config import settings
    from chord.resources import peak_memory

    width, height = settings.parse_size(method.size)
    dynamic = sum(o.rest_means.shape[0] for o in scene.dynamic.values())
    estimate = peak_memory.estimate(
        memory,
        width=width,
        height=height,
        frames=method.frame_num,
        batch=method.batch_size,
        gaussians=scene.means.shape[0],
        dynamic_gaussians=dynamic,
        model=shape,
        use_tiny_vae=method.use_tiny_vae,
        contact_points=sum(len(p) for p in points.values()),
    )
    return estimate


def describe(row: dict) -> str:
    """One line of a tier's result."""
    if not row["ok"]:
        where = row["where"][-1] if row["where"] else "?"
        return f"{row['tier']}: FAILED at {where}: {row['error'].splitlines()[0][:300]}"
    its = ", ".join(f"{e} it {v['it']}" for e, v in row["iterations"].items())
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    return (
        f"{row['tier']}: ok ({row['size']}, {row['frames']} frames, batch {row['batch']}; {its}; "
        f"{row['host_reads']} host reads; traced peak {mib(row['traced_peak_bytes'])}, model "
        f"{mib(row['model_peak_bytes'])}; {row['seconds']:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chord.checks.fake_iteration", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", type=Path, default=REPO_CONFIG, help="a workflow config")
    parser.add_argument(
        "--configfile",
        type=Path,
        action="append",
        default=[],
        help="a config file merged over --config, as snakemake --configfile does (repeatable)",
    )
    parser.add_argument("--tier", action="append", help="a tier of the config (default: all)")
    parser.add_argument(
        "--preset", help="a preset of the config over its method, as a sheet row's preset column"
    )
    parser.add_argument(
        "--scene", help="a scene of the config's sheet: its method, as the workflow resolves it"
    )
    parser.add_argument(
        "--experts",
        choices=["tiny", "a14b"],
        default="tiny",
        help="the tiny random folder's experts (default), or A14B's built on the fake device",
    )
    parser.add_argument(
        "--wan",
        type=Path,
        help="with --experts a14b: build the experts at this Wan folder's shapes (its "
        "transformer/config.json), not A14B's",
    )
    parser.add_argument(
        "--gaussians",
        type=int,
        default=SCENE_GAUSSIANS,
        help=f"Gaussians of each of the scene's two objects (default {SCENE_GAUSSIANS}: the "
        "graph's ops, not its sizes, are what most checks need)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.gaussians < 2 * SCENE_CONTROL_POINTS:
        print(f"fake_iteration: --gaussians {args.gaussians}: at least {2 * SCENE_CONTROL_POINTS}",
              file=sys.stderr)  # fmt: skip
        return 2

    # the config is read and checked before torch is imported (none of this imports it): a bad
    # one is named at once, not after the device's setup
    from chord.config import settings
    from chord.resources import peak_memory, tiers

    try:
        data = settings.read_yaml(args.config)
        for extra in args.configfile:
            data = settings.merge(data, settings.read_yaml(extra))
        config = settings.validate_config(data)
        shape = peak_memory.ModelShape.from_folder(args.wan) if args.wan else None
    except (settings.ConfigError, OSError, ValueError) as exc:
        print(f"fake_iteration: {exc}", file=sys.stderr)
        return 2
    if args.preset is not None and args.preset not in config["presets"]:
        print(
            f"fake_iteration: --preset {args.preset}: not a preset of {args.config}",
            file=sys.stderr,
        )
        return 2
    preset = config["presets"][args.preset] if args.preset else {}
    method = settings.method_from_mapping(
        {**config["method"], **preset}, where=f"{args.config}: method"
    )
    memory = settings.MemoryConfig(**config["memory"])
    if args.scene is not None:
        try:
            scenes = settings.load(data).scenes
        except settings.ConfigError as exc:
            print(f"fake_iteration: {exc}", file=sys.stderr)
            return 2
        if args.scene not in scenes:
            print(f"fake_iteration: --scene {args.scene}: not a scene of {args.config}'s sheet",
                  file=sys.stderr)  # fmt: skip
            return 2
        method = scenes[args.scene].method
    tier_map = tiers.parse(config["tiers"])
    names = args.tier or list(tier_map)
    unknown = [n for n in names if n not in tier_map]
    if unknown:
        print(
            f"fake_iteration: --tier {unknown}: not tiers of {args.config} {list(tier_map)}",
            file=sys.stderr,
        )
        return 2
    from chord.checks import cuda_shim

    try:
        cuda_shim.load()
    except cuda_shim.ShimError as exc:
        print(f"fake_iteration: {exc}", file=sys.stderr)
        return 2
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        teacher = Teacher(Path(tmp), args.experts, shape)
        for name in names:
            tier = tier_map[name]
            m, mem = tiers.apply(tiers.per_gpu(method, tier), memory, tier)
            budget = int(tier.gpu_mem_gb * 1e9)
            rows.append(run_tier(name, m, mem, teacher, budget, args.gaussians))
            print(describe(rows[-1]), flush=True)
    report = {
        "device": "faked cuda:0 (chord.checks.fake_cuda)",
        "torch": torch.__version__,
        "experts": teacher.shape.describe(),
    }
    report["tiers"] = rows
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
