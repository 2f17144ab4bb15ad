"""The float32 fallback: refused where the job's host RAM cannot hold a float32 expert,
recorded in the checkpoints so a resumed run computes in float32 too, and logged with its cost
and its TF32 decision."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from chord.guidance import tiny_models, wan, wan_float32
from chord.resources import peak_memory
from chord.training import checkpoint, float32_fallback, run_loop
from tests.unit.guidance.test_wan_diffusers import prompt_embeddings
from tests.unit.training.test_run_loop import (
    FlakyTeacher,
    H,
    T,
    W,
    make_trainer,
    method,
    tiny_scene,
)


@pytest.fixture(autouse=True)
def deterministic():
    """Bit-exact comparisons need torch's deterministic CPU kernels (as the stage sets)."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "w")


@pytest.fixture(scope="module")
def embeddings(folder):
    return prompt_embeddings(folder)


class TransientTeacher(FlakyTeacher):
    """The oracle, with ``bad`` infinite velocities from now on, then healthy again (at
    whatever precision): what a run that cannot fall back retries through."""

    def __init__(self, oracle):
        super().__init__(oracle)
        self.fp32, self.bad = True, 0

    def velocity(self, z_t, *args, **kw):
        v = self.oracle.velocity(z_t, *args, **kw)
        if self.bad:
            self.bad -= 1
            return torch.full_like(v, float("inf"))
        return v


def test_float32_fallback_is_refused_where_the_job_host_ram_cannot_hold_the_float32_expert(
    tmp_path, caplog
):
    """A Wan job asks for the memory model's host RAM of one bf16 expert plus 10%
    (chord.resources.job_size.job_request); a switch of expert after the fallback loads the next
    one in
    float32, twice that. With that RAM (and a GPU that fits) the fallback is refused, the log
    names both figures, and training goes on at the guidance's precision; with enough RAM it
    is taken."""
    m = method(iterations=6, batch_size=1, save_interval=2)
    scene, _ = tiny_scene()
    shape = dict(width=W, height=H, frames=T, batch=1, gaussians=int(scene.means.shape[0]))

    def host(expert_bytes):
        return peak_memory.estimate({}, **shape, expert_bytes=expert_bytes)["host_bytes"]

    job = int(host(2) * 1.1)
    need = host(4)
    assert job < need  # an A14B expert: 26.6 GiB in bf16, 53.3 GiB in float32
    for limit, switches in ((job, False), (need, True)):
        tr = make_trainer(
            m, gpu_memory_bytes=200 * peak_memory.GiB, host_memory_bytes=limit
        )  # A14B in float32 fits 200 GiB at this size: only the host RAM decides
        tr.guidance = TransientTeacher(tr.guidance)
        tr.guidance.fp32 = False
        tr.guidance.model_shape = peak_memory.A14B
        folder = tmp_path / str(limit)
        run_loop.run(tr, 1, 3, config_hash="h", checkpoint_dir=folder)
        tr.guidance.bad = 2  # two non-finite steps: a roll-back, then healthy again
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="chord.training.run_loop"):
            last = run_loop.run(
                tr, 3, 7, config_hash="h", checkpoint_dir=folder, max_nonfinite_steps=2
            )
        assert last == 6 and tr.nonfinite == 0  # the run went on to its end
        assert tr.guidance.fp32 == switches == tr.float32_fallback
        ckpt = checkpoint.load_checkpoint(folder / "ckpt_000006.pt")
        assert ckpt["float32_fallback"] == switches
        if switches:
            assert "float32 fallback taken after 2 non-finite steps" in caplog.text
            continue
        problem = float32_fallback.problem(tr)
        gib = peak_memory.GiB
        assert f"needs {need / gib:.1f} GiB of host RAM" in problem
        assert f"the job may use {job / gib:.1f} GiB" in problem
        assert "GPU" not in problem  # the GPU fits: only the host RAM is named
        assert (
            f"float32 fallback not taken: {problem}; retrying at the guidance's precision"
            in caplog.text
        )


class Bf16Breaks(wan.WanGuidance):
    """The tiny Wan teacher whose bf16 passes give infinite velocities once ``broken``: what
    bf16 rounding can do to A14B and a tiny random model does not."""

    broken = False

    def velocity(self, *args, **kw):
        v = super().velocity(*args, **kw)
        if self.broken and self.compute_dtype != torch.float32:
            return torch.full_like(v, float("inf"))
        return v


def wan_trainer(folder, txt, m, *, broken):
    scene, mesh = tiny_scene()
    guidance = Bf16Breaks(folder, dtype=torch.bfloat16)  # as on CUDA (bf16 autocast)
    guidance.broken = broken
    return make_trainer(m, scene, mesh, guidance=guidance, txt=txt)


def motion(tr) -> dict:
    return {k: p.detach().clone() for k, p in tr.scene.dynamic["obj_0"].param_groups().items()}


def test_a_run_resumed_after_the_fallback_computes_in_float32_and_ends_as_one_run(
    folder, embeddings, tmp_path
):
    """The fallback is in the checkpoints: a run stopped after it (SIGTERM, a requeue) and
    resumed in a new process switches its guidance to float32 before the first step, and
    ends where the uninterrupted run does, bit for bit; an older checkpoint without the
    field leaves the guidance at bf16."""
    m = method(iterations=6, batch_size=1, save_interval=2)
    one = wan_trainer(folder, embeddings, m, broken=False)
    run_loop.run(one, 1, 3, config_hash="h", checkpoint_dir=tmp_path / "one")
    one.guidance.broken = True  # bf16 fails from iteration 3 on
    rows = []
    run_loop.run(
        one,
        3,
        7,
        config_hash="h",
        checkpoint_dir=tmp_path / "one",
        log=rows.append,
        max_nonfinite_steps=2,
    )
    assert [r["skipped"] for r in rows] == [1, 1, 0, 0, 0, 0]  # 3, 4, then 3..6 in float32
    assert one.guidance.compute_dtype == torch.float32

    stopped = wan_trainer(folder, embeddings, m, broken=False)
    ckpts = tmp_path / "stopped"
    run_loop.run(stopped, 1, 3, config_hash="h", checkpoint_dir=ckpts)
    stopped.guidance.broken = True

    def sigterm_after_4(rec):
        if rec["it"] == 4 and not rec["skipped"]:  # iteration 4 in float32
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(run_loop.Interrupted):
        run_loop.run(
            stopped,
            3,
            7,
            config_hash="h",
            checkpoint_dir=ckpts,
            log=sigterm_after_4,
            max_nonfinite_steps=2,
        )
    ckpt = checkpoint.load_checkpoint(ckpts / "ckpt_000004.pt")

    resumed = wan_trainer(folder, embeddings, m, broken=True)  # a new process: bf16 again
    assert resumed.guidance.compute_dtype == torch.bfloat16
    start = checkpoint.restore(resumed, ckpt)
    assert start == 5
    assert resumed.guidance.compute_dtype == torch.float32  # before the first step
    assert resumed.float32_fallback and ckpt["float32_fallback"] is True
    after = []
    run_loop.run(resumed, start, 7, config_hash="h", checkpoint_dir=ckpts, log=after.append)
    assert [(r["it"], r["skipped"]) for r in after] == [(5, 0), (6, 0)]
    ref, got = motion(one), motion(resumed)
    for k in ref:
        assert torch.equal(got[k], ref[k]), (k, float((got[k] - ref[k]).abs().max()))
    assert checkpoint.load_checkpoint(ckpts / "ckpt_000006.pt")["float32_fallback"] is True

    old = {k: v for k, v in ckpt.items() if k != "float32_fallback"}  # before the field
    older = wan_trainer(folder, embeddings, m, broken=False)
    assert checkpoint.restore(older, old) == 5
    assert older.guidance.compute_dtype == torch.bfloat16 and not older.float32_fallback


def test_the_switch_logs_its_slowdown_and_keeps_tf32_off_only_inside_the_dit_pass(
    folder, embeddings, caplog
):
    """The log line at the switch gives the cost, from public dense TFLOPS (H100/H200 SXM
    989 bf16 vs 67 float32, A100 312 vs 19.5: 14.8x and 16x), and the TF32 decision. The DiT
    passes then run with TF32 off even where the process allowed it, and the process's
    setting is back once the pass is over."""
    g = wan.WanGuidance(folder, dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="chord.guidance.wan"):
        g.use_float32()
    assert "expect roughly 15-16x slower DiT passes" in caplog.text
    assert "H100/H200 SXM 989 vs 67, A100 SXM 312 vs 19.5" in caplog.text
    assert "TF32 off (matmuls and convolutions in IEEE float32" in caplog.text

    switches = wan_float32.tf32_switches()
    allowed = {"fp32_precision": "tf32", "allow_tf32": True}  # TF32 on, as a user may set it
    saved = [getattr(obj, name) for obj, name, _ in switches]
    seen = []
    z = torch.randn(1, 16, (T - 1) // 4 + 1, H // 8, W // 8)
    y = torch.zeros(20, (T - 1) // 4 + 1, H // 8, W // 8)
    try:
        for obj, name, _ in switches:
            setattr(obj, name, allowed[name])
        g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)  # loads the expert in float32
        probe = g.experts["transformer_2"].register_forward_pre_hook(
            lambda *_: seen.append([getattr(obj, name) for obj, name, _ in switches])
        )
        g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)
        probe.remove()
        after = [getattr(obj, name) for obj, name, _ in switches]
    finally:
        for (obj, name, _), value in zip(switches, saved, strict=True):
            setattr(obj, name, value)
    assert seen == [[ieee for _, _, ieee in switches]]  # one DiT call (CFG batch)
    assert after == [allowed[name] for _, name, _ in switches]
    assert g.experts["transformer_2"].proj_out.weight.dtype == torch.float32
