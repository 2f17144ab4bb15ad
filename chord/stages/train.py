"""Stages ``train_coarse`` and ``train_fine`` (METHOD §7, §17–§19): build the trainer from
the earlier stages' files, resume from the newest valid checkpoint, and write the hand-off
state (coarse.pt / fine.pt) and the loss log."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from chord.config import settings
from chord.config.result_keys import stage_config, training_hash
from chord.plan import results_layout, scene_plan
from chord.render.backend import describe_backend
from chord.resources import job_size, out_of_memory, tiers
from chord.training import (
    checkpoint,
    device_report,
    recorded_run,
    resume,
    scalars,
    scene_trainer,
    slurm_time_limit,
)
from chord.training.distributed import Group
from chord.training.loss_log import LOSS_HISTORY
from chord.training.run_settings import RunSettings

logger = logging.getLogger(__name__)


def run_preflight(
    inputs, method, memory, guidance, device, render_backend, tier, checkpoint_dir, env
):
    """:func:`chord.checks.preflight.preflight` of this training, from its input files' headers."""
    from chord.checks import capacity, preflight

    counts = {name: job_size.ply_vertex_count(path) for name, path in inputs["plys"].items()}
    dynamic = list(inputs["voxels"])
    roles = {name: "dynamic" if name in dynamic else "static" for name in counts}
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
        control_point_count=capacity.control_points(method, dynamic),
        checkpoint_dir=Path(checkpoint_dir),
        env=env,
        contact_points=job_size.contact_points(method, roles),
    )


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
    render_backend: str = "auto",
    env=None,
    run_settings: RunSettings | None = None,
) -> dict:
    """Run ``stage`` ("coarse" or "fine"); returns a summary.

    ``method`` and ``memory`` (a MemoryConfig; None: the defaults) are the effective ones, with the
    memory tier's flags and size applied (:func:`chord.resources.tiers.apply`); the hand-off state
    records that size and ``run_settings.tier``. The fine stage continues the coarse hand-off at the
    size it was trained at (:func:`chord.training.resume.load_handoff`), and either stage resumes
    from its configuration's newest checkpoint (:mod:`chord.training.resume`).

    The training's preflight (:func:`chord.checks.preflight.preflight`, ``env`` the process
    environment for its allocator check) runs first and stops a run that would fail later.
    On a CPU, torch's deterministic algorithms are switched on for the process, so resume and
    coarse → fine reproduce an uninterrupted run bit for bit (METHOD §7); on a GPU results
    agree up to floating-point reordering.

    ``run_settings`` (:class:`chord.training.run_settings.RunSettings`; None: the defaults): how
    the job runs, none of it in the training hash. Its ``deadline`` (the job's end) stops the
    training (:func:`chord.training.run_loop.run`) and its ``runtime_h`` is what the log warns of
    when the run's projected time exceeds it; rank 0 reports progress
    (:class:`chord.training.progress.Progress`: a line in the log every ``progress_every_s``
    seconds, ``progress.jsonl`` and ``progress.json`` beside the loss history) naming its ``scene``,
    ``tier`` and ``attempt``, with ``preview`` (folder, every, ref_azim, ref_cam_radius, fps: the
    run's view-only keys) a live preview of the motion every so many iterations
    (:mod:`chord.training.live_preview`), with ``tensorboard`` TensorBoard scalars
    (:mod:`chord.training.scalars`). All of these: :func:`chord.training.recorded_run.run`.
    """
    method = stage_config(method, "train")  # only the keys it reads
    run_settings = run_settings or RunSettings()
    tier = run_settings.tier
    if torch.device(device).type == "cpu":
        torch.use_deterministic_algorithms(True)
    handed, method = resume.load_handoff(stage, handoff, method)
    memory = memory or settings.memory_from_mapping({})
    if run_settings.tensorboard:
        scalars.summary_writer()  # its absence stops the run before anything loads
    if tier:
        logger.info("training %s on tier %s", stage, tier)
    run_preflight(
        inputs, method, memory, guidance, device, render_backend, tier, checkpoint_dir, env
    )
    # N ranks of batch_size videos train what one process of N·batch_size does: one hash
    h = training_hash(method, guidance, group.world_size if group else 1)
    begin = resume.find_start(checkpoint_dir, h, method, handed, handoff)
    group = group or Group(device=device)
    seed = group.broadcast_int(begin.seed, "base seed")  # an unseeded run draws it once, on rank 0
    trainer = scene_trainer.build(
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
        device_report.describe_device(device),
        describe_backend(trainer.backend),
    )
    predicted = device_report.log_memory_estimate(trainer, method, guidance, tier)
    start = begin.restore(trainer, stage)
    N = method.iterations  # the coarse stage of a second layer stops where that layer joins
    stop = method.add_cp_layer_iter if stage == "coarse" and method.add_cp_objs else N + 1
    writer = group.rank == 0  # only rank 0 writes logs, checkpoints and the hand-off
    # The loss log grows beside the checkpoints (outside the job's outputs, which Snakemake
    # deletes when an attempt fails) and is copied to the output at the end: a retry or a
    # requeued job keeps the rows before its resume point.
    last = recorded_run.run(
        trainer,
        start,
        stop,
        stage=stage,
        config_hash=h,
        folder=begin.folder,
        guidance=guidance,
        writer=writer,
        run_settings=run_settings,
    )
    device_report.log_measured_memory(device, predicted, memory)
    if writer:
        Path(loss_log).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(begin.folder / LOSS_HISTORY, loss_log)
        final = checkpoint.handoff_contents(
            trainer, last, h, size=method.size, tier=tier, before=handed, device=device
        )
        checkpoint.save_checkpoint(out, final)
    group.barrier()
    return {"stage": stage, "start": start, "last": last, "seed": seed}


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
    :func:`run_stage` on ``batch_size / N`` of the scene's videos
    (:func:`chord.resources.tiers.per_gpu`; a ``batch_size`` that N does not divide is a
    ConfigError): the draws and the result of one process with
    ``batch_size`` videos, up to the reduction order. Rank 0 writes; a failing rank fails the
    job with its traceback, and an out-of-memory error in any rank is recorded for the retry.
    ``CHORD_TEST_OOM_TIERS`` in ``env`` (tests) makes the training run out of memory on those
    tiers (``<tier>@<rank>``: in that rank only)."""
    from chord.resources import gpus
    from chord.training import live_preview, multi_gpu_launch

    spec = scene_plan.run_spec(conf, scene)  # a seed sweep's run (<scene>/seed_<s>): its seed
    table = tiers.parse(conf.tiers)
    chosen = table[tier]
    job = tiers.training_job(spec.method, conf.memory, chosen, scene=scene)
    method, memory = job.rank_method, job.memory  # the videos of each rank
    record = Path(checkpoint_dir) / out_of_memory.RECORD
    oom = env.get("CHORD_TEST_OOM_TIERS", "")
    deadline = slurm_time_limit.slurm_deadline(env)
    kwargs = {
        "inputs": {**inputs, "data_dir": spec.data},
        "out": out,
        "loss_log": loss_log,
        "checkpoint_dir": checkpoint_dir,
        "method": method,
        "memory": memory,
        "guidance": conf.guidance,
        "handoff": handoff,
        "render_backend": conf.render_backend,
        "run_settings": RunSettings(
            scene=scene,
            tier=chosen.name,
            attempt=attempt,
            deadline=deadline,
            runtime_h=chosen.runtime_h,
            progress_every_s=spec.method.progress_every_s,
            # the live previews' view-only keys: read here, by no training
            preview=live_preview.view_keys(
                spec.method, results_layout.previews_dir(conf.results, scene)
            ),
            tensorboard=conf.logging.tensorboard,
        ),
    }
    order = list(table)
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
