"""Stages ``train_coarse`` and ``train_fine`` (METHOD §7, §17–§19): build the trainer from
the earlier stages' files, resume from the newest valid checkpoint, and write the hand-off
state (coarse.pt / fine.pt) and the loss log."""

from __future__ import annotations

import csv
import dataclasses
import logging
import shutil
from pathlib import Path

import numpy as np
import torch
import trimesh

from chord.config import settings
from chord.config.result_keys import stage_config, training_hash
from chord.core import media
from chord.core.errors import InputError
from chord.gaussians import ply
from chord.guidance import oracle
from chord.guidance import text as text_cond
from chord.motion.model import build_scene
from chord.plan import results_layout, scene_plan
from chord.render import cameras
from chord.render.backend import describe_backend, resolve_backend
from chord.resources import job_size, out_of_memory, peak_memory, tiers
from chord.scene import ingestion as sc
from chord.training import checkpoint, progress, rng, run_loop, scalars, slurm_time_limit
from chord.training.distributed import Group
from chord.training.trainer import Trainer

logger = logging.getLogger(__name__)

# Beside a configuration's checkpoints: its loss log across attempts (copied to the output).
LOSS_HISTORY = "losses.tsv"
# nan: NaN entries of the teacher's velocities; nonfinite_entries: NaN or ±inf entries of them and
# of the averaged gradients (any skips the step: README "Non-finite steps")
LOG_FIELDS = (
    "it", "sds", "ground", "temporal", "arap", "t", "cfg", "skipped", "nan", "nonfinite_entries"
)  # fmt: skip


def build(
    *,
    scene_json: Path,
    plys: dict,
    voxels: dict,
    text_path: Path | None,
    data_dir: Path,
    method,
    guidance,
    memory=None,
    seed: int = 0,
    group: Group | None = None,
    device="cpu",
    render_backend: str = "auto",
) -> Trainer:
    """A :class:`~chord.training.trainer.Trainer` from the stage outputs of one scene, with the
    memory
    flags ``memory`` (a MemoryConfig; None: the defaults); ``render_backend`` is resolved for
    ``device`` first (an error before anything loads when it cannot run)."""
    memory = memory or settings.memory_from_mapping({})
    backend = resolve_backend(render_backend, device)
    doc = sc.read_scene_json(scene_json)
    names = [o["name"] for o in doc["objects"] if o["role"] != "avoided"]
    gsets = {n: ply.read_ply(plys[n], sh_degree_cap=method.sh_degree) for n in names}
    vox = {}
    for name, path in voxels.items():
        with np.load(path) as z:
            vox[name] = {k: z[k] for k in z.files}
    scene = build_scene(doc, gsets, vox, method, device=device)
    width, height = settings.parse_size(method.size, where="method: size")
    target = tuple(cameras.scene_target(method, doc))
    if guidance.backend == "oracle":
        teacher = oracle.for_scene(
            doc, gsets, data_dir, method, guidance, width, height, device, backend
        )
        text = None
    else:
        from chord.guidance import wan

        teacher = wan.from_config(guidance, method, memory, device=device)
        text = text_cond.read(text_path)[0]
    meshes = {}
    for name in method.add_cp_objs:
        parts = sc.load_parts(sc.mesh_path(scene_json, doc, name))
        meshes[name] = trimesh.util.concatenate(
            [trimesh.Trimesh(p.vertices, p.faces, process=False) for p in parts]
        )
    ground = method.ground_level if method.ground_level is not None else doc["ground_level"]
    return Trainer(
        scene=scene,
        guidance=teacher,
        text=text,
        method=method,
        width=width,
        height=height,
        target=target,
        memory=memory,
        seed=seed,
        group=group or Group(device=device),
        ground_level=ground,
        meshes=meshes,
        surface_voxel_size={n: float(v["surface_voxel_size"]) for n, v in vox.items()},
        backend=backend,
    )


def newest_checkpoint(folder: Path) -> dict | None:
    """The newest readable checkpoint in ``folder`` (one configuration's), else None."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("ckpt_*.pt"), reverse=True):
        try:
            return run_loop.load_checkpoint(path)
        except ValueError as exc:  # e.g. a file cut short by a kill: try the one before
            logger.warning("skipping %s: %s", path, exc)
    return None


class LossLog:
    """A TSV of per-iteration losses (appends on resume)."""

    def __init__(self, path: Path, start: int, extra: tuple[str, ...] = ()):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if self.path.is_file() and start > 1:  # keep what was logged before the resume point
            with open(self.path) as f:
                rows = [r for r in csv.DictReader(f, delimiter="\t") if int(r["it"]) < start]
        self.f = open(self.path, "w", newline="")
        self.w = csv.DictWriter(self.f, LOG_FIELDS + extra, delimiter="\t", extrasaction="ignore")
        self.w.writeheader()
        self.w.writerows(rows)

    def __call__(self, rec: dict) -> None:
        self.w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in rec.items()})
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def describe_device(device) -> str:
    """The device, with the GPU's name and the job's CUDA_VISIBLE_DEVICES on CUDA."""
    import os

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return str(dev)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    return f"{dev} ({torch.cuda.get_device_name(dev)}, CUDA_VISIBLE_DEVICES={visible})"


def live_preview(trainer: Trainer, method, preview: dict):
    """The :class:`chord.training.live_preview.Previews` of ``trainer`` from the reference
    camera."""
    from chord.training.live_preview import Previews

    view = cameras.reference_view(
        method.elev_l, method.elev_r, preview["ref_azim"], preview["ref_cam_radius"], trainer.target
    )
    return Previews(
        preview["folder"],
        trainer,
        viewmat=view,
        fovy=method.fovy,
        background=cameras.background_for(method.invert_bg_prob),
        fps=preview["fps"],
    )


def gpu_peak_gb(device):
    """A function of the peak GPU memory allocated so far (GB) on CUDA, else None."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    return lambda: torch.cuda.max_memory_allocated() / 1e9


def run_preflight(
    inputs, method, memory, guidance, device, render_backend, tier, checkpoint_dir, env
):
    """:func:`chord.checks.preflight.preflight` of this training, from its input files' headers."""
    from chord.checks import preflight

    counts = {name: job_size.ply_vertex_count(path) for name, path in inputs["plys"].items()}
    dynamic = list(inputs["voxels"])
    return preflight.preflight(
        method=method,
        memory=memory,
        guidance=guidance,
        device=device,
        render_backend=render_backend,
        tier=tier,
        host_mem_gb=None,
        gaussians=sum(counts.values()),
        dynamic_gaussians=sum(counts[n] for n in dynamic),
        control_point_count=preflight.control_points(method, dynamic),
        checkpoint_dir=Path(checkpoint_dir),
        env=env,
    )


def log_memory_estimate(trainer: Trainer, method, guidance, tier: str | None) -> dict | None:
    """Log the peak-memory model's estimate (:mod:`chord.resources.peak_memory`, that of the Wan
    teacher) of
    this training, ``method`` and ``trainer.memory`` being the effective ones; returns it (None
    for the oracle)."""
    if guidance.backend != "wan":
        return None
    scene = trainer.scene
    dynamic = sum(scene.slices[n].stop - scene.slices[n].start for n in scene.dynamic)
    model = peak_memory.model_for(guidance.ckpt_dir)
    e = job_size.estimate(method, trainer.memory, None, int(scene.means.shape[0]), dynamic, model)
    on = f" on tier {tier}" if tier else ""
    logger.info("memory model%s (experts: %s): %s", on, model.describe(), peak_memory.describe(e))
    return e


def log_measured_memory(device, predicted: dict | None, memory) -> None:
    """On CUDA, log the measured peak GPU memory of this process beside the model's."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return
    gib = peak_memory.GiB
    line = (
        f"measured peak GPU memory: {torch.cuda.max_memory_allocated() / gib:.1f} GiB allocated, "
        f"{torch.cuda.max_memory_reserved() / gib:.1f} GiB reserved"
    )
    if predicted is not None:
        line += (
            f" (model: {predicted['gpu_bytes'] / gib:.1f} allocated, "
            f"{predicted['reserved_bytes'] / gib:.1f} reserved)"
        )
    if memory.log_run_time:  # its phase clock resets the allocated peak per phase
        line += "; allocated is the last phase's (per-phase peaks: the loss log's *_peak_mb)"
    logger.info(line)


def run_stage(
    stage: str,
    *,
    inputs: dict,
    out: Path,
    loss_log: Path,
    checkpoint_dir: Path,
    method,
    guidance,
    memory=None,
    handoff: Path | None = None,
    device="cpu",
    group: Group | None = None,
    tier: str | None = None,
    render_backend: str = "auto",
    env=None,
    deadline: float | None = None,
    runtime_h: float | None = None,
    scene: str = "-",
    attempt: int = 1,
    progress_every_s: float = progress.DEFAULT_EVERY_S,
    preview: dict | None = None,
    tensorboard: bool = False,
) -> dict:
    """Run ``stage`` ("coarse" or "fine"); returns a summary.

    ``method`` and ``memory`` (a MemoryConfig; None: the defaults) are the effective ones, with
    the memory tier's flags and size applied (:func:`chord.resources.tiers.apply`); the hand-off
    state
    records that size and ``tier``. The fine
    stage continues the coarse hand-off at the size it was trained at.

    The training's preflight (:func:`chord.checks.preflight.preflight`, ``env`` the process
    environment for its allocator check) runs first and stops a run that would fail later.
    On a CPU, torch's deterministic algorithms are switched on for the process, so resume and
    coarse → fine reproduce an uninterrupted run bit for bit (METHOD §7); on a GPU results
    agree up to floating-point reordering. ``deadline``: the job's end (seconds since the
    epoch), before which the training stops (:func:`chord.training.run_loop.run`); ``runtime_h``:
    the
    tier's wall time, which the log warns of when the run's projected time exceeds it.

    Rank 0 reports progress (:class:`chord.training.progress.Progress`: a line in the log every
    ``progress_every_s`` seconds, ``progress.jsonl`` and ``progress.json`` beside the loss
    history), naming ``scene`` (the run), ``tier`` and ``attempt``; with ``preview`` (folder,
    every, ref_azim, ref_cam_radius, fps: the run's view-only keys, read by no training) a
    live preview of the motion every so many iterations (:mod:`chord.training.live_preview`);
    ``tensorboard``: TensorBoard scalars too (:mod:`chord.training.scalars`).
    """
    method = stage_config(method, "train")  # only the keys it reads
    if torch.device(device).type == "cpu":
        torch.use_deterministic_algorithms(True)
    start_ckpt = None
    if stage == "fine":
        if handoff is None:
            raise ValueError("train_fine needs the coarse hand-off state")
        start_ckpt = run_loop.load_checkpoint(handoff)
        size = start_ckpt.get("size", method.size)
        if size != method.size:  # e.g. the coarse stage escalated to a lowres tier
            logger.info("continuing the coarse hand-off at its size %s, not %s", size, method.size)
            method = dataclasses.replace(method, size=size)
    memory = memory or settings.memory_from_mapping({})
    if tensorboard:
        scalars.summary_writer()  # its absence stops the run before anything loads
    if tier:
        logger.info("training %s on tier %s", stage, tier)
    run_preflight(
        inputs, method, memory, guidance, device, render_backend, tier, checkpoint_dir, env
    )
    # N ranks of batch_size videos train what one process of N·batch_size does: one hash
    h = training_hash(method, guidance, group.world_size if group else 1)
    seed = rng.base_seed(method.seed)
    if start_ckpt is not None:
        if start_ckpt["config_hash"] != h:
            raise InputError(f"{handoff}: written with another configuration; rerun coarse")
        seed = start_ckpt["seed"]
    # checkpoints live per configuration hash: a changed configuration starts fresh
    ckpt_dir = Path(checkpoint_dir) / h
    others = [p.name for p in Path(checkpoint_dir).glob("*") if p.is_dir() and p.name != h]
    resume = newest_checkpoint(ckpt_dir)
    if resume is not None:
        seed = resume["seed"]
    elif others:
        logger.info(
            "configuration changed since the checkpoints in %s; starting fresh", checkpoint_dir
        )
    group = group or Group(device=device)
    seed = group.broadcast_int(seed, "base seed")  # an unseeded run draws it once, on rank 0
    trainer = build(
        **inputs,
        method=method,
        guidance=guidance,
        memory=memory,
        seed=seed,
        device=device,
        group=group,
        render_backend=render_backend,
    )
    logger.info(
        "training on %s; rendering with the %s",
        describe_device(device),
        describe_backend(trainer.backend),
    )
    predicted = log_memory_estimate(trainer, method, guidance, tier)
    N = method.iterations
    stop = method.add_cp_layer_iter if stage == "coarse" and method.add_cp_objs else N + 1
    start = 1
    if start_ckpt is not None:
        start = checkpoint.restore(trainer, start_ckpt)
    if resume is not None and resume["iteration"] + 1 > start:
        start = checkpoint.restore(trainer, resume)
        logger.info("resuming %s from iteration %d", stage, start)
    early = (2 * N) // 3 if method.early_stop else None
    timings = ()
    if memory.log_run_time:  # per-phase seconds (and CUDA peaks) as extra columns
        phases = ("regularisers", "sds", "all_reduce")
        timings = tuple(f"{p}_s" for p in phases)
        if torch.cuda.is_available():
            timings += tuple(f"{p}_peak_mb" for p in phases)
    writer = group.rank == 0  # only rank 0 writes logs, checkpoints and the hand-off
    # The loss log grows beside the checkpoints (outside the job's outputs, which Snakemake
    # deletes when an attempt fails) and is copied to the output at the end: a retry or a
    # requeued job keeps the rows before its resume point.
    history = ckpt_dir / LOSS_HISTORY
    log = LossLog(history, start, timings) if writer else None
    board = (
        scalars.Scalars(ckpt_dir / scalars.FOLDER, stage, start, log)
        if log and tensorboard
        else None
    )
    watch = None
    try:
        if start < stop and (early is None or start <= early):
            if writer:
                watch = progress.Progress(
                    ckpt_dir,
                    scene=scene,
                    stage=stage,
                    start=start,
                    last=min(stop - 1, early) if early is not None else stop - 1,
                    tier=tier,
                    attempt=attempt,
                    every_s=progress_every_s,
                    gpu_peak=gpu_peak_gb(device),
                )
                if preview and preview["every"]:
                    # a preview is for watching: without an MP4 encoder the run goes on without
                    off = media.mp4_unavailable_reason()
                    if off is None:
                        watch.render_preview = live_preview(trainer, method, preview)
                        watch.preview_every = preview["every"]
                    else:
                        logger.warning("live previews off: %s", off)
            last = run_loop.run(
                trainer,
                start,
                stop,
                config_hash=h,
                checkpoint_dir=ckpt_dir,
                log=board or log,
                writer=writer,
                max_nonfinite_steps=guidance.max_nonfinite_steps,
                fallback=guidance.nonfinite_fallback,
                deadline=deadline,
                runtime_h=runtime_h,
                tier=tier,
                progress=watch,
            )
        else:
            last = start - 1
    except Exception as exc:
        if watch is not None and not isinstance(exc, run_loop.Interrupted):
            watch.event("failed", watch.latest.get("it", start), error=type(exc).__name__)
        raise
    finally:
        if log is not None:
            log.close()
        if board is not None:
            board.close()
    if watch is not None:
        watch.finish(last)
    log_measured_memory(device, predicted, memory)
    if writer:
        Path(loss_log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(history, loss_log)
    if writer:  # the hand-off records the size trained at (a lowres tier changes it) and the tier
        final = {
            **checkpoint.contents(trainer, last, h),
            "size": method.size,
            "tier": tier,
            # every stage's tier, coarse first: the result's provenance (metrics.tsv)
            "tiers": [*(start_ckpt.get("tiers", []) if start_ckpt else []), tier],
            "render_backend": trainer.backend,
            "device": str(device),
        }
        run_loop.save_checkpoint(out, final)
    group.barrier()
    return {"stage": stage, "start": start, "last": last, "seed": seed}


def live_preview_every(method) -> int:
    """Iterations between live previews (method.preview_every; -1: about ten per run)."""
    from chord.training.live_preview import every

    return every(method.preview_every, method.iterations)


def run(
    stage: str,
    *,
    conf,
    scene: str,
    tier: str,
    inputs: dict,
    out: Path,
    loss_log: Path,
    checkpoint_dir: Path,
    handoff: Path | None,
    env,
    attempt: int = 1,
) -> dict:
    """Rules ``train_coarse`` and ``train_fine``: :func:`run_stage` on this attempt's memory
    ``tier`` (its flags and size applied to the scene's method and the config's memory
    flags), on the tier's GPUs (:func:`chord.resources.gpus.job_gpus` narrows ``env``'s
    CUDA_VISIBLE_DEVICES to them before CUDA starts), noting an out-of-memory exit for the
    retry's tier (:func:`chord.resources.out_of_memory.recorded`).

    On a multi-GPU tier (``gpus: N``) N ranks train, one process per GPU
    (:func:`chord.training.multi_gpu_launch.launch`: NCCL on CUDA, gloo on a CPU), each
    :func:`run_stage` on
    ``batch_size / N`` of the scene's videos (:func:`chord.resources.tiers.per_gpu`; a
    ``batch_size``
    that N does not divide is a ConfigError): the draws and the result of one process with
    ``batch_size`` videos, up to the reduction order. Rank 0 writes; a failing rank fails the
    job with its traceback, and an out-of-memory error in any rank is recorded for the retry.
    ``CHORD_TEST_OOM_TIERS`` in ``env`` (tests) makes the training run out of memory on those
    tiers (``<tier>@<rank>``: in that rank only)."""
    from chord.resources import gpus
    from chord.training import multi_gpu_launch

    spec = scene_plan.run_spec(conf, scene)  # a seed sweep's run (<scene>/seed_<s>): its seed
    table = tiers.parse(conf.tiers)
    chosen = table[tier]
    job = tiers.training_job(spec.method, conf.memory, chosen, scene=scene)
    method, memory = job.rank_method, job.memory  # the videos of each rank
    record = Path(checkpoint_dir) / out_of_memory.RECORD
    oom = env.get("CHORD_TEST_OOM_TIERS", "")
    kwargs = {
        "inputs": {**inputs, "data_dir": spec.data},
        "out": out,
        "loss_log": loss_log,
        "checkpoint_dir": checkpoint_dir,
        "method": method,
        "memory": memory,
        "guidance": conf.guidance,
        "handoff": handoff,
        "tier": chosen.name,
        "runtime_h": chosen.runtime_h,
        "render_backend": conf.render_backend,
        "scene": scene,
        "attempt": attempt,
        "progress_every_s": spec.method.progress_every_s,
        "tensorboard": conf.logging.tensorboard,
        "preview": {  # the live previews' view-only keys: read here, by no training
            "folder": results_layout.previews_dir(conf.results, scene),
            "every": live_preview_every(spec.method),
            "ref_azim": spec.method.ref_azim,
            "ref_cam_radius": spec.method.ref_cam_radius,
            "fps": spec.method.save_fps,
        },
    }
    order = list(table)
    deadline = kwargs["deadline"] = slurm_time_limit.slurm_deadline(env)
    with (
        gpus.job_gpus(env, chosen.gpus),
        out_of_memory.recorded(record, chosen.name, order=order),
        slurm_time_limit.time_limit(checkpoint_dir, chosen, env, deadline, scene=scene),
    ):
        cuda = torch.cuda.is_available()
        if chosen.gpus == 1:
            out_of_memory.inject(oom, chosen.name)
            return run_stage(stage, device="cuda" if cuda else "cpu", env=env, **kwargs)
        if cuda and torch.cuda.device_count() < chosen.gpus:
            raise settings.ConfigError(
                f"scene {scene}: tier {chosen.name} trains on {chosen.gpus} GPUs (gpus: "
                f"{chosen.gpus}), but this job sees {torch.cuda.device_count()} "
                f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', 'unset')}); run it "
                f"where a node has {chosen.gpus} GPUs (locally the gpu resource is capped at "
                "this machine's count)"
            )
        logger.info(
            "tier %s: %d ranks on %s, %d of the %d videos per step each",
            chosen.name,
            chosen.gpus,
            f"GPUs {env.get('CUDA_VISIBLE_DEVICES', 'all')}" if cuda else "the CPU (gloo)",
            method.batch_size,
            spec.method.batch_size,
        )
        target = out_of_memory.with_injected(run_stage, oom, chosen.name)
        env = dict(env)
        return multi_gpu_launch.launch(
            target, chosen.gpus, env=env, kwargs={"stage": stage, "env": env, **kwargs}
        )
