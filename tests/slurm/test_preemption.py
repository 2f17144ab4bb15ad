"""Preemption through Slurm: a training job that is requeued, or whose processes all get
SIGTERM, resumes from the checkpoint of its last finished iteration and ends in the state of
an uninterrupted run; a stopped Snakemake, run again, redoes no finished job.

hop's training is made long (conftest LONG iterations, resumed from nothing: a new
configuration) so it can be interrupted once its loss log has some rows; the uninterrupted
reference is the same configuration trained locally (conftest ``long_reference``, which
test_time_limit.py shares).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.slurm.conftest import (
    LONG,
    TARGET,
    assert_same_state,
    finish,
    long_hop,
    rule_jobs,
    run_snakemake,
    running_training,
    set_overrides,
    slurm_jobs,
    start,
    wait_for_logged,
    wait_until,
)


def finished(work: Path, rule: str, scene: str) -> bool:
    """Whether the running Snakemake (its log so far) has seen the rule's job for the scene
    finish."""
    log = (work.parent / "snakemake.log").read_text()
    ids = re.findall(rf"Job (\d+) has been submitted .*/rule_{rule}/{scene}/", log)
    return any(re.search(rf"^Finished jobid: {i} ", log, re.M) for i in ids)


def resumed_from(work) -> list[int]:
    text = (work / "results/hop/logs/train_coarse.log").read_text()
    return [int(n) for n in re.findall(r"resuming coarse from iteration (\d+)", text)]


def test_a_requeued_training_resumes_from_its_sigterm_checkpoint(
    slurm_demo, slurm_cluster, long_reference, tmp_path
):
    work = long_hop(slurm_demo.work, tmp_path / "w")
    proc = start(work, slurm_demo.profile, slurm_cluster, TARGET)
    try:
        jobid, seen = wait_for_logged(work, slurm_cluster, slurm_demo.work)
        slurm_cluster.run("scontrol", "requeue", jobid)
        # the requeued job waits for its begin time (~2 min): let it start now
        wait_until(
            "the requeued job to be pending",
            lambda: (
                slurm_cluster.run("squeue", "-h", "-j", jobid, "-o", "%T").stdout.strip()
                == "PENDING"
            ),
            timeout=60,
        )
        slurm_cluster.run("scontrol", "update", f"jobid={jobid}", "StartTime=now")
        log = finish(proc, work)
    finally:
        proc.kill()
    assert proc.returncode == 0, log[-5000:]
    (resume,) = resumed_from(work)
    assert resume > seen  # the SIGTERM checkpoint came after the logged iterations
    runs = [j for j in slurm_jobs(slurm_cluster, log, duplicates=True) if j["JobID"] == jobid]
    assert [j["State"] for j in runs] == ["REQUEUED", "COMPLETED"], runs
    assert len(rule_jobs(slurm_jobs(slurm_cluster, log), "train_coarse")) == 1  # no resubmission
    assert_same_state(work / TARGET, long_reference.state, LONG["iterations"])


def test_sigterm_to_every_process_of_the_job_keeps_the_last_finished_iteration(
    slurm_demo, slurm_cluster, long_reference, tmp_path
):
    """scancel --signal=TERM --full signals the batch step too: srun turns its SIGTERM into a
    SIGKILL of the training's step at once, before the training's own SIGTERM handler can
    write a checkpoint. The last finished iteration must be on disk anyway."""
    work = long_hop(slurm_demo.work, tmp_path / "w")
    proc = start(work, slurm_demo.profile, slurm_cluster, TARGET)
    try:
        jobid, seen = wait_for_logged(work, slurm_cluster, slurm_demo.work)
        slurm_cluster.run("scancel", "--signal=TERM", "--full", jobid)
        log = finish(proc, work)
    finally:
        proc.kill()
    assert proc.returncode == 0, log[-5000:]
    (resume,) = resumed_from(work)
    # at most the iteration in flight is lost (a row is logged before its checkpoint)
    assert resume >= seen, (resume, seen)
    jobs = rule_jobs(slurm_jobs(slurm_cluster, log), "train_coarse")
    assert [j["State"] for j in jobs] == ["FAILED", "COMPLETED"], jobs  # Snakemake's retry
    assert_same_state(work / TARGET, long_reference.state, LONG["iterations"])


# SIGTERM passes too (Snakemake then waits for its running jobs to finish, and the second run
# has nothing to do), at another minute of CI time.
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
def test_snakemake_stopped_and_run_again_redoes_no_finished_job(
    slurm_demo, slurm_cluster, long_reference, tmp_path, sig
):
    """Stop the submitting Snakemake while hop trains and sway's (short) training is done;
    the same command again finishes and trains sway no more. On SIGINT (Ctrl-C) Snakemake
    cancels its running jobs: hop resumes in the second run. On SIGTERM it lets them finish:
    the second run has nothing to do."""
    work = long_hop(slurm_demo.work, tmp_path / "w")
    set_overrides(work, sway={"iterations": 13})  # a new configuration: sway trains again
    targets = (TARGET, "results/sway/train/coarse.pt")
    proc = start(work, slurm_demo.profile, slurm_cluster, *targets)
    try:
        # hop waits (suspended) until Snakemake has seen sway finish: a job still running
        # when Snakemake stops counts as incomplete and runs again
        hop = wait_until("hop's training job", lambda: running_training(slurm_cluster))
        slurm_cluster.run("scontrol", "suspend", hop)
        wait_until("sway's training", lambda: finished(work, "train_coarse", "sway"), timeout=300)
        done = (work / targets[1]).stat().st_mtime_ns
        slurm_cluster.run("scontrol", "resume", hop)
        _, seen = wait_for_logged(work, slurm_cluster, slurm_demo.work)
        proc.send_signal(sig)
        first = finish(proc, work, timeout=200)
        assert proc.returncode != 0, first[-3000:]
        assert not running_training(slurm_cluster), "Snakemake left its training job running"
    finally:
        proc.kill()
        slurm_cluster.cancel_all()  # nothing left to hold the node from the next test
    again = run_snakemake(work, slurm_demo.profile, *targets, cluster=slurm_cluster)
    log = again.stdout + again.stderr
    assert (work / targets[1]).stat().st_mtime_ns == done  # sway: not trained again
    if sig == signal.SIGINT:
        jobs = [j["Comment"] for j in slurm_jobs(slurm_cluster, log)]
        assert jobs == ["rule_train_coarse_wildcards_hop"], first[-3000:]
        (resume,) = resumed_from(work)
        assert resume >= seen, (resume, seen)
    else:
        assert "Nothing to be done" in log, first[-3000:] + log[-3000:]
    assert_same_state(work / TARGET, long_reference.state, LONG["iterations"])
