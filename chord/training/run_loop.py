"""The run loop (METHOD §19–§20) around the Trainer (:mod:`chord.training.trainer`): iterations
from a start to a stop, checkpoints at the save points, SIGTERM and the job's time limit, the
roll-back after non-finite steps, and the coarse → fine hand-off files."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

from chord.training import checkpoint, float32_fallback
from chord.training.checkpoint import load_checkpoint, save_checkpoint
from chord.training.trainer import Trainer

logger = logging.getLogger(__name__)


def save_points(method) -> set[int]:
    """METHOD §19: iterations 1, 5, every save_interval and ⌊2N/3⌋."""
    N = method.iterations
    return {1, 5, *range(method.save_interval, N + 1, method.save_interval), (2 * N) // 3}


class Interrupted(Exception):
    """SIGTERM arrived: a checkpoint of the last finished iteration was written."""

    exit_code = 143


class TimeLimit(Interrupted):
    """The job's time limit (``run``'s ``deadline``) leaves no time for another iteration: a
    checkpoint of the last finished iteration was written; the job is to be continued."""


# Seconds kept free before a deadline besides two of the slowest iterations: the checkpoint
# write, the requeue and the exit of the job's processes.
STOP_MARGIN_S = 20.0
# Iterations timed, after a run's first (which loads the expert and warms up), before the run's
# total time is projected from their mean.
PROJECT_AFTER = 3


def last_iteration(method, stop: int) -> int:
    """The last iteration a run up to ``stop`` (exclusive) trains: ⌊2N/3⌋ with early_stop
    (METHOD §19), else ``stop - 1``."""
    if method.early_stop:
        return min(stop - 1, (2 * method.iterations) // 3)
    return stop - 1


def project_run_time(elapsed_s: float, first_s: float, timed: int, left: int) -> float:
    """Seconds a run takes in all, projected after its first iteration (``first_s``) and
    ``timed`` more (``elapsed_s`` for all of them) with ``left`` iterations still to train: the
    mean of the iterations after the first for each one left."""
    return elapsed_s + (elapsed_s - first_s) / timed * left


def check_projection(
    projected_s: float, first: int, last: int, runtime_h: float | None, tier: str | None
) -> str | None:
    """The warning when a run projected to take ``projected_s`` for iterations ``first`` to
    ``last`` exceeds its tier's ``runtime_h`` (None: no limit known), else None."""
    if runtime_h is None or projected_s <= runtime_h * 3600.0:
        return None
    key = f"tiers.{tier}.runtime_h" if tier else "its tier's runtime_h"
    return (
        f"iterations {first}..{last} are projected to take {projected_s / 3600.0:.1f} h, more "
        f"than {key} ({runtime_h:g} h): on Slurm the job requeues itself from its checkpoints "
        f"(about {math.ceil(projected_s / (runtime_h * 3600.0))} jobs), elsewhere the "
        f"scheduler may end it; raise {key}, or train on a faster tier"
    )


def _checkpoints(folder: Path | None) -> list[Path]:
    return sorted(Path(folder).glob("ckpt_*.pt")) if folder is not None else []


def run(
    trainer: Trainer,
    start: int,
    stop: int,
    *,
    config_hash: str,
    checkpoint_dir: Path | None = None,
    log=None,
    max_nonfinite_steps: int = 5,
    fallback: str = "float32",
    writer: bool = True,
    deadline: float | None = None,
    runtime_h: float | None = None,
    tier: str | None = None,
    progress=None,
) -> int:
    """Iterations [start, stop) (early stop honoured); returns the last iteration run.

    Checkpoints go to ``checkpoint_dir`` at METHOD §19's save points and at the end, and
    between them the newest finished iteration's (each replacing the one before), so a run
    killed outright resumes where it stopped. SIGTERM (a preempted job) finishes the current
    iteration, writes a checkpoint and raises :class:`Interrupted`. Only the ``writer`` (rank
    0) saves. After ``max_nonfinite_steps`` skipped steps in a row the run rolls back to the
    newest checkpoint and, with ``fallback`` "float32", runs the guidance in float32 from
    then on (draws are deterministic, so only a change like this can help; the checkpoints
    record it, so a resumed run does too); if the steps keep failing it stops with a clear
    error instead of looping.

    ``deadline`` (seconds since the epoch: the end of the job's time limit) stops the run
    like SIGTERM, raising :class:`TimeLimit`, after the first iteration that leaves less than
    two of the slowest iterations so far plus :data:`STOP_MARGIN_S` before it.

    After the first iteration and :data:`PROJECT_AFTER` more, the run's total time is projected
    (:func:`project_run_time`) and logged, with a warning when it exceeds ``runtime_h``, the
    wall time of ``tier``'s jobs (:func:`check_projection`).

    ``progress`` (a :class:`chord.training.progress.Progress`, rank 0's): the log's progress lines
    and
    records, and a line of each roll-back, float32 fallback, time-limit stop and SIGTERM.
    """
    import signal
    import threading

    m = trainer.method
    early = (2 * m.iterations) // 3 if m.early_stop else None
    saves = save_points(m)
    last = start - 1
    final = last_iteration(m, stop)
    t0 = time.perf_counter()
    first_s = None  # seconds of this run's first iteration
    steps = 0  # iterations run (a rolled-back one too: it took its time)
    term = []
    old = None
    if checkpoint_dir is not None and threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, lambda *_: term.append(True))
    rolled_back_to = None
    newest = None  # the checkpoint of the last iteration, when not a save point
    from tqdm import tqdm

    bar = tqdm(
        total=stop - start, initial=0, desc="train", unit="it", disable=not sys.stderr.isatty()
    )
    try:
        it = start
        slowest = 0.0  # seconds of the slowest iteration, its checkpoint included
        while it < stop:
            began = time.perf_counter()
            rec = trainer.step(it)
            last = it
            bar.update(1)
            bar.set_postfix(
                sds=f"{rec['sds']:.4g}",
                arap=f"{rec['arap']:.3g}",
                cfg=f"{rec['cfg']:.2f}",
                refresh=False,
            )
            if log is not None:
                log(rec)
            steps += 1
            if first_s is None:
                first_s = time.perf_counter() - t0
            elif steps == 1 + PROJECT_AFTER and it < final:
                elapsed = time.perf_counter() - t0
                projected = project_run_time(elapsed, first_s, PROJECT_AFTER, final - it)
                logger.info(
                    "projected run time of iterations %d..%d: %.2f h (%.1f s per iteration "
                    "after the first, %.1f s)",
                    start,
                    final,
                    projected / 3600.0,
                    (elapsed - first_s) / PROJECT_AFTER,
                    first_s,
                )
                warning = check_projection(projected, start, final, runtime_h, tier)
                if warning is not None:
                    logger.warning("%s", warning)
            if trainer.nonfinite >= max_nonfinite_steps:
                ckpts = _checkpoints(checkpoint_dir)
                if not ckpts or ckpts[-1] == rolled_back_to:
                    raise RuntimeError(
                        f"iteration {it}: {trainer.nonfinite} non-finite steps in a row "
                        "persist after rolling back; check the guidance (e.g. run it in "
                        "float32) and the learning rates"
                    )
                rolled_back_to = ckpts[-1]
                failed_at = it
                it = checkpoint.restore(trainer, load_checkpoint(ckpts[-1]))
                if progress is not None:
                    progress.event("rollback", failed_at, to=it - 1, nonfinite=trainer.nonfinite)
                if fallback == "float32" and hasattr(trainer.guidance, "use_float32"):
                    taken = float32_fallback.fall_back(
                        trainer,
                        f"after {trainer.nonfinite} non-finite steps in a row",
                        "retrying at the guidance's precision",
                    )
                    if progress is not None:
                        progress.event("float32", it, taken=taken)
                trainer.nonfinite = 0
                logger.warning("rolled back to %s after non-finite steps", ckpts[-1].name)
                continue
            # every rank stops after the same iteration, whichever got the signal (METHOD §18)
            halt = trainer.group.any(bool(term), "SIGTERM")
            late = False
            if deadline is not None and it < stop - 1 and not (early is not None and it >= early):
                need = 2 * max(slowest, time.perf_counter() - began) + STOP_MARGIN_S
                late = trainer.group.any(time.time() + need > deadline, "time limit")
            kept = it in saves or it == stop - 1 or halt or late
            # Between save points the newest finished (finite) iteration is kept on disk too,
            # replacing the one before: a job whose processes are all signalled at once
            # (scancel --full; srun answers its SIGTERM with a SIGKILL of the step) is killed
            # before the SIGTERM checkpoint below, yet resumes from its last iteration.
            if writer and checkpoint_dir is not None and (kept or trainer.nonfinite == 0):
                path = Path(checkpoint_dir) / f"ckpt_{it:06d}.pt"
                save_checkpoint(path, checkpoint.contents(trainer, it, config_hash))
                if newest is not None:
                    newest.unlink(missing_ok=True)
                newest = None if kept else path
            slowest = max(slowest, time.perf_counter() - began)
            if progress is not None:
                progress.step(it, rec, time.perf_counter() - began)
                if halt or late:
                    progress.event("sigterm" if halt else "time_limit", it)
            if halt:
                raise Interrupted(f"SIGTERM after iteration {it}; checkpoint written")
            if late:
                left = deadline - time.time()
                raise TimeLimit(
                    f"time limit in {left:.0f} s, the slowest iteration took {slowest:.1f} s: "
                    f"stopped after iteration {it}; checkpoint written"
                )
            if early is not None and it >= early:
                break
            it += 1
    finally:
        bar.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    logger.info("iterations %d..%d in %.1f s", start, last, time.perf_counter() - t0)
    return last
