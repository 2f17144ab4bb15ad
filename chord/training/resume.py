"""Where a training stage starts (METHOD §7, §17): the coarse hand-off the fine stage
continues, the newest readable checkpoint of the stage's configuration, and the base seed
they carry. Checkpoints live per configuration hash, so a changed configuration starts
fresh."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from chord.core.errors import InputError
from chord.training import checkpoint, rng

logger = logging.getLogger(__name__)


def load_handoff(stage: str, handoff: Path | None, method):
    """(the coarse hand-off state the fine ``stage`` continues, or None for the coarse stage;
    ``method`` at the size that state was trained at, e.g. after the coarse stage escalated to
    a lowres tier)."""
    if stage != "fine":
        return None, method
    if handoff is None:
        raise ValueError("train_fine needs the coarse hand-off state")
    state = checkpoint.load_checkpoint(handoff)
    size = state.get("size", method.size)
    if size != method.size:
        logger.info("continuing the coarse hand-off at its size %s, not %s", size, method.size)
        method = dataclasses.replace(method, size=size)
    return state, method


def newest_checkpoint(folder: Path) -> dict | None:
    """The newest readable checkpoint in ``folder`` (one configuration's), else None."""
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("ckpt_*.pt"), reverse=True):
        try:
            return checkpoint.load_checkpoint(path)
        except ValueError as exc:  # e.g. a file cut short by a kill: try the one before
            logger.warning("skipping %s: %s", path, exc)
    return None


@dataclasses.dataclass
class Start:
    """A stage's starting point: ``folder`` its configuration's checkpoints, ``seed`` the base
    seed (before rank 0's is broadcast), ``handoff`` the coarse state it continues and
    ``resume`` the checkpoint it resumes from (each None when there is none)."""

    folder: Path
    seed: int
    handoff: dict | None = None
    resume: dict | None = None

    def restore(self, trainer, stage: str) -> int:
        """Restore the hand-off, then a newer checkpoint, into ``trainer``; returns the first
        iteration to run."""
        start = 1
        if self.handoff is not None:
            start = checkpoint.restore(trainer, self.handoff)
        if self.resume is not None and self.resume["iteration"] + 1 > start:
            start = checkpoint.restore(trainer, self.resume)
            logger.info("resuming %s from iteration %d", stage, start)
        return start


def find_start(
    checkpoint_dir: Path,
    config_hash: str,
    method,
    handoff_state: dict | None = None,
    handoff: Path | None = None,
) -> Start:
    """The :class:`Start` of a stage whose checkpoints (every configuration's) are in
    ``checkpoint_dir``: a hand-off (``handoff_state``, read from ``handoff``) of another
    configuration is an InputError; the seed is the newest checkpoint's, else the hand-off's,
    else ``method``'s (a fresh one when unseeded)."""
    seed = rng.base_seed(method.seed)
    if handoff_state is not None:
        if handoff_state["config_hash"] != config_hash:
            raise InputError(f"{handoff}: written with another configuration; rerun coarse")
        seed = handoff_state["seed"]
    folder = Path(checkpoint_dir) / config_hash
    others = [
        p.name for p in Path(checkpoint_dir).glob("*") if p.is_dir() and p.name != config_hash
    ]
    resume = newest_checkpoint(folder)
    if resume is not None:
        seed = resume["seed"]
    elif others:
        logger.info(
            "configuration changed since the checkpoints in %s; starting fresh", checkpoint_dir
        )
    return Start(folder, seed, handoff_state, resume)
