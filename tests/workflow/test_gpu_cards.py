"""Real GPUs as fixtures, through the workflow: for every node of tests/data/gpu_cards.tsv, a dry
run of config/config.yaml with the Wan teacher, that node's nvidia-smi behind a fake on PATH and
one scene of the shipped method on tier auto plans its training on the tier a user expects, and
logs why each fuller tier was skipped."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.gpu_cards import install_fake_nvidia_smi, nodes
from tests.unit.resources.test_gpu_cards import CONFIG, LOWRES, MULTI, write_a14b_configs
from tests.workflow.test_multi_gpu import training_resources
from tests.workflow.test_scale import copy_workflow, snakemake

NODES = nodes()
# every node on the shipped tiers; on the README's multi-GPU tiers, the nodes they are for and
# one single-GPU node of each size (the multi-GPU tier skipped: too few GPUs)
CASES = [(row, "shipped") for row in NODES] + [
    (row, "multi") for row in NODES if row.multi != row.shipped or row.node in ("l40s", "rtx_4090")
]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("cards")
    copy_workflow(work)
    (work / "config").mkdir()
    folder = write_a14b_configs(work / "Wan2.2-I2V-A14B-Diffusers")
    tiny = work / "lighttaew2_1.safetensors"
    tiny.write_bytes(b"")
    guidance = {"backend": "wan", "ckpt_dir": str(folder), "tiny_vae_path": str(tiny)}
    conf = {**CONFIG, "guidance": {**CONFIG["guidance"], **guidance}}
    (work / "config/config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
    (work / "config/multi.yaml").write_text(yaml.safe_dump({"tiers": MULTI}, sort_keys=False))
    # the shipped method (no preset): 832x480, 41 frames, batch 4, the Tiny VAE
    (work / "config/scenes.tsv").write_text(
        "scene\tdata\tprompt\ttier\nhop\tresources/demo/hop\ta block hops\tauto\n"
    )
    return work


@pytest.mark.parametrize("row, tiers", CASES, ids=[f"{r.node}-{t}" for r, t in CASES])
def test_the_dry_run_plans_the_tier_a_user_of_the_node_expects(work, row, tiers, tmp_path):
    expected = getattr(row, tiers)
    fake = install_fake_nvidia_smi(tmp_path / "bin", row)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    extra = ["--configfile", str(work / "config/multi.yaml")] if tiers == "multi" else []
    # the local gpu resource is capped at this machine's GPU count: give a 4-GPU tier room
    args = ["-n", "results/hop/train/coarse.pt", "--resources", "gpu=8", *extra]
    proc = snakemake(work, *args, env=env, check=expected != "lowres")
    out = proc.stdout + proc.stderr
    if expected == "lowres":
        assert proc.returncode != 0 and LOWRES in out and row.name in out, out[-3000:]
        return
    res = training_resources(proc, "train_coarse")
    assert res["tier"] == expected, out[-3000:]
    names = list(MULTI if tiers == "multi" else CONFIG["tiers"])
    assert res["gpu"] == str(MULTI.get(expected, {}).get("gpus", 1))
    line = next(li for li in out.splitlines() if "tier auto: scene hop" in li)
    assert f"{expected} on {row.gpus} x {row.name}" in line, line
    for skipped in names[: names.index(expected)]:
        assert f"; {skipped}: needs" in line, line
