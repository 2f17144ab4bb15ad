"""chord status on a results tree with one run in each state (done, running, stalled, failed,
waiting), locally and with a fake Slurm (squeue and sacct on PATH), and without torch."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest

from chord.cli import status
from chord.config import settings
from chord.plan import results_layout, scene_plan
from chord.resources import out_of_memory
from chord.training import progress
from chord.training.slurm_time_limit import TIME_LIMIT_RECORD
from tests.conftest import REPO

SCENES = {"fin": "hop", "run": "sway", "stuck": "hop", "bad": "sway", "wait": "hop"}
SLOWEST_S = 2.0  # the stalled run's slowest iteration: its limit is max(10 x 2 s, 10 min)


def progress_doc(path: Path, *, age_s: float, state="running", it=120, total=300, s_per_it=1.5,
                 **extra):  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"scene": "x", "stage": "coarse", "it": it, "total": total, "s_per_it": s_per_it,
           "eta_s": (total - it) * s_per_it, "sds": 0.25, "arap": 0.003, "tier": "full",
           "attempt": 2, "state": state, "slowest_s": SLOWEST_S,
           "updated_at": time.time() - age_s, **extra}  # fmt: skip
    path.write_text(json.dumps(doc))


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def stage_files(root: Path, run: str) -> list[Path]:
    """Every output that shows a stage of ``run`` done, in the stages' order (status's own
    list: the plan's files)."""
    plan = scene_plan.scene(settings.load_file(root / "config.yaml"), run)
    return [f for _, files in status._stage_outputs(plan) for f in files]


@pytest.fixture
def tree(tmp_path):
    demo = tmp_path / "demo"
    sheet = "scene\tdata\tprompt\n" + "".join(
        f"{s}\t{demo / d}\ta prompt\n" for s, d in SCENES.items()
    )
    touch(tmp_path / "scenes.tsv", sheet)
    res = tmp_path / "results"
    config = {"scenes": str(tmp_path / "scenes.tsv"), "results": str(res), "demo_dir": str(demo)}
    touch(tmp_path / "config.yaml", json.dumps(config))
    # done: every stage's output to metrics.json
    for path in stage_files(tmp_path, "fin"):
        touch(path)
    ckpt = results_layout.checkpoints(res, "run", "coarse") / "0123abcd"
    preview = results_layout.previews_dir(res, "run") / "it_000120.mp4"
    progress_doc(ckpt / progress.LATEST, age_s=5, preview=str(preview))
    touch(ckpt.parent / out_of_memory.RECORD, "full\n")  # ran out of memory once, retried
    touch(results_layout.scene_json(res, "run"))
    stale = STALL_FACTOR_S = max(status.STALL_FACTOR * SLOWEST_S, status.STALL_FLOOR_S)
    progress_doc(
        results_layout.checkpoints(res, "stuck", "coarse") / "h" / progress.LATEST, age_s=2 * stale
    )
    # failed: ingest's log ends its attempt in an error (an earlier attempt's is not it)
    touch(
        results_layout.log(res, "bad", "ingest"),
        "2026-12-04 10:00:00,000 INFO chord: attempt started (pid 1)\n"
        "2026-12-04 10:00:01,000 ERROR chord: an old error\n"
        "2026-12-04 10:10:00,000 INFO chord: attempt started (pid 2)\n"
        "2026-12-04 10:10:01,000 ERROR chord: scene bad: obj_1.glb: no mesh\n",
    )
    assert STALL_FACTOR_S == 600.0
    return tmp_path


def chord_status(root: Path, *args, path=None) -> subprocess.CompletedProcess:
    """``chord status`` in a fresh interpreter that then checks torch was never imported."""
    code = (
        "import sys; from chord.cli import main; rc = main.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'chord status imported torch'; sys.exit(rc)"
    )
    env = {**os.environ, "PATH": path or os.environ["PATH"], "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", code, "status", "--config", str(root / "config.yaml"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=60)


def status_here(root: Path, *args, path: str) -> subprocess.CompletedProcess:
    """``chord status`` as :func:`chord_status` runs it, in this process (its imports paid
    once; the torch-free check is test_each_state_is_told_without_torch's)."""
    from chord.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = ["status", "--config", str(root / "config.yaml"), *args]
    with mock.patch.dict(os.environ, {"PATH": path}), redirect_stdout(out), redirect_stderr(err):
        rc = main.main(argv)
    return subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())


def no_slurm_path() -> str:
    """PATH without squeue or sacct (this machine may have Slurm)."""
    return os.pathsep.join(
        d
        for d in os.environ["PATH"].split(os.pathsep)
        if not (Path(d) / "squeue").exists() and not (Path(d) / "sacct").exists()
    )


def test_each_state_is_told_without_torch(tree):
    proc = chord_status(tree, "--json", path=no_slurm_path())
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    runs = {r["run"]: r for r in doc["runs"]}
    assert {k: r["state"] for k, r in runs.items()} == {
        "fin": "done", "run": "running", "stuck": "stalled", "bad": "failed", "wait": "waiting"
    }  # fmt: skip
    assert runs["fin"]["done"] == "evaluate" and runs["run"]["done"] == "ingest"
    r = runs["run"]
    assert (r["it"], r["total"], r["tier"], r["attempt"]) == (120, 300, "full", 2)
    assert r["losses"] == {"sds": 0.25, "arap": 0.003}
    assert r["record"] == "coarse: out of memory on full"
    assert 0 < r["eta_s"] <= 180 * 1.5 and r["age_s"] < 60
    # GPU hours left: the running and the stalled run, 180 iterations of 1.5 s each, on full
    assert doc["total"]["gpu_h_left"] == {"full": pytest.approx(2 * 180 * 1.5 / 3600)}
    bad = runs["bad"]
    assert bad["log"].endswith("bad/logs/ingest.log")
    assert bad["error"].endswith("ERROR chord: scene bad: obj_1.glb: no mesh")
    counts = {k: doc["total"][k] for k in status.STATES}
    assert counts == {
        "done": 1,
        "running": 1,
        "stalled": 1,
        "stopped": 0,
        "failed": 1,
        "waiting": 1,
    }
    text = chord_status(tree, path=no_slurm_path()).stdout
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert [lines[s][2] for s in SCENES] == ["done", "running", "stalled", "failed", "waiting"]
    assert lines["run"][3] == "coarse:120/300"
    assert "log: " in text and "obj_1.glb: no mesh" in text
    assert f"preview: {tree / 'results/run/train/previews/it_000120.mp4'}" in text
    assert text.splitlines()[-1].startswith("total: 5 runs: 1 done, 1 running, 1 stalled")


def test_slurm_jobs_are_matched_by_the_executors_comment(tree, tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    # squeue: the waiting run's training is pending; sacct: the failed run's ingest job failed,
    # the running run's earlier job ran out of memory (a newer one runs)
    scripts = {
        "squeue": "205|PENDING|rule_train_coarse_wildcards_wait\n"
        "207|RUNNING|rule_train_coarse_wildcards_run\n",
        "sacct": "101|FAILED|rule_ingest_wildcards_bad\n"
        "150|OUT_OF_MEMORY|rule_train_coarse_wildcards_run\n"
        "160|COMPLETED|rule_export_wildcards_fin\n",
    }
    for name, out in scripts.items():
        (bin_ / name).write_text(f"#!/bin/sh\nprintf '{out}'\n")
        (bin_ / name).chmod(0o755)
    proc = status_here(tree, "--json", path=f"{bin_}{os.pathsep}{no_slurm_path()}")
    assert proc.returncode == 0, proc.stderr
    runs = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    jobs = {k: (r["state"], r["job"], r["job_state"]) for k, r in runs.items()}
    assert jobs == {
        "fin": ("done", "160", "COMPLETED"),
        "run": ("running", "207", "RUNNING"),
        "stuck": ("stalled", None, None),
        "bad": ("failed", "101", "FAILED"),
        "wait": ("waiting", "205", "PENDING"),
    }


def test_an_error_of_an_earlier_attempt_is_not_a_failure(tmp_path):
    log = tmp_path / "train_coarse.log"
    log.write_text(
        "t ERROR chord: out of GPU memory: injected\n"
        "t INFO chord: attempt started (pid 3)\n"
        "t INFO chord.training.progress: progress scene=a stage=coarse it=1/9\n"
    )
    assert status.last_error(log) is None
    with open(log, "a") as f:
        f.write("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert status.last_error(log) == "RuntimeError: boom"


def test_watch_prints_again_until_interrupted_and_configfile_merges(tree, monkeypatch, capsys):
    import time as time_module

    from chord.cli import main

    # a --configfile over --config, as snakemake's: here a results folder with nothing in it
    touch(tree / "over.yaml", json.dumps({"results": str(tree / "elsewhere")}))
    naps = []

    def nap(seconds):
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(time_module, "sleep", nap)
    monkeypatch.setenv("PATH", no_slurm_path())
    argv = ["status", "--config", str(tree / "config.yaml"), "--watch", "30"]
    assert main.main([*argv, "--configfile", str(tree / "over.yaml")]) == 0
    out = capsys.readouterr().out
    assert naps == [30, 30] and out.count("total: 5 runs") == 2  # printed twice, then Ctrl-C
    assert "\x1b" not in out  # not a terminal: no redraw codes
    assert "total: 5 runs: 0 done, 0 running, 0 stalled, 0 stopped, 0 failed, 5 waiting" in out


def test_a_new_attempt_loading_runs_and_only_a_passed_time_limit_is_a_record(tree):
    res = tree / "results"
    now = time.time()
    # "bad": its training failed once (progress), then a retry started, no iteration yet
    progress_doc(results_layout.checkpoints(res, "bad", "coarse") / "h" / progress.LATEST,
                 age_s=300, state="failed")  # fmt: skip
    results_layout.log(res, "bad", "ingest").unlink()
    touch(results_layout.log(res, "bad", "train_coarse"),
          "t ERROR chord: out of GPU memory: injected\n"
          "t INFO chord: attempt started (pid 7, Slurm job 12)\n")  # fmt: skip
    # "wait": a Slurm job stopped at its time limit (its deadline passed); "run": one whose
    # job is still within its limit (the record each job writes at its start)
    folder = results_layout.checkpoints(res, "wait", "coarse")
    touch(
        folder / TIME_LIMIT_RECORD,
        json.dumps({"job": "41", "deadline": now - 60, "tier": "full", "runtime_h": 1}),
    )
    touch(
        results_layout.checkpoints(res, "run", "coarse") / TIME_LIMIT_RECORD,
        json.dumps({"job": "42", "deadline": now + 3600, "tier": "full", "runtime_h": 1}),
    )
    progress_doc(folder / "h" / progress.LATEST, age_s=2 * status.STALL_FLOOR_S,
                 state="stopped")  # fmt: skip
    proc = status_here(tree, "--json", path=no_slurm_path())
    runs = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    assert (runs["bad"]["state"], runs["bad"]["error"]) == ("running", None)
    # it stopped itself at its time limit: "stopped", not waiting or failed (issue 47)
    assert runs["wait"]["state"] == "stopped"
    assert runs["wait"]["record"] == "coarse: job 41 reached its time limit on tier full"
    assert runs["run"]["record"] == "coarse: out of memory on full"  # no time-limit record


# -- issue 47: the run's own state files read as untrusted; the smaller things ----------------


def in_process(root: Path) -> tuple[dict, str]:
    """{run: its RunStatus} and the rendered table of ``chord status`` on the tree ``root``
    (in this process: the torch-free check is the subprocess tests')."""
    rows = status.collect(settings.load_file(root / "config.yaml"), env={"PATH": no_slurm_path()})
    return {r.run: r for r in rows}, status.render(rows)


def others_still_shown(runs: dict, text: str) -> None:
    """Every run but "run" (the damaged one) is told as in the undamaged tree."""
    states = {k: r.state for k, r in runs.items() if k != "run"}
    assert states == {"fin": "done", "stuck": "stalled", "bad": "failed", "wait": "waiting"}
    assert all(not r.damaged for k, r in runs.items() if k != "run")
    shown = {line.split()[0] for line in text.splitlines() if line and not line[0].isspace()}
    assert set(SCENES) <= shown  # every run has its row
    assert runs["stuck"].remaining_gpu_h == pytest.approx(180 * 1.5 / 3600)
    assert "obj_1.glb: no mesh" in text


def _field(name: str, value):
    def damage(doc: dict) -> str:
        doc[name] = value
        return json.dumps(doc)

    return damage


HOSTILE_PROGRESS = {
    **{
        f"{name} a string": (_field(name, "12.5"), f"{name} is a string, expected {kind}")
        for name, kind in [
            ("s_per_it", "a number"),
            ("it", "an integer"),
            ("updated_at", "a number"),
            ("eta_s", "a number"),
            ("slowest_s", "a number"),
            ("total", "an integer"),
        ]
    },  # fmt: skip
    "a list": (lambda doc: json.dumps([doc]), "a list, expected a JSON object"),
    "truncated": (lambda doc: json.dumps(doc)[:40], "truncated or not JSON ("),
    "empty": (lambda doc: "", "empty, expected a JSON object"),
    "NaN s_per_it": (_field("s_per_it", float("nan")), "s_per_it is nan, expected a finite"),
}


@pytest.mark.parametrize("damage", HOSTILE_PROGRESS, ids=list(HOSTILE_PROGRESS))
def test_a_damaged_progress_json_is_told_in_its_own_row(tree, damage):
    write, message = HOSTILE_PROGRESS[damage]
    path = next((tree / "results").glob("run/**/progress.json"))
    path.write_text(write(json.loads(path.read_text())))
    runs, text = in_process(tree)
    (note,) = runs["run"].damaged
    assert note.startswith(f"{path}: {message}"), note
    assert f"    damaged: {path}: {message}" in text
    assert runs["run"].it is None and runs["run"].remaining_gpu_h is None  # nothing of it used
    others_still_shown(runs, text)
    assert text.splitlines()[-1].endswith("; 1 with damaged state files")
    # the command: the table, exit status 0 as for a failed run (a fact of that run)
    proc = status_here(tree, path=no_slurm_path())
    assert proc.returncode == 0, proc.stderr
    assert f"damaged: {path}: {message}" in proc.stdout
    doc = json.loads(status_here(tree, "--json", path=no_slurm_path()).stdout)
    assert doc["total"]["damaged"] == 1


def test_a_damaged_older_progress_leaves_the_sound_newer_one_in_use(tree):
    folder = next((tree / "results").glob("run/**/progress.json")).parent
    touch(folder.parent / "0000aaaa" / progress.LATEST, '{"it": 3, "updated_at": "yesterday"')
    runs, text = in_process(tree)
    r = runs["run"]
    assert (r.state, r.it, r.total) == ("running", 120, 300)
    assert r.damaged == [f"{folder.parent / '0000aaaa' / progress.LATEST}: truncated or not JSON "
                         "(Expecting ',' delimiter: line 1 column 36 (char 35))"]  # fmt: skip


HOSTILE_RECORDS = {
    "deadline a string": (
        lambda folder: touch(folder / TIME_LIMIT_RECORD, '{"job": "41", "deadline": "soon"}'),
        TIME_LIMIT_RECORD,
        "deadline is a string, expected a number",
    ),
    "time limit a list": (
        lambda folder: touch(folder / TIME_LIMIT_RECORD, "[41]"),
        TIME_LIMIT_RECORD,
        "a list, expected a JSON object",
    ),
    "out-of-memory record a folder": (
        lambda folder: (
            (folder / out_of_memory.RECORD).unlink() or (folder / out_of_memory.RECORD).mkdir()
        ),
        out_of_memory.RECORD,
        "an unreadable out-of-memory record (Is a directory); delete it",
    ),
}


@pytest.mark.parametrize("damage", HOSTILE_RECORDS, ids=list(HOSTILE_RECORDS))
def test_a_damaged_record_is_told_in_its_own_row(tree, damage):
    write, name, message = HOSTILE_RECORDS[damage]
    folder = results_layout.checkpoints(tree / "results", "run", "coarse")
    write(folder)
    runs, text = in_process(tree)
    (note,) = runs["run"].damaged
    assert note.startswith(f"{folder / name}: {message}"), note
    assert runs["run"].state == "running"  # its progress is sound
    others_still_shown(runs, text)


def test_a_sigterm_stop_shows_the_logs_own_line(tree):
    """A preempted training (SIGTERM): chord.training.run_loop writes its checkpoint, its
    progress event and raises Interrupted; the adapter logs "stage failed" with the
    traceback, which ends with the job's own line."""
    res = tree / "results"
    progress_doc(results_layout.checkpoints(res, "wait", "coarse") / "h" / progress.LATEST,
                 age_s=900, state="stopped", it=65, event="sigterm")  # fmt: skip
    line = "SIGTERM after iteration 65; checkpoint written"
    ckpt = results_layout.checkpoints(res, "wait", "coarse") / "h" / "ckpt_000065.pt"
    touch(ckpt.with_name("ckpt_000050.pt"), "")
    touch(ckpt, "")
    log = results_layout.log(res, "wait", "train_coarse")
    touch(
        log,
        "2026-12-04 10:00:00,000 INFO chord.stages.adapter: attempt started (pid 7)\n"
        "2026-12-04 10:00:05,000 INFO chord.stages.train: training on cuda:0 (NVIDIA H100, "
        "CUDA_VISIBLE_DEVICES=0); rendering with the gsplat rasterizer\n"
        "2026-12-04 11:00:00,000 INFO chord.training.progress: progress-event scene=wait "
        "stage=coarse event=sigterm it=65 tier=full attempt=2\n"
        "2026-12-04 11:00:00,100 ERROR chord.stages.adapter: stage failed\n"
        "Traceback (most recent call last):\n"
        '  File "/x/chord/stages/adapter.py", line 62, in stage_logging\n'
        "    yield\n"
        '  File "/x/chord/training/run_loop.py", line 244, in run\n'
        f'    raise Interrupted(f"{line}")\n'
        f"chord.training.run_loop.Interrupted: {line}\n",
    )
    os.utime(log, (time.time() - 900, time.time() - 900))
    assert status.last_error(log) == f"chord.training.run_loop.Interrupted: {line}"
    runs, text = in_process(tree)
    r = runs["wait"]
    # it stopped itself: "stopped", with the log's own line and the checkpoint it left
    assert r.state == "stopped" and r.error.endswith(line) and r.log == str(log)
    assert f"    log: {log}: chord.training.run_loop.Interrupted: {line}" in text
    assert f"    checkpoint: {ckpt} (the next attempt resumes from it)" in text
    assert "stage failed" not in text and " 1 stopped, " in text


@pytest.mark.parametrize("gap", [0, 1, 4, -2])
def test_done_is_the_furthest_stage_with_every_earlier_one_done(tree, gap):
    """ "wait" has every stage's outputs but those of one (the ``gap``-th, in the plan's order):
    done names the last stage before it, and the run is not done."""
    stages = [(name, files) for name, files in status._stage_outputs(
        scene_plan.scene(settings.load_file(tree / "config.yaml"), "wait")) if files]  # fmt: skip
    for _, files in stages:
        for f in files:
            touch(f)
    for f in stages[gap][1]:
        f.unlink()
    runs, _ = in_process(tree)
    index = gap % len(stages)
    assert runs["wait"].done == (stages[index - 1][0] if index else "-")
    assert runs["wait"].state != "done"
    assert runs["fin"].done == stages[-1][0] == "evaluate"  # all of them: done


def test_a_cpu_run_is_not_labelled_with_a_gpu_tier(tree):
    res = tree / "results"
    for run in ("run", "stuck"):  # both trainings on the CPU (chord.stages.train's line)
        touch(
            results_layout.log(res, run, "train_coarse"),
            "2026-12-04 10:00:00,000 INFO chord.stages.adapter: attempt started (pid 7)\n"
            "2026-12-04 10:00:01,000 INFO chord.stages.train: training coarse on tier full\n"
            "2026-12-04 10:00:05,000 INFO chord.stages.train: training on cpu; rendering with "
            "the torch rasterizer\n",
        )
    runs, text = in_process(tree)
    for run in ("run", "stuck"):
        r = runs[run]
        assert (r.device, r.tier, r.remaining_gpu_h) == ("cpu", "full", None)
        assert r.remaining_cpu_h == pytest.approx(180 * 1.5 / 3600)
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert lines["run"][8] == lines["stuck"][8] == "cpu"
    total = text.splitlines()[-1]
    assert "GPU hours" not in total and "hours left on CPU (measured s/it): 0.1" in total
    doc = json.loads(status.as_json(list(runs.values())))
    assert doc["total"]["gpu_h_left"] == {}
    assert doc["total"]["cpu_h_left"] == pytest.approx(2 * 180 * 1.5 / 3600)
    # a GPU run beside it keeps its tier and GPU hours
    touch(results_layout.log(res, "stuck", "train_coarse"),
          "t INFO chord.stages.train: training on cuda:0 (NVIDIA H100, CUDA_VISIBLE_DEVICES=0); "
          "rendering with the gsplat rasterizer\n")  # fmt: skip
    runs, text = in_process(tree)
    assert (runs["stuck"].device, runs["stuck"].remaining_gpu_h) == (
        "cuda", pytest.approx(180 * 1.5 / 3600))  # fmt: skip
    total = text.splitlines()[-1]
    assert "GPU hours left by tier (measured s/it): full 0.1; hours left on CPU" in total
