"""Real GPUs as fixtures (tests/data/gpu_cards.tsv): for every node, what nvidia-smi reports is
read right, and `tier: auto` and `chord doctor` pick the tier a user of that node expects, with
the Wan 2.2 A14B teacher and the default method; every fuller tier skipped says why."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
import yaml

from chord.cli import main
from chord.config import settings
from chord.resources import gpus, job_size, peak_memory, tiers
from tests import components
from tests.components import skip_without
from tests.conftest import REPO
from tests.gpu_cards import NodeRow, install_fake_nvidia_smi, nodes

NODES = nodes()
CONFIG = yaml.safe_load((REPO / "config/config.yaml").read_text())
SHIPPED = CONFIG["tiers"]
# The README's multi-GPU tiers ("Which tier for which node") beside the shipped ones: split on
# two GPUs (host RAM: two ranks' experts, ~65 GiB by the model, +10%) and 4 x 24 GB with mmgp.
MULTI = {
    "full": SHIPPED["full"],
    "duo48": {**SHIPPED["split"], "gpus": 2, "host_mem_gb": 80},
    "split": SHIPPED["split"],
    "quad24": {
        "gpus": 4,
        "gpu_mem_gb": 24,
        "host_mem_gb": 224,
        "runtime_h": 12,
        "enable_mmgp": True,
        "checkpoint_tiny_vae": True,
    },
    **{k: v for k, v in SHIPPED.items() if k not in ("full", "split")},
}
ROLES = {"obj_0": "dynamic", "obj_1": "static"}  # two objects: 200k Gaussians, 100k dynamic
LOWRES = "fits only tiers that lower the SDS size"


def by_id(rows):
    return pytest.mark.parametrize("row", rows, ids=[r.node for r in rows])


def write_a14b_configs(folder: Path) -> Path:
    """A Wan folder holding only the A14B experts' configs (diffusers' WanTransformer3DModel
    arguments): what the memory model reads; no weights."""
    config = peak_memory.transformer_kwargs(peak_memory.A14B)
    for expert in ("transformer", "transformer_2"):
        (folder / expert).mkdir(parents=True, exist_ok=True)
        (folder / expert / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def on_node(tmp_path, monkeypatch):
    """Put a node's fake nvidia-smi first on PATH; returns the node as chord.resources.gpus
    reads it."""

    def put(row: NodeRow) -> gpus.Node:
        install_fake_nvidia_smi(tmp_path / "bin" / row.node, row)
        path = f"{tmp_path / 'bin' / row.node}{os.pathsep}{os.environ['PATH']}"
        monkeypatch.setenv("PATH", path)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return gpus.node(os.environ)

    return put


def pick(table: dict, node: gpus.Node, **kw) -> str:
    """tiers.auto for a scene of the shipped config's method, with the A14B memory model."""
    method = settings.method_from_mapping(CONFIG["method"])
    memory = settings.memory_from_mapping(CONFIG["memory"])
    fits = job_size.scene_fits(method, memory, ROLES, node, backend="wan", label="scene s")
    return tiers.auto(tiers.parse(table), node, fits, method=method, **kw)


@by_id(NODES)
def test_nvidia_smi_of_a_real_node_is_read_as_it_reports(on_node, row):
    node = on_node(row)
    assert node.gpus == row.gpus and node.card.name == row.name
    assert node.total_bytes == row.memory_total_mib * 2**20
    assert node.card.compute_cap == row.compute_cap
    # one GPU per training slot, as Snakemake's gpu resource counts them
    assert gpus.gpu_slots(os.environ) == row.gpus


@by_id(NODES)
def test_auto_picks_the_tier_a_user_of_the_node_expects(on_node, row, caplog):
    node = on_node(row)
    for table, expected in ((SHIPPED, row.shipped), (MULTI, row.multi)):
        if expected == "lowres":
            with pytest.raises(settings.ConfigError, match=LOWRES) as err:
                pick(table, node)
            assert row.name in str(err.value)  # names the card
            assert pick(table, node, allow_lowres=True) == "lowres"
            continue
        with caplog.at_level(logging.INFO, logger="chord.resources.tiers"):
            caplog.clear()
            assert pick(table, node) == expected, (row.node, list(table))
        # every fuller tier passed over is logged with its reason
        names = list(table)
        logged = caplog.text
        for skipped in names[: names.index(expected)]:
            assert f"; {skipped}: needs" in logged, (skipped, logged)
        assert "the memory model predicts" not in logged  # the label decides for these scenes


def test_a_tier_is_skipped_by_the_memory_model_with_its_estimate(on_node, caplog):
    """A scene too large for `full` on an 80 GB card (81 frames, Wan 2.2's own length: ~85 GiB
    by the model) but not for `split`: auto passes over full and says what the model predicts."""
    node = on_node(next(r for r in NODES if r.node == "h100_80gb"))
    method = settings.method_from_mapping({**CONFIG["method"], "frame_num": 81})
    memory = settings.memory_from_mapping(CONFIG["memory"])
    fits = job_size.scene_fits(method, memory, ROLES, node, backend="wan", label="scene s")
    table = tiers.parse(SHIPPED)
    with caplog.at_level(logging.INFO, logger="chord.resources.tiers"):
        tier = tiers.auto(table, node, fits, method=method)
    assert tier == "split"
    assert "full: the memory model predicts it would not fit: scene s, tier full" in caplog.text


def test_a_label_matches_every_card_sold_by_it():
    """The rule: a card's reported total in 10^9 bytes is at least its label; the least share
    any card reports (15/16 of the label in GiB, ECC on GDDR) is still above the label in GB,
    and no card of a label reaches the next label up in the tier table."""
    label_of = {"offload": 24, "split": 48, "full": 80, "lowres": 16}
    for row in NODES:
        label = label_of.get(row.shipped)
        if label is None:  # 40 GB: between the tiers' labels
            continue
        total = row.memory_total_mib * 2**20
        assert gpus.matches(total, label), row.node
        assert total >= gpus.LEAST_SHARE_OF_LABEL * label * 2**30, row.node
    least = gpus.LEAST_SHARE_OF_LABEL * 2**30 / gpus.GB
    assert 1 < least < 1.01  # 1.0066: every such card matches its label in GB
    assert not gpus.matches(40960 * 2**20, 48)  # an A100 40GB is no 48 GB card


@pytest.fixture
def a14b_config(tmp_path, monkeypatch):
    """config/config.yaml with the Wan teacher (the A14B experts' configs) and one scene of its
    method (no preset), on tier auto."""
    monkeypatch.chdir(tmp_path)
    folder = write_a14b_configs(tmp_path / "Wan2.2-I2V-A14B-Diffusers")
    tiny = tmp_path / "lighttaew2_1.safetensors"
    tiny.write_bytes(b"")
    conf = {
        **CONFIG,
        "guidance": {**CONFIG["guidance"], "backend": "wan", "ckpt_dir": str(folder)},
        "scenes": str(tmp_path / "scenes.tsv"),
        "results": str(tmp_path / "results"),
    }
    conf["guidance"]["tiny_vae_path"] = str(tiny)
    (tmp_path / "scenes.tsv").write_text(
        "scene\tdata\tprompt\nhop\tresources/demo/hop\ta block hops\n"
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


def doctor_tier_rows(config: Path, capsys, *extra: str) -> list[str]:
    main.main(["doctor", "--config", str(config), *extra])
    out = capsys.readouterr().out
    return [line for line in out.splitlines() if line.startswith("tier ")]


@skip_without(
    components.CPU_ONLY, not torch.cuda.is_available(), "reads the fake nvidia-smi's node"
)
@by_id(NODES)
def test_doctor_names_the_tier_auto_picks_on_the_node(on_node, row, a14b_config, capsys):
    on_node(row)
    rows = doctor_tier_rows(a14b_config, capsys)
    assert len(rows) == 1, rows
    if row.shipped == "lowres":
        assert rows[0].split()[1] == "fail" and LOWRES in rows[0], rows
        return
    assert rows[0].split()[1] == "pass", rows
    assert f"scene(s) hop: {row.shipped} on {row.gpus} x {row.name}" in rows[0], rows


def test_doctor_on_a_profile_node_takes_the_label_and_gpu_count(a14b_config, capsys, tmp_path):
    """A profile's gpu_mem_gb and gpus_per_node (a login node without GPUs)."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"gpu_mem_gb": 48, "gpus_per_node": 2}))
    rows = doctor_tier_rows(a14b_config, capsys, "--configfile", str(site))
    assert (
        "split on 2 x a 48 GB GPU" in rows[0]
        and "full: needs 80 GB per GPU, 48.0 GB here" in rows[0]
    ), rows
