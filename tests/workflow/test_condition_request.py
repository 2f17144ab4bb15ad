"""The condition job asks for what it uses: a GPU where the Wan folder's UMT5 encodes on one
(method.t5_cpu false), of the kind and partition its scene trains on; none with t5_cpu or the
oracle demo's tiny encoder, whose job keeps the profile's CPU partition. On a machine without
GPUs the job that asks for one still runs (on the CPU)."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from chord.guidance import text, tiny_models
from tests.conftest import REPO
from tests.workflow.test_scale import TINY, copy_workflow, extra_config, snakemake, write_sheet

TARGET = "results/hop/condition/text.safetensors"
# a site profile's CPU partition for the stages that ask for no GPU
CPU_PARTITION = ["--default-resources", "slurm_partition=cpu"]


def condition_resources(proc) -> dict[str, str]:
    """The resources of the dry run's one condition job."""
    text_ = proc.stdout
    assert text_.count("rule condition:") == 1, text_[-3000:]
    after = text_.split("rule condition:", 1)[1]
    line = next(li for li in after.splitlines() if li.strip().startswith("resources:"))
    return dict(re.findall(r"(\w+)=([^,\s]+)", line.split("resources:", 1)[1]))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The shipped config with the Wan teacher over a tiny Wan folder, hop on tier full, which
    a site maps to its 80 GB kind."""
    work = tmp_path_factory.mktemp("condition")
    copy_workflow(work)
    (work / "config").mkdir()
    folder = tiny_models.write_tiny_wan(work / "wan")
    tiny_vae = tiny_models.write_tiny_vae(work / "lighttaew2_1.safetensors", folder)
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    conf["guidance"].update(backend="wan", ckpt_dir=str(folder), tiny_vae_path=str(tiny_vae))
    conf["scene_overrides"] = {"hop": dict(TINY)}
    conf["tiers"]["full"].update(gpu_model="h100", slurm_partition="gpu80")
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    write_sheet(work / "config/scenes.tsv", "full")
    return work


def t5_cpu(work, value: bool) -> list[str]:
    values = {"scene_overrides": {"hop": {**TINY, "t5_cpu": value}}}
    return ["--configfile", extra_config(work, f"t5_cpu_{value}", values)]


def test_the_condition_job_asks_for_the_gpu_its_encoder_uses(work):
    # Wan's default: UMT5 encodes on a GPU, so the job asks for one, of hop's start tier's kind
    proc = snakemake(work, "-n", TARGET, *CPU_PARTITION, *t5_cpu(work, False))
    res = condition_resources(proc)
    assert res["gpu"] == "1", proc.stdout[-3000:]
    assert (res["gpu_model"], res["slurm_partition"]) == ("h100", "gpu80")
    # t5_cpu: no GPU, and the job stays on the profile's CPU partition
    res = condition_resources(snakemake(work, "-n", TARGET, *CPU_PARTITION, *t5_cpu(work, True)))
    assert res["gpu"] == "0" and "gpu_model" not in res
    assert res["slurm_partition"] == "cpu"


def test_the_oracle_demos_condition_job_asks_for_no_gpu(tmp_path):
    copy_workflow(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text((REPO / "config/config.yaml").read_text())
    write_sheet(tmp_path / "config/scenes.tsv", "full")
    res = condition_resources(snakemake(tmp_path, "-n", TARGET, *CPU_PARTITION))
    assert res["gpu"] == "0" and "gpu_model" not in res and res["slurm_partition"] == "cpu"


def test_a_condition_job_that_asks_for_a_gpu_runs_where_there_is_none(work):
    """The local profile's gpu resource is the GPU count, or the CPU count without GPUs: the
    job of gpu=1 is not blocked, and encodes on what there is."""
    proc = snakemake(work, TARGET, *t5_cpu(work, False))
    log = proc.stdout + proc.stderr
    assert "gpu=1" in log, log[-3000:]
    _, meta = text.read(work / TARGET)
    cuda = torch.cuda.is_available()
    assert (meta["device"], meta["dtype"]) == (("cuda", "bfloat16") if cuda else ("cpu", "float32"))
    assert meta["encoder"] == f"umt5 from {work / 'wan'}"
