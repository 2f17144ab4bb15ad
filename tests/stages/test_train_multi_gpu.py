"""A multi-GPU tier through the training stage (chord.stages.train.run): two CPU ranks (gloo)
with one video each train what one process with the scene's batch_size 2 trains; a rank's
out-of-memory error is recorded for the retry; a batch_size the GPUs do not divide, or a job
with fewer GPUs than its tier, is a configuration error."""

from __future__ import annotations

import csv

import pytest
import torch
import yaml

from chord import config as cc
from chord import demo, out_of_memory, train
from chord.stages import train as train_stage
from tests.conftest import REPO
from tests.stages.test_geometry_stages import train_inputs

TINY = {
    "gs_init_num": 800,
    "surface_target_num": 300,
    "cp_num": 12,
    "size": "48*32",
    "frame_num": 5,
    "iterations": 4,
    "batch_size": 2,
    "seed": 3,
    "save_interval": 2,
    "prev_frame_number": 2,
    "back_iter": 3,
    "arap_sample_num": 64,
}
TIERS = {"solo": {"gpu_mem_gb": 24}, "duo": {"gpu_mem_gb": 24, "gpus": 2}}


def load(root, data, **method):
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    (root / "scenes.tsv").write_text(f"scene\tdata\tprompt\ttier\nhop\t{data}\tp\tsolo\n")
    conf.update(scenes=str(root / "scenes.tsv"), tiers=TIERS)
    conf["scene_overrides"] = {"hop": {**TINY, **method}}
    return cc.load(conf)


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi_gpu")
    data = demo.write_demo_scene("hop", root / "data", frame_num=5)
    conf = load(root, data)
    inputs = train_inputs(data, root / "results", "hop", conf.scenes["hop"].method)
    inputs.pop("data_dir")  # run() adds the scene's data folder
    return root, conf, inputs


def run_on(hop, tier, name=None, env=None):
    root, conf, inputs = hop
    name = name or tier
    summary = train_stage.run(
        "coarse",
        conf=conf,
        scene="hop",
        tier=tier,
        inputs=inputs,
        out=root / name / "coarse.pt",
        loss_log=root / name / "losses.tsv",
        checkpoint_dir=root / name / "ckpt",
        handoff=None,
        env=env or {},
    )
    return summary, train.load_checkpoint(root / name / "coarse.pt")


@pytest.fixture(scope="module")
def solo_and_duo(hop):
    return run_on(hop, "solo"), run_on(hop, "duo")


def losses(path):
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


EPS32 = torch.finfo(torch.float32).eps
ROUNDINGS = 4  # solo: reg + video 0 + video 1 (2 sums); duo: reg + video per rank, all-reduce


def assert_moments_close(two: dict, one: dict, betas, what: str) -> None:
    """Adam's moments after t steps of gradients that differ by float32 summation order.

    One process sums each element's gradient as reg + g_video0 + g_video1 (2 roundings), two
    ranks as (reg + g_video) per rank, then the all-reduce's sum (2 more; halving is exact):
    |δg_k| ≤ 4·(eps/2)·3G = 6·eps·G, with G the largest gradient contribution of the tensor.
    G is read off the second moment: v_t ≥ (1−β2)·β2^(t−k)·g_k², so every |g_k| ≤
    sqrt(v_t / ((1−β2)·β2^(t−1))). Then |δm_t| = |(1−β1)·Σ β1^(t−k)·δg_k| ≤ 6·eps·G and
    |δv_t| ≤ (1−β2)·Σ β2^(t−k)·2|g_k||δg_k| ≤ 12·eps·G², per element of the tensor."""
    b1, b2 = betas
    for i, st in one.items():
        t = float(st["step"])
        assert float(two[i]["step"]) == t, f"{what}[{i}]"
        v = torch.maximum(st["exp_avg_sq"], two[i]["exp_avg_sq"])
        g = float((v / ((1 - b2) * b2 ** (t - 1))).sqrt().max())
        dg = ROUNDINGS * (EPS32 / 2) * 3 * g
        for key, tol in (("exp_avg", dg), ("exp_avg_sq", 2 * g * dg)):
            label = f"{what}[{i}].{key}"
            torch.testing.assert_close(
                two[i][key], st[key], rtol=0, atol=tol, msg=lambda m, label=label: f"{label}: {m}"
            )


def test_two_ranks_of_one_video_train_what_one_process_of_two_trains(hop, solo_and_duo):
    """The same draws (video indices 0 and 1, on ranks 0 and 1) and the same steps: the states
    agree up to float32 reduction order (the ranks' gradients are summed by the all-reduce,
    one process accumulates them video by video), ~1e-7 here, not bit for bit; Adam's moments
    to the summation rounding of their gradients (:func:`assert_moments_close`)."""
    root = hop[0]
    (s1, one), (s2, two) = solo_and_duo
    assert s1 == s2 == {"stage": "coarse", "start": 1, "last": 4, "seed": 3}
    assert (one["tier"], two["tier"]) == ("solo", "duo")
    assert set(one["motion"]) == set(two["motion"])
    for k in one["motion"]:
        torch.testing.assert_close(
            two["motion"][k], one["motion"][k], atol=1e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )
    for name, opt in one["optimizers"].items():  # the averaged gradients drove the same steps
        assert two["optimizers"][name]["param_groups"] == opt["param_groups"], name
        assert set(two["optimizers"][name]["state"]) == set(opt["state"]), name
        betas = opt["param_groups"][0]["betas"]
        assert_moments_close(two["optimizers"][name]["state"], opt["state"], betas, name)
    # the loss log is rank 0's, with the losses of every rank's videos: one process's
    a, b = losses(root / "solo/losses.tsv"), losses(root / "duo/losses.tsv")
    assert [r["it"] for r in a] == [r["it"] for r in b] == ["1", "2", "3", "4"]
    for ra, rb in zip(a, b, strict=True):
        for key in ("sds", "ground", "temporal", "arap", "t", "cfg"):
            assert float(rb[key]) == pytest.approx(float(ra[key]), rel=1e-4, abs=1e-9), key


def test_a_multi_gpu_tier_shares_the_configuration_of_one_gpu(hop, solo_and_duo):
    """The checkpoint folder and the hand-off's hash are the scene's, whatever the tier's GPU
    count: a retry on another tier resumes, a fine stage continues the coarse hand-off."""
    (_, one), (_, two) = solo_and_duo
    root, conf = hop[0], hop[1]
    h = cc.training_hash(conf.scenes["hop"].method, conf.guidance)
    assert one["config_hash"] == h
    assert two["config_hash"] == h
    assert [p.name for p in (root / "duo/ckpt").iterdir() if p.is_dir()] == [h]


def test_out_of_memory_in_one_rank_is_recorded_for_the_retry(hop, tmp_path):
    record = hop[0] / "oom" / "ckpt" / out_of_memory.RECORD
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 1"):
        run_on(hop, "duo", "oom", env={"CHORD_TEST_OOM_TIERS": "duo@1"})
    assert out_of_memory.read(record) == {"duo"}


def test_a_batch_size_the_gpus_do_not_divide_is_a_config_error(hop, tmp_path):
    root, _, inputs = hop
    conf = load(tmp_path, hop[1].scenes["hop"].data, batch_size=3)
    with pytest.raises(cc.ConfigError) as err:
        train_stage.run(
            "coarse",
            conf=conf,
            scene="hop",
            tier="duo",
            inputs=inputs,
            out=tmp_path / "coarse.pt",
            loss_log=tmp_path / "losses.tsv",
            checkpoint_dir=tmp_path / "ckpt",
            handoff=None,
            env={},
        )
    msg = str(err.value)
    assert "scene hop: tier duo" in msg and "gpus: 2" in msg and "batch_size 3" in msg
    assert not (tmp_path / "ckpt").exists()  # nothing started


def test_a_job_with_fewer_gpus_than_its_tier_stops_before_training(hop, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(cc.ConfigError, match=r"tier duo trains on 2 GPUs .* this job sees 1"):
        run_on(hop, "duo", "few", env={"CUDA_VISIBLE_DEVICES": "0"})
