"""The GPUs of this machine and which ones a training job takes (one, or a multi-GPU tier's
``gpus``): ``nvidia-smi`` queries (no torch: the DAG build asks them), the ``gpu`` resource's
slot count, and per-GPU lock files so jobs running at once on one workstation get distinct
GPUs."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path

logger = logging.getLogger(__name__)


def visible_gpus(env: Mapping[str, str]) -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU that
    ``nvidia-smi -L`` lists (none without the NVIDIA driver)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    out = _nvidia_smi(["-L"])
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def gpu_memory_gb(env: Mapping[str, str]) -> float | None:
    """Memory of the smallest visible GPU in GB (``nvidia-smi``), or None without a GPU."""
    gpus = visible_gpus(env)
    if not gpus:
        return None
    out = _nvidia_smi(["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"])
    sizes = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and (parts[0] in gpus or parts[1] in gpus):
            sizes.append(float(parts[2]) / 1024)  # MiB -> GiB
    return min(sizes) if sizes else None


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
