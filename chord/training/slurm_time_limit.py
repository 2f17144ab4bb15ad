"""A training inside a Slurm job and the job's time limit: the limit's end from ``squeue``,
the record that tells the next job whether this one progressed, and ``scontrol requeue`` when
the training stops for the limit (:class:`chord.training.run_loop.TimeLimit`)."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import threading
import time
from pathlib import Path

from chord.config import settings
from chord.core import atomic_files
from chord.resources import tiers

logger = logging.getLogger(__name__)

# Beside a stage's checkpoints while a Slurm job trains: the job, the end of its time limit and
# the newest checkpoint it started from. Removed when the training exits before that end; one
# left behind by a job killed at its time limit tells the next job whether that one progressed.
TIME_LIMIT_RECORD = "time_limit.json"


# What each field of the record must be when read back (None allowed where type(None) is
# listed; deadline and tier required, the rest may be absent)
RECORD_FIELDS = {"job": (str, int, type(None)), "deadline": (int, float), "tier": (str,),
                 "runtime_h": (int, float), "checkpoint": (str, type(None))}  # fmt: skip


def previous_record(path: Path) -> dict | None:
    """The record a job before this one left (None: none). It was written by another job,
    maybe another version, on a file system that may have filled up: one that cannot be read,
    is cut short or has a field of another type is a warning naming the file and the field,
    and is not used (the job trains as if there were none)."""
    try:
        doc = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        logger.warning("%s: an unreadable time-limit record (%s); not used", path, exc)
        return None
    if not isinstance(doc, dict):
        logger.warning("%s: a time-limit record that is no JSON object; not used", path)
        return None
    wrong = [f"no {k}" for k in ("deadline", "tier") if k not in doc]
    for key, kinds in RECORD_FIELDS.items():
        value = doc.get(key)
        if key in doc and (not isinstance(value, kinds) or isinstance(value, bool)):
            wrong.append(f"{key} is {value!r:.40}")
    if wrong:
        logger.warning("%s: a damaged time-limit record (%s); not used", path, "; ".join(wrong))
        return None
    return doc


def slurm_deadline(env) -> float | None:
    """The end of this Slurm job's time limit (seconds since the epoch, from ``squeue``), or
    None outside a Slurm job (no ``SLURM_JOB_ID`` in ``env``), without a limit, or when
    ``squeue`` does not answer (logged)."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    cmd = ["squeue", "--noheader", "--jobs", job, "--format", "%e"]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "SLURM_TIME_FORMAT": "%s"},  # the end as seconds since the epoch
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("Slurm job %s: no end time (%s); training without one", job, exc)
        return None
    out = proc.stdout.strip()
    if proc.returncode != 0 or not out.isdigit():
        if out not in ("Unknown", "NONE", "N/A") or proc.returncode != 0:
            logger.warning(
                "Slurm job %s: no end time from %s (%s); training without one",
                job,
                " ".join(cmd),
                (proc.stderr.strip() or out or f"status {proc.returncode}"),
            )
        return None
    return float(out)


def _newest_checkpoint_file(folder: Path) -> str | None:
    """The newest checkpoint file of any configuration in a stage's ``folder`` (name and
    modification time): a new one means an iteration finished."""
    files = [(p.stat().st_mtime_ns, p) for p in Path(folder).glob("*/ckpt_*.pt")]
    if not files:
        return None
    mtime, path = max(files)
    return f"{path.relative_to(folder)}@{mtime}"


@contextlib.contextmanager
def time_limit(folder: Path, tier: tiers.Tier, env, deadline: float | None, scene: str = ""):
    """A training in a Slurm job whose time limit ends at ``deadline`` (None: nothing to do).

    Before it trains: if the job before it on this tier was killed at its time limit (its
    :data:`TIME_LIMIT_RECORD` is left and its deadline past) without finishing an iteration (no
    newer checkpoint), a ConfigError names the tier's runtime_h: this job would end the same
    way. When the training stops for the time limit (:class:`chord.training.run_loop.TimeLimit`),
    the job
    requeues itself (``scontrol requeue``: the same job id, pending again; its next run resumes
    from the checkpoint just written); if Slurm refuses, the job fails and a Snakemake retry
    resubmits it on the same tier."""
    if deadline is None:
        yield
        return
    from chord.training import run_loop  # torch: not for the record's readers (chord status)

    path = Path(folder) / TIME_LIMIT_RECORD
    newest = _newest_checkpoint_file(folder)
    before = previous_record(path)
    if (
        before is not None
        and before.get("checkpoint") == newest
        and before.get("tier") == tier.name
        and tier.runtime_h <= before.get("runtime_h", 0)
        and time.time() >= before.get("deadline", float("inf"))
    ):
        raise settings.ConfigError(
            f"scene {scene}: Slurm job {before.get('job')} of this training reached its time "
            f"limit ({tier.runtime_min} min, tiers.{tier.name}.runtime_h: {tier.runtime_h:g}) "
            f"without finishing an iteration after {newest or 'the start'}: loading and one "
            f"iteration do not fit in it, so no job on tier {tier.name} can progress. Raise "
            f"tiers.{tier.name}.runtime_h (and the partition's time limit); to try this "
            f"tier's time again as it is, delete {path}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "job": env.get("SLURM_JOB_ID"),
        "deadline": deadline,
        "tier": tier.name,
        "runtime_h": tier.runtime_h,
        "checkpoint": newest,
    }
    # whole or absent: a job killed while writing it (Slurm's SIGKILL) leaves no empty record
    atomic_files.write_json(path, record)

    def stopped(signum, frame):  # SIGTERM while loading (train.run handles its own)
        raise run_loop.Interrupted("SIGTERM before the first iteration")

    # a cancelled or preempted job stops through the finally below: its record goes, and only
    # a job killed at its time limit leaves one
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    except run_loop.TimeLimit as exc:
        requeue(env, str(exc))
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        if time.time() < deadline:  # ended before its time limit
            path.unlink(missing_ok=True)


def requeue(env, why: str) -> bool:
    """``scontrol requeue`` this Slurm job (its next run resumes from the checkpoints);
    whether Slurm took it, logged either way."""
    job = env["SLURM_JOB_ID"]
    # Slurm stops this run as soon as it takes the requeue (its SIGTERM may come before
    # scontrol returns), so the line is written first
    logger.info("%s; requeueing Slurm job %s to continue", why, job)
    try:
        proc = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, timeout=60, env=env
        )
        problem = None
        if proc.returncode != 0:
            problem = proc.stderr.strip() or proc.stdout.strip() or f"status {proc.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    if problem is None:
        return True
    logger.error(
        "%s; Slurm job %s could not requeue itself (scontrol requeue: %s): the job fails and "
        "a Snakemake retry resubmits it on the same tier (submit training jobs with --requeue: "
        "the profile's slurm-requeue: true)",
        why,
        job,
        problem,
    )
    return False
