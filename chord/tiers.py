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
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chord import config as cc
from chord import peak_memory
from chord.errors import InputError

logger = logging.getLogger(__name__)

AUTO = "auto"
# What a tier holds besides its memory flags (chord.config.MEMORY_FLAGS).
TIER_KEYS = ("gpu_mem_gb", "host_mem_gb", "runtime_h", "size", "gpu_model", "slurm_partition")
# Written next to a stage's checkpoints: one tier name per line that ran out of GPU memory.
OOM_RECORD = "out_of_memory.txt"


@dataclass(frozen=True)
class Tier:
    """One memory tier: what it needs (GPU memory, host RAM, wall time), its memory flags, an
    optional lower SDS ``size`` and, where a profile maps tiers to GPU kinds, the GPU model and
    Slurm partition its jobs ask for."""

    name: str
    gpu_mem_gb: float
    host_mem_gb: float = 32.0
    runtime_h: float = 24.0
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

    Order is escalation order: fullest first, each tier needing no more GPU memory than the one
    before it.
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
            flags=flags,
            size=size,
            gpu_model=spec.get("gpu_model"),
            slurm_partition=spec.get("slurm_partition"),
        )
    names = list(tiers)
    for before, after in zip(names, names[1:], strict=False):
        if tiers[after].gpu_mem_gb > tiers[before].gpu_mem_gb:
            raise cc.ConfigError(
                f"config: tiers: {after!r} needs {tiers[after].gpu_mem_gb} GB of GPU memory, more "
                f"than {before!r} before it ({tiers[before].gpu_mem_gb} GB); list tiers fullest "
                "first (that order is the out-of-memory escalation order)"
            )
    return tiers


def auto(
    tiers: Mapping[str, Tier],
    gpu_mem_gb: float | None,
    fits: Callable[[Tier], bool] | None = None,
    *,
    method=None,
    allow_lowres: bool = False,
) -> str:
    """The first (fullest) tier that fits ``gpu_mem_gb`` of GPU memory.

    A tier fits when its declared ``gpu_mem_gb`` does and ``fits`` (a predicate, usually a
    :class:`ModelFits`: the peak-memory model) accepts it. ``None`` for the GPU means no GPU (a
    CPU run, where the memory flags do not matter): the first tier, without asking ``fits``. A
    GPU smaller than every tier gets the leanest one.

    ``auto`` never picks a tier that changes the result by itself: a tier whose ``size`` is
    below ``method``'s (any tier with a ``size`` when ``method`` is None). When only such a
    tier fits (by declared memory, or by the model) it raises ConfigError with the predicted
    peak and the remedies, unless ``allow_lowres`` (the config's ``auto_lowres``).

    When ``fits`` rejects every candidate, the run is not blocked (the model is calibrated on
    CPU proxies): the choice by declared memory stands, with a warning giving the predicted
    peak (``fits.describe(tier)`` where ``fits`` has it) and what lowers it. An out-of-memory
    exit still escalates (:func:`for_attempt`).
    """
    if not tiers:
        raise cc.ConfigError("config: tiers: empty; at least one memory tier is needed")
    names = list(tiers)
    if gpu_mem_gb is None:
        return names[0]
    candidates = [name for name in names if tiers[name].gpu_mem_gb <= gpu_mem_gb]
    if not candidates:
        logger.warning(
            "a %.0f GB GPU is smaller than every tier; using the leanest, %s", gpu_mem_gb, names[-1]
        )
        candidates = names[-1:]

    def changes_result(name: str) -> bool:
        tier = tiers[name]
        if method is None:
            return tier.size is not None
        return lower_size(method, tier) is not None

    keep = [n for n in candidates if allow_lowres or not changes_result(n)]
    remedies = (
        "To lower the peak: method.use_tiny_vae: true, or a lower method.size, frame_num or "
        "batch_size"
    )
    optin = "auto_lowres: true in the config, or that tier in the sheet's tier column"
    if not keep:
        lowres = ", ".join(f"{n} ({tiers[n].size})" for n in candidates)
        raise cc.ConfigError(
            f"tier auto: a {gpu_mem_gb:.0f} GB GPU fits only tiers that lower the SDS size "
            f"({lowres}), which changes the result; to accept that, set {optin}"
        )
    declared = keep[0]
    if fits is None:
        return declared
    describe = getattr(fits, "describe", None) or (lambda tier: f"tier {tier.name}")
    for name in candidates:
        if not fits(tiers[name]):
            continue
        if name not in keep:
            raise cc.ConfigError(
                f"tier auto: the memory model predicts that no tier at the method's size fits "
                f"{gpu_mem_gb:.0f} GB of GPU memory ({describe(tiers[declared])}); the first "
                f"that does is {name} at size {tiers[name].size}, which changes the result. "
                f"{remedies}; or accept {name}: {optin}"
            )
        if name != declared:
            skipped = candidates[: candidates.index(name)]
            lower = changes_result(name)
            logger.log(
                logging.WARNING if lower else logging.INFO,
                "the memory model predicts that tier(s) %s would not fit %.0f GB of GPU "
                "memory; starting on %s%s (%s)",
                ", ".join(skipped),
                gpu_mem_gb,
                name,
                f" at size {tiers[name].size}, which changes the result" if lower else "",
                describe(tiers[name]),
            )
        return name
    leanest = "" if keep[-1] == declared else f"; leanest: {describe(tiers[keep[-1]])}"
    logger.warning(
        "the memory model predicts that no tier fits %.0f GB of GPU memory (%s%s); starting on "
        "%s by its declared gpu_mem_gb anyway (the model is calibrated on CPU proxies; an "
        "out-of-memory exit retries on the next tier). %s",
        gpu_mem_gb,
        describe(tiers[declared]),
        leanest,
        declared,
        remedies,
    )
    return declared


def base(
    name: str,
    tiers: Mapping[str, Tier],
    gpu_mem_gb: float | None,
    fits: Callable[[Tier], bool] | None = None,
    *,
    method=None,
    allow_lowres: bool = False,
) -> str:
    """A scene's first-attempt tier: its sheet value, or :func:`auto` (with ``fits``) for
    ``auto``."""
    if name == AUTO:
        return auto(tiers, gpu_mem_gb, fits, method=method, allow_lowres=allow_lowres)
    if name not in tiers:
        raise cc.ConfigError(f"tier {name!r} is not one of {[AUTO, *tiers]}")
    return name


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


def memory_shape(method, gaussians: int, dynamic_gaussians: int | None = None) -> dict:
    """The keyword arguments of :func:`chord.peak_memory.estimate` besides the flags: the method's
    SDS size, frame_num, batch_size, use_tiny_vae and the Gaussian counts."""
    width, height = cc.parse_size(method.size, where="method: size")
    return {
        "width": width,
        "height": height,
        "frames": method.frame_num,
        "batch": method.batch_size,
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
    already applied), with the experts of ``model`` (:func:`chord.peak_memory.model_for`)."""
    if tier is not None:
        method, mem = apply(method, mem, tier)
    return peak_memory.estimate(
        mem, model=model, **memory_shape(method, gaussians, dynamic_gaussians)
    )


@dataclass(frozen=True)
class ModelFits:
    """The ``fits`` of :func:`auto` for one scene: whether the peak-memory model predicts that
    a training of ``method`` with the memory flags ``mem`` on a tier fits a GPU of
    ``gpu_mem_gb`` (:func:`chord.peak_memory.fits`: reserved bytes plus a CUDA context, read as
    GiB)."""

    method: Any
    mem: Any  # MemoryConfig: the flags a tier leaves unset
    gpu_mem_gb: float
    gaussians: int
    dynamic_gaussians: int
    label: str = ""
    model: peak_memory.ModelShape = peak_memory.A14B

    def __call__(self, tier: Tier) -> bool:
        m, mem = apply(self.method, self.mem, tier)
        shape = memory_shape(m, self.gaussians, self.dynamic_gaussians)
        return peak_memory.fits(mem, self.gpu_mem_gb, model=self.model, **shape)

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
    gpu_mem_gb: float | None,
    *,
    backend: str,
    fitted: Path | None = None,
    label: str = "",
    model: peak_memory.ModelShape = peak_memory.A14B,
) -> ModelFits | None:
    """The :class:`ModelFits` of a scene for ``tier: auto``, or None where the model does not
    apply: no GPU, the oracle teacher (the model is that of the Wan teacher), or no objects
    known (ingest reports that). ``fitted``: the sheet's ``gaussians`` folder; ``model``: the
    experts' shapes (:func:`chord.peak_memory.model_for` the Wan folder)."""
    if gpu_mem_gb is None or backend != "wan":
        return None
    objects = [obj for obj, role in roles.items() if role != "avoided"]
    n, dynamic = gaussian_counts(method, roles, imported_counts(fitted, objects))
    if n <= 0:
        return None
    return ModelFits(method, mem, gpu_mem_gb, n, dynamic, label, model)


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
def out_of_memory_record(path: Path, tier: str) -> Iterator[None]:
    """Run a training on ``tier``: if it runs out of GPU memory, note ``tier`` in ``path`` (the
    next attempt reads it) and re-raise; if it completes, remove the record."""
    try:
        yield
    except BaseException as exc:
        if is_out_of_memory(exc):
            record_out_of_memory(path, tier)
        raise
    Path(path).unlink(missing_ok=True)


def inject_out_of_memory(tiers_spec: str, tier: str) -> None:
    """Test hook: raise torch's out-of-memory error when ``tier`` is one of the comma-separated
    names in ``tiers_spec`` (the train adapter passes ``$CHORD_TEST_OOM_TIERS``). It lets a CPU
    test drive the real exit-and-escalate path; unset, it does nothing."""
    if tier in {t.strip() for t in tiers_spec.split(",") if t.strip()}:
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"injected out-of-memory on tier {tier!r} (test hook CHORD_TEST_OOM_TIERS)"
        )
