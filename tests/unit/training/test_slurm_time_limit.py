"""A training in a Slurm job and its time limit (chord.training.slurm_time_limit), without a
training: the limit's end from a fake ``squeue``, the record a job killed at its limit leaves
and what the next job on the tier concludes from it, and the requeue through a fake
``scontrol``. The whole path with a training: tests/stages/test_time_limit.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest

from chord.config import settings
from chord.resources.tiers import Tier
from chord.training import run_loop
from chord.training import slurm_time_limit as stl

JOB = "4242"


@pytest.fixture
def fake(tmp_path):
    """Writes a fake Slurm command into a folder put first on PATH; returns (write, env)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": JOB}

    def write(name, script):
        (bin_ / name).write_text("#!/bin/sh\n" + script)
        (bin_ / name).chmod(0o755)

    return write, env


def test_the_deadline_is_squeues_end_time_in_seconds(fake, caplog):
    write, env = fake
    # the end as seconds since the epoch only when asked for it so, of this job's end (%e)
    write(
        "squeue",
        f'[ "$SLURM_TIME_FORMAT" = "%s" ] && [ "$*" = "--noheader --jobs {JOB} --format %e" ] '
        "&& echo 1767225600\n",
    )
    assert stl.slurm_deadline(env) == 1767225600.0
    assert stl.slurm_deadline({k: v for k, v in env.items() if k != "SLURM_JOB_ID"}) is None
    assert stl.slurm_deadline({**env, "SLURM_JOB_ID": ""}) is None
    with caplog.at_level(logging.WARNING):
        for answer in ("Unknown", "NONE", "N/A"):  # a job without a time limit: no warning
            write("squeue", f"echo {answer}\n")
            assert stl.slurm_deadline(env) is None
        assert caplog.text == ""
        write("squeue", "echo 'slurm_load_jobs error' >&2; exit 1\n")
        assert stl.slurm_deadline(env) is None
        assert "slurm_load_jobs error" in caplog.text
        caplog.clear()
        write("squeue", "echo Unknown; exit 1\n")
        assert stl.slurm_deadline(env) is None and "no end time" in caplog.text
        caplog.clear()
        write("squeue", "echo tomorrow\n")
        assert stl.slurm_deadline(env) is None and "tomorrow" in caplog.text
        caplog.clear()
        bin_ = env["PATH"].split(os.pathsep)[0]
        os.remove(f"{bin_}/squeue")  # no squeue at all
        assert stl.slurm_deadline({**env, "PATH": bin_}) is None
        assert "no end time" in caplog.text


def test_the_newest_checkpoint_of_any_configuration_is_named_with_its_time(tmp_path):
    assert stl._newest_checkpoint_file(tmp_path) is None
    for i, (conf, name) in enumerate([("h1", "ckpt_000009.pt"), ("h2", "ckpt_000001.pt")]):
        (tmp_path / conf).mkdir()
        (tmp_path / conf / name).write_bytes(b"x")
        os.utime(tmp_path / conf / name, ns=(10**18 + i, 10**18 + i))
    (tmp_path / "h1" / "notes.pt").write_bytes(b"x")
    assert stl._newest_checkpoint_file(tmp_path) == f"h2/ckpt_000001.pt@{10**18 + 1}"


TIER = Tier(name="solo", gpu_mem_gb=80.0, runtime_h=2.0)


def past_record(folder, **kw):
    """The record of a job on TIER killed at its limit an hour ago, from no checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "job": "41",
        "deadline": time.time() - 3600,
        "tier": "solo",
        "runtime_h": 2.0,
        "checkpoint": None,
        **kw,
    }
    (folder / stl.TIME_LIMIT_RECORD).write_text(json.dumps(record))


def test_without_a_deadline_nothing_is_recorded(tmp_path):
    past_record(tmp_path)  # not even read
    with stl.time_limit(tmp_path, TIER, {}, None, "hop"):
        pass
    assert json.loads((tmp_path / stl.TIME_LIMIT_RECORD).read_text())["job"] == "41"


def test_the_record_is_kept_while_training_and_removed_when_it_ends_in_time(tmp_path):
    deadline = time.time() + 3600
    folder = tmp_path / "results" / "hop" / "ckpt"  # a first job: no folder yet
    old = signal.getsignal(signal.SIGTERM)
    with stl.time_limit(folder, TIER, {"SLURM_JOB_ID": JOB}, deadline, "hop"):
        record = json.loads((folder / stl.TIME_LIMIT_RECORD).read_text())
        assert record == {
            "job": JOB,
            "deadline": deadline,
            "tier": "solo",
            "runtime_h": 2.0,
            "checkpoint": None,
        }
        assert signal.getsignal(signal.SIGTERM) is not old  # a SIGTERM while loading stops
        with pytest.raises(run_loop.Interrupted, match="before the first iteration"):
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    assert signal.getsignal(signal.SIGTERM) is old
    assert not (folder / stl.TIME_LIMIT_RECORD).exists()
    with pytest.raises(RuntimeError):  # an error ends it too: the record goes
        with stl.time_limit(folder, TIER, {"SLURM_JOB_ID": JOB}, deadline, "hop"):
            raise RuntimeError("boom")
    assert not (folder / stl.TIME_LIMIT_RECORD).exists()


def test_a_job_past_its_deadline_leaves_the_record_and_its_checkpoint(tmp_path):
    (tmp_path / "h1").mkdir()
    (tmp_path / "h1" / "ckpt_000003.pt").write_bytes(b"x")
    with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() - 1, "hop"):
        pass
    record = json.loads((tmp_path / stl.TIME_LIMIT_RECORD).read_text())
    assert record["checkpoint"].startswith("h1/ckpt_000003.pt@")


def test_a_job_after_one_killed_without_progress_stops_naming_the_runtime(tmp_path):
    past_record(tmp_path)
    with pytest.raises(settings.ConfigError, match="tiers.solo.runtime_h") as err:
        with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() + 3600, "hop"):
            pytest.fail("trained")
    assert "scene hop" in str(err.value) and "Slurm job 41" in str(err.value)
    assert "120 min" in str(err.value)


@pytest.mark.parametrize(
    "change",
    [
        {"deadline": time.time() + 3600},  # that job's limit has not passed: it was not killed
        {"tier": "lean"},  # it ran on another tier
        {"runtime_h": 1.0},  # the tier's runtime_h was raised since
        {"checkpoint": "h1/ckpt_000001.pt@1"},  # it finished an iteration: a newer one
    ],
    ids=["not-past", "other-tier", "raised", "progressed"],
)
def test_a_job_after_one_that_progressed_or_on_other_terms_trains(tmp_path, change):
    past_record(tmp_path, **change)
    ran = []
    with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() + 3600, "hop"):
        ran.append(True)
    assert ran


def test_the_same_runtime_as_before_is_refused_and_an_unreadable_record_ignored(tmp_path):
    past_record(tmp_path, runtime_h=2.0)
    with pytest.raises(settings.ConfigError):
        with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() + 3600):
            pass
    (tmp_path / stl.TIME_LIMIT_RECORD).write_text("{cut")
    with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() + 3600):
        pass
    (tmp_path / stl.TIME_LIMIT_RECORD).write_text("[]")
    with stl.time_limit(tmp_path, TIER, {"SLURM_JOB_ID": JOB}, time.time() + 3600):
        pass


def test_a_training_stopped_for_the_limit_requeues_the_job(fake, tmp_path):
    write, env = fake
    write("scontrol", f'echo "$@" >> {tmp_path}/scontrol.log\n')
    with pytest.raises(run_loop.TimeLimit):
        with stl.time_limit(tmp_path / "c", TIER, env, time.time() + 3600, "hop"):
            raise run_loop.TimeLimit("stopped")
    assert (tmp_path / "scontrol.log").read_text() == f"requeue {JOB}\n"
    with pytest.raises(run_loop.Interrupted):  # a SIGTERM (preemption): no requeue
        with stl.time_limit(tmp_path / "c", TIER, env, time.time() + 3600, "hop"):
            raise run_loop.Interrupted("SIGTERM")
    assert (tmp_path / "scontrol.log").read_text() == f"requeue {JOB}\n"


def test_a_refused_requeue_is_logged_and_reported(fake, caplog):
    write, env = fake
    write("scontrol", "exit 0\n")
    assert stl.requeue(env, "why") is True
    with caplog.at_level(logging.ERROR):
        write("scontrol", "echo 'Requested operation is presently disabled' >&2; exit 1\n")
        assert stl.requeue(env, "why") is False
        assert f"Slurm job {JOB} could not requeue itself (scontrol requeue: Requested " in (
            caplog.text
        )
        caplog.clear()
        write("scontrol", "exit 2\n")
        assert stl.requeue(env, "why") is False and "status 2" in caplog.text
        caplog.clear()
        assert stl.requeue({**env, "PATH": "/nonexistent"}, "why") is False
        assert "could not requeue" in caplog.text
