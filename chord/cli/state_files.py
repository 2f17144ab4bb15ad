"""The files of a run that ``chord status`` reads (issue 47): its state files, written by other
jobs, other versions, on file systems that fill up, read as untrusted (:func:`read_state`:
each field checked against what its writer writes, a damaged file told by path and field),
and its logs (:func:`last_error`, :func:`device`). Files only, no torch."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

from chord.training import progress

TAIL_BYTES = 65536  # of a log, read for its last error
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |^(error: |\w+(Error|Exception|Interrupt): )")
ATTEMPT_LINE = "attempt started ("  # chord.stages.adapter.stage_logging's first line
TRACEBACK_LINE = "Traceback (most recent call last):"
# chord.stages.train's "training on <device>; ..." line, or a multi-rank tier's "tier <name>:
# <n> ranks on the CPU (gloo)" / "... ranks on GPUs ..." (chord.stages.train.run)
DEVICE_LINE = re.compile(
    r": (?:training on (?P<device>[a-z]+)\b|tier \S+: \d+ ranks on (?P<ranks>the CPU|GPUs))"
)

# What each field of a state file that status reads must be (null: not given); the writers:
# chord.training.progress.Progress (progress.json), chord.training.slurm_time_limit
NUMBER, INTEGER, TEXT, JOB_ID = "a number", "an integer", "a string", "a string or an integer"
PROGRESS_FIELDS = {
    "stage": TEXT, "state": TEXT, "tier": TEXT, "preview": TEXT,
    "it": INTEGER, "total": INTEGER, "attempt": INTEGER,
    "s_per_it": NUMBER, "eta_s": NUMBER, "slowest_s": NUMBER, "updated_at": NUMBER,
    **{k: NUMBER for k in progress.LOSSES},
}  # fmt: skip
TIME_LIMIT_FIELDS = {"job": JOB_ID, "deadline": NUMBER, "tier": TEXT}
# numbers that time is computed with: finite, and but for the clock readings not negative
TIMES = ("s_per_it", "eta_s", "slowest_s", "updated_at", "deadline")
CLOCKS = ("updated_at", "deadline")


def _kind(value) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _fits(value, kind: str) -> bool:
    if isinstance(value, bool):  # JSON true/false: no number
        return False
    if kind == TEXT:
        return isinstance(value, str)
    if kind == JOB_ID:
        return isinstance(value, str | int)
    if kind == INTEGER:
        return isinstance(value, int)
    return isinstance(value, int | float)


def read_state(path: Path, fields: Mapping[str, str]) -> tuple[dict | None, str | None]:
    """The JSON object in ``path`` with its ``fields`` (name: what it must be) checked, and
    what is wrong with the file: (the fields given, None); (None, None) where there is no
    file; (None, "<path>: what is wrong") for a file that cannot be read, is empty, cut short
    or not JSON, is no object, or has a field of another type (each such field named)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    if not data.strip():
        return None, f"{path}: empty, expected a JSON object"
    try:
        doc = json.loads(data)
    except ValueError as exc:  # a cut-short write, not UTF-8, not JSON
        return None, f"{path}: truncated or not JSON ({exc})"
    except RecursionError:
        return None, f"{path}: not JSON as written (nested too deeply)"
    if not isinstance(doc, dict):
        return None, f"{path}: {_kind(doc)}, expected a JSON object"
    problems = []
    for name, kind in fields.items():
        value = doc.get(name)
        if value is None:
            continue
        if not _fits(value, kind):
            problems.append(f"{name} is {_kind(value)}, expected {kind}")
        elif name in TIMES and not math.isfinite(value):
            problems.append(f"{name} is {value}, expected a finite number")
        elif name in TIMES and name not in CLOCKS and value < 0:
            problems.append(f"{name} is {value}, expected a number >= 0")
    if problems:
        return None, f"{path}: " + "; ".join(problems)
    return {name: doc[name] for name in fields if doc.get(name) is not None}, None


def tail(path: Path) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(size - TAIL_BYTES, 0))
        return f.read().decode("utf-8", "replace").splitlines()


def last_error(path: Path) -> str | None:
    """The last error line of the newest attempt in the log ``path`` (None: none): an error
    line, or the exception a traceback ends with (the job's own words after the adapter's
    generic "stage failed", e.g. "...Interrupted: SIGTERM after iteration 65; checkpoint
    written")."""
    try:
        lines = tail(path)
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if ATTEMPT_LINE in line]
    lines = lines[starts[-1] :] if starts else lines
    errors, traceback = [], False
    for line in lines:
        if line.startswith(TRACEBACK_LINE):
            traceback = True
        elif traceback and line.strip() and not line[0].isspace():
            errors.append(line.strip())  # the exception the traceback ends with
            traceback = False
        elif ERROR_LINE.search(line):
            errors.append(line.strip())
    return errors[-1] if errors else None


def device(log: Path) -> str | None:
    """The device type (cpu, cuda) of the newest device line of a training's ``log`` (None:
    none, or no log). The whole log is read: the line comes at an attempt's start."""
    found = None
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = DEVICE_LINE.search(line)
                if m:
                    found = m["device"] or ("cpu" if m["ranks"] == "the CPU" else "cuda")
    except OSError:
        return None
    return found
