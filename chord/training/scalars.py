"""TensorBoard scalars of a training (``logging.tensorboard: true``; the ``tensorboard`` extra):
each iteration's losses, CFG scale and seconds, under ``<stage>/<name>``, in ``tensorboard/``
beside the stage's checkpoints. A resumed run drops the steps after its resume point
(``purge_step``), so a rolled-back or killed span is not drawn twice."""

from __future__ import annotations

import time
from pathlib import Path

from chord.config.settings import ConfigError

FOLDER = "tensorboard"
#: the loss record's keys drawn (those present)
KEYS = ("sds", "ground", "temporal", "arap", "contact", "support", "cfg", "t", "skipped")


def summary_writer():
    """torch's SummaryWriter class, or a ConfigError naming the extra to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(
            f"logging.tensorboard: true needs the tensorboard package ({exc}); install it "
            "with pip install -e '.[tensorboard]' or set logging.tensorboard: false"
        ) from None
    return SummaryWriter


class Scalars:
    """A loss-log callable (``chord.training.run_loop.run``'s ``log``) writing TensorBoard scalars
    of
    ``stage`` from iteration ``start`` on, then passing the record to ``then``."""

    def __init__(self, folder: Path, stage: str, start: int, then=None):
        self.stage, self.then = stage, then
        self.board = summary_writer()(log_dir=str(folder), purge_step=start if start > 1 else None)
        self.last = time.perf_counter()

    def __call__(self, rec: dict) -> None:
        it = int(rec["it"])
        now = time.perf_counter()
        for key in KEYS:
            value = rec.get(key)
            if isinstance(value, int | float):
                self.board.add_scalar(f"{self.stage}/{key}", float(value), it)
        self.board.add_scalar(f"{self.stage}/seconds_per_iteration", now - self.last, it)
        self.last = now
        if self.then is not None:
            self.then(rec)

    def close(self) -> None:
        self.board.close()
