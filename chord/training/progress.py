"""A training's progress where its user looks (issue 37): a ``progress`` line in the job's log
every ``progress_every_s`` seconds (and after every iteration slower than that), flushed and
free of terminal codes, so ``tail -f`` of a rule's ``log:`` shows it under Snakemake and Slurm
where tqdm (a terminal only) is silent; the same fields appended to :data:`JSONL` beside the
stage's loss history, and the latest state in :data:`LATEST`, replaced atomically, which
``chord status`` reads. An event (a roll-back, the float32 fallback, a time-limit stop, SIGTERM)
writes its own line and record.

The line's layout is fixed: ``progress`` then :data:`FIELDS` as ``key=value`` (losses among
them in the loss log's order), parsed back by :func:`parse_line`. The time left is measured
over the recent iterations of this process only, so a resumed run counts from its resume
point. Nothing here imports torch: the trainer passes the GPU peak in."""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from pathlib import Path

from chord.core.atomic_files import atomic_path

logger = logging.getLogger(__name__)

JSONL = "progress.jsonl"  # every progress line and event of a stage's configuration
LATEST = "progress.json"  # the newest state (status reads it)
TAG = "progress"  # a progress line's first word
EVENT_TAG = "progress-event"  # an event line's first word
#: the fields of a progress line, in order (losses: :data:`LOSSES`, between eta and cfg)
HEAD = ("scene", "stage", "it", "pct", "s_per_it", "eta")
LOSSES = ("sds", "ground", "temporal", "arap", "contact", "support")
TAIL = ("cfg", "gpu_peak_gb", "rss_gb", "tier", "attempt")
FIELDS = HEAD + LOSSES + TAIL
# the iterations the time per iteration is averaged over (the newest of this process)
WINDOW = 50
DEFAULT_EVERY_S = 60.0
# LATEST follows every iteration between the lines, at most once per this many seconds
LATEST_EVERY_S = 1.0


def hms(seconds: float | None) -> str:
    """``H:MM:SS`` (hours unbounded), or ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace(" ", "_")  # one token per value


def format_line(tag: str, fields: dict) -> str:
    """``tag k=v k=v ...`` with spaces in values replaced, in ``fields``' order."""
    return " ".join([tag, *(f"{k}={_value(v)}" for k, v in fields.items())])


def parse_line(line: str) -> tuple[str, dict] | None:
    """(tag, {key: text}) of a progress or event line (with or without the log's
    ``<time> <level> <logger>:`` prefix), else None."""
    for tag in (EVENT_TAG, TAG):
        head, sep, rest = line.partition(f"{tag} ")
        if sep and (not head or head.endswith(": ")):
            pairs = (tok.partition("=") for tok in rest.split())
            return tag, {k: v for k, sep2, v in pairs if sep2}
    return None


def rss_gb() -> float | None:
    """This process's resident memory (GB), from /proc (its peak where /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
        except (ImportError, OSError):
            return None


class Progress:
    """One stage's progress from iteration ``start`` to ``last`` (the stage's last iteration,
    early stop included) in ``folder`` (its checkpoints' folder). Records of iterations at or
    after ``start`` already in :data:`JSONL` (a killed run's, past its checkpoint) are marked
    ``superseded`` rather than kept twice. ``clock``: seconds (tests pass a fake one)."""

    def __init__(
        self,
        folder: Path,
        *,
        scene: str,
        stage: str,
        start: int,
        last: int,
        tier: str | None = None,
        attempt: int = 1,
        every_s: float = DEFAULT_EVERY_S,
        gpu_peak=None,
        clock=time.monotonic,
        wall=time.time,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.scene, self.stage, self.start, self.last = scene, stage, start, last
        self.tier, self.attempt, self.every_s = tier, attempt, float(every_s)
        self.gpu_peak, self.clock, self.wall = gpu_peak, clock, wall
        self.recent: collections.deque = collections.deque(maxlen=WINDOW)
        self.slowest = 0.0
        self.emitted = None  # clock of the last line
        self.written = float("-inf")  # clock of the last write of LATEST
        self.latest: dict = {}
        self.preview: str | None = None  # the newest live preview's path
        # live previews (:mod:`chord.training.live_preview`, set by the stage): a function of the
        # iteration that writes one and returns its path, every so many iterations
        self.render_preview = None
        self.preview_every = 0
        self._supersede(start, "resume")
        self.event("start", start, resumed=start > 1)

    # -- the files -------------------------------------------------------------------------

    def _append(self, rec: dict) -> None:
        with open(self.folder / JSONL, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _supersede(self, first: int, why: str) -> None:
        """Mark the records of iterations >= ``first`` as superseded (by a resume or a
        roll-back): a reader skips them, and the iterations run again append new ones."""
        path = self.folder / JSONL
        if not path.is_file():
            return
        lines, changed = [], False
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by a kill
                changed = True
                continue
            if "event" not in rec and rec.get("it", 0) >= first and "superseded" not in rec:
                rec["superseded"] = why
                changed = True
            lines.append(json.dumps(rec))
        if changed:
            with atomic_path(path) as tmp:
                tmp.write_text("".join(f"{x}\n" for x in lines))

    def _write_latest(self, state: str) -> None:
        self.written = self.clock()
        doc = {
            **self.latest,
            "state": state,
            "slowest_s": self.slowest,
            "total": self.last,
            "updated_at": self.wall(),
            "pid": os.getpid(),
        }
        if self.preview:
            doc["preview"] = self.preview
            doc["preview_s"] = getattr(self.render_preview, "seconds", None)
        with atomic_path(self.folder / LATEST) as tmp:
            tmp.write_text(json.dumps(doc, indent=1) + "\n")

    # -- what the loop calls ----------------------------------------------------------------

    def step(self, it: int, rec: dict, took: float) -> None:
        """Iteration ``it`` finished in ``took`` seconds (its checkpoint included) with the loss
        record ``rec``; writes a line after the first iteration of this process, when
        ``every_s`` passed since the last line, and after the stage's last iteration."""
        now = self.clock()
        self.recent.append(took)
        self.slowest = max(self.slowest, took)
        per_it = sum(self.recent) / len(self.recent)
        left = max(self.last - it, 0)
        self.latest = {
            "scene": self.scene,
            "stage": self.stage,
            "it": it,
            "total": self.last,
            "pct": round(100.0 * it / self.last, 1) if self.last else 100.0,
            "s_per_it": per_it,
            "eta": hms(per_it * left),
            "eta_s": per_it * left,
            **{k: _num(rec.get(k)) for k in LOSSES},
            "cfg": _num(rec.get("cfg")),
            "gpu_peak_gb": self.gpu_peak() if self.gpu_peak else None,
            "rss_gb": rss_gb(),
            "tier": self.tier,
            "attempt": self.attempt,
        }
        if self.emitted is None or now - self.emitted >= self.every_s or it >= self.last:
            self.emitted = now
            self._emit()
        elif now - self.written >= LATEST_EVERY_S:  # status sees the newest iteration
            self._write_latest("running")
        if (
            self.render_preview
            and self.preview_every
            and (it % self.preview_every == 0 or it >= self.last)
        ):
            self.previewed(self.render_preview(it))

    def _emit(self) -> None:
        shown = {k: self.latest.get(k) for k in FIELDS}
        shown["it"] = f"{self.latest['it']}/{self.last}"
        logger.info("%s", format_line(TAG, shown))
        self._append({**self.latest, "time": self.wall()})
        self._write_latest("running")

    def event(self, kind: str, it: int, **extra) -> None:
        """A line and a record of its own: ``kind`` (start, rollback, float32, time_limit,
        sigterm, done, failed) at iteration ``it``."""
        fields = {
            "scene": self.scene,
            "stage": self.stage,
            "event": kind,
            "it": it,
            **extra,
            "tier": self.tier,
            "attempt": self.attempt,
        }
        logger.info("%s", format_line(EVENT_TAG, fields))
        self._append({**fields, "time": self.wall()})
        if kind == "rollback":
            self._supersede(int(extra["to"]) + 1, "rollback")
        state = {"done": "done", "failed": "failed", "time_limit": "stopped"}
        state["sigterm"] = "stopped"
        if not self.latest:
            self.latest = {k: v for k, v in fields.items() if k != "event"}
            self.latest["total"] = self.last
        self.latest["event"] = kind
        self._write_latest(state.get(kind, "running"))

    def previewed(self, path: Path) -> None:
        """A live preview was written to ``path`` (status names the newest)."""
        self.preview = str(path)
        self._write_latest("running")

    def finish(self, it: int) -> None:
        """The stage ran to ``it``: a final line if the last was not of it, and the state."""
        if self.latest.get("it") != it and "s_per_it" in self.latest:
            self._emit()
        self.event("done", it)


def _num(v):
    return float(v) if isinstance(v, int | float) else None


def read_records(path: Path) -> list[dict]:
    """The records of a :data:`JSONL`, superseded ones left out (a cut-short line skipped)."""
    out = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "superseded" not in rec:
            out.append(rec)
    return out
