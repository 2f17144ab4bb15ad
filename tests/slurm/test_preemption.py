"""Preemption through Slurm: a training job that is requeued, or whose processes all get
SIGTERM, resumes from the checkpoint of its last finished iteration and ends in the state of
an uninterrupted run; a stopped Snakemake, run again, redoes no finished job.

hop's training is made long (LONG iterations, resumed from nothing: a new configuration)
so it can be interrupted once its loss log has some rows; the uninterrupted reference is the
same configuration trained locally.
"""

from __future__ import annotations

import csv
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.slurm.conftest import (
    assert_same_state,
    copy_workdir,
    rule_jobs,
    run_snakemake,
    set_overrides,
    slurm_jobs,
    snakemake_cmd,
    snakemake_env,
    wait_until,
)

LONG = {"iterations": 90, "save_interval": 1000}  # save points 1, 5 and 60 only
AFTER = 15  # interrupt once this many iterations are logged (between save points 5 and 60)
TARGET = "results/hop/train/coarse.pt"


CHECKPOINTS = "results/hop/checkpoints/coarse"


def long_hop(slurm_demo, folder: Path) -> Path:
    work = copy_workdir(slurm_demo.work, folder)
    set_overrides(work, hop=LONG)
    return work


@pytest.fixture(scope="module")
def reference(slurm_demo, tmp_path_factory):
    """hop's long training run through without interruption, locally."""
    work = long_hop(slurm_demo, tmp_path_factory.mktemp("reference") / "w")
    run_snakemake(work, None, TARGET)
    return torch.load(work / TARGET, weights_only=True)


def logged_iterations(work: Path, old: set[str]) -> int:
    """Rows of the long training's loss log (kept beside its configuration's checkpoints; the
    configurations ``old`` are the demo's)."""
    rows = 0
    for path in (work / CHECKPOINTS).glob("*/losses.tsv"):
        if path.parent.name not in old:
            with open(path) as f:
                rows = max(rows, sum(1 for _ in csv.DictReader(f, delimiter="\t")))
    return rows


def start(work, profile, cluster, *targets) -> subprocess.Popen:
    log = open(work.parent / "snakemake.log", "w")
    return subprocess.Popen(
        snakemake_cmd(work, profile, *targets),
        cwd=work,
        env=snakemake_env(cluster),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a signal meant for it reaches no test process
        # a job a shell starts in the background (as CI may be) inherits SIGINT ignored, and
        # Python then raises no KeyboardInterrupt: Snakemake would not hear the test's Ctrl-C.
        # A user's Ctrl-C reaches a Snakemake whose SIGINT is the default: restore it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(proc: subprocess.Popen, work, timeout=400) -> str:
    proc.wait(timeout=timeout)
    return (work.parent / "snakemake.log").read_text()


def running_training(cluster, scene="hop") -> str | None:
    """The Slurm job id of the scene's training while it runs."""
    out = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k").stdout
    for line in out.splitlines():
        jobid, comment = line.split("|", 1)
        if comment == f"rule_train_coarse_wildcards_{scene}":
            return jobid
    return None


def interrupt_when_logged(work: Path, cluster, demo: Path) -> tuple[str, int]:
    """Wait until hop's long training job runs and has logged AFTER iterations; return its
    job id and the iterations logged then."""
    old = {p.name for p in (demo / CHECKPOINTS).iterdir()}  # the demo's configuration
    jobid = wait_until("hop's training job", lambda: running_training(cluster), timeout=300)

    def logged():
        rows = logged_iterations(work, old)
        return rows if rows >= AFTER else None

    return jobid, wait_until(f"{AFTER} logged iterations", logged, timeout=300, every=0.1)


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
    slurm_demo, slurm_cluster, reference, tmp_path
):
    work = long_hop(slurm_demo, tmp_path / "w")
    proc = start(work, slurm_demo.profile, slurm_cluster, TARGET)
    try:
        jobid, seen = interrupt_when_logged(work, slurm_cluster, slurm_demo.work)
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
    assert_same_state(work / TARGET, reference, LONG["iterations"])


def test_sigterm_to_every_process_of_the_job_keeps_the_last_finished_iteration(
    slurm_demo, slurm_cluster, reference, tmp_path
):
    """scancel --signal=TERM --full signals the batch step too: srun turns its SIGTERM into a
    SIGKILL of the training's step at once, before the training's own SIGTERM handler can
    write a checkpoint. The last finished iteration must be on disk anyway."""
    work = long_hop(slurm_demo, tmp_path / "w")
    proc = start(work, slurm_demo.profile, slurm_cluster, TARGET)
    try:
        jobid, seen = interrupt_when_logged(work, slurm_cluster, slurm_demo.work)
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
    assert_same_state(work / TARGET, reference, LONG["iterations"])


# SIGTERM passes too (Snakemake then waits for its running jobs to finish, and the second run
# has nothing to do), at another minute of CI time.
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
def test_snakemake_stopped_and_run_again_redoes_no_finished_job(
    slurm_demo, slurm_cluster, reference, tmp_path, sig
):
    """Stop the submitting Snakemake while hop trains and sway's (short) training is done;
    the same command again finishes and trains sway no more. On SIGINT (Ctrl-C) Snakemake
    cancels its running jobs: hop resumes in the second run. On SIGTERM it lets them finish:
    the second run has nothing to do."""
    work = long_hop(slurm_demo, tmp_path / "w")
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
        _, seen = interrupt_when_logged(work, slurm_cluster, slurm_demo.work)
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
    assert_same_state(work / TARGET, reference, LONG["iterations"])
