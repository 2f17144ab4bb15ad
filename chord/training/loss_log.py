"""A training's loss log: a TSV row per iteration, kept beside the configuration's checkpoints
across attempts (a resumed run keeps the rows before its resume point) and copied to the
stage's output at its end."""

from __future__ import annotations

import csv
from pathlib import Path

# Beside a configuration's checkpoints: its loss log across attempts (copied to the output).
LOSS_HISTORY = "losses.tsv"
# nan: NaN entries of the teacher's velocities; nonfinite_entries: NaN or ±inf entries of them and
# of the averaged gradients (any skips the step: METHOD §11, DESIGN "Non-finite steps");
# contact: the contact loss and support: the support loss (chord.motion.contact; 0 where their
# lambda is 0)
LOG_FIELDS = (
    "it", "sds", "ground", "temporal", "arap", "contact", "support", "t", "cfg", "skipped", "nan",
    "nonfinite_entries",
)  # fmt: skip
# the phases a run with memory.log_run_time times (chord.training.phase_clock)
TIMED_PHASES = ("regularisers", "sds", "all_reduce")


def timing_columns(memory, cuda: bool) -> tuple[str, ...]:
    """The extra columns of a run with the memory flags ``memory``: with ``log_run_time`` the
    seconds of each timed phase and, on ``cuda``, its peak memory (MB); else none."""
    if not memory.log_run_time:
        return ()
    columns = tuple(f"{p}_s" for p in TIMED_PHASES)
    if cuda:
        columns += tuple(f"{p}_peak_mb" for p in TIMED_PHASES)
    return columns


class LossLog:
    """A TSV of per-iteration losses (appends on resume)."""

    def __init__(self, path: Path, start: int, extra: tuple[str, ...] = ()):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if self.path.is_file() and start > 1:  # keep what was logged before the resume point
            with open(self.path) as f:
                rows = [r for r in csv.DictReader(f, delimiter="\t") if int(r["it"]) < start]
        self.f = open(self.path, "w", newline="")
        self.w = csv.DictWriter(self.f, LOG_FIELDS + extra, delimiter="\t", extrasaction="ignore")
        self.w.writeheader()
        self.w.writerows(rows)

    def __call__(self, rec: dict) -> None:
        self.w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in rec.items()})
        self.f.flush()

    def close(self) -> None:
        self.f.close()
