"""Memory tiers (DESIGN §6): named sets of memory flags with the GPU memory, host RAM and wall
time a training needs; the tier a scene starts on; and the leaner tier an out-of-memory retry
moves to (which GPU a job takes: :mod:`chord.resources.gpus`).

Memory flags (:class:`chord.config.settings.MemoryConfig`) change memory and time, never results, so
they are Snakemake resources of the training rules (computed from ``attempt``), not params. A
tier's ``size`` (the ``lowres`` tiers) does change results: :func:`apply` puts it into the
method, so it enters the training's configuration hash and checkpoint folder. ``tier: auto``
checks each candidate against a predicate, the peak-memory model's
(:class:`chord.resources.job_size.ModelFits`), before a job starts. Nothing here imports Snakemake
or
torch; ``rules/common.smk`` and the training stage call these functions.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chord.config import result_keys, settings
from chord.resources import gpus

logger = logging.getLogger(__name__)

AUTO = "auto"
# What a tier holds besides its memory flags (chord.config.settings.MEMORY_FLAGS).
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
            raise settings.ConfigError(
                "config: tiers: 'auto' is reserved (the sheet's automatic choice)"
            )
        size = spec.get("size")
        if size is not None:
            settings.parse_size(size, where=f"config: tiers.{name}.size")
        flags = {k: v for k, v in spec.items() if k not in TIER_KEYS}
        settings.check_memory_flags(flags, where=f"config: tiers.{name}")  # names and types
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
            raise settings.ConfigError(f"config: tiers.{name}.gpus: {tiers[name].gpus}; at least 1")
    names = list(tiers)
    for before, after in zip(names, names[1:], strict=False):
        if tiers[after].gpu_mem_gb > tiers[before].gpu_mem_gb:
            raise settings.ConfigError(
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
    one of its ``gpu_mem_gb`` label (:func:`chord.resources.gpus.matches`: the reported total in
    10^9
    bytes is at least the label, so a 24564 MiB RTX 4090 runs a 24 GB tier), and when ``fits``
    (a predicate, usually a :class:`chord.resources.job_size.ModelFits`: the peak-memory model
    against
    the card's real bytes) accepts it. ``None`` for the node means no GPU (a CPU run, where the
    memory flags do not matter): the first tier, without asking ``fits``. A GPU smaller than
    every tier gets the leanest one.

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
        raise settings.ConfigError("config: tiers: empty; at least one memory tier is needed")
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
        raise settings.ConfigError(
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
            raise settings.ConfigError(
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
        raise settings.ConfigError(f"tier {name!r} is not one of {[AUTO, *tiers]}")
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
        raise settings.ConfigError(
            f"{where}tier {tier.name}{reached} trains on {n} GPUs (gpus: {n}), each on "
            f"batch_size/gpus videos, but method.batch_size {batch} is not a multiple of {n}; "
            f"set batch_size to a multiple of {n}, or use tiers with fewer GPUs"
        )
    return dataclasses.replace(method, batch_size=batch // n)


def for_attempt(
    start: str, attempt: int, tiers: Mapping[str, Tier], out_of_memory: Iterable[str] = ()
) -> str:
    """The tier of attempt ``attempt`` (1-based) of a training that starts on ``start``.

    Attempt 1 runs on ``start``. A retry moves past every tier from ``start`` on that ran out of
    memory (``out_of_memory``, see :func:`chord.resources.out_of_memory.read`), stopping at the
    leanest;
    a retry after another failure (a preempted job, say) stays on its tier.
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
    w, h = settings.parse_size(size)
    return w * h


def lower_size(method, tier: Tier) -> str | None:
    """``tier``'s size where it is below ``method``'s (the lowres tiers), else None."""
    if tier.size is not None and pixels(tier.size) < pixels(method.size):
        return tier.size
    return None


@dataclass(frozen=True)
class TrainingJob:
    """A scene's training on one tier, the one place a tier is applied: ``method`` with the
    tier's size (what the checkpoints and the training hash are of), ``memory`` with the tier's
    flags, and ``rank_method``, what each of the tier's ranks runs (``batch_size / gpus``
    videos; the method itself on one GPU)."""

    tier: Tier
    method: Any
    memory: Any
    rank_method: Any

    def config_hash(self, guidance) -> str:
        """The training's hash (:func:`chord.config.result_keys.training_hash`): its checkpoint
        folder
        and the training rules' params; a multi-GPU tier's ranks hash as one process does."""
        return result_keys.training_hash(self.method, guidance)


def training_job(method, memory, tier: Tier, *, scene: str | None = None) -> TrainingJob:
    """:class:`TrainingJob` of a scene's ``method`` and the config's ``memory`` flags on
    ``tier`` (a ``batch_size`` its GPUs do not divide is a ConfigError naming ``scene``)."""
    method, memory = apply(method, memory, tier)
    return TrainingJob(tier, method, memory, per_gpu(method, tier, scene=scene))


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
