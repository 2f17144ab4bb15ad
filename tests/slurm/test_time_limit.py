"""A training longer than its job's time limit, through Slurm: hop's tier gets a wall time of
one minute (Slurm's smallest --time); each run of the job stops before the limit with a
checkpoint and requeues the job (the same job id, pending again, so Snakemake waits and
resubmits nothing), the next run resumes, and the last ends in the state of the same training
run locally without interruption.

The first run is made longer than its limit by the clock, not by the CPU: once it has logged
some iterations the test stops its training process (SIGSTOP) until STOP_MARGIN_S before the
limit. A training sized to outlast a minute on its own would need a size for each CPU speed:
one run on a fast machine (nothing tested), ten on a loaded one. The test cluster holds a
requeued job for its cred_expire (tests/slurm/cluster.py), not Slurm's default two minutes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import yaml

from chord.training.run_loop import STOP_MARGIN_S
from tests.slurm.conftest import (
    LONG,
    TARGET,
    assert_same_state,
    finish,
    long_hop,
    minutes,
    rule_jobs,
    run_id,
    set_sheet_tiers,
    slurm_jobs,
    start,
    wait_for_logged,
)

RUNTIME_H = 1 / 60  # one minute


def limited_hop(src, dst):
    """The finished demo workdir, hop trained anew (LONG) on the first tier, whose jobs may
    run one minute."""
    work = long_hop(src, dst)
    path = work / "config/config.yaml"
    conf = yaml.safe_load(path.read_text())
    first = next(iter(conf["tiers"]))
    conf["tiers"][first]["runtime_h"] = RUNTIME_H
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    set_sheet_tiers(work, {"hop": first})
    return work


def hold_until_late(work, cluster, jobid: str) -> None:
    """Stop the job's training process until STOP_MARGIN_S before the job's time limit (the
    time its training keeps for the checkpoint, the requeue and the exit), then let it go on:
    it must stop before the limit after the iteration in flight. A training that already
    stopped by itself is left as it is."""
    log = (work / "results/hop/logs/train_coarse.log").read_text()
    (pid,) = re.findall(rf"attempt started \(pid (\d+), Slurm job {jobid}\)", log)[-1:]
    out = subprocess.run(
        ["squeue", "-h", "-j", jobid, "-o", "%e"],
        capture_output=True,
        text=True,
        env={**cluster.env, "SLURM_TIME_FORMAT": "%s"},  # the end as seconds since the epoch
    ).stdout.strip()
    if not out.isdigit():
        return  # the run ended already (it stopped by itself)
    try:
        os.kill(int(pid), signal.SIGSTOP)
    except ProcessLookupError:
        return
    try:
        time.sleep(max(0.0, int(out) - STOP_MARGIN_S - time.time()))
    finally:
        try:
            os.kill(int(pid), signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_training_longer_than_its_time_limit_requeues_and_ends_as_one_run(
    slurm_demo, slurm_cluster, long_reference, tmp_path
):
    work = limited_hop(slurm_demo.work, tmp_path / "w")
    proc = start(work, slurm_demo.profile, slurm_cluster, TARGET)
    try:
        jobid, _ = wait_for_logged(work, slurm_cluster, slurm_demo.work)
        hold_until_late(work, slurm_cluster, jobid)
        log = finish(proc, work)
    finally:
        proc.kill()
    assert proc.returncode == 0, log[-5000:]

    (job,) = rule_jobs(slurm_jobs(slurm_cluster, log), "train_coarse")  # submitted once
    fields = ("JobID", "JobName", "State", "Elapsed", "Timelimit")
    runs = [
        r
        for r in slurm_cluster.sacct(*fields, duplicates=True)
        if r["JobID"] == job["JobID"] and r["JobName"] == run_id(log)
    ]
    states = [r["State"] for r in runs]
    # several runs of the one job: each stopped itself before its time limit and requeued
    assert len(runs) >= 2 and states == ["REQUEUED"] * (len(runs) - 1) + ["COMPLETED"], runs
    for r in runs:
        assert minutes(r["Timelimit"]) == 1, r
        h, m, s = (int(x) for x in r["Elapsed"].split(":"))
        assert h * 3600 + m * 60 + s < 60, r  # stopped before the limit, not killed at it

    train_log = (work / "results/hop/logs/train_coarse.log").read_text()
    assert len(re.findall(r"requeueing Slurm job \d+ to continue", train_log)) == len(runs) - 1
    resumed = [int(n) for n in re.findall(r"resuming coarse from iteration (\d+)", train_log)]
    assert len(resumed) == len(runs) - 1 and resumed == sorted(set(resumed)), resumed

    assert_same_state(work / TARGET, long_reference.state, LONG["iterations"])
    rows = [
        (w / "results/hop/train/coarse_losses.tsv").read_text() for w in (work, long_reference.work)
    ]
    assert rows[0] == rows[1]  # every iteration logged once, as in one run
