"""Memory tiers (DESIGN §6): named sets of memory flags with the GPU memory, host RAM and wall
time a training needs; the tier a scene starts on; and the leaner tier an out-of-memory retry
moves to (which GPU a job takes: :mod:`chord.gpus`).

Memory flags (:class:`chord.config.MemoryConfig`) change memory and time, never results, so
they are Snakemake resources of the training rules (computed from ``attempt``), not params. A
tier's ``size`` (the ``lowres`` tiers) does change results: :func:`apply` puts it into the
method, so it enters the training's configuration hash and checkpoint folder. ``tier: auto``
checks each candidate against the peak-memory model (:mod:`chord.peak_memory`,
:class:`ModelFits`) before a job starts. Nothing here imports Snakemake or torch;
``rules/common.smk`` and the training stage call these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chord import config as cc
from chord import gpus, peak_memory
from chord.errors import InputError

logger = logging.getLogger(__name__)

AUTO = "auto"
# What a tier holds besides its memory flags (chord.config.MEMORY_FLAGS).
TIER_KEYS = (
    "gpu_mem_gb",
    "host_mem_gb",
    "runtime_h",
    "cpus_per_gpu",
    "gpus",
    "size",
    "gpu_model",
    "slurm_partition",
)
# Written next to a stage's checkpoints: one tier name per line that ran out of GPU memory.
OOM_RECORD = "out_of_memory.txt"
# What lowers a training's peak GPU memory without a leaner tier.
REMEDIES = (
    "To lower the peak: method.use_tiny_vae: true, or a lower method.size, frame_num or batch_size"
)


@dataclass(frozen=True)
class Tier:
    """One memory tier: what it needs (GPU memory, host RAM, wall time), its memory flags, an
    optional lower SDS ``size`` and, where a profile maps tiers to GPU kinds, the GPU model and
    Slurm partition its jobs ask for.

    ``gpus`` > 1: a data-parallel tier. Its jobs ask for that many GPUs of one node and train
    with that many ranks (METHOD §18), each on ``batch_size / gpus`` of the scene's videos (the
    method's ``batch_size`` stays the videos per step: :func:`per_gpu`), so the result is that
    of one GPU up to the reduction order. ``gpu_mem_gb`` and ``cpus_per_gpu`` are per GPU;
    ``host_mem_gb`` is the job's, all ranks together."""

    name: str
    gpu_mem_gb: float
    host_mem_gb: float = 32.0
    runtime_h: float = 24.0
    cpus_per_gpu: int = 8
    gpus: int = 1
    flags: dict = field(default_factory=dict)  # memory flag -> value, only those the tier sets
    size: str | None = None
    gpu_model: str | None = None
    slurm_partition: str | None = None

    @property
    def mem_mb(self) -> int:
        """Host RAM in MB (Snakemake's ``mem_mb``)."""
        return int(round(self.host_mem_gb * 1024))

    @property
    def runtime_min(self) -> int:
        """Wall time in minutes (Snakemake's ``runtime``)."""
        return int(math.ceil(self.runtime_h * 60))


def parse(mapping: Mapping[str, Mapping]) -> dict[str, Tier]:
    """The config's ``tiers:`` block (schema-validated) -> ordered ``{name: Tier}``.

    Order is escalation order: fullest first, each tier needing no more GPU memory (per GPU:
    a multi-GPU tier's ``gpu_mem_gb`` is that of each of its GPUs) than the one before it. The
    GPU count does not enter the order; list a multi-GPU tier before the single-GPU tiers of its
    per-GPU memory (``auto`` takes the first that fits, and it is the faster).
    """
    tiers: dict[str, Tier] = {}
    for name, spec in mapping.items():
        if name == AUTO:
            raise cc.ConfigError("config: tiers: 'auto' is reserved (the sheet's automatic choice)")
        size = spec.get("size")
        if size is not None:
            cc.parse_size(size, where=f"config: tiers.{name}.size")
        flags = {k: v for k, v in spec.items() if k not in TIER_KEYS}
        cc.check_memory_flags(flags, where=f"config: tiers.{name}")  # names and types
        tiers[name] = Tier(
            name=name,
            gpu_mem_gb=float(spec["gpu_mem_gb"]),
            host_mem_gb=float(spec.get("host_mem_gb", 32)),
            runtime_h=float(spec.get("runtime_h", 24)),
            cpus_per_gpu=int(spec.get("cpus_per_gpu", 8)),
            gpus=int(spec.get("gpus", 1)),
            flags=flags,
            size=size,
            gpu_model=spec.get("gpu_model"),
            slurm_partition=spec.get("slurm_partition"),
        )
        if tiers[name].gpus < 1:
            raise cc.ConfigError(f"config: tiers.{name}.gpus: {tiers[name].gpus}; at least 1")
    names = list(tiers)
    for before, after in zip(names, names[1:], strict=False):
        if tiers[after].gpu_mem_gb > tiers[before].gpu_mem_gb:
            raise cc.ConfigError(
                f"config: tiers: {after!r} needs {tiers[after].gpu_mem_gb} GB of GPU memory, more "
                f"than {before!r} before it ({tiers[before].gpu_mem_gb} GB); list tiers fullest "
                "first (that order is the out-of-memory escalation order)"
            )
    return tiers


@dataclass(frozen=True)
class Choice:
    """What ``tier: auto`` picked for a node: ``tier``, and every fuller tier passed over with
    the reason (``skipped``: (tier, why) in escalation order: by GPU count, by label, or by the
    peak-memory model's estimate)."""

    tier: str
    node: gpus.Node | None = None
    skipped: tuple[tuple[str, str], ...] = ()
    sheet: bool = False  # named in the sheet's tier column, not chosen by auto

    def describe(self) -> str:
        """One line for logs and ``chord doctor``: the tier, the node, the tiers skipped."""
        if self.sheet:
            return f"{self.tier} (the sheet's tier column)"
        if self.node is None:
            return f"{self.tier} (no GPU: a CPU run takes the first tier)"
        why = "".join(f"; {name}: {reason}" for name, reason in self.skipped)
        return f"{self.tier} on {self.node.describe()}{why}"


def choose(
    tiers: Mapping[str, Tier],
    node: gpus.Node | None,
    fits: Callable[[Tier], bool] | None = None,
    *,
    method=None,
    allow_lowres: bool = False,
) -> Choice:
    """The first (fullest) tier that ``node``'s GPUs can run (:func:`auto` without the logging).

    A tier fits a node when the node has its ``gpus`` GPUs, when the node's smallest GPU is
    one of its ``gpu_mem_gb`` label (:func:`chord.gpus.matches`: the reported total in 10^9
    bytes is at least the label, so a 24564 MiB RTX 4090 runs a 24 GB tier), and when ``fits``
    (a predicate, usually a :class:`ModelFits`: the peak-memory model against the card's real
    bytes) accepts it. ``None`` for the node means no GPU (a CPU run, where the memory flags do
    not matter): the first tier, without asking ``fits``. A GPU smaller than every tier gets
    the leanest one.

    It never picks a tier that changes the result by itself: a tier whose ``size`` is below
    ``method``'s (any tier with a ``size`` when ``method`` is None). When only such a tier fits
    (by label, or by the model) it raises ConfigError with the predicted peak and the remedies,
    unless ``allow_lowres`` (the config's ``auto_lowres``).

    When ``fits`` rejects every candidate, the run is not blocked (the model is calibrated on
    CPU proxies): the choice by label stands, with a warning giving the predicted peak
    (``fits.describe(tier)`` where ``fits`` has it) and what lowers it. An out-of-memory exit
    still escalates (:func:`for_attempt`).
    """
    if not tiers:
        raise cc.ConfigError("config: tiers: empty; at least one memory tier is needed")
    names = list(tiers)
    if node is None:
        return Choice(names[0])
    card = node.card
    skipped: list[tuple[str, str]] = []
    candidates = []
    for name in names:
        tier = tiers[name]
        if tier.gpus > node.gpus:
            skipped.append((name, f"needs {tier.gpus} GPUs, the node has {node.gpus}"))
        elif not gpus.matches(node.total_bytes, tier.gpu_mem_gb):
            skipped.append((name, f"needs {tier.gpu_mem_gb:g} GB per GPU, {card.gb:.1f} GB here"))
        else:
            candidates.append(name)
    if not candidates:
        logger.warning(
            "%s is smaller than every tier; using the leanest, %s", node.describe(), names[-1]
        )
        candidates = names[-1:]
        skipped = [s for s in skipped if s[0] != names[-1]]

    def changes_result(name: str) -> bool:
        tier = tiers[name]
        if method is None:
            return tier.size is not None
        return lower_size(method, tier) is not None

    keep = [n for n in candidates if allow_lowres or not changes_result(n)]
    remedies = REMEDIES
    optin = "auto_lowres: true in the config, or that tier in the sheet's tier column"
    if not keep:
        lowres = ", ".join(f"{n} ({tiers[n].size})" for n in candidates)
        raise cc.ConfigError(
            f"tier auto: {node.describe()} fits only tiers that lower the SDS size "
            f"({lowres}), which changes the result; to accept that, set {optin}"
        )
    declared = keep[0]

    def chosen(name: str) -> Choice:  # with the reasons of the fuller tiers passed over
        order = names.index(name)
        return Choice(name, node, tuple(s for s in skipped if names.index(s[0]) < order))

    by_label = chosen(declared)
    if fits is None:
        return by_label
    describe = getattr(fits, "describe", None) or (lambda tier: f"tier {tier.name}")
    for name in candidates:
        if not fits(tiers[name]):
            skipped.append(
                (name, f"the memory model predicts it would not fit: {describe(tiers[name])}")
            )
            continue
        if name not in keep:
            raise cc.ConfigError(
                f"tier auto: the memory model predicts that no tier at the method's size fits "
                f"{node.describe()} ({describe(tiers[declared])}); the first that does is {name} "
                f"at size {tiers[name].size}, which changes the result. {remedies}; or accept "
                f"{name}: {optin}"
            )
        if changes_result(name):
            logger.warning(
                "tier auto: starting on %s at size %s, which changes the result",
                name,
                tiers[name].size,
            )
        return chosen(name)
    leanest = "" if keep[-1] == declared else f"; leanest: {describe(tiers[keep[-1]])}"
    logger.warning(
        "the memory model predicts that no tier fits %s (%s%s); starting on %s by its label "
        "anyway (the model is calibrated on CPU proxies; an out-of-memory exit retries on the "
        "next tier). %s",
        node.describe(),
        describe(tiers[declared]),
        leanest,
        declared,
        remedies,
    )
    return by_label


def auto(
    tiers: Mapping[str, Tier],
    node: gpus.Node | None,
    fits: Callable[[Tier], bool] | None = None,
    *,
    method=None,
    allow_lowres: bool = False,
) -> str:
    """The tier :func:`choose` picks, with every fuller tier it skipped logged with the reason."""
    choice = choose(tiers, node, fits, method=method, allow_lowres=allow_lowres)
    logger.info("tier auto: %s", choice.describe())
    return choice.tier


def start(
    name: str,
    tiers: Mapping[str, Tier],
    node: gpus.Node | None,
    fits: Callable[[Tier], bool] | None = None,
    *,
    method=None,
    allow_lowres: bool = False,
) -> Choice:
    """A scene's first-attempt tier: its sheet value, or :func:`choose` (with ``fits``) for
    ``auto``. With ``method``, every tier a training of it may run on (this one and those an
    out-of-memory retry may move to) must split its ``batch_size`` over its GPUs
    (:func:`per_gpu`): a ConfigError before any job starts, not hours later on a retry."""
    if name == AUTO:
        choice = choose(tiers, node, fits, method=method, allow_lowres=allow_lowres)
    elif name in tiers:
        choice = Choice(name, node, sheet=True)
    else:
        raise cc.ConfigError(f"tier {name!r} is not one of {[AUTO, *tiers]}")
    if method is not None:
        names = list(tiers)
        for later in names[names.index(choice.tier) :]:
            per_gpu(method, tiers[later], start=choice.tier)
    return choice


def per_gpu(method, tier: Tier, *, scene: str | None = None, start: str | None = None):
    """``method`` as each rank of a training on ``tier`` runs it: ``batch_size / tier.gpus``
    videos (the method itself on a single-GPU tier). The scene's ``batch_size`` is the videos
    per step on every tier, so N ranks of B/N videos draw and train what one GPU with B does
    (METHOD §18, ``Trainer.video_index``). A ``batch_size`` that ``gpus`` does not divide is a
    ConfigError naming ``scene``, the tier and the values (``start``: the scene's start tier,
    when ``tier`` is one a retry may move to)."""
    n, batch = tier.gpus, method.batch_size
    if n == 1:
        return method
    if batch % n:
        where = f"scene {scene}: " if scene else ""
        reached = ""
        if start and start != tier.name:
            reached = f", which an out-of-memory retry from tier {start} may reach,"
        raise cc.ConfigError(
            f"{where}tier {tier.name}{reached} trains on {n} GPUs (gpus: {n}), each on "
            f"batch_size/gpus videos, but method.batch_size {batch} is not a multiple of {n}; "
            f"set batch_size to a multiple of {n}, or use tiers with fewer GPUs"
        )
    return dataclasses.replace(method, batch_size=batch // n)


def gaussian_counts(
    method, roles: Mapping[str, str], imported: Mapping[str, int] | None = None
) -> tuple[int, int]:
    """(all, dynamic) Gaussians a scene trains with, known before its ``gaussians`` stage runs.

    ``roles``: ``{obj: "static" | "dynamic" | "avoided"}`` (:func:`chord.config.object_roles`).
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
    from chord.ply import find_fitted_ply

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


def memory_shape(
    method, gaussians: int, dynamic_gaussians: int | None = None, gpus: int = 1
) -> dict:
    """The keyword arguments of :func:`chord.peak_memory.estimate` besides the flags: the method's
    SDS size, frame_num, use_tiny_vae, the Gaussian counts, and on ``gpus`` GPUs (a multi-GPU
    tier) the videos each holds, ``batch_size / gpus`` (rounded up where it does not divide:
    :func:`per_gpu` reports that)."""
    width, height = cc.parse_size(method.size, where="method: size")
    return {
        "width": width,
        "height": height,
        "frames": method.frame_num,
        "batch": -(-method.batch_size // gpus),
        "gpus": gpus,
        "gaussians": gaussians,
        "dynamic_gaussians": dynamic_gaussians,
        "use_tiny_vae": method.use_tiny_vae,
    }


def estimate(
    method,
    mem,
    tier: Tier | None,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: peak_memory.ModelShape = peak_memory.A14B,
) -> dict:
    """:func:`chord.peak_memory.estimate` of a training of ``method`` with the memory flags ``mem``
    on ``tier`` (its flags and size applied, :func:`apply`; ``None``: as they are, e.g.
    already applied, on one GPU), with the experts of ``model``
    (:func:`chord.peak_memory.model_for`). On a multi-GPU tier the GPU figures are per GPU (its
    ``batch_size / gpus`` videos) and the host RAM the job's (every rank holds an expert)."""
    gpus = 1
    if tier is not None:
        method, mem = apply(method, mem, tier)
        gpus = tier.gpus
    return peak_memory.estimate(
        mem, model=model, **memory_shape(method, gaussians, dynamic_gaussians, gpus)
    )


@dataclass(frozen=True)
class ModelFits:
    """The ``fits`` of :func:`auto` for one scene: whether the peak-memory model predicts that
    a training of ``method`` with the memory flags ``mem`` on a tier fits a GPU of
    ``gpu_gib`` GiB, the card's reported total (:func:`chord.peak_memory.fits`: reserved bytes
    plus a CUDA context). On a multi-GPU tier, each of its GPUs with ``batch_size / gpus``
    videos."""

    method: Any
    mem: Any  # MemoryConfig: the flags a tier leaves unset
    gpu_gib: float
    gaussians: int
    dynamic_gaussians: int
    label: str = ""
    model: peak_memory.ModelShape = peak_memory.A14B

    def __call__(self, tier: Tier) -> bool:
        m, mem = apply(self.method, self.mem, tier)
        shape = memory_shape(m, self.gaussians, self.dynamic_gaussians, tier.gpus)
        return peak_memory.fits(mem, self.gpu_gib, model=self.model, **shape)

    def describe(self, tier: Tier) -> str:
        e = estimate(
            self.method, self.mem, tier, self.gaussians, self.dynamic_gaussians, self.model
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
    (:func:`chord.peak_memory.model_for` the Wan folder)."""
    if node is None or backend != "wan":
        return None
    objects = [obj for obj, role in roles.items() if role != "avoided"]
    n, dynamic = gaussian_counts(method, roles, imported_counts(fitted, objects))
    if n <= 0:
        return None
    return ModelFits(method, mem, node.total_bytes / peak_memory.GiB, n, dynamic, label, model)


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
                raise cc.ConfigError(
                    f"tier {tier.name}: the memory model puts a training's host RAM at "
                    f"{host / peak_memory.GiB:.1f} GiB{ranks}, {mem_mb} MB with the "
                    f"{margin - 1:.0%} margin the job asks for, more than the tier's "
                    f"host_mem_gb {tier.host_mem_gb:g} ({tier.mem_mb} MB); raise "
                    f"tiers.{tier.name}.host_mem_gb to at least {math.ceil(mem_mb / 1024)}"
                )
    return {"mem_mb": mem_mb, "cpus_per_gpu": tier.cpus_per_gpu}


def for_attempt(
    start: str, attempt: int, tiers: Mapping[str, Tier], out_of_memory: Iterable[str] = ()
) -> str:
    """The tier of attempt ``attempt`` (1-based) of a training that starts on ``start``.

    Attempt 1 runs on ``start``. A retry moves past every tier from ``start`` on that ran out of
    memory (``out_of_memory``, see :func:`read_out_of_memory`), stopping at the leanest; a retry
    after another failure (a preempted job, say) stays on its tier.
    """
    names = list(tiers)
    i = names.index(start)
    if attempt <= 1:
        return start
    failed = set(out_of_memory)
    while names[i] in failed and i < len(names) - 1:
        i += 1
    return names[i]


def pixels(size: str) -> int:
    w, h = cc.parse_size(size)
    return w * h


def lower_size(method, tier: Tier) -> str | None:
    """``tier``'s size where it is below ``method``'s (the lowres tiers), else None."""
    if tier.size is not None and pixels(tier.size) < pixels(method.size):
        return tier.size
    return None


def apply(method, mem, tier: Tier) -> tuple:
    """(method, memory flags) a training on ``tier`` runs with: ``mem`` with the flags the
    tier sets, and ``method`` with the tier's size where that is lower (it changes the result:
    the size only ever goes down)."""
    size = lower_size(method, tier)
    if size is not None:
        method = dataclasses.replace(method, size=size)
    if tier.flags:
        mem = dataclasses.replace(mem, **tier.flags)
    return method, mem


def read_out_of_memory(path: Path) -> set[str]:
    """Tier names recorded in ``path`` (missing file: none)."""
    try:
        return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except FileNotFoundError:
        return set()


def record_out_of_memory(path: Path, tier: str) -> None:
    """Note that a training on ``tier`` ran out of GPU memory (read by the next attempt)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{tier}\n")


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's out-of-memory error (``torch.cuda.OutOfMemoryError``, since torch 2.5 also
    ``torch.OutOfMemoryError``); torch is only consulted if already imported."""
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return oom is not None and isinstance(exc, oom)


@contextlib.contextmanager
def out_of_memory_record(path: Path, tier: str, order: Sequence[str] = ()) -> Iterator[None]:
    """Run a training on ``tier``: if it runs out of GPU memory, note ``tier`` in ``path`` (the
    next attempt reads it) and re-raise; if it completes, remove the record. ``order``: the
    tiers' escalation order; when ``tier`` is its last (nothing leaner to retry on) the error
    logged names the tiers tried and what lowers the peak."""
    try:
        yield
    except BaseException as exc:
        if is_out_of_memory(exc):
            record_out_of_memory(path, tier)
            if order and tier == order[-1]:
                tried = read_out_of_memory(path)
                logger.error(
                    "out of GPU memory on every tier tried (%s): %s is the leanest, no retry "
                    "is left. %s",
                    ", ".join(t for t in order if t in tried),
                    tier,
                    REMEDIES,
                )
        raise
    Path(path).unlink(missing_ok=True)


def inject_out_of_memory(tiers_spec: str, tier: str, rank: int = 0) -> None:
    """Test hook: raise torch's out-of-memory error when ``tier`` is one of the comma-separated
    names in ``tiers_spec`` (the train adapter passes ``$CHORD_TEST_OOM_TIERS``), in every
    rank, or ``tier@r`` in rank ``r`` only (a multi-GPU tier). It lets a CPU test drive the
    real exit-and-escalate path; unset, it does nothing."""
    names = {t.strip() for t in tiers_spec.split(",") if t.strip()}
    if tier in names or f"{tier}@{rank}" in names:
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"injected out-of-memory on tier {tier!r}, rank {rank} (test hook CHORD_TEST_OOM_TIERS)"
        )


def with_injected_out_of_memory(target: Callable, tiers_spec: str, tier: str) -> Callable:
    """``target`` (a rank's training: called with ``group=``) with :func:`inject_out_of_memory`
    in front, for that rank; picklable, so each rank of a multi-GPU tier runs the hook."""
    return functools.partial(_inject_then_run, target, tiers_spec, tier)


def _inject_then_run(target: Callable, tiers_spec: str, tier: str, /, **kwargs):
    group = kwargs.get("group")
    inject_out_of_memory(tiers_spec, tier, group.rank if group is not None else 0)
    return target(**kwargs)


def table(
    tiers: Mapping[str, Tier],
    *,
    method,
    memory,
    gaussians: int,
    dynamic_gaussians: int | None = None,
    model: peak_memory.ModelShape = peak_memory.A14B,
    gpus: int | None = None,
) -> list[dict]:
    """One row per tier (``gpus`` overrides each tier's GPU count): the
    videos per GPU, the peak per GPU, what it needs with a CUDA context, whether that fits the
    tier's declared ``gpu_mem_gb``, and the job's host RAM."""
    rows = []
    for tier in tiers.values():
        if gpus is not None:
            tier = dataclasses.replace(tier, gpus=gpus)
        e = estimate(method, memory, tier, gaussians, dynamic_gaussians, model)
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
    """``python -m chord.tiers``: the memory model's peak per GPU for each tier of a config."""
    import argparse

    import yaml

    p = argparse.ArgumentParser(
        prog="python -m chord.tiers",
        description="Predicted peak GPU memory (per GPU) and host RAM (per job) of each tier.",
    )
    p.add_argument("--config", default="config/config.yaml", help="its tiers and memory flags")
    p.add_argument("--size", default="832*480")
    p.add_argument("--frames", type=int, default=41)
    p.add_argument("--batch", type=int, default=4, help="method.batch_size: videos per step")
    p.add_argument("--gaussians", type=int, default=200_000, help="all objects' Gaussians")
    p.add_argument("--dynamic", type=int, default=100_000, help="the dynamic objects' share")
    p.add_argument("--wan-vae", action="store_true", help="encode with the Wan VAE, not Tiny")
    p.add_argument("--gpus", type=int, default=None, help="every tier on this many GPUs")
    p.add_argument("--ckpt-dir", default=None, help="Wan folder: its experts' shapes (A14B)")
    args = p.parse_args(argv)
    with open(args.config) as f:
        conf = yaml.safe_load(f)
    cc.validate_config(conf)
    method = cc.method_from_mapping(
        {
            "size": args.size,
            "frame_num": args.frames,
            "batch_size": args.batch,
            "use_tiny_vae": not args.wan_vae,
        }
    )
    memory = cc.memory_from_mapping(conf.get("memory") or {})
    rows = table(
        parse(conf["tiers"]),
        method=method,
        memory=memory,
        gaussians=args.gaussians,
        dynamic_gaussians=args.dynamic,
        model=peak_memory.model_for(args.ckpt_dir),
        gpus=args.gpus,
    )
    print(
        f"{args.size}, {args.frames} frames, batch_size {args.batch}, {args.gaussians} "
        f"Gaussians ({args.dynamic} dynamic), {'Wan' if args.wan_vae else 'Tiny'} VAE"
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
