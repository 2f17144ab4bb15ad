"""A multi-GPU tier through the training stage (chord.stages.train.run): two CPU ranks (gloo)
with one video each train what one process with the scene's batch_size 2 trains; a rank's
out-of-memory error is recorded for the retry; a batch_size the GPUs do not divide, or a job
with fewer GPUs than its tier, is a configuration error."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
import yaml

from chord.config import result_keys as rk
from chord.config import settings
from chord.resources import out_of_memory
from chord.scene import demo
from chord.stages import train as train_stage
from chord.training import checkpoint
from chord.training.trainer import Trainer
from tests.conftest import REPO
from tests.stages.test_geometry_stages import TINY_TRAINING, train_inputs

TINY = {
    **TINY_TRAINING,
    "early_stop": False,  # all 4 (the shipped early stop would end them at 2)
    "batch_size": 2,
    "save_interval": 2,
}
TIERS = {"solo": {"gpu_mem_gb": 24}, "duo": {"gpu_mem_gb": 24, "gpus": 2}}


def load(root, data, tiers=None, **method):
    """The tiny hop scene on tier solo of :data:`TIERS` (``tiers``: values to change per tier;
    ``method``: over :data:`TINY`)."""
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    (root / "scenes.tsv").write_text(f"scene\tdata\tprompt\ttier\nhop\t{data}\tp\tsolo\n")
    table = {name: {**spec, **(tiers or {}).get(name, {})} for name, spec in TIERS.items()}
    conf.update(scenes=str(root / "scenes.tsv"), tiers=table)
    conf["scene_overrides"] = {"hop": {**TINY, **method}}
    return settings.load(conf)


def hop_scene(root):
    """(root, config, training inputs) of the tiny hop scene, its geometry made under root."""
    data = demo.write_demo_scene("hop", root / "data", frame_num=5)
    conf = load(root, data)
    inputs = train_inputs(data, root / "results", "hop", conf.scenes["hop"].method)
    inputs.pop("data_dir")  # run() adds the scene's data folder
    return root, conf, inputs


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    return hop_scene(tmp_path_factory.mktemp("multi_gpu"))


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
    return summary, checkpoint.load_checkpoint(root / name / "coarse.pt")


@pytest.fixture(scope="module")
def solo_and_duo(hop):
    return run_on(hop, "solo"), run_on(hop, "duo")


def losses(path):
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


EPS32 = torch.finfo(torch.float32).eps
SUBNORMAL32 = 2.0**-149  # float32's smallest step: a rounding's absolute error where g² underflows


def summation_model(batch: int, gpus: int) -> tuple[int, int]:
    """(roundings, terms) of an element's gradient summed in two orders: one process sums
    reg + g_video0 + … + g_video(B−1) (B roundings), ``gpus`` ranks each reg plus its B/gpus
    videos (B/gpus roundings), then the all-reduce's sum (gpus − 1 more; dividing by 2 ranks
    is exact); every partial sum is at most (1 + B)·G, G the largest contribution."""
    return batch + batch // gpus + gpus - 1, 1 + batch


def assert_moments_close(
    two: dict, one: dict, betas, what: str, batch: int = 2, gpus: int = 2
) -> None:
    """Adam's moments after t steps of gradients that differ by float32 summation order.

    One process sums each element's gradient as reg + g_video0 + g_video1 (2 roundings), two
    ranks as (reg + g_video) per rank, then the all-reduce's sum (2 more; halving is exact):
    |δg_k| ≤ 4·(eps/2)·3G = 6·eps·G, with G the largest gradient contribution of the tensor
    (other batches: :func:`summation_model`).
    G is read off the second moment: v_t ≥ (1−β2)·β2^(t−k)·g_k² − 2t·2^-149 (its 4 roundings
    a step, absolute where g² is subnormal or underflows), so every |g_k| ≤
    sqrt((v_t + 2t·2^-149) / ((1−β2)·β2^(t−1))). Then |δm_t| = |(1−β1)·Σ β1^(t−k)·δg_k| ≤
    6·eps·G and |δv_t| ≤ (1−β2)·Σ β2^(t−k)·2|g_k||δg_k| ≤ 12·eps·G², per element of the
    tensor."""
    b1, b2 = betas
    for i, st in one.items():
        t = float(st["step"])
        assert float(two[i]["step"]) == t, f"{what}[{i}]"
        v = torch.maximum(st["exp_avg_sq"], two[i]["exp_avg_sq"]).double() + 2 * t * SUBNORMAL32
        g = float((v / ((1 - b2) * b2 ** (t - 1))).sqrt().max())
        roundings, terms = summation_model(batch, gpus)
        dg = roundings * (EPS32 / 2) * terms * g
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


@pytest.fixture(scope="module")
def four_videos(hop):
    """Batch 4 for one iteration: one process with the 4 videos, and the duo tier's 2 ranks
    with 2 each (the same scene files as ``hop``)."""
    root, conf, inputs = hop
    four = root / "four"
    four.mkdir()
    conf = load(four, conf.scenes["hop"].data, batch_size=4, iterations=1)
    hop4 = (four, conf, inputs)
    return conf, run_on(hop4, "solo"), run_on(hop4, "duo")


def assert_first_step_close(two: dict, one: dict, batch: int, gpus: int) -> dict:
    """The motion after one Adam step from the same start, its gradients differing by the
    summation order only (|δg| ≤ dg, :func:`summation_model`; |g| ≥ sqrt(v/(1−β2))·(1 − 2u),
    v = (1−β2)·g² rounded twice). The step is lr·g/(|g| + e) (m̂ = g, sqrt(v̂) = |g|), whose
    derivative in g is lr·e/(|g| + e)²: where |g| > dg both runs step the same way and differ
    by at most lr·e·dg/(|g| − dg)², plus 8 roundings of the step in each run (16u·lr) and of
    the parameter itself (2u·|p|); elsewhere (or where v is subnormal, its rounding not
    relative) a sign may flip (2·lr). Returns, per parameter, how many elements are held to
    the tight bound."""
    u, normal = EPS32 / 2, torch.finfo(torch.float32).tiny
    tight = {}
    roundings, terms = summation_model(batch, gpus)
    for name, opt in one["optimizers"].items():
        for group in opt["param_groups"]:
            (i,) = group["params"]
            key = f"{name}.layer1.{group['name']}"
            b2, e, lr = group["betas"][1], group["eps"], group["lr"]
            st, st2 = opt["state"][i], two["optimizers"][name]["state"][i]
            assert float(st["step"]) == float(st2["step"]) == 1.0, key
            v = torch.stack([st["exp_avg_sq"], st2["exp_avg_sq"]]).double()
            g = (v.min(0).values / (1 - b2)).sqrt() * (1 - 2 * u)
            G = ((float(v.max()) + 2 * SUBNORMAL32) / (1 - b2)) ** 0.5  # as assert_moments_close
            dg = roundings * u * terms * G
            p1, p2 = one["motion"][key].double(), two["motion"][key].double()
            sensitivity = lr * e * dg / (g - dg).clamp(min=0) ** 2
            held = (g > dg) & (v.min(0).values >= normal)
            step = torch.where(held, sensitivity.clamp(max=2 * lr), 2 * lr)
            tol = step + 16 * u * lr + 2 * u * torch.maximum(p1.abs(), p2.abs())
            excess = float(((p2 - p1).abs() - tol).max())
            assert excess <= 0, f"{key}: {excess:.3g} past the bound"
            tight[key] = int(held.sum())
    return tight


def test_two_ranks_of_two_videos_train_what_one_process_of_four_trains(four_videos):
    """More than one video per rank: rank r trains the scene's videos 2r and 2r + 1
    (Trainer.video_index of the per-rank batch), so 2 ranks of 2 draw and train exactly the
    4 videos of one process; the states agree up to float32 summation order."""
    from chord.resources import tiers

    conf, (s1, one), (s2, two) = four_videos
    assert s1 == s2 == {"stage": "coarse", "start": 1, "last": 1, "seed": 3}
    per_rank = tiers.per_gpu(conf.scenes["hop"].method, tiers.parse(conf.tiers)["duo"])
    assert per_rank.batch_size == 2
    for k in one["motion"]:
        if not k.endswith(("cp_deform", "cp_radius", "cp_rotation")):  # not trained
            assert torch.equal(two["motion"][k], one["motion"][k]), k
    tight = assert_first_step_close(two, one, batch=4, gpus=2)
    assert tight["obj_0.layer1.cp_deform"] and tight["obj_0.layer1.cp_radius"], tight
    for name, opt in one["optimizers"].items():
        assert two["optimizers"][name]["param_groups"] == opt["param_groups"], name
        betas = opt["param_groups"][0]["betas"]
        assert_moments_close(
            two["optimizers"][name]["state"], opt["state"], betas, name, batch=4, gpus=2
        )
    rank = lambda r: SimpleNamespace(rank=r, method=per_rank)  # noqa: E731
    drawn = [[Trainer.video_index(rank(r), b) for b in range(2)] for r in range(2)]
    assert drawn == [[0, 1], [2, 3]]  # each video of the batch once, none twice


def test_a_multi_gpu_tier_shares_the_configuration_of_one_gpu(hop, solo_and_duo):
    """The checkpoint folder and the hand-off's hash are the scene's, whatever the tier's GPU
    count: a retry on another tier resumes, a fine stage continues the coarse hand-off."""
    (_, one), (_, two) = solo_and_duo
    root, conf = hop[0], hop[1]
    h = rk.training_hash(conf.scenes["hop"].method, conf.guidance)
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
    with pytest.raises(settings.ConfigError) as err:
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
    with pytest.raises(settings.ConfigError, match=r"tier duo trains on 2 GPUs .* this job sees 1"):
        run_on(hop, "duo", "few", env={"CUDA_VISIBLE_DEVICES": "0"})
