"""What a training job asks of the GPU and the scheduler, from the peak-memory model
(:mod:`chord.resources.peak_memory`) applied to a scene on a tier: the Gaussian counts known before
the ``gaussians`` stage runs, the peak estimate per tier, the fit test ``tier: auto`` uses
(:class:`ModelFits`), the host RAM and CPUs a job requests, and the condition job's GPU.
``python -m chord.resources.job_size`` prints the model's peak per tier of a config. Torch-free: the
DAG build sizes every job from here."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chord.config import settings
from chord.core.errors import InputError
from chord.resources import gpus, peak_memory, tiers
from chord.resources.tiers import Tier, apply, parse


def condition_gpus(guidance, method) -> int:
    """GPUs the condition job asks for and uses: 1 where the Wan folder's UMT5 encodes on a GPU
    (``method.t5_cpu`` false, Wan's default), 0 with ``t5_cpu`` or the oracle demo's tiny
    encoder (on the CPU)."""
    return int(bool(guidance.ckpt_dir) and not method.t5_cpu)


def gaussian_counts(
    method, roles: Mapping[str, str], imported: Mapping[str, int] | None = None
) -> tuple[int, int]:
    """(all, dynamic) Gaussians a scene trains with, known before its ``gaussians`` stage runs.

    ``roles``: ``{obj: "static" | "dynamic" | "avoided"}``
    (:func:`chord.config.settings.object_roles`).
    Each object that is not avoided starts with ``method.gs_init_nums[obj]``, else
    ``method.gs_init_num``, surface Gaussians, or with the count of its imported PLY where
    ``imported`` has one (the sheet's ``gaussians`` folder, :func:`imported_counts`).
    """
    imported = imported or {}
    counts = {
        obj: imported.get(obj, method.gs_init_nums.get(obj, method.gs_init_num))
        for obj, role in roles.items()
        if role != "avoided"
    }
    dynamic = sum(n for obj, n in counts.items() if roles[obj] == "dynamic")
    return sum(counts.values()), dynamic


def imported_counts(folder: Path | None, objects: Iterable[str]) -> dict[str, int]:
    """``{obj: vertex count}`` of the fitted 3DGS PLYs under the sheet's ``gaussians`` folder
    (read from the PLY headers; an object without one is left out: its stage reports it)."""
    if folder is None:
        return {}
    from chord.gaussians.ply import find_fitted_ply

    counts = {}
    for obj in objects:
        try:
            counts[obj] = ply_vertex_count(find_fitted_ply(Path(folder) / obj))
        except (ValueError, OSError):
            continue
    return counts


def ply_vertex_count(path: Path) -> int:
    """The ``element vertex`` count in a PLY header (ValueError when there is none)."""
    with open(path, "rb") as f:
        for _ in range(200):
            line = f.readline()
            words = line.split()
            if words[:2] == [b"element", b"vertex"] and len(words) == 3:
                return int(words[2])
            if not line or line.strip() == b"end_header":
                break
    raise InputError(f"{path}: no 'element vertex' in the PLY header")


#: the contact terms' points per dynamic object (chord.motion.contact.CONTACT_SAMPLES, the
#: evaluation's surface samples; a test keeps them equal)
CONTACT_SAMPLES = 2048


def contact_points(method, roles: Mapping[str, str]) -> int:
    """The points the contact and support losses (:mod:`chord.motion.contact`) read per
    iteration, all dynamic objects together: :data:`CONTACT_SAMPLES` surface samples each; 0
    where both weights are 0 or no object is static (no grid:
    :func:`chord.training.scene_trainer.build`)."""
    on = method.lambda_contact > 0 or method.lambda_support > 0
    if not on or "static" not in roles.values():
        return 0
    return CONTACT_SAMPLES * sum(role == "dynamic" for role in roles.values())


def trained_contact(method, scene, grid) -> dict:
    """The contact keywords of :func:`estimate` for a built training: :func:`contact_points`
    of ``scene``'s objects (a MotionScene: its ``names`` and ``dynamic``) and the node count of
    its distance ``grid`` (:class:`chord.motion.contact.DistanceGrid`); none without one."""
    if grid is None:
        return {}
    roles = {n: "dynamic" if n in scene.dynamic else "static" for n in scene.names}
    points = contact_points(method, roles)
    return {"contact_points": points, "contact_grid_nodes": int(grid.values.numel())}


def memory_shape(
    method,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    gpus: int = 1,
    contact_points: int = 0,
) -> dict:
    """The keyword arguments of :func:`chord.resources.peak_memory.estimate` besides the flags: the
    method's
    SDS size, frame_num, use_tiny_vae, the Gaussian counts, and on ``gpus`` GPUs (a multi-GPU
    tier) the videos each holds, ``batch_size / gpus`` (rounded up where it does not divide:
    :func:`chord.resources.tiers.per_gpu` reports that); ``contact_points``: those of the
    contact loss (:func:`contact_points`; 0: off)."""
    width, height = settings.parse_size(method.size, where="method: size")
    contact = {"contact_points": contact_points} if contact_points else {}  # only where on
    return {
        "width": width,
        "height": height,
        "frames": method.frame_num,
        "batch": -(-method.batch_size // gpus),
        "gpus": gpus,
        "gaussians": gaussians,
        "dynamic_gaussians": dynamic_gaussians,
        "use_tiny_vae": method.use_tiny_vae,
        **contact,
    }


def estimate(
    method,
    mem,
    tier: Tier | None,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: peak_memory.ModelShape = peak_memory.A14B,
    *,
    contact_points: int = 0,
    contact_grid_nodes: int | None = None,
) -> dict:
    """:func:`chord.resources.peak_memory.estimate` of a training of ``method`` with the memory
    flags ``mem``
    on ``tier`` (its flags and size applied, :func:`chord.resources.tiers.apply`; ``None``: as they
    are, e.g.
    already applied, on one GPU), with the experts of ``model``
    (:func:`chord.resources.peak_memory.model_for`). On a multi-GPU tier the GPU figures are per
    GPU (its
    ``batch_size / gpus`` videos) and the host RAM the job's (every rank holds an expert).
    ``contact_points`` (:func:`contact_points`; 0: off) and ``contact_grid_nodes`` (None: the
    worst case): the contact loss's sizes."""
    gpus = 1
    if tier is not None:
        method, mem = apply(method, mem, tier)
        gpus = tier.gpus
    shape = memory_shape(method, gaussians, dynamic_gaussians, gpus, contact_points)
    return peak_memory.estimate(mem, model=model, contact_grid_nodes=contact_grid_nodes, **shape)


@dataclass(frozen=True)
class ModelFits:
    """The ``fits`` of :func:`chord.resources.tiers.auto` for one scene: whether the peak-memory
    model
    predicts that a training of ``method`` with the memory flags ``mem`` on a tier fits a GPU of
    ``gpu_gib`` GiB, the card's reported total (:func:`chord.resources.peak_memory.fits`: reserved
    bytes
    plus a CUDA context). On a multi-GPU tier, each of its GPUs with ``batch_size / gpus``
    videos."""

    method: Any
    mem: Any  # MemoryConfig: the flags a tier leaves unset
    gpu_gib: float
    gaussians: int
    dynamic_gaussians: int
    label: str = ""
    model: peak_memory.ModelShape = peak_memory.A14B
    contact_points: int = 0  # the contact loss's (contact_points; 0: off)

    def __call__(self, tier: Tier) -> bool:
        m, mem = apply(self.method, self.mem, tier)
        shape = memory_shape(
            m, self.gaussians, self.dynamic_gaussians, tier.gpus, self.contact_points
        )
        return peak_memory.fits(mem, self.gpu_gib, model=self.model, **shape)

    def describe(self, tier: Tier) -> str:
        e = estimate(
            self.method,
            self.mem,
            tier,
            self.gaussians,
            self.dynamic_gaussians,
            self.model,
            contact_points=self.contact_points,
        )
        where = f"{self.label}, " if self.label else ""
        return f"{where}tier {tier.name} predicted {peak_memory.describe(e)}"


def scene_fits(
    method,
    mem,
    roles: Mapping[str, str],
    node: gpus.Node | None,
    *,
    backend: str,
    fitted: Path | None = None,
    label: str = "",
    model: peak_memory.ModelShape = peak_memory.A14B,
) -> ModelFits | None:
    """The :class:`ModelFits` of a scene for ``tier: auto`` on ``node``'s smallest GPU (its
    real bytes), or None where the model does not apply: no GPU, the oracle teacher (the model
    is that of the Wan teacher), or no objects known (ingest reports that). ``fitted``: the
    sheet's ``gaussians`` folder; ``model``: the experts' shapes
    (:func:`chord.resources.peak_memory.model_for` the Wan folder)."""
    if node is None or backend != "wan":
        return None
    objects = [obj for obj, role in roles.items() if role != "avoided"]
    n, dynamic = gaussian_counts(method, roles, imported_counts(fitted, objects))
    if n <= 0:
        return None
    gib = node.total_bytes / peak_memory.GiB
    contact = contact_points(method, roles)
    return ModelFits(method, mem, gib, n, dynamic, label, model, contact)


def scene_start(
    conf: settings.Config, scene_plan, table: Mapping[str, Tier], node, model=peak_memory.A14B
):
    """The :class:`chord.resources.tiers.Choice` a scene's training starts on
    (:func:`chord.resources.tiers.start`):
    its sheet column, or ``auto`` on ``node`` with the peak-memory model's fit (``model``: the
    experts' shapes). A ConfigError names the scene."""
    spec = conf.scenes[scene_plan.scene]
    fits = None
    if spec.tier == tiers.AUTO:
        fits = scene_fits(
            spec.method,
            conf.memory,
            scene_plan.roles,
            node,
            backend=conf.guidance.backend,
            fitted=spec.gaussians,
            label=f"scene {scene_plan.scene}",
            model=model,
        )
    try:
        return tiers.start(
            spec.tier, table, node, fits, method=spec.method, allow_lowres=conf.auto_lowres
        )
    except settings.ConfigError as exc:
        raise settings.ConfigError(f"scene {scene_plan.scene}: {exc}") from None


#: Host RAM (MB) and CPUs of a training with the oracle teacher: no Wan weights (the demo's
#: trainings measure ~0.5 GB max_rss in their benchmark files).
ORACLE_HOST_MB = 2048
ORACLE_CPUS = 1


def job_request(
    tier: Tier,
    *,
    backend: str,
    method=None,
    mem=None,
    roles: Mapping[str, str] | None = None,
    fitted: Path | None = None,
    model: peak_memory.ModelShape = peak_memory.A14B,
) -> dict:
    """``{"mem_mb", "cpus_per_gpu"}`` a training job on ``tier`` asks the scheduler for: what
    the training needs, with the tier's ``host_mem_gb`` and ``cpus_per_gpu`` as the ceiling.
    The oracle teacher needs little (:data:`ORACLE_HOST_MB`, one CPU); the Wan teacher the
    peak-memory model's host RAM (one expert, mmgp's staging on offload tiers) with a 10%
    margin, where the scene's Gaussian counts are known (else the tier's value). On a
    multi-GPU tier each rank holds all of that (the estimate's host RAM is the job's, every
    rank's expert); ``cpus_per_gpu`` is per GPU already.

    A Wan training the model says needs more than the ceiling is a ConfigError naming both
    figures and the ``host_mem_gb`` that fits (a job capped below its need would be killed
    for its memory hours in, or fail its preflight)."""
    if backend == "oracle":
        return {
            "mem_mb": min(tier.mem_mb, ORACLE_HOST_MB * tier.gpus),
            "cpus_per_gpu": min(tier.cpus_per_gpu, ORACLE_CPUS),
        }
    mem_mb = tier.mem_mb
    if method is not None and mem is not None and roles:
        objects = [obj for obj, role in roles.items() if role != "avoided"]
        n, dynamic = gaussian_counts(method, roles, imported_counts(fitted, objects))
        if n > 0:
            margin = 1.1
            host = estimate(method, mem, tier, n, dynamic, model)["host_bytes"]
            mem_mb = int(math.ceil(host * margin / 2**20))
            if mem_mb > tier.mem_mb:
                ranks = f" ({tier.gpus} ranks, each with its expert)" if tier.gpus > 1 else ""
                raise settings.ConfigError(
                    f"tier {tier.name}: the memory model puts a training's host RAM at "
                    f"{host / peak_memory.GiB:.1f} GiB{ranks}, {mem_mb} MB with the "
                    f"{margin - 1:.0%} margin the job asks for, more than the tier's "
                    f"host_mem_gb {tier.host_mem_gb:g} ({tier.mem_mb} MB); raise "
                    f"tiers.{tier.name}.host_mem_gb to at least {math.ceil(mem_mb / 1024)}"
                )
    return {"mem_mb": mem_mb, "cpus_per_gpu": tier.cpus_per_gpu}


def table(
    tiers: Mapping[str, Tier],
    *,
    method,
    memory,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: peak_memory.ModelShape = peak_memory.A14B,
    gpus: int | None = None,
    contact_points: int = 0,
) -> list[dict]:
    """One row per tier (``gpus`` overrides each tier's GPU count): the
    videos per GPU, the peak per GPU, what it needs with a CUDA context, whether that fits the
    tier's declared ``gpu_mem_gb``, and the job's host RAM."""
    rows = []
    for tier in tiers.values():
        if gpus is not None:
            tier = dataclasses.replace(tier, gpus=gpus)
        e = estimate(
            method, memory, tier, gaussians, dynamic_gaussians, model, contact_points=contact_points
        )
        need = e["reserved_bytes"] / peak_memory.GiB + peak_memory.CUDA_CONTEXT_GIB
        rows.append(
            {
                "tier": tier.name,
                "gpus": tier.gpus,
                "videos_per_gpu": e["batch"],
                "size": f"{e['width']}x{e['height']}",
                "allocated_gib": e["gpu_bytes"] / peak_memory.GiB,
                "reserved_gib": e["reserved_bytes"] / peak_memory.GiB,
                "needs_gib": need,
                "gpu_mem_gb": tier.gpu_mem_gb,
                "fits": need <= tier.gpu_mem_gb,
                "host_gib": e["host_bytes"] / peak_memory.GiB,
                "phase": e["phase"],
                "divides": method.batch_size % tier.gpus == 0,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m chord.resources.job_size``: the memory model's peak per GPU for each tier of
    a config."""
    import argparse

    import yaml

    p = argparse.ArgumentParser(
        prog="python -m chord.resources.job_size",
        description="Predicted peak GPU memory (per GPU) and host RAM (per job) of each tier.",
    )
    p.add_argument("--config", default="config/config.yaml", help="its tiers and memory flags")
    p.add_argument("--size", default="832*480")
    p.add_argument("--frames", type=int, default=41)
    p.add_argument("--batch", type=int, default=4, help="method.batch_size: videos per step")
    p.add_argument("--gaussians", type=int, default=200_000, help="all objects' Gaussians")
    p.add_argument("--dynamic", type=int, default=100_000, help="the dynamic objects' share")
    p.add_argument(
        "--dynamic-objects", type=int, default=1, help="beside one static: the contact loss's sets"
    )
    p.add_argument("--wan-vae", action="store_true", help="encode with the Wan VAE, not Tiny")
    p.add_argument("--gpus", type=int, default=None, help="every tier on this many GPUs")
    p.add_argument("--ckpt-dir", default=None, help="Wan folder: its experts' shapes (A14B)")
    args = p.parse_args(argv)
    with open(args.config) as f:
        conf = yaml.safe_load(f)
    settings.validate_config(conf)
    method = settings.method_from_mapping(
        {
            **(conf.get("method") or {}),  # lambda_contact, surface_target_num
            "size": args.size,
            "frame_num": args.frames,
            "batch_size": args.batch,
            "use_tiny_vae": not args.wan_vae,
        }
    )
    memory = settings.memory_from_mapping(conf.get("memory") or {})
    roles = {"obj_0": "static"} | {f"obj_{i + 1}": "dynamic" for i in range(args.dynamic_objects)}
    contact = contact_points(method, roles)
    rows = table(
        parse(conf["tiers"]),
        method=method,
        memory=memory,
        gaussians=args.gaussians,
        dynamic_gaussians=args.dynamic,
        model=peak_memory.model_for(args.ckpt_dir),
        gpus=args.gpus,
        contact_points=contact,
    )
    print(
        f"{args.size}, {args.frames} frames, batch_size {args.batch}, {args.gaussians} "
        f"Gaussians ({args.dynamic} dynamic), {'Wan' if args.wan_vae else 'Tiny'} VAE"
        + (f", contact loss on {contact} surface points" if contact else "")
    )
    head = (
        f"{'tier':<12}{'gpus':>5}{'videos/GPU':>11}{'size':>9}{'allocated':>11}"
        f"{'reserved':>10}{'needs':>8}{'declared':>10}  fits  {'host/job':>8}  phase"
    )
    print(head)
    for r in rows:
        fits = "yes" if r["fits"] else "no"
        if not r["divides"]:
            fits = "batch"  # batch_size is not a multiple of gpus: a ConfigError
        print(
            f"{r['tier']:<12}{r['gpus']:>5}{r['videos_per_gpu']:>11}{r['size']:>9}"
            f"{r['allocated_gib']:>10.1f}G{r['reserved_gib']:>9.1f}G{r['needs_gib']:>7.1f}G"
            f"{r['gpu_mem_gb']:>9.0f}G  {fits:<5} {r['host_gib']:>7.0f}G  {r['phase']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
