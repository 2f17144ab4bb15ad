"""Multi-GPU tiers in the workflow (dry runs): a scene on a tier of `gpus: 2` asks the
scheduler for 2 GPUs (the rules' gpu resource; the Slurm executor makes it --gpus=2), and a
batch_size the tier's GPUs do not divide stops the DAG build, naming the scene, the tier and
the values."""

from __future__ import annotations

import re

import pytest
import yaml

from chord.resources.job_size import ORACLE_HOST_MB
from tests.conftest import REPO
from tests.workflow.test_scale import TINY, copy_workflow, extra_config, snakemake, write_sheet

TIERS = {
    "full": {"gpu_mem_gb": 80, "host_mem_gb": 64, "runtime_h": 12},
    "duo": {"gpu_mem_gb": 48, "gpus": 2, "host_mem_gb": 64, "runtime_h": 16},
    "split": {"gpu_mem_gb": 48, "host_mem_gb": 64, "runtime_h": 16, "split_sds_backward": True},
}


def training_resources(proc, rule: str) -> dict[str, str]:
    """The resources of the dry run's one ``rule`` job (the trainings are checkpoints)."""
    text = proc.stdout
    heads = re.findall(rf"^(?:rule|checkpoint) {rule}:$", text, re.M)
    assert len(heads) == 1, text[-3000:]
    after = text.split(heads[0], 1)[1]
    line = next(li for li in after.splitlines() if li.strip().startswith("resources:"))
    return dict(re.findall(r"(\w+)=([^,\s]+)", line.split("resources:", 1)[1]))


@pytest.fixture
def work(tmp_path):
    work = tmp_path / "w"
    copy_workflow(work)
    (work / "config").mkdir()
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["scene_overrides"] = {"hop": {**TINY, "batch_size": 2}}
    conf["tiers"] = TIERS
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    return work


def test_a_scene_on_a_two_gpu_tier_asks_for_two_gpus(work):
    # the local gpu resource is capped at this machine's GPU count: give it room
    room = ["--resources", "gpu=8"]
    write_sheet(work / "config/scenes.tsv", "duo")
    proc = snakemake(work, "-n", "results/hop/train/coarse.pt", *room)
    res = training_resources(proc, "train_coarse")
    assert (res["tier"], res["gpu"]) == ("duo", "2")
    assert res["cpus_per_gpu"] == "1"  # per GPU: the oracle's one CPU on each
    assert res["mem_mb"] == str(2 * ORACLE_HOST_MB)  # each rank's host RAM
    write_sheet(work / "config/scenes.tsv", "full")
    res = training_resources(
        snakemake(work, "-n", "results/hop/train/coarse.pt", *room), "train_coarse"
    )
    assert (res["tier"], res["gpu"]) == ("full", "1")
    # the fine stage asks from its own attempt's tier too
    fine = extra_config(
        work,
        "fine",
        {
            "scene_overrides": {
                "hop": {**TINY, "batch_size": 2, "add_cp_objs": ["obj_0"], "add_cp_layer_iter": 1}
            }
        },
    )
    write_sheet(work / "config/scenes.tsv", "duo")
    proc = snakemake(work, "-n", "results/hop/train/fine.pt", "--configfile", fine, *room)
    assert training_resources(proc, "train_fine")["gpu"] == "2"


def test_a_batch_size_the_tiers_gpus_do_not_divide_stops_the_dag_build(work):
    odd = extra_config(work, "odd", {"scene_overrides": {"hop": {**TINY, "batch_size": 3}}})
    write_sheet(work / "config/scenes.tsv", "duo")
    proc = snakemake(work, "-n", "results/hop/train/coarse.pt", "--configfile", odd, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "scene hop: tier duo trains on 2 GPUs (gpus: 2)" in out, out[-3000:]
    assert "method.batch_size 3 is not a multiple of 2" in out
    # starting on full, a retry may reach duo: the same error, before any job
    write_sheet(work / "config/scenes.tsv", "full")
    proc = snakemake(work, "-n", "results/hop/train/coarse.pt", "--configfile", odd, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "which an out-of-memory retry from tier full may reach" in out
    # starting below it, nothing reaches duo: fine
    write_sheet(work / "config/scenes.tsv", "split")
    snakemake(work, "-n", "results/hop/train/coarse.pt", "--configfile", odd)
