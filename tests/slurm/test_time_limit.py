"""A training longer than its job's time limit, through Slurm: hop's tier gets a wall time of
one minute (Slurm's smallest --time) and a training that needs several; each run of the job
stops before the limit with a checkpoint and requeues the job (the same job id, pending again,
so Snakemake waits and resubmits nothing), the next run resumes, and the last ends in the state
of the same training run locally without interruption.

The test cluster holds a requeued job for its cred_expire (tests/slurm/cluster.py), not
Slurm's default two minutes.
"""

from __future__ import annotations

import re
import subprocess

import torch
import yaml

from tests.slurm.conftest import (
    assert_same_state,
    copy_workdir,
    minutes,
    rule_jobs,
    run_id,
    run_snakemake,
    set_overrides,
    set_sheet_tiers,
    slurm_jobs,
    snakemake_cmd,
    snakemake_env,
)

TARGET = "results/hop/train/coarse.pt"
# Long enough on this 2-core machine (~0.1 s per iteration) for about three one-minute runs
# (a run trains for ~25 s: Snakemake starts twice in each, and the training stops
# STOP_MARGIN_S plus two iterations before the limit), with the save points 1, 5 and 2N/3 only.
LONG = {"iterations": 600, "save_interval": 1000}
RUNTIME_H = 1 / 60  # one minute


def limited_hop(src, dst):
    """The finished demo workdir, hop trained anew (LONG) on the first tier, whose jobs may
    run one minute."""
    work = copy_workdir(src, dst)
    set_overrides(work, hop=LONG)
    path = work / "config/config.yaml"
    conf = yaml.safe_load(path.read_text())
    first = next(iter(conf["tiers"]))
    conf["tiers"][first]["runtime_h"] = RUNTIME_H
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    set_sheet_tiers(work, {"hop": first})
    return work


def test_a_training_longer_than_its_time_limit_requeues_and_ends_as_one_run(
    slurm_demo, slurm_cluster, tmp_path
):
    work = limited_hop(slurm_demo.work, tmp_path / "slurm")
    local = limited_hop(slurm_demo.local, tmp_path / "local")
    with open(tmp_path / "local.log", "w") as out:  # the uninterrupted run, meanwhile
        reference = subprocess.Popen(
            snakemake_cmd(local, None, TARGET),
            cwd=local,
            env=snakemake_env(None),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        proc = run_snakemake(work, slurm_demo.profile, TARGET, cluster=slurm_cluster)
    finally:
        reference.wait(timeout=900)
    assert reference.returncode == 0, (tmp_path / "local.log").read_text()[-5000:]
    log = proc.stdout + proc.stderr

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

    want = torch.load(local / TARGET, weights_only=True)
    assert_same_state(work / TARGET, want, LONG["iterations"])
    rows = [(w / "results/hop/train/coarse_losses.tsv").read_text() for w in (work, local)]
    assert rows[0] == rows[1]  # every iteration logged once, as in one run
