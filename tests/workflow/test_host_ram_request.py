"""A training job that the memory model says needs more host RAM than its tier's host_mem_gb
stops the DAG build, before any job runs, naming the scene, the tier, the need, the ceiling
and the fix; its start tier and every tier an out-of-memory retry may reach."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import REPO
from tests.workflow.test_multi_gpu import training_resources
from tests.workflow.test_scale import snakemake, wan_workdir, write_sheet

TARGET = "results/hop/train/coarse.pt"
ROOM = ["--resources", "gpu=8"]  # the local gpu resource is capped at this machine's count


def tiers(work, name: str, **changes) -> list[str]:
    """--configfile with the shipped tiers, ``changes`` ({tier: {key: value}}) applied, in
    their order (the escalation order)."""
    table = yaml.safe_load((REPO / "config/config.yaml").read_text())["tiers"]
    for tier, values in changes.items():
        table[tier].update(values)
    path = work / "config" / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"tiers": table}, sort_keys=False))
    return ["--configfile", str(path)]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The shipped config and method with the Wan teacher (A14B's shapes)."""
    return wan_workdir(tmp_path_factory.mktemp("host"))


def test_the_readmes_2x48_tier_with_too_little_host_ram_stops_the_dag_build(work):
    write_sheet(work / "config/scenes.tsv", "split")
    duo = tiers(work, "duo", split={"gpus": 2})
    # not a dry run: nothing runs, not even the scene's geometry or text stages
    proc = snakemake(work, TARGET, *duo, *ROOM, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "scene hop: tier split: the memory model puts a training's host RAM at" in out
    assert "more than the tier's host_mem_gb 64 (65536 MB)" in out
    assert "raise tiers.split.host_mem_gb to at least 72" in out, out[-3000:]
    assert "localrule" not in out and not (work / "results").exists()
    # as the README sets it: the job asks for its need
    duo = tiers(work, "duo80", split={"gpus": 2, "host_mem_gb": 80})
    proc = snakemake(work, "-n", TARGET, *duo, *ROOM)
    mem_mb = int(training_resources(proc, "train_coarse")["mem_mb"])
    assert 64 * 1024 < mem_mb <= 72 * 1024


def test_a_tier_a_retry_may_reach_is_checked_at_dag_build_too(work):
    write_sheet(work / "config/scenes.tsv", "full")
    lean = tiers(work, "lean", offload={"host_mem_gb": 32})
    proc = snakemake(work, "-n", TARGET, *lean, *ROOM, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "scene hop: tier offload: " in out and "(a retry from tier full may reach it)" in out
    # starting on the last tier, no retry reaches offload
    write_sheet(work / "config/scenes.tsv", "lowres_min")
    snakemake(work, "-n", TARGET, *lean, *ROOM)
