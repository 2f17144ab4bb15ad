"""A Trainer's checkpoint (chord.training.checkpoint, METHOD §17): what it holds, restoring it
(the weights, the optimisers' moments, the seed, the float32 fallback) and the hand-off
files' provenance, on the tiny scene of test_run_loop (two iterations, no run loop)."""

from __future__ import annotations

import torch

from chord.training import checkpoint
from tests.unit.training.test_run_loop import FlakyTeacher, make_trainer, method, run_steps


def trained(m, steps=1):
    tr = make_trainer(m)
    run_steps(tr, 1, steps + 1)
    return tr


def test_a_checkpoint_holds_what_continues_the_run():
    m = method(iterations=4, batch_size=1)
    tr = trained(m)
    ckpt = checkpoint.contents(tr, 2, "h")
    assert ckpt["format"] == checkpoint.CKPT_FORMAT == "chord-train/1"
    assert (ckpt["iteration"], ckpt["seed"], ckpt["config_hash"]) == (2, tr.seed, "h")
    assert ckpt["surface_voxel_size"] == {"obj_0": 0.05} and ckpt["float32_fallback"] is False
    assert set(ckpt["optimizers"]) == {"obj_0"} and ckpt["motion"]
    # what load_checkpoint checks (issue 47) is what is written: one table, each field's type
    assert set(ckpt) == set(checkpoint.FIELDS) and checkpoint.problems(ckpt) == []
    handoff = checkpoint.handoff_contents(tr, 2, "h", size="32*16", tier="full", before=None,
                                          device="cpu")  # fmt: skip
    assert set(handoff) - set(ckpt) == set(checkpoint.HANDOFF_FIELDS)
    assert checkpoint.problems(handoff) == []


def test_restoring_a_checkpoint_continues_after_its_iteration(tmp_path):
    m = method(iterations=4, batch_size=1)
    a = trained(m)
    checkpoint.save_checkpoint(tmp_path / "c.pt", checkpoint.contents(a, 2, "h"))
    b = make_trainer(m)
    b.seed = 99
    b.arap_connectivity["obj_0"] = "stale"  # of the weights before the restore
    assert checkpoint.restore(b, checkpoint.load_checkpoint(tmp_path / "c.pt")) == 3
    assert b.seed == a.seed and b.arap_connectivity == {} and not b.float32_fallback
    pa, pb = a.scene.dynamic["obj_0"], b.scene.dynamic["obj_0"]
    for (k, p), (_, q) in zip(pa.named_parameters(), pb.named_parameters(), strict=True):
        assert torch.equal(p, q), k
    sa, sb = a.optimizers["obj_0"].state_dict(), b.optimizers["obj_0"].state_dict()
    assert sa["state"] and sa["state"].keys() == sb["state"].keys()
    for i in sa["state"]:
        assert torch.equal(sa["state"][i]["exp_avg"], sb["state"][i]["exp_avg"])
        assert torch.equal(sa["state"][i]["step"], sb["state"][i]["step"])


def test_a_checkpoint_after_the_float32_fallback_switches_the_guidance_again():
    m = method(iterations=4, batch_size=1)
    a = trained(m)
    ckpt = checkpoint.contents(a, 1, "h")
    for fell_back in (True, False, None):  # None: an older checkpoint without the field
        b = make_trainer(m)
        b.guidance = FlakyTeacher(b.guidance)
        if fell_back is None:
            ckpt.pop("float32_fallback")
        else:
            ckpt["float32_fallback"] = fell_back
        checkpoint.restore(b, ckpt)
        assert b.float32_fallback is bool(fell_back) and b.guidance.fp32 is bool(fell_back)


def test_a_handoff_records_the_size_and_every_stages_tier():
    m = method(iterations=4, batch_size=1)
    tr = trained(m)
    coarse = checkpoint.handoff_contents(
        tr, 1, "h", size="32*16", tier="full", before=None, device=torch.device("cpu")
    )
    assert coarse["iteration"] == 1 and coarse["config_hash"] == "h"
    assert (coarse["size"], coarse["tier"], coarse["tiers"]) == ("32*16", "full", ["full"])
    assert coarse["render_backend"] == tr.backend and coarse["device"] == "cpu"
    fine = checkpoint.handoff_contents(
        tr, 4, "h", size="16*8", tier="lowres", before=coarse, device="cpu"
    )
    assert fine["tiers"] == ["full", "lowres"] and fine["size"] == "16*8"
