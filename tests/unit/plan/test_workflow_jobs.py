"""chord.plan.workflow_jobs: the tier and the job request of each training attempt, asked directly
(no Snakemake): what the rules' resources and params return."""

from __future__ import annotations

import yaml

from chord.config import settings as cc
from chord.plan import results_layout as P
from chord.plan import scene_plan
from chord.plan.workflow_jobs import WorkflowJobs
from chord.resources import job_size
from chord.resources import out_of_memory as oom
from chord.resources import tiers as ct
from tests.conftest import REPO, write_still_motion
from tests.unit.plan.test_scene_plan import three_objects


def jobs_of(tmp_path, *, tier="full", **config):
    """A toy scene (two seeds if ``seeds``) on the shipped tiers; the node asks counted."""
    data = three_objects(tmp_path / "data" / "toy")
    write_still_motion(data, ("obj_1",))
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    sheet = tmp_path / "scenes.tsv"
    sheet.write_text(f"scene\tdata\tprompt\ttier\ntoy\t{data}\tp\t{tier}\n")
    base.update(scenes=str(sheet), results=str(tmp_path / "results"), **config)
    conf = cc.load(base)
    asked, said = [], []

    def node():
        asked.append(1)
        return None  # a CPU: auto takes the first tier

    jobs = WorkflowJobs(
        conf,
        ct.parse(conf.tiers),
        scene_plan=lambda name: scene_plan.scene(conf, name),
        node=node,
        model=None,
        results=conf.results,
        log=said.append,
    )
    return jobs, asked, said


def test_a_retry_after_running_out_of_memory_asks_for_the_next_tiers_resources(tmp_path):
    jobs, asked, _ = jobs_of(tmp_path, sweep={"seeds": [0, 1]})
    names = list(jobs.tiers)
    assert jobs.resource("toy/seed_1", "coarse", "tier", 1) == names[0] == "full"
    # seed 1 ran out of memory on full; seed 0's record is its own and empty
    oom.record(P.checkpoints(jobs.results, "toy/seed_1", "coarse") / oom.RECORD, "full")
    assert jobs.resource("toy/seed_1", "coarse", "tier", 2) == names[1]
    assert jobs.resource("toy/seed_0", "coarse", "tier", 2) == names[0]
    runtime = jobs.tiers[names[1]].runtime_min
    assert jobs.resource("toy/seed_1", "coarse", "runtime", 2) == runtime
    # the oracle's host RAM, whatever the tier (its method does not size it)
    assert jobs.resource("toy/seed_1", "coarse", "mem_mb", 2) == job_size.ORACLE_HOST_MB
    assert jobs.preview_mem_mb("toy", 1) == job_size.ORACLE_HOST_MB
    assert asked == []  # a sheet tier: the node is not asked


def test_auto_asks_for_the_node_once_and_says_each_choice_once(tmp_path):
    jobs, asked, said = jobs_of(tmp_path, tier="auto")
    assert jobs.scene_tier("toy") == list(jobs.tiers)[0]  # no GPU: the first tier
    jobs.check_job_requests("toy")
    assert jobs.resource("toy", "coarse", "tier", 1) == jobs.scene_tier("toy")
    assert len(asked) == 1 and len(said) == 1 and said[0].startswith("tier auto: scene toy")


def test_the_training_hash_is_of_the_start_tiers_method_per_run(tmp_path):
    jobs, _, _ = jobs_of(tmp_path, sweep={"seeds": [0, 1]})
    hashes = {run: jobs.training_hash(run) for run in ("toy/seed_0", "toy/seed_1")}
    assert hashes["toy/seed_0"] != hashes["toy/seed_1"]  # the seed changes the result
    start = jobs.tiers[jobs.scene_tier("toy")]
    job = ct.training_job(
        scene_plan.run_spec(jobs.conf, "toy/seed_1").method, jobs.conf.memory, start
    )
    assert hashes["toy/seed_1"] == job.config_hash(jobs.conf.guidance)
