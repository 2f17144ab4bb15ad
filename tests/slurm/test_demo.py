"""The demo scenes end to end through the real Slurm executor plugin, with a site profile
derived from profiles/slurm, checked against Slurm's own accounting and a local run."""

from __future__ import annotations

import re

import pandas as pd
import torch
import yaml

from tests.slurm.cluster import PARTITION
from tests.slurm.conftest import (
    FIRST_KIND,
    SHEET_TIERS,
    ci_tiers,
    gpu_kinds,
    job_number,
    minutes,
    rule_jobs,
    run_snakemake,
    tres,
)
from tests.workflow.test_workflow import planned_jobs

SCENES = ("hop", "sway")


def local_rules(log: str) -> set[str]:
    """Rules the run's Snakemake ran on the submitting machine (``localrules:`` blocks and
    ``localrule: True``), as its log names them: ``localrule <name>:``."""
    return set(re.findall(r"^localrule (\w+):", log, re.M))


def profile_groups(profile) -> dict[str, str]:
    return yaml.safe_load((profile / "config.yaml").read_text())["groups"]


def test_every_remote_rule_ran_as_its_own_slurm_job(slurm_demo, tmp_path):
    """What the local plan runs, per rule, ran as that many completed Slurm jobs (except the
    local rules and the grouped ones), on the site's partition; the one failed job is hop's
    first training attempt (out of memory, retried on the next tier)."""
    from tests.slurm.conftest import small_demo

    plan = planned_jobs(run_snakemake(small_demo(tmp_path / "plan"), None, "-n"))
    groups = profile_groups(slurm_demo.profile)
    local = local_rules(slurm_demo.log)
    # the demo scenes' generation (under a second, no torch) waits in no queue
    assert {f"demo_{scene}" for scene in SCENES} <= local
    remote = {r: n for r, n in plan.items() if r not in local and r not in groups}
    assert {"condition", "train_coarse", "export", "evaluate"} <= set(remote)
    done = [j for j in slurm_demo.jobs if j["State"] == "COMPLETED"]
    for rule, count in remote.items():
        assert len(rule_jobs(done, rule)) == count, (rule, slurm_demo.jobs)
    failed = [j for j in slurm_demo.jobs if j["State"] != "COMPLETED"]
    assert [(j["Comment"], j["State"]) for j in failed] == [
        ("rule_train_coarse_wildcards_hop", "FAILED")
    ]
    assert {j["Partition"] for j in slurm_demo.jobs} == {PARTITION}
    for rule in local | set(groups):
        assert not rule_jobs(slurm_demo.jobs, rule), rule


def test_the_geometry_stages_of_a_scene_ran_as_one_group_job(slurm_demo):
    groups = profile_groups(slurm_demo.profile)
    (group,) = set(groups.values())
    jobs = [j for j in slurm_demo.jobs if j["Comment"].startswith(f"rule_{group}_")]
    assert len(jobs) == len(SCENES), slurm_demo.jobs
    seen = []
    for job in jobs:
        (log,) = (slurm_demo.work / ".snakemake/slurm_logs").glob(f"group_*/**/{job['JobID']}.log")
        text = log.read_text()
        scenes = set(re.findall(r"wildcards: scene=([\w-]+)", text))
        assert len(scenes) == 1, (job, scenes)  # one scene per group job
        assert set(re.findall(r"^rule (\w+):", text, re.M)) == set(groups), text[-3000:]
        seen += scenes
    assert sorted(seen) == sorted(SCENES)


def test_training_jobs_ask_for_their_tiers_gpu_kind_memory_and_time(slurm_demo):
    """Each training attempt asks for its tier's GPU kind, host memory and wall time: sway
    runs on its sheet tier; hop starts on the first tier and, out of memory there, runs on
    the next."""
    tiers = ci_tiers(slurm_demo.profile, slurm_demo.work)
    names = list(tiers)
    runs_on = {"hop": names[:2], "sway": [SHEET_TIERS["sway"]]}
    kinds = set()
    for scene, expected in runs_on.items():
        jobs = sorted(rule_jobs(slurm_demo.jobs, "train_coarse", scene), key=job_number)
        assert len(jobs) == len(expected), jobs
        for job, name in zip(jobs, expected, strict=True):
            tier = tiers[name]
            assert gpu_kinds(job) == {tier.gpu_model}, job
            assert tres(job)["gres/gpu"] == "1"
            assert tres(job)["mem"] == f"{tier.mem_mb}M", job
            assert minutes(job["Timelimit"]) == tier.runtime_min, job
            kinds |= gpu_kinds(job)
        state = torch.load(slurm_demo.work / f"results/{scene}/train/coarse.pt", weights_only=True)
        assert state["tier"] == expected[-1]
    assert FIRST_KIND in kinds and len(kinds) == 2  # both GPU kinds were used
    # the CPU stages asked for no GPU
    for job in rule_jobs(slurm_demo.jobs, "export") + rule_jobs(slurm_demo.jobs, "condition"):
        assert "gres/gpu" not in tres(job), job


def test_the_slurm_run_gives_the_local_runs_results(slurm_demo):
    got = pd.read_csv(slurm_demo.work / "results/metrics.tsv", sep="\t")
    want = pd.read_csv(slurm_demo.local / "results/metrics.tsv", sep="\t")
    assert sorted(got["scene"]) == sorted(SCENES)
    pd.testing.assert_frame_equal(got, want)
    for scene in SCENES:
        a, b = (
            torch.load(w / f"results/{scene}/train/coarse.pt", weights_only=True)
            for w in (slurm_demo.work, slurm_demo.local)
        )
        assert a["iteration"] == b["iteration"] and a["tier"] == b["tier"]
        for key in a["motion"]:
            assert torch.equal(a["motion"][key], b["motion"][key]), (scene, key)
