"""A training's out-of-memory record (DESIGN §6): the tiers on which it ran out of GPU
memory, written beside its checkpoints and read by the next attempt, which moves to a leaner
tier (:func:`chord.resources.tiers.for_attempt`); and the test hook that raises torch's
out-of-memory
error on named tiers, so a CPU test drives the real exit-and-escalate path. Nothing here
imports torch unless the hook fires."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from chord.core.errors import InputError
from chord.resources.tiers import REMEDIES

logger = logging.getLogger(__name__)

# Written next to a stage's checkpoints: one tier name per line that ran out of GPU memory.
RECORD = "out_of_memory.txt"


def read(path: Path) -> set[str]:
    """Tier names recorded in ``path`` (missing file: none). Written by another job, maybe on
    a file system that filled up: a file that cannot be read or is not text is an InputError
    of one line naming it (the tier to train on cannot be known without it; deleting it starts
    again from the configured tier)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InputError(
            f"{path}: an unreadable out-of-memory record ({why}); delete it to train again "
            "from the configured tier"
        ) from None
    return {line.strip() for line in text.splitlines() if line.strip()}


def record(path: Path, tier: str) -> None:
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
def recorded(path: Path, tier: str, order: Sequence[str] = ()) -> Iterator[None]:
    """Run a training on ``tier``: if it runs out of GPU memory, note ``tier`` in ``path`` (the
    next attempt reads it) and re-raise; if it completes, remove the record. ``order``: the
    tiers' escalation order; when ``tier`` is its last (nothing leaner to retry on) the error
    logged names the tiers tried and what lowers the peak."""
    try:
        yield
    except BaseException as exc:
        if is_out_of_memory(exc):
            record(path, tier)
            if order and tier == order[-1]:
                tried = read(path)
                logger.error(
                    "out of GPU memory on every tier tried (%s): %s is the leanest, no retry "
                    "is left. %s",
                    ", ".join(t for t in order if t in tried),
                    tier,
                    REMEDIES,
                )
        raise
    Path(path).unlink(missing_ok=True)


def inject(tiers_spec: str, tier: str, rank: int = 0) -> None:
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


def with_injected(target: Callable, tiers_spec: str, tier: str) -> Callable:
    """``target`` (a rank's training: called with ``group=``) with :func:`inject`
    in front, for that rank; picklable, so each rank of a multi-GPU tier runs the hook."""
    return functools.partial(_inject_then_run, target, tiers_spec, tier)


def _inject_then_run(target: Callable, tiers_spec: str, tier: str, /, **kwargs):
    group = kwargs.get("group")
    inject(tiers_spec, tier, group.rank if group is not None else 0)
    return target(**kwargs)
