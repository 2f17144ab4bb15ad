"""The training stage on the demo scene `hop` with the oracle: hand-off file, loss log and
resume from the newest checkpoint of the same configuration."""

from __future__ import annotations

import csv

import pytest

from chord import config as cc
from chord import demo, train
from chord.stages import train as train_stage
from tests.stages.test_geometry_stages import train_inputs


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    data = demo.write_demo_scene("hop", root / "data", frame_num=5)
    m = cc.method_from_mapping(
        {
            "gs_init_num": 800,
            "surface_target_num": 300,
            "cp_num": 12,
            "size": "48*32",
            "frame_num": 5,
            "iterations": 4,
            "batch_size": 1,
            "seed": 3,
            "save_interval": 2,
            "prev_frame_number": 2,
            "back_iter": 3,
            "arap_sample_num": 64,
        }
    )
    inputs = train_inputs(data, root / "results", "hop", m)
    return root, m, inputs


def test_coarse_stage_writes_the_hand_off_and_resumes(hop):
    root, m, inputs = hop
    guidance = cc.guidance_from_mapping({"backend": "oracle"})
    out, log, ckpts = root / "coarse.pt", root / "losses.tsv", root / "ckpt"
    summary = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=out,
        loss_log=log,
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert summary == {"stage": "coarse", "start": 1, "last": 4, "seed": 3}
    ckpt = train.load_checkpoint(out)
    assert ckpt["iteration"] == 4 and ckpt["seed"] == 3
    assert (ckpt["render_backend"], ckpt["device"]) == ("torch", "cpu")  # what rendered, where
    (folder,) = ckpts.iterdir()  # one folder per configuration hash
    assert folder.name == cc.training_hash(m, guidance)
    assert sorted(p.name for p in folder.iterdir()) == [
        "ckpt_000001.pt",
        "ckpt_000002.pt",
        "ckpt_000004.pt",
        "losses.tsv",  # the loss log across attempts, copied to the output
    ]
    with open(log) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [int(r["it"]) for r in rows] == [1, 2, 3, 4]
    # a rerun resumes after the newest checkpoint and runs nothing more
    again = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "again.pt",
        loss_log=log,
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert again["start"] == 5 and again["last"] == 4
    a, b = train.load_checkpoint(out), train.load_checkpoint(root / "again.pt")
    for k in a["motion"]:
        assert a["motion"][k].equal(b["motion"][k]), k
    # a changed configuration starts fresh
    m2 = cc.method_from_mapping({**vars(m), "iterations": 2})
    fresh = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "fresh.pt",
        loss_log=root / "l2.tsv",
        checkpoint_dir=ckpts,
        method=m2,
        guidance=guidance,
    )
    assert fresh["start"] == 1 and len(list(ckpts.iterdir())) == 2
    # a checkpoint cut short by a kill is skipped in favour of the one before it
    (folder / "ckpt_000004.pt").write_bytes(b"truncated")
    resumed = train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "r.pt",
        loss_log=root / "l3.tsv",
        checkpoint_dir=ckpts,
        method=m,
        guidance=guidance,
    )
    assert resumed["start"] == 3
    # a new output (Snakemake deletes a failed attempt's) still holds every row: the rows
    # before the resume point come from the log beside the checkpoints
    with open(root / "l3.tsv") as f:
        assert [int(r["it"]) for r in csv.DictReader(f, delimiter="\t")] == [1, 2, 3, 4]
    r = train.load_checkpoint(root / "r.pt")
    for k in a["motion"]:  # and the resumed run ends bit for bit where the first one did
        assert r["motion"][k].equal(a["motion"][k]), k


def test_oracle_needs_the_scripted_motion(hop, tmp_path):
    root, m, inputs = hop
    guidance = cc.guidance_from_mapping({"backend": "oracle"})
    with pytest.raises(ValueError, match="motion.json: missing; the oracle guidance"):
        train_stage.build(**{**inputs, "data_dir": tmp_path}, method=m, guidance=guidance)


def test_log_run_time_adds_phase_timings_to_the_loss_log(hop):
    root, m, inputs = hop
    guidance = cc.guidance_from_mapping({"backend": "oracle"})
    timed = cc.method_from_mapping({**vars(m), "iterations": 2})
    train_stage.run_stage(
        "coarse",
        inputs=inputs,
        out=root / "timed.pt",
        loss_log=root / "timed.tsv",
        checkpoint_dir=root / "timed_ckpt",
        method=timed,
        memory=cc.memory_from_mapping({"log_run_time": True}),
        guidance=guidance,
    )
    with open(root / "timed.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 2
    assert all(float(r["sds_s"]) > 0 and float(r["regularisers_s"]) > 0 for r in rows)
