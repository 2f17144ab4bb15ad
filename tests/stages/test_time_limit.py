"""A training in a Slurm job and the job's time limit (chord.stages.train.run): it stops before
the limit with a checkpoint and the job requeues itself, and its runs end in the state of one
uninterrupted run; a job killed at its limit before finishing an iteration makes the next job
on that tier stop at once, naming the tier's runtime_h. Slurm's squeue (the job's end time)
and scontrol (the requeue) are fakes on PATH; Slurm itself: tests/slurm/test_time_limit.py."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from chord.config import settings
from chord.stages import train as train_stage
from chord.training import checkpoint, run_loop, slurm_time_limit
from tests.conftest import REPO
from tests.processes.test_train_cli import assert_same_state, read_loss_log
from tests.processes.test_train_multi_gpu import hop_scene, load

JOB = "4242"
# squeue answers with the end time the test wrote (only when asked for it in seconds since the
# epoch), scontrol notes its arguments
SQUEUE = """#!/bin/sh
[ "$SLURM_TIME_FORMAT" = "%s" ] || exit 3
cat "$FAKE_SLURM/end"
"""
SCONTROL = """#!/bin/sh
echo "$@" >> "$FAKE_SLURM/scontrol.log"
"""


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    return hop_scene(tmp_path_factory.mktemp("time_limit"))


@pytest.fixture
def slurm(tmp_path):
    """A fake Slurm job: (environment of its processes, folder of the fakes' files)."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    for name, text in (("squeue", SQUEUE), ("scontrol", SCONTROL)):
        (fake / "bin" / name).write_text(text)
        (fake / "bin" / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": JOB,
        "FAKE_SLURM": str(fake),
    }
    return env, fake


def kwargs(hop, name, env, conf=None) -> dict:
    root, conf0, inputs = hop
    return {
        "conf": conf or conf0,
        "scene": "hop",
        "tier": "solo",
        "inputs": inputs,
        "out": root / name / "coarse.pt",
        "loss_log": root / name / "losses.tsv",
        "checkpoint_dir": root / name / "ckpt",
        "handoff": None,
        "env": env,
    }


def job_ends_in(fake, seconds: float) -> None:
    (fake / "end").write_text(f"{int(time.time() + seconds)}\n")


def test_a_job_near_its_time_limit_requeues_itself_and_its_runs_end_as_one_run(hop, slurm):
    """Each run's job ends STOP_MARGIN_S after it starts: every run stops after its first
    iteration (less than the margin and two iterations left), so four iterations take four
    runs, three of them requeued."""
    env, fake = slurm
    root = hop[0]
    iterations = hop[1].scenes["hop"].method.iterations
    train_stage.run("coarse", **kwargs(hop, "whole", {}))
    runs = 0
    while True:
        runs += 1
        assert runs <= iterations, "a run finished no iteration"
        job_ends_in(fake, run_loop.STOP_MARGIN_S)
        try:
            summary = train_stage.run("coarse", **kwargs(hop, "limited", env))
            break
        except run_loop.TimeLimit as exc:
            assert "checkpoint written" in str(exc)
    assert runs == iterations
    assert summary["start"] == iterations and summary["last"] == iterations
    assert (fake / "scontrol.log").read_text().splitlines() == [f"requeue {JOB}"] * (runs - 1)
    whole = checkpoint.load_checkpoint(root / "whole/coarse.pt")
    assert_same_state(checkpoint.load_checkpoint(root / "limited/coarse.pt"), whole)
    assert read_loss_log(root / "limited/losses.tsv") == read_loss_log(root / "whole/losses.tsv")
    assert not (root / "limited/ckpt" / slurm_time_limit.TIME_LIMIT_RECORD).exists()


RUN_IN_CHILD = """
import pickle, sys
from chord.stages import train
train.run("coarse", **pickle.load(open(sys.argv[1], "rb")))
"""


def test_a_job_killed_at_its_limit_before_an_iteration_stops_the_next_one(hop, slurm, tmp_path):
    """The first job is killed (SIGKILL, as Slurm does after its grace time) while it loads,
    its time limit then past: the next job on the same tier would end the same way, so it
    stops before training, naming the tier's runtime_h. With a longer runtime_h it trains."""
    env, fake = slurm
    root = hop[0]
    args = tmp_path / "args.pkl"
    args.write_bytes(pickle.dumps(kwargs(hop, "stuck", env)))
    record = root / "stuck/ckpt" / slurm_time_limit.TIME_LIMIT_RECORD
    job_ends_in(fake, 5)
    child = subprocess.Popen(
        [sys.executable, "-c", RUN_IN_CHILD, str(args)],
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not record.exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the job wrote no time-limit record"
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert not list((root / "stuck/ckpt").glob("*/ckpt_*.pt"))  # killed before iteration 1
    end = int((fake / "end").read_text())
    time.sleep(max(0.0, end - time.time() + 1))  # the killed job's time limit is past
    job_ends_in(fake, 3600)  # the next job
    with pytest.raises(settings.ConfigError) as err:
        train_stage.run("coarse", **kwargs(hop, "stuck", env))
    assert "tiers.solo.runtime_h" in str(err.value) and str(record) in str(err.value)
    assert not list((root / "stuck/ckpt").glob("*/ckpt_*.pt"))  # it did not train
    assert not (fake / "scontrol.log").exists()

    longer = load(tmp_path, hop[1].scenes["hop"].data, tiers={"solo": {"runtime_h": 48}})
    summary = train_stage.run("coarse", **kwargs(hop, "stuck", env, conf=longer))
    assert summary["last"] == hop[1].scenes["hop"].method.iterations
    assert not record.exists()


def test_the_requeue_is_logged_before_slurm_stops_the_run(tmp_path, caplog):
    """Slurm stops the run as soon as it takes the requeue, its SIGTERM often before scontrol
    returns (here: scontrol signals the training and hangs): the log still says the job was
    requeued, as the line is written before the call."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\nkill -TERM $PPID\nsleep 30\n")
    (fake / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": JOB}

    def stopped(signum, frame):  # as slurm_time_limit.time_limit's handler
        raise run_loop.Interrupted("SIGTERM")

    old = signal.signal(signal.SIGTERM, stopped)
    try:
        with caplog.at_level("INFO", logger="chord.training.slurm_time_limit"):
            with pytest.raises(run_loop.Interrupted):
                slurm_time_limit.requeue(env, "stopped 30 s before the time limit")
    finally:
        signal.signal(signal.SIGTERM, old)
    assert f"requeueing Slurm job {JOB} to continue" in caplog.text
