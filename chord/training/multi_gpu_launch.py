"""The ranks of a multi-GPU tier's training inside one job (METHOD §18): one process per GPU,
started and watched here, without torchrun.

:func:`launch` starts ``world_size`` Python processes (``python -m
chord.training.multi_gpu_launch``), each with
RANK, LOCAL_RANK and WORLD_SIZE set and its own GPU (cuda:LOCAL_RANK of the job's
CUDA_VISIBLE_DEVICES, selected before NCCL starts: :func:`chord.training.distributed.from_env`; gloo
on a CPU), meeting through a rendezvous file of a temporary folder. Each runs ``target(group=,
device=, **kwargs)`` (the training stage's ``run_stage``; it and its arguments travel by
pickle) and sends its log records and its outcome to this process over a pipe, so the rule's
log holds every rank's lines (prefixed ``rank r:``) and the job's exit status follows its
ranks:

- all ranks finish: rank 0's return value;
- a rank fails: the others are stopped (SIGTERM, then SIGKILL after a grace period: they may
  be waiting in a collective for the rank that failed) and the job raises the failing rank's
  exception, of its own type, with that rank's traceback as its cause and in the log. An
  out-of-memory error in any rank wins over the errors it causes in the others, so the
  training's out-of-memory record (:func:`chord.resources.out_of_memory.recorded`) sees it and the
  retry escalates; then a bad input (exit status 2), then any other error (first reported),
  then an interruption (SIGTERM: :class:`chord.training.run_loop.Interrupted`), then a rank that
  died
  without a word (a signal; the host's out-of-memory killer, say);
- SIGTERM to this process (a preempted Slurm job) goes on to every rank; they stop after the
  same iteration (:func:`chord.training.run_loop.run` agrees on it over the group), rank 0 writes
  its
  checkpoint, and the job raises :class:`~chord.training.run_loop.Interrupted` as one process would.

The rank processes die with this one (``PR_SET_PDEATHSIG``), so a killed job leaves none.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds the other ranks get to stop after one failed, before SIGKILL.
GRACE_S = 30.0
# Root-cause order of rank outcomes (lower wins): see the module docstring.
PRIORITY = {"oom": 0, "input": 1, "error": 2, "interrupted": 3, "died": 4}


class RankFailed(RuntimeError):
    """A rank of a multi-GPU training failed (its traceback is the cause)."""


class RemoteTraceback(Exception):
    """A rank's traceback, as text: the cause of the exception :func:`launch` raises."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def launch(
    target: Callable,
    world_size: int,
    *,
    env: Mapping[str, str],
    kwargs: Mapping[str, Any] | None = None,
    grace_s: float = GRACE_S,
) -> Any:
    """Run ``target(group=..., device=group.device, **kwargs)`` on ``world_size`` ranks, one
    process each, with the environment ``env`` (its CUDA_VISIBLE_DEVICES: the job's GPUs);
    returns rank 0's result or raises the failing rank's error (module docstring).
    ``target`` and ``kwargs`` must pickle (a module-level function, config dataclasses)."""
    import torch

    threads = max(1, torch.get_num_threads() // world_size)
    with tempfile.TemporaryDirectory(prefix="chord-ranks-") as tmp:
        payload = Path(tmp) / "payload.pkl"
        with open(payload, "wb") as f:
            pickle.dump(
                {
                    "target": target,
                    "kwargs": dict(kwargs or {}),
                    "init_method": f"file://{Path(tmp) / 'rendezvous'}",
                    "level": logging.getLogger().getEffectiveLevel(),
                    "threads": threads,
                },
                f,
            )
        return _run_ranks(payload, world_size, env, threads, grace_s)


def _child_env(env: Mapping[str, str], rank: int, world: int, threads: int) -> dict:
    import chord

    here = str(Path(chord.__file__).resolve().parent.parent)  # import this chord in the ranks
    path = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    return {
        **env,
        "PYTHONPATH": path,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": str(threads),
    }


def _run_ranks(payload: Path, world: int, env: Mapping[str, str], threads: int, grace_s: float):
    procs, readers = [], []
    reports: dict[int, tuple] = {}
    lock = threading.Lock()

    def forward(signum, frame):  # SIGTERM (preemption): every rank checkpoints and stops
        logger.info("SIGTERM: passing it on to the ranks")
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, forward)
    try:
        for rank in range(world):
            r, w = os.pipe()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chord.training.multi_gpu_launch",
                    str(payload),
                    str(rank),
                    str(w),
                ],
                env=_child_env(env, rank, world, threads),
                pass_fds=(w,),
            )
            os.close(w)
            procs.append(proc)
            conn = Connection(r, writable=False)
            reader = threading.Thread(target=_read, args=(conn, rank, reports, lock), daemon=True)
            reader.start()
            readers.append(reader)
        logger.info("%d ranks started (pids %s)", world, ", ".join(str(p.pid) for p in procs))
        codes, ended = _watch(procs, grace_s)
    except BaseException:
        for proc in procs:  # e.g. KeyboardInterrupt in this process: leave no rank behind
            if proc.poll() is None:
                proc.kill()
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    for reader in readers:
        reader.join(timeout=10)
    return _outcome(codes, ended, reports, world)


def _read(conn: Connection, rank: int, reports: dict, lock) -> None:
    """Log records and the outcome of one rank, until its end of the pipe closes."""
    try:
        while True:
            message = conn.recv()
            if message[0] == "log":
                record = logging.makeLogRecord(message[1])
                target = logging.getLogger(record.name)
                if target.isEnabledFor(record.levelno):
                    target.handle(record)
            else:
                with lock:
                    reports[rank] = (*message, time.monotonic())
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


def _watch(procs: list, grace_s: float) -> tuple[list[int], list[float]]:
    """Wait for every rank; a failed rank stops the others (SIGTERM, then SIGKILL after
    ``grace_s``: they may wait in a collective for it). Returns the exit codes and when each
    was seen."""
    failed_at = None
    ended = [float("inf")] * len(procs)
    while True:
        codes = [proc.poll() for proc in procs]
        now = time.monotonic()
        ended = [min(t, now) if c is not None else t for t, c in zip(ended, codes, strict=True)]
        if all(code is not None for code in codes):
            return codes, ended
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
            for proc, code in zip(procs, codes, strict=True):
                if code is None:
                    proc.send_signal(signal.SIGTERM)
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.05)


def _outcome(codes: list[int], ended: list[float], reports: dict, world: int):
    if all(code == 0 for code in codes) and all(
        reports.get(r, ("",))[0] == "ok" for r in range(world)
    ):
        return reports[0][1]
    failures = []  # (priority, time, rank, kind, exception or None, traceback text, message)
    for rank, code in enumerate(codes):
        report = reports.get(rank)
        if report is not None and report[0] == "error":
            _, kind, blob, text, message, when = report
            failures.append((PRIORITY[kind], when, rank, kind, _unpickle(blob), text, message))
        elif report is None or code != 0:
            how = f"signal {_signal_name(-code)}" if code < 0 else f"status {code}"
            message = f"rank {rank} of {world} exited with {how} without reporting an error"
            failures.append((PRIORITY["died"], ended[rank], rank, "died", None, "", message))
    failures.sort(key=lambda f: (f[0], f[1], f[2]))
    _, _, rank, kind, exc, text, message = failures[0]
    for _, _, other, other_kind, _, _, other_message in failures[1:]:
        logger.info("rank %d of %d stopped too (%s): %s", other, world, other_kind, other_message)
    if text:
        logger.error("rank %d of %d failed:\n%s", rank, world, text.rstrip())
    cause = RemoteTraceback(f"rank {rank} of {world}:\n{text}") if text else None
    if kind == "died":
        exc = RankFailed(message)
    elif exc is None or kind == "error":
        name = type(exc).__name__ if exc is not None else kind
        exc = RankFailed(f"rank {rank} of {world} failed: {name}: {message}")
    raise exc from cause


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _unpickle(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    try:
        return pickle.loads(blob)
    except Exception:
        return None


# -- the rank process ------------------------------------------------------------------------


def _kind(exc: BaseException) -> str:
    from chord.core.errors import InputError
    from chord.resources.out_of_memory import is_out_of_memory
    from chord.training.run_loop import Interrupted

    if is_out_of_memory(exc):
        return "oom"
    if isinstance(exc, (InputError, FileNotFoundError)):
        return "input"
    if isinstance(exc, Interrupted):
        return "interrupted"
    return "error"


def _pickled(exc: BaseException) -> bytes | None:
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
        return blob
    except Exception:
        return None


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the launching one dies (a killed job leaves no rank)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _PipeHandler(logging.Handler):
    """Sends this rank's log records, message formatted and prefixed ``rank r:``, to the
    launching process."""

    def __init__(self, conn: Connection, rank: int, send_lock: threading.Lock):
        super().__init__()
        self.conn, self.rank, self.send_lock = conn, rank, send_lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = f"rank {self.rank}: {record.getMessage()}"
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            d = dict(record.__dict__, msg=msg, args=None, exc_info=None, exc_text=None)
            d.pop("message", None)
            with self.send_lock:
                self.conn.send(("log", d))
        except Exception:
            self.handleError(record)


def main(argv: list[str]) -> None:
    """``python -m chord.training.multi_gpu_launch PAYLOAD RANK FD``: one rank (see
    :func:`launch`)."""
    payload_path, rank, fd = argv[0], int(argv[1]), int(argv[2])
    _die_with_parent()
    conn = Connection(fd, readable=False)
    send_lock = threading.Lock()
    code = 1
    group = None
    try:
        with open(payload_path, "rb") as f:
            payload = pickle.load(f)
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.addHandler(_PipeHandler(conn, rank, send_lock))
        root.setLevel(payload["level"])
        import torch

        from chord.training import distributed

        torch.set_num_threads(payload["threads"])
        group = distributed.from_env(os.environ, init_method=payload["init_method"])
        value = payload["target"](group=group, device=group.device, **payload["kwargs"])
        with send_lock:
            conn.send(("ok", value))
        distributed.close(group)
        code = 0
    except BaseException as exc:
        report = ("error", _kind(exc), _pickled(exc), traceback.format_exc(), str(exc))
        try:
            with send_lock:
                conn.send(report)
        except OSError:
            pass
    finally:
        try:
            conn.close()
        except OSError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        # without the interpreter's clean-up: a failed rank's collectives (NCCL) may not end
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
