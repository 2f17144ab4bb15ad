"""``chord status``: where every run of the sheet stands, from its files alone (issue 37).

For each run (a scene, or one seed of a sweep): the furthest stage done, its state, and for a
training the newest progress record (:mod:`chord.training.progress`: iteration, time per iteration,
time left, losses, tier, attempt, live preview), its out-of-memory and time-limit records, the
age of its last progress, and a failed job's log and last error line. On Slurm (``squeue`` or
``sacct`` on PATH) the run's newest job, matched by the comment the Slurm executor plugin
gives each job (``rule_<rule>_wildcards_<values joined by _, / as _>``).

States: ``done`` (metrics.json written), ``running`` (a training reported within the stall
limit, a new attempt of it is loading, or its Slurm job runs), ``stalled`` (a training's
newest progress is older than max(:data:`STALL_FACTOR` x its slowest iteration,
:data:`STALL_FLOOR_S`) and it did not say it stopped), ``stopped`` (a training stopped itself
at a SIGTERM or its time limit, after writing a checkpoint: the log's own line and that
checkpoint are shown; the next attempt resumes from it), ``failed`` (an error ends the newest
attempt's log, a training recorded a failure or a bad input, or Slurm ended its job so),
``waiting`` (none of these: not started, queued, or between jobs). Reads files only and
imports no torch.

The run's own state files (``progress.json``, ``time_limit.json``, the out-of-memory and
bad-input records) are written by other jobs, other versions, on file systems that fill up, so
each is read as untrusted (issue 47): a file that cannot be read, is cut short, is not a JSON
object or has a field of the wrong type is not used, and its run's row says so (``damaged:``,
naming the file and the field) while every other run is told as usual. The exit status stays
0, as for a failed run: a damaged file is a fact about that run, not an error of the command.

"done" is the furthest stage whose outputs exist with those of every stage before it (in the
order of :func:`_stage_outputs`). A training's device is read from its log (its "training on
..." line); a CPU run is labelled ``cpu`` rather than with its memory tier, and its time left
is counted in hours on the CPU, not GPU hours."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from chord.cli import state_files
from chord.cli.state_files import (  # noqa: F401 (status.last_error: its tests')
    ATTEMPT_LINE,
    ERROR_LINE,
    PROGRESS_FIELDS,
    TIME_LIMIT_FIELDS,
    last_error,
    read_state,
)
from chord.config import settings
from chord.core.errors import InputError
from chord.plan import results_layout, scene_plan
from chord.resources import out_of_memory, tiers
from chord.training import progress
from chord.training.slurm_time_limit import TIME_LIMIT_RECORD

STATES = ("done", "running", "stalled", "stopped", "failed", "waiting")
STALL_FACTOR = 10  # stalled: no progress for this many of the slowest iteration ...
STALL_FLOOR_S = 600.0  # ... and at least this long
INPUT_ERROR_RECORD = "input_error.txt"  # chord.stages.adapter's (it imports the stages)
# Slurm states of a job that ended badly / that is still there
SLURM_FAILED = {"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "CANCELLED", "BOOT_FAIL"}
SLURM_LIVE = {"RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED"}
COMMENT = re.compile(r"^rule_(?P<rule>.+?)(?:_wildcards_(?P<wildcards>.*))?$")


@dataclasses.dataclass
class RunStatus:
    run: str
    scene: str
    done: str  # the furthest stage done ("-": none)
    state: str
    stage: str | None = None  # the training stage the progress is of
    it: int | None = None
    total: int | None = None
    s_per_it: float | None = None
    eta_s: float | None = None
    losses: dict = dataclasses.field(default_factory=dict)
    tier: str | None = None
    attempt: int | None = None
    record: str | None = None  # out-of-memory / time-limit / bad-input record
    age_s: float | None = None  # of the newest progress
    log: str | None = None  # the failing job's log
    error: str | None = None  # its last error line
    job: str | None = None  # Slurm job id
    job_state: str | None = None
    preview: str | None = None
    remaining_gpu_h: float | None = None
    device: str | None = None  # the training's device type (cpu, cuda), from its log
    remaining_cpu_h: float | None = None  # a CPU run's hours left (wall clock)
    damaged: list[str] = dataclasses.field(default_factory=list)  # "<file>: what is wrong"
    checkpoint: str | None = None  # a stopped training's newest checkpoint


def _stage_outputs(p: scene_plan.ScenePlan) -> list[tuple[str, list[Path]]]:
    """The run's stages in DAG order, each with the files that show it done."""
    r, s, run = p.results, p.scene, p.run
    out = [
        ("ingest", [results_layout.scene_json(r, s)]),
        ("gaussians", list(p.gaussians().values())),
        ("voxelize", list(p.voxels().values())),
        ("reference", [results_layout.reference_png(r, s)]),
        ("condition", [results_layout.text_condition(r, s)]),
    ]
    out += [(f"train_{st}", [results_layout.train_state(r, run, st)]) for st in p.stages]
    out += [
        ("export", [results_layout.ref_view_mp4(r, run)]),
        ("evaluate", [results_layout.metrics_json(r, run)]),
    ]
    return out


def _furthest(p: scene_plan.ScenePlan) -> str:
    """The furthest stage whose outputs exist with those of every stage before it ("-": none);
    a stage with no outputs here (no dynamic object: nothing to voxelize) is passed over."""
    done = "-"
    for name, files in _stage_outputs(p):
        if not all(f.exists() for f in files):
            break
        if files:
            done = name
    return done


def _latest_progress(
    p: scene_plan.ScenePlan, damaged: list[str]
) -> tuple[Path | None, dict | None]:
    """The newest sound progress.json of the run's trainings (any configuration) and its
    folder; what is wrong with each damaged one is appended to ``damaged``."""
    best = (None, None, -1.0)
    for st in p.stages:
        folder = results_layout.checkpoints(p.results, p.run, st)
        try:
            subs = [sub for sub in os.scandir(folder) if sub.is_dir()]
        except OSError:
            continue
        for sub in sorted(subs, key=lambda e: e.name):
            doc, problem = read_state(Path(sub.path) / progress.LATEST, PROGRESS_FIELDS)
            if problem:
                damaged.append(problem)
            if doc is not None and doc.get("updated_at", 0) > best[2]:
                best = (Path(sub.path), doc, doc.get("updated_at", 0))
    return best[0], best[1]


def _records(p: scene_plan.ScenePlan, now: float, damaged: list[str]) -> str | None:
    """The run's out-of-memory, time-limit and bad-input records, in words (what is wrong with
    a damaged one appended to ``damaged``). A Slurm job's time-limit record
    (:mod:`chord.training.slurm_time_limit`) is written at its start and removed when it ends
    in time: only one whose deadline has passed tells of a job killed at its limit."""
    notes = []
    for st in p.stages:
        folder = results_layout.checkpoints(p.results, p.run, st)
        path = folder / out_of_memory.RECORD
        try:
            oom = out_of_memory.read(path)
        except InputError as exc:  # not a file, not text: the message names it
            damaged.append(str(exc))
            oom = set()
        if oom:
            notes.append(f"{st}: out of memory on {','.join(sorted(oom))}")
        limit, problem = read_state(folder / TIME_LIMIT_RECORD, TIME_LIMIT_FIELDS)
        if problem:
            damaged.append(problem)
        if limit is not None and now >= limit.get("deadline", float("inf")):
            notes.append(
                f"{st}: job {limit.get('job')} reached its time limit on tier {limit.get('tier')}"
            )
        path = folder / INPUT_ERROR_RECORD
        try:
            bad = path.read_bytes().decode("utf-8", "replace").strip()
            notes.append(f"{st}: bad input: {bad}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            damaged.append(f"{path}: cannot be read ({exc.strerror or exc})")
    return "; ".join(notes) or None


def _device(p: scene_plan.ScenePlan, stage: str | None) -> str | None:
    """The device type the run's training (``stage``'s, else the last one logged) runs on."""
    for st in [stage] if stage in p.stages else reversed(p.stages):
        found = state_files.device(results_layout.log(p.results, p.run, f"train_{st}"))
        if found:
            return found
    return None


def _logs(p: scene_plan.ScenePlan) -> list[Path]:
    """The run's logs (its scene's and its own), newest first."""
    folders = {
        results_layout.scene_dir(p.results, p.scene) / "logs",
        results_layout.scene_dir(p.results, p.run) / "logs",
    }
    found = []
    for folder in folders:
        try:
            found += [(e.stat().st_mtime, Path(e.path)) for e in os.scandir(folder)]
        except OSError:
            continue
    return [path for _, path in sorted(found, reverse=True)]


def _loading(p: scene_plan.ScenePlan, now: float, since: float | None) -> bool:
    """Whether a training attempt started (its log's first line, written by the adapter)
    after the newest progress (``since``), within the stall limit, and has no error yet."""
    for stage in p.stages:
        log = results_layout.log(p.results, p.run, f"train_{stage}")
        try:
            mtime = log.stat().st_mtime
        except OSError:
            continue
        if now - mtime > STALL_FLOOR_S or (since is not None and mtime <= since):
            continue
        try:
            lines = state_files.tail(log)
        except OSError:  # gone since
            continue
        starts = [i for i, line in enumerate(lines) if ATTEMPT_LINE in line]
        if starts and not any(ERROR_LINE.search(x) for x in lines[starts[-1] :]):
            return True
    return False


def _failure(p: scene_plan.ScenePlan) -> tuple[str, str] | None:
    """(log, its last error) of the newest log of the run that ends its attempt in error."""
    logs = _logs(p)
    if logs:
        error = last_error(logs[0])
        if error:
            return str(logs[0]), error
    return None


# -- Slurm ---------------------------------------------------------------------------------


def slurm_jobs(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{comment key (its wildcards): (job id, state)} of this user's jobs: ``squeue``'s
    (live), over ``sacct``'s of the last days (the newest job per key). Empty without Slurm."""
    jobs: dict[str, tuple[int, str, str]] = {}

    def take(out: str) -> None:
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) < 3:
                continue
            job, state, comment = parts[0].strip(), parts[1].strip(), parts[2].strip()
            state = state.split()[0] if state else ""
            m = COMMENT.match(comment)
            if not m or not job.split("_")[0].split(".")[0].isdigit():
                continue
            key = m["wildcards"] or ""
            num = int(job.split("_")[0].split(".")[0])
            if key not in jobs or num >= jobs[key][0]:
                jobs[key] = (num, job, state)

    path = env.get("PATH")
    commands = [
        ["sacct", "-X", "--noheader", "--parsable2", "--starttime", "now-7days",
         "--format", "JobID,State,Comment"],
        ["squeue", "--me", "--noheader", "--format", "%i|%T|%k"],
    ]  # fmt: skip
    for cmd in commands:  # squeue last: a live job is the newest word
        if shutil.which(cmd[0], path=path) is None:
            continue
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=30, env=dict(env), check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0:
            take(proc.stdout)
    return {key: (job, state) for key, (_, job, state) in jobs.items()}


def _job_of(run: str, scene: str, jobs: dict) -> tuple[str, str] | None:
    """The run's newest job: one of its own (wildcards = the run), else of its scene."""
    key = run.replace("/", "_")
    best = None
    for k, (job, state) in jobs.items():
        if k in (key, scene) or k.startswith(f"{key}_"):
            if best is None or _num(job) > _num(best[0]):
                best = (job, state)
    return best


def _num(job: str) -> int:
    return int(job.split("_")[0].split(".")[0])


# -- one run --------------------------------------------------------------------------------


def run_status(
    p: scene_plan.ScenePlan, conf: settings.Config, now: float, jobs: dict, table: dict
) -> RunStatus:
    """The status of the run ``p`` at ``now`` (seconds since the epoch)."""
    st = RunStatus(run=p.run, scene=p.scene, done=_furthest(p), state="waiting")
    folder, doc = _latest_progress(p, st.damaged)
    st.record = _records(p, now, st.damaged)
    spec = conf.scenes[p.scene]
    st.tier = spec.tier
    if doc is not None:
        st.stage, st.it, st.total = doc.get("stage"), doc.get("it"), doc.get("total")
        st.s_per_it, st.eta_s = doc.get("s_per_it"), doc.get("eta_s")
        st.losses = {k: doc[k] for k in progress.LOSSES if doc.get(k) is not None}
        st.tier, st.attempt = doc.get("tier") or st.tier, doc.get("attempt")
        st.age_s = max(now - doc.get("updated_at", now), 0.0)
        st.preview = doc.get("preview")
    job = _job_of(p.run, p.scene, jobs)
    if job:
        st.job, st.job_state = job
    if st.done == "evaluate":
        st.state = "done"
        return st
    limit = max(STALL_FACTOR * (doc or {}).get("slowest_s", 0.0), STALL_FLOOR_S)
    pstate = (doc or {}).get("state")
    if pstate == "running":
        st.state = "stalled" if st.age_s > limit else "running"
        if st.state == "running" and st.eta_s is not None:
            st.eta_s = max(st.eta_s - st.age_s, 0.0)
    elif pstate == "failed":
        st.state = "failed"
    elif pstate == "stopped":  # it said so: a SIGTERM or its time limit, checkpoint written
        st.state = "stopped"
        ckpts = sorted(folder.glob("ckpt_*.pt")) if folder is not None else []
        st.checkpoint = str(ckpts[-1]) if ckpts else None
    if pstate in (None, "failed", "stopped") and _loading(p, now, (doc or {}).get("updated_at")):
        st.state = "running"  # a new attempt of the training loads (no iteration yet)
    if st.job_state in SLURM_LIVE and st.state != "stalled":
        st.state = "running" if st.job_state == "RUNNING" else st.state
    elif st.job_state in SLURM_FAILED and st.state not in ("running", "stopped"):
        st.state = "failed"
    if st.state in ("waiting", "failed", "stalled", "stopped"):
        failure = _failure(p)
        if failure and (st.state != "waiting" or st.job_state not in SLURM_LIVE):
            st.log, st.error = failure
            if st.state == "waiting":
                st.state = "failed"
        elif st.state == "failed" and st.record and "bad input" in st.record:
            st.error = st.record
    if st.state in ("failed", "stalled", "stopped") and st.log is None and st.stage:
        st.log = str(results_layout.log(p.results, p.run, f"train_{st.stage}"))
    st.device = _device(p, st.stage)
    hours = _remaining(st, spec)
    if st.device == "cpu":
        st.remaining_cpu_h = hours
    elif hours is not None:
        st.remaining_gpu_h = hours * (table[st.tier].gpus if st.tier in table else 1)
    return st


def _remaining(st: RunStatus, spec) -> float | None:
    """Hours left of the run's trainings (wall clock) at its measured time per iteration: the
    rest of the stage in progress, and a fine stage not yet started (its iterations at that
    pace)."""
    if st.s_per_it is None or st.total is None or st.it is None or st.state == "done":
        return None
    left = max(st.total - st.it, 0)
    if st.stage == "coarse" and spec.method.add_cp_objs:
        left += max(spec.method.iterations - st.total, 0)
    return left * st.s_per_it / 3600.0


def collect(
    conf: settings.Config, *, env: Mapping[str, str] | None = None, now: float | None = None
):
    """Every run's :class:`RunStatus`, in sheet and seed order."""
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    jobs = slurm_jobs(env)
    try:
        table = tiers.parse(conf.tiers)
    except settings.ConfigError:
        table = {}
    plans = {name: scene_plan.scene(conf, name) for name in conf.scenes}
    return [run_status(p, conf, now, jobs, table) for p in scene_plan.runs(plans)]


# -- the report -----------------------------------------------------------------------------

COLUMNS = ("run", "done", "state", "it", "s/it", "eta", "sds", "arap", "tier", "att", "age",
           "job")  # fmt: skip


def _fmt(v, spec="{:.3g}") -> str:
    return "-" if v is None else spec.format(v)


def _row(st: RunStatus) -> list[str]:
    it = f"{st.stage}:{st.it}/{st.total}" if st.it is not None else "-"
    job = f"{st.job} {st.job_state}" if st.job else "-"
    return [
        st.run,
        st.done,
        st.state,
        it,
        _fmt(st.s_per_it),
        progress.hms(st.eta_s) if st.eta_s is not None and st.state == "running" else "-",
        _fmt(st.losses.get("sds")),
        _fmt(st.losses.get("arap")),
        "cpu" if st.device == "cpu" else st.tier or "-",  # a memory tier is a GPU's
        _fmt(st.attempt, "{}"),
        progress.hms(st.age_s) if st.age_s is not None else "-",
        job,
    ]


def totals(rows: list[RunStatus]) -> dict:
    counts = {s: sum(r.state == s for r in rows) for s in STATES}
    hours: dict[str, float] = {}
    for r in rows:
        if r.remaining_gpu_h is not None and r.state != "done":
            hours[r.tier or "-"] = hours.get(r.tier or "-", 0.0) + r.remaining_gpu_h
    cpu_h = sum(r.remaining_cpu_h for r in rows if r.remaining_cpu_h is not None)
    unmeasured = sum(
        r.state != "done" and r.remaining_gpu_h is None and r.remaining_cpu_h is None for r in rows
    )
    damaged = sum(bool(r.damaged) for r in rows)
    return {"runs": len(rows), **counts, "gpu_h_left": hours, "cpu_h_left": cpu_h,
            "unmeasured": unmeasured, "damaged": damaged}  # fmt: skip


def render(rows: list[RunStatus]) -> str:
    """The table, each run's notes (record, failing log and error, preview) under it, and the
    total line."""
    cells = [list(COLUMNS)] + [_row(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    out = []
    for row, st in zip(cells, [None, *rows], strict=True):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if st is None:
            continue
        for note in st.damaged:
            out.append(f"    damaged: {note}")
        if st.record:
            out.append(f"    record: {st.record}")
        if st.log and st.state in ("failed", "stalled", "stopped"):
            out.append(f"    log: {st.log}" + (f": {st.error}" if st.error else ""))
        if st.checkpoint:
            out.append(f"    checkpoint: {st.checkpoint} (the next attempt resumes from it)")
        elif st.error:
            out.append(f"    error: {st.error}")
        if st.preview and st.state != "done":
            out.append(f"    preview: {st.preview}")
    t = totals(rows)
    hours = ", ".join(f"{k} {v:.1f}" for k, v in sorted(t["gpu_h_left"].items())) or "-"
    left = []
    if t["gpu_h_left"] or not t["cpu_h_left"]:
        left.append(f"GPU hours left by tier (measured s/it): {hours}")
    if t["cpu_h_left"]:
        left.append(f"hours left on CPU (measured s/it): {t['cpu_h_left']:.1f}")
    out.append(
        f"total: {t['runs']} runs: {t['done']} done, {t['running']} running, "
        f"{t['stalled']} stalled, {t['stopped']} stopped, {t['failed']} failed, "
        f"{t['waiting']} waiting; "
        + "; ".join(left)
        + (f"; {t['unmeasured']} not measured yet" if t["unmeasured"] else "")
        + (f"; {t['damaged']} with damaged state files" if t["damaged"] else "")
    )
    return "\n".join(out)


def as_json(rows: list[RunStatus]) -> str:
    return json.dumps(
        {"runs": [dataclasses.asdict(r) for r in rows], "total": totals(rows)}, indent=1
    )
