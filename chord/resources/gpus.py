"""The GPUs of this machine and which ones a training job takes (one, or a multi-GPU tier's
``gpus``): ``nvidia-smi`` queries (no torch: the DAG build asks them), the GPUs a node offers a
tier (:class:`Node`), the ``gpu`` resource's slot count, and per-GPU lock files so jobs running
at once on one workstation get distinct GPUs."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MiB = 2**20
GiB = 2**30
#: The unit of a tier's ``gpu_mem_gb`` and of a card's label ("24 GB", "80 GB"): 10^9 bytes.
GB = 10**9
#: The least share of its label (read in GiB) a card reports as memory.total: GDDR cards with
#: ECC on keep 1/16 for it and a little more (L4 23034 MiB of 24 GiB, L40S 46068 of 48: 0.9373;
#: T4 15360 of 16: 0.9375); HBM and consumer cards report 99-100% (H100 81559 MiB of 80 GiB).
#: That is 1.0064 GB per GB of label, so every card's total in GB is at least its label:
#: :func:`matches`.
LEAST_SHARE_OF_LABEL = 23034 / 24576


@dataclass(frozen=True)
class Card:
    """One GPU as ``nvidia-smi`` reports it: its name, ``memory.total`` (MiB) and compute
    capability ("8.9"; None where the driver does not report it)."""

    name: str
    total_mib: float
    compute_cap: str | None = None

    @property
    def total_bytes(self) -> int:
        return int(self.total_mib * MiB)

    @property
    def gb(self) -> float:
        """The total in GB (10^9 bytes): the unit of the label it is sold by."""
        return self.total_bytes / GB

    def describe(self) -> str:
        cap = f", sm {self.compute_cap}" if self.compute_cap else ""
        return f"{self.name} ({self.total_mib:.0f} MiB = {self.gb:.1f} GB{cap})"


def matches(card_bytes: int, gpu_mem_gb: float) -> bool:
    """Whether a GPU of ``card_bytes`` (its reported total) is one of at least ``gpu_mem_gb``
    GB by its label, e.g. a tier's ``gpu_mem_gb: 24`` and an RTX 4090 (24564 MiB), an L4
    (23034 MiB): its total in 10^9 bytes is at least the label (every card reports at least
    :data:`LEAST_SHARE_OF_LABEL` of its label in GiB, which is more than the label in GB)."""
    return card_bytes >= gpu_mem_gb * GB


@dataclass(frozen=True)
class Node:
    """The GPUs a training job gets on a node: how many (what a multi-GPU tier may use) and the
    smallest of them (what each rank must fit). ``source``: where it was learnt
    ("nvidia-smi", or "config" for the config's ``gpu_mem_gb`` / ``gpus_per_node``)."""

    gpus: int
    card: Card
    source: str = "nvidia-smi"

    @property
    def total_bytes(self) -> int:
        return self.card.total_bytes

    def describe(self) -> str:
        return f"{self.gpus} x {self.card.describe()} ({self.source})"


def labelled_card(gpu_mem_gb: float) -> Card:
    """A GPU known only by its label (the config's ``gpu_mem_gb``): the least memory a card of
    that label has, ``gpu_mem_gb`` x 10^9 bytes (:func:`matches`), for the memory model."""
    return Card(f"a {gpu_mem_gb:g} GB GPU", gpu_mem_gb * GB / MiB)


def node(
    env: Mapping[str, str],
    *,
    gpu_mem_gb: float | None = None,
    gpus_per_node: int | None = None,
) -> Node | None:
    """The GPUs of a training job's node: the config's ``gpu_mem_gb`` (a label, set by a
    profile whose jobs run elsewhere) and ``gpus_per_node`` where given, else this machine's
    visible GPUs (``nvidia-smi``: their count and the smallest). None without either (a CPU
    run). With ``gpu_mem_gb`` but no ``gpus_per_node``, the GPUs visible here, at least 1."""
    if gpu_mem_gb is not None:
        count = gpus_per_node or len(visible_gpus(env)) or 1
        return Node(count, labelled_card(gpu_mem_gb), "config")
    found = visible_cards(env)
    if not found:
        return None
    smallest = min(found, key=lambda c: c.total_mib)
    if gpus_per_node is not None:
        return Node(gpus_per_node, smallest, "nvidia-smi, gpus_per_node from the config")
    return Node(len(found), smallest)


def visible_cards(env: Mapping[str, str]) -> list[Card]:
    """The visible GPUs (:func:`visible_gpus`) as ``nvidia-smi --query-gpu`` describes them.
    Drivers before compute_cap was a query field (R510) answer without it."""
    gpus = visible_gpus(env)
    if not gpus:
        return []
    fields = ["index", "uuid", "name", "memory.total", "compute_cap"]
    out = ""
    for query in (fields, fields[:-1]):
        out = _nvidia_smi([f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits"])
        if out:
            break
    cards = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not (parts[0] in gpus or parts[1] in gpus):
            continue
        try:
            total = float(parts[3])
        except ValueError:  # "[N/A]"
            continue
        cap = parts[4] if len(parts) > 4 and parts[4][:1].isdigit() else None
        cards.append(Card(parts[2], total, cap))
    return cards


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU that
    ``nvidia-smi -L`` lists (none without the NVIDIA driver)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    out = _nvidia_smi(["-L"])
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def gpu_slots(env: Mapping[str, str]) -> int:
    """How many training jobs may run at once on this machine: one per visible GPU; without
    GPUs they train on the CPU, one thread each, so the ``cores`` limit alone governs."""
    gpus = len(visible_gpus(env))
    return gpus if gpus else max(1, os.cpu_count() or 1)


def _nvidia_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


@contextlib.contextmanager
def gpu_set(
    gpus: list[str], count: int, lock_dir: Path, *, poll_s: float = 2.0
) -> Iterator[list[str]]:
    """Hold ``count`` of ``gpus`` while the block runs; yields their ids.

    Snakemake counts GPUs (the ``gpu`` resource) but does not say which ones a job gets. Each
    job takes an exclusive lock on ``lock_dir/gpu_<id>.lock`` per GPU (the first free ones),
    so jobs running at once on one machine get distinct GPUs; the kernel drops the locks when
    the process ends, however it ends. All or nothing: a job that cannot lock ``count`` free
    GPUs releases those it got and waits (e.g. for another Snakemake run's jobs), so two jobs of
    several GPUs never hold part of a set each."""
    if not 1 <= count <= len(gpus):
        raise ValueError(f"gpu_set: {count} of the GPUs {gpus}")
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        held = []
        for gpu in gpus:
            f = open(lock_dir / f"gpu_{gpu}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            held.append((gpu, f))
            if len(held) == count:
                break
        if len(held) == count:
            try:
                yield [gpu for gpu, _ in held]
            finally:
                _release(held)
            return
        _release(held)
        if not waited:
            logger.info("fewer than %d of the GPUs %s are free; waiting", count, gpus)
            waited = True
        time.sleep(poll_s)


def _release(held: list) -> None:
    for _, f in held:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@contextlib.contextmanager
def job_gpus(
    env: MutableMapping[str, str], count: int = 1, lock_dir: Path | None = None
) -> Iterator[list[str]]:
    """Pin a training job to ``count`` GPUs (a multi-GPU tier's ``gpus``) while the block runs;
    yields their ids (empty without GPUs).

    With more than ``count`` GPUs visible, takes ``count`` free ones (:func:`gpu_set`) and
    narrows ``CUDA_VISIBLE_DEVICES`` in ``env`` to them, before CUDA starts; with ``count`` or
    fewer (a Slurm job sees only its own), ``env`` stays as it is and all visible are yielded
    (the caller checks that there are enough).
    """
    gpus = visible_gpus(env)
    if len(gpus) <= count:
        yield gpus
        return
    with gpu_set(gpus, count, lock_dir or default_lock_dir()) as held:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(held)
        logger.info("GPU(s) %s of %s", ",".join(held), gpus)
        yield held


@contextlib.contextmanager
def job_gpu(env: MutableMapping[str, str], lock_dir: Path | None = None) -> Iterator[str | None]:
    """Pin a training job to one GPU while the block runs; yields its id (None without GPUs).

    With several GPUs visible, takes a free one (:func:`gpu_set`) and narrows
    ``CUDA_VISIBLE_DEVICES`` in ``env`` to it, before CUDA starts; with one or none (a Slurm job
    sees only its own), ``env`` stays as it is. (:func:`job_gpus` for several.)
    """
    with job_gpus(env, 1, lock_dir) as held:
        yield held[0] if held else None


def default_lock_dir() -> Path:
    """Per-user, per-machine folder of the GPU locks."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"chord-gpu-locks-{os.getuid()}"
