"""chord status on a results tree with one run in each state (done, running, stalled, failed,
waiting), locally and with a fake Slurm (squeue and sacct on PATH), and without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chord.cli import status
from chord.plan import results_layout as P
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
    for path in (P.scene_json(res, "fin"), P.train_state(res, "fin", "coarse"),
                 P.ref_view_mp4(res, "fin"), P.metrics_json(res, "fin")):  # fmt: skip
        touch(path)
    ckpt = P.checkpoints(res, "run", "coarse") / "0123abcd"
    preview = P.previews_dir(res, "run") / "it_000120.mp4"
    progress_doc(ckpt / progress.LATEST, age_s=5, preview=str(preview))
    touch(ckpt.parent / out_of_memory.RECORD, "full\n")  # ran out of memory once, retried
    touch(P.scene_json(res, "run"))
    stale = STALL_FACTOR_S = max(status.STALL_FACTOR * SLOWEST_S, status.STALL_FLOOR_S)
    progress_doc(P.checkpoints(res, "stuck", "coarse") / "h" / progress.LATEST, age_s=2 * stale)
    # failed: ingest's log ends its attempt in an error (an earlier attempt's is not it)
    touch(
        P.log(res, "bad", "ingest"),
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
    assert counts == {"done": 1, "running": 1, "stalled": 1, "failed": 1, "waiting": 1}
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
    proc = chord_status(tree, "--json", path=f"{bin_}{os.pathsep}{no_slurm_path()}")
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
    assert "total: 5 runs: 0 done, 0 running, 0 stalled, 0 failed, 5 waiting" in out


def test_a_new_attempt_loading_runs_and_only_a_passed_time_limit_is_a_record(tree):
    res = tree / "results"
    now = time.time()
    # "bad": its training failed once (progress), then a retry started, no iteration yet
    progress_doc(P.checkpoints(res, "bad", "coarse") / "h" / progress.LATEST, age_s=300,
                 state="failed")  # fmt: skip
    P.log(res, "bad", "ingest").unlink()
    touch(P.log(res, "bad", "train_coarse"),
          "t ERROR chord: out of GPU memory: injected\n"
          "t INFO chord: attempt started (pid 7, Slurm job 12)\n")  # fmt: skip
    # "wait": a Slurm job stopped at its time limit (its deadline passed); "run": one whose
    # job is still within its limit (the record each job writes at its start)
    folder = P.checkpoints(res, "wait", "coarse")
    touch(
        folder / TIME_LIMIT_RECORD,
        json.dumps({"job": "41", "deadline": now - 60, "tier": "full", "runtime_h": 1}),
    )
    touch(
        P.checkpoints(res, "run", "coarse") / TIME_LIMIT_RECORD,
        json.dumps({"job": "42", "deadline": now + 3600, "tier": "full", "runtime_h": 1}),
    )
    progress_doc(folder / "h" / progress.LATEST, age_s=2 * status.STALL_FLOOR_S,
                 state="stopped")  # fmt: skip
    proc = chord_status(tree, "--json", path=no_slurm_path())
    runs = {r["run"]: r for r in json.loads(proc.stdout)["runs"]}
    assert (runs["bad"]["state"], runs["bad"]["error"]) == ("running", None)
    assert runs["wait"]["state"] == "waiting"
    assert runs["wait"]["record"] == "coarse: job 41 reached its time limit on tier full"
    assert runs["run"]["record"] == "coarse: out of memory on full"  # no time-limit record
