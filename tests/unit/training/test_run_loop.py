"""The optimisation loop on tiny scenes: memory modes give the default mode's gradients, and
coarse then fine equals one uninterrupted run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from chord.config import settings
from chord.gaussians import gaussian_set
from chord.guidance import text, tiny_models, wan, wan_folder
from chord.guidance.oracle import OracleGuidance
from chord.motion.model import DynamicObject, MotionScene
from chord.render.rasterizer import splat_tensors
from chord.resources import cuda_settings
from chord.training import checkpoint, float32_fallback, progress, resume, run_loop
from chord.training.trainer import Trainer

W, H, T = 32, 16, 5


@pytest.fixture(autouse=True)
def deterministic():
    """Bit-exact comparisons need torch's deterministic CPU kernels (as the stage sets)."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def box_splats(extents, centre, n, seed):
    mesh = trimesh.creation.box(extents=extents)
    mesh.apply_translation(centre)
    mesh.visual.face_colors = (200, 90 + 40 * seed, 40, 255)
    return mesh, splat_tensors(gaussian_set.init_from_mesh([mesh], n, seed=seed))


def tiny_scene(seed=0):
    mesh, dyn = box_splats((0.3, 0.5, 0.3), (0.0, 0.25, 0.0), 300, 0)
    _, slab = box_splats((1.2, 0.05, 1.0), (0.0, -0.025, 0.0), 150, 1)
    g = torch.Generator().manual_seed(seed)
    centres = dyn["means"][torch.randperm(300, generator=g)[:6]]
    obj = DynamicObject(
        "obj_0",
        dyn["means"],
        dyn["quats"],
        centres,
        dyn["means"][::3],
        frame_num=T,
        arap_sample_num=64,
    )
    with torch.no_grad():  # anisotropic, rotated control points: every parameter matters
        obj.layer1.cp_deform.normal_(0, 0.02, generator=g)
        obj.layer1.cp_radius.add_(0.3 * torch.randn(6, 3, generator=g))
        obj.layer1.cp_rotation.add_(0.2 * torch.randn(6, 4, generator=g))
    return MotionScene(["obj_0", "obj_1"], [dyn, slab], {"obj_0": obj}), mesh


def method(**kw):
    base = {
        "frame_num": T,
        "size": f"{W}*{H}",
        "batch_size": 2,
        "iterations": 8,
        "seed": 0,
        "prev_frame_number": 2,
        "back_iter": 4,
        "arap_sample_num": 64,
    }
    return settings.method_from_mapping({**base, **kw})


@pytest.fixture(scope="module")
def wan_guidance(tmp_path_factory):
    folder = tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "w")
    tok, enc = wan_folder.load_text_encoder(folder)
    e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
    return wan.WanGuidance(folder), {"prompt": e[0], "negative": e[1]}


def oracle_for(scene):
    """Target: the object lifted by 0.1 in every frame after the first."""
    means = scene.means[None].repeat(T, 1, 1)
    means[1:, scene.slices["obj_0"], 1] += 0.1
    target = {
        "means": means,
        "quats": scene.quats[None].expand(T, -1, -1),
        "scales": scene.scales,
        "opacities": scene.opacities,
        "sh": scene.sh,
        "sh_degree": scene.sh_degree,
    }
    return OracleGuidance(target, width=W, height=H, pool=4)


def sds_grads(memory, guidance, txt, m):
    scene, _ = tiny_scene()
    tr = Trainer(
        scene=scene, guidance=guidance, text=txt, method=m, width=W, height=H, memory=memory
    )
    tr.sds(3, tr.cameras_at(3))
    obj = scene.dynamic["obj_0"]
    return {k: p.grad.clone() for k, p in obj.param_groups().items()}


def flags(split_sds=False, split_render=False, chunk=-1, **kw):
    """MemoryConfig with the split flags and chunk given (the schema's defaults otherwise)."""
    return settings.memory_from_mapping(
        {
            "split_sds_backward": split_sds,
            "split_render_backward": split_render,
            "split_render_chunk_size": chunk,
            **kw,
        }
    )


MODES = [
    flags(s, r, c)
    for s, r, c in itertools.product((False, True), (False, True), (-1, 2, 1))
    if r or c == -1
]


def mode_id(f) -> str:
    return (
        f"sds{int(f.split_sds_backward)}"
        f"-render{int(f.split_render_backward)}-chunk{f.split_render_chunk_size}"
    )


@pytest.mark.parametrize("memory", MODES[1:], ids=mode_id)
def test_memory_modes_give_the_default_gradients(memory, wan_guidance):
    """Bit for bit where the arithmetic is the same (split_sds_backward stores g itself, a
    whole-video re-render backpropagates the same ∂L/∂V); a chunked re-render sums the
    frames' parameter gradients in another order: float32 rounding only."""
    guidance, txt = wan_guidance
    m = method()
    ref = sds_grads(MODES[0], guidance, txt, m)
    got = sds_grads(memory, guidance, txt, m)
    assert_mode_grads_equal(memory, got, ref)
    assert float(ref["cp_deform"].abs().sum()) > 0


def assert_mode_grads_equal(memory, got: dict, ref: dict) -> None:
    """The memory mode's gradients are the default mode's: bit for bit, or within float32
    rounding for a chunked re-render (its frames' parameter gradients summed in another
    order)."""
    for k in ref:
        if memory.split_render_backward and memory.split_render_chunk_size != -1:
            rel = float((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30))
            assert rel < 1e-5, (k, rel)
        else:
            assert torch.equal(got[k], ref[k]), (k, float((got[k] - ref[k]).abs().max()))


def slab_grid():
    """The contact loss's distance grid of the tiny scene's static slab (obj_1)."""
    from chord.motion import contact

    slab = trimesh.creation.box(extents=(1.2, 0.05, 1.0))
    slab.apply_translation((0.0, -0.025, 0.0))
    return contact.signed_distance_grid([(slab.vertices, slab.faces)])


def step_grads(memory, guidance, txt, m, grid):
    """The contact loss and the dynamic object's gradients of iteration 3's regularisers and
    SDS (the order of Trainer.step) with the contact grid ``grid``."""
    from chord.motion import contact

    scene, mesh = tiny_scene()
    points = contact.surface_samples(mesh.vertices, mesh.faces, 512, seed=0)
    tr = Trainer(
        scene=scene,
        guidance=guidance,
        text=txt,
        method=m,
        width=W,
        height=H,
        memory=memory,
        contact_grid=grid,
        contact_points={"obj_0": points},
    )
    cams = tr.cameras_at(3)
    loss = tr.regularisers(3, cams)["contact"]
    tr.sds(3, cams)
    obj = scene.dynamic["obj_0"]
    return loss, {k: p.grad.clone() for k, p in obj.param_groups().items()}


@pytest.mark.parametrize("memory", MODES[1:], ids=mode_id)
def test_memory_modes_give_the_default_gradients_with_the_contact_loss(memory, wan_guidance):
    """Issue 36: with the contact loss on (the block's surface set against the static slab it
    stands on, its random deformation pushing some of it in), each memory mode still gives the
    default mode's gradients, as without it (the memory tiers keep their results)."""
    guidance, txt = wan_guidance
    m, grid = method(lambda_contact=1e6), slab_grid()
    loss, ref = step_grads(MODES[0], guidance, txt, m, grid)
    assert loss > 0
    _, without = step_grads(MODES[0], guidance, txt, method(), None)
    assert not torch.equal(ref["cp_deform"], without["cp_deform"])  # the term is in them
    _, got = step_grads(memory, guidance, txt, m, grid)
    assert_mode_grads_equal(memory, got, ref)


@pytest.mark.parametrize(
    "memory",
    [
        flags(checkpoint_tiny_vae=True),
        flags(True, True, 2, checkpoint_tiny_vae=True),  # the split tier's flags
    ],
    ids=["checkpoint", "split-tier"],
)
def test_tiny_vae_checkpoints_give_the_default_gradients(memory, tmp_path):
    """checkpoint_tiny_vae recomputes the Tiny VAE's blocks in the backward: same gradients."""
    from chord.guidance.tiny_vae import TinyVAEEncoder

    folder = tiny_models.write_tiny_wan(tmp_path / "w")
    tok, enc = wan_folder.load_text_encoder(folder)
    e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
    torch.manual_seed(0)
    guidance = wan.WanGuidance(folder, tiny_vae=TinyVAEEncoder())
    txt = {"prompt": e[0], "negative": e[1]}
    m = method()
    ref = sds_grads(flags(), guidance, txt, m)
    got = sds_grads(memory, guidance, txt, m)
    for k in ref:
        rel = float((got[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30))
        assert rel < 1e-5, (k, rel)
    assert float(ref["cp_deform"].abs().sum()) > 0


def test_split_backward_renders_each_video_once_without_grad(wan_guidance):
    """With both splits the backward's video leaf is the targets pass's render, kept: per
    video one render without grad, then the re-render chunks with grad."""
    guidance, txt = wan_guidance
    scene, _ = tiny_scene()
    tr = Trainer(
        scene=scene,
        guidance=guidance,
        text=txt,
        method=method(),
        width=W,
        height=H,
        memory=flags(True, True, 2),
    )
    calls = []
    render = tr.render

    def counted(viewmat, background, frames):
        calls.append((len(frames), torch.is_grad_enabled()))
        return render(viewmat, background, frames)

    tr.render = counted
    tr.sds(3, tr.cameras_at(3))
    per_video = [(T, False), (2, True), (2, True), (1, True)]  # T = 5 in chunks of 2
    assert sorted(calls) == sorted(per_video * 2)  # batch 2


def run_steps(tr, start, stop):
    for it in range(start, stop):
        tr.step(it)


def make_trainer(m, scene=None, mesh=None, *, guidance=None, txt=None, **kw):
    """A Trainer of ``scene`` (default: :func:`tiny_scene`) on ``guidance`` (default: its
    oracle) with the text condition ``txt``."""
    if scene is None:
        scene, mesh = tiny_scene()
    return Trainer(
        scene=scene,
        guidance=oracle_for(scene) if guidance is None else guidance,
        text=txt,
        method=m,
        width=W,
        height=H,
        meshes={"obj_0": mesh},
        surface_voxel_size={"obj_0": 0.05},
        **kw,
    )


def test_coarse_then_fine_equals_one_run(tmp_path):
    m = method(add_cp_objs=["obj_0"], add_cp_layer_iter=5, add_cp_num=12, surface_target_num=200)
    one = make_trainer(m)
    run_steps(one, 1, 9)
    coarse = make_trainer(m)
    run_steps(coarse, 1, 5)
    checkpoint.save_checkpoint(tmp_path / "coarse.pt", checkpoint.contents(coarse, 4, "h"))
    fine = make_trainer(m)
    start = checkpoint.restore(fine, checkpoint.load_checkpoint(tmp_path / "coarse.pt"))
    assert start == 5
    run_steps(fine, start, 9)
    a, b = one.scene.dynamic["obj_0"], fine.scene.dynamic["obj_0"]
    assert a.layer2 is not None and b.layer2 is not None
    for (k, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), k
    sa, sb = one.optimizers["obj_0"].state_dict(), fine.optimizers["obj_0"].state_dict()
    for i in sa["state"]:
        assert torch.equal(sa["state"][i]["exp_avg"], sb["state"][i]["exp_avg"])


def test_training_moves_toward_the_oracle_target():
    m = method(iterations=30, batch_size=1, lambda_arap=0.0, lambda_dis_time=0.0)
    tr = make_trainer(m)
    obj = tr.scene.dynamic["obj_0"]
    with torch.no_grad():
        obj.layer1.cp_deform.zero_()
    run_steps(tr, 1, 31)
    with torch.no_grad():
        pos, _ = obj.deform(range(T))
    lift = (pos[1:, :, 1] - obj.rest_means[:, 1]).mean()
    assert 0.02 < float(lift) < 0.2  # the block rose toward the target's +0.1


@pytest.mark.parametrize("loss", ["temporal", "arap", "ground"])
def test_the_regularisers_train_the_deformation_not_the_radii_or_rotations(loss):
    """METHOD §16: the ground, temporal and ARAP losses see the skinning weights detached, so
    their gradients reach the control points' deformations only, never their radii and
    rotations (which SDS alone trains). Each loss alone, at an iteration where it is on."""
    weights = {"lambda_dis_time": 0.0, "lambda_arap": 0.0, "lambda_ground": 0.0}
    weights[{"temporal": "lambda_dis_time", "arap": "lambda_arap"}.get(loss, "lambda_ground")] = 1.0
    m = method(iterations=8, batch_size=1, gl_objects=["obj_0"], **weights)
    tr = make_trainer(m)
    obj = tr.scene.dynamic["obj_0"]
    with torch.no_grad():  # a motion to regularise, below the ground too
        obj.layer1.cp_deform.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    tr.ground_level = 0.3
    out = tr.regularisers(4, tr.cameras_at(4))
    assert out[loss] > 0 and {k for k, v in out.items() if v} == {loss}
    groups = obj.param_groups()
    assert float(groups["cp_deform"].grad.abs().sum()) > 0
    for name in ("cp_radius", "cp_rotation"):
        grad = groups[name].grad
        assert grad is None or not grad.any(), f"the {loss} loss trains {name}"


def test_progressive_reset_zeroes_the_table_moments_and_keeps_the_step():
    m = method(back_iter=3)
    tr = make_trainer(m)
    run_steps(tr, 1, 3)
    p = tr.scene.dynamic["obj_0"].layer1.cp_deform
    before = tr.optimizers["obj_0"].state[p]["step"].clone()
    tr.before_step(3)
    st = tr.optimizers["obj_0"].state[p]
    assert float(st["exp_avg"].abs().max()) == 0.0 and torch.equal(st["step"], before)
    q, tau = tr.scene.dynamic["obj_0"].layer1.transforms(torch.arange(T))
    torch.testing.assert_close(tau[3:], tau[2:3].expand(2, -1, -1))


def test_non_finite_gradients_skip_the_step():
    m = method(iterations=4, batch_size=1)
    tr = make_trainer(m)
    obj = tr.scene.dynamic["obj_0"]
    before = obj.layer1.cp_deform.detach().clone()
    # an infinite teacher velocity (NaNs would be zeroed by RF-SDS itself, METHOD §11)
    tr.guidance.velocity = lambda z_t, *a, **k: torch.full_like(z_t, float("inf"))
    rec = tr.step(2)
    assert rec["skipped"] == 1 and tr.nonfinite == 1
    assert torch.equal(obj.layer1.cp_deform.detach(), before)
    assert np.isfinite(before.numpy()).all()


class FlakyTeacher:
    """The oracle, but its velocity is infinite until use_float32() is called."""

    def __init__(self, oracle):
        self.oracle, self.fp32, self.calls = oracle, False, 0

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def velocity(self, z_t, *args, **kw):
        self.calls += 1
        v = self.oracle.velocity(z_t, *args, **kw)
        return v if self.fp32 else torch.full_like(v, float("inf"))

    def use_float32(self):
        self.fp32 = True


def test_non_finite_steps_roll_back_and_fall_back_to_float32(tmp_path):
    m = method(iterations=6, batch_size=1, save_interval=2)
    tr = make_trainer(m)
    oracle = tr.guidance
    tr.guidance = FlakyTeacher(oracle)
    tr.guidance.fp32 = True  # healthy for the first iterations
    run_loop.run(tr, 1, 3, config_hash="h", checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000001.pt", "ckpt_000002.pt"]
    tr.guidance.fp32 = False  # now every step is non-finite until the fallback
    watch = progress.Progress(
        tmp_path / "progress", scene="s", stage="coarse", start=3, last=6, every_s=0
    )
    last = run_loop.run(
        tr, 3, 7, config_hash="h", checkpoint_dir=tmp_path, max_nonfinite_steps=2, progress=watch
    )
    assert last == 6 and tr.guidance.fp32 and tr.nonfinite == 0
    # the roll-back (two failed steps, 3 and 4, back to the checkpoint of 2) and the fallback
    # each have their line and record; the failed span is marked, not counted twice
    events = progress.read_records(tmp_path / "progress" / progress.JSONL)
    kinds = [(r["event"], r["it"]) for r in events if "event" in r]
    assert kinds == [("start", 3), ("rollback", 4), ("float32", 3)]
    assert [r["it"] for r in events if "event" not in r] == [3, 4, 5, 6]
    marked = (tmp_path / "progress" / progress.JSONL).read_text().count('"superseded": "rollback"')
    assert marked == 1  # iteration 3's first, non-finite try
    stuck = make_trainer(m)
    stuck.guidance = FlakyTeacher(stuck.guidance)
    stuck.guidance.fp32 = True
    run_loop.run(stuck, 1, 3, config_hash="h", checkpoint_dir=tmp_path / "stuck")
    stuck.guidance.fp32 = False
    stuck.guidance.use_float32 = lambda: None  # a fallback that does not help
    with pytest.raises(RuntimeError, match="non-finite steps in a row persist after rolling"):
        run_loop.run(
            stuck, 3, 7, config_hash="h", checkpoint_dir=tmp_path / "stuck", max_nonfinite_steps=2
        )


def test_non_finite_fallback_none_keeps_the_guidance_precision(tmp_path):
    tr = make_trainer(method(iterations=6, batch_size=1, save_interval=2))
    tr.guidance = FlakyTeacher(tr.guidance)
    tr.guidance.fp32 = True
    run_loop.run(tr, 1, 3, config_hash="h", checkpoint_dir=tmp_path)
    tr.guidance.fp32 = False
    with pytest.raises(RuntimeError, match="persist after rolling back"):
        run_loop.run(
            tr,
            3,
            7,
            config_hash="h",
            checkpoint_dir=tmp_path,
            max_nonfinite_steps=2,
            fallback="none",
        )
    assert not tr.guidance.fp32  # never switched


def test_sigterm_writes_a_checkpoint_and_stops(tmp_path):
    import os
    import signal

    m = method(iterations=6, batch_size=1, save_interval=100)
    tr = make_trainer(m)

    def log(rec):
        if rec["it"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    watch = progress.Progress(tmp_path / "progress", scene="s", stage="coarse", start=1, last=6)
    with pytest.raises(run_loop.Interrupted):
        run_loop.run(tr, 1, 7, config_hash="h", checkpoint_dir=tmp_path, log=log, progress=watch)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*")) == ["ckpt_000001.pt", "ckpt_000002.pt"]
    assert json.loads((tmp_path / "progress" / progress.LATEST).read_text())["event"] == "sigterm"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored


class Killed(Exception):
    """The process killed outright (SIGKILL, ``scancel --full``): no handler runs."""


def dies_at(trainer, at: int) -> None:
    """``trainer`` is killed when iteration ``at`` starts, after finishing the ones before."""
    step = trainer.step

    def dying(it):
        if it == at:
            raise Killed(f"killed in iteration {it}")
        return step(it)

    trainer.step = dying


def test_a_run_killed_between_save_points_keeps_its_newest_finished_iteration(tmp_path):
    """Save points 1, 5 and 6 (N = 9, ⌊2N/3⌋ = 6): killed in iteration 5, the run has kept
    iteration 4's checkpoint (each newest one replacing the one before) besides the save point
    1's, and a resume starts from it with iteration 4's state."""
    from chord.motion import state

    tr = make_trainer(method(iterations=9, batch_size=1, save_interval=100))
    assert run_loop.save_points(tr.method) == {1, 5, 6}
    dies_at(tr, 5)
    with pytest.raises(Killed):
        run_loop.run(tr, 1, 10, config_hash="h", checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*")) == ["ckpt_000001.pt", "ckpt_000004.pt"]
    newest = resume.newest_checkpoint(tmp_path)
    assert newest["iteration"] == 4
    now, _ = state.to_dict(tr.scene)  # the trainer after iteration 4: the kill came before 5
    for k, v in now.items():
        assert torch.equal(newest["motion"][k], v), k


def test_split_render_backward_empties_the_cuda_cache_after_each_chunk(monkeypatch):
    """METHOD §15: each re-render chunk backpropagates, then empties the cache (and so does the
    encoder backward before them); on a CPU the call is a no-op, so it is counted here."""
    calls = []
    monkeypatch.setattr(cuda_settings, "empty_cache", lambda device: calls.append(device))
    m = method(batch_size=2)
    tr = make_trainer(m, memory=flags(True, True, 2))
    tr.sds(3, tr.cameras_at(3))
    chunks = len(range(0, T, 2))  # frames [0, 2), [2, 4), [4, 5)
    assert calls == [tr.device] * (1 + chunks) * m.batch_size


class NaNTeacher(FlakyTeacher):
    """The oracle, with a few NaN entries in its velocity until use_float32() is called."""

    def velocity(self, z_t, *args, **kw):
        v = self.oracle.velocity(z_t, *args, **kw)
        if not self.fp32:
            v = v.contiguous().clone()
            v.view(-1)[:3] = float("nan")
        return v


def test_nan_from_the_teacher_is_a_non_finite_step_that_rolls_back(tmp_path):
    """sds_grad zeroes NaN entries (METHOD §11), so they would vanish; the step is skipped
    and counted instead, and persistent NaNs roll back and switch to float32."""
    tr = make_trainer(method(iterations=6, batch_size=1, save_interval=2))
    tr.guidance = NaNTeacher(tr.guidance)
    before = {k: p.detach().clone() for k, p in tr.scene.dynamic["obj_0"].param_groups().items()}
    rec = tr.step(1)
    assert rec["skipped"] == 1 and rec["nan"] == 3 and tr.nonfinite == 1
    for k, p in tr.scene.dynamic["obj_0"].param_groups().items():
        assert p.equal(before[k]), k  # no Adam step
    tr = make_trainer(method(iterations=6, batch_size=1, save_interval=2))
    tr.guidance = NaNTeacher(tr.guidance)
    tr.guidance.fp32 = True
    rows = []
    run_loop.run(tr, 1, 3, config_hash="h", checkpoint_dir=tmp_path, log=rows.append)
    tr.guidance.fp32 = False
    run_loop.run(
        tr, 3, 7, config_hash="h", checkpoint_dir=tmp_path, log=rows.append, max_nonfinite_steps=2
    )
    assert [r["nan"] for r in rows][:4] == [0, 0, 3, 3] and tr.guidance.fp32  # rolled back


def test_float32_fallback_is_not_taken_where_the_memory_model_says_it_will_not_fit(
    tmp_path, caplog
):
    """An A14B expert in float32 is 57 GiB of weights alone (91 GiB reserved in all at 832x480 on
    the full tier): where it cannot fit, the fallback would run out of memory hours into a
    run. It is checked first and, when it does not fit (here: a 48 GiB GPU at the test's tiny
    size), the run retries at its precision and then stops with the reason."""
    from chord.resources import peak_memory

    m = method(iterations=6, batch_size=1, save_interval=2)
    for gib, switches in ((48, False), (200, True)):
        tr = make_trainer(m, gpu_memory_bytes=gib * peak_memory.GiB)
        tr.guidance = FlakyTeacher(tr.guidance)
        tr.guidance.model_shape = peak_memory.A14B
        tr.guidance.fp32 = True
        folder = tmp_path / str(gib)
        run_loop.run(tr, 1, 3, config_hash="h", checkpoint_dir=folder)
        tr.guidance.fp32 = False
        if switches:
            run_loop.run(tr, 3, 7, config_hash="h", checkpoint_dir=folder, max_nonfinite_steps=2)
            assert tr.guidance.fp32
            continue
        assert "in float32 the memory model predicts" in float32_fallback.problem(tr)
        with pytest.raises(RuntimeError, match="persist after rolling back"):
            run_loop.run(tr, 3, 7, config_hash="h", checkpoint_dir=folder, max_nonfinite_steps=2)
        assert not tr.guidance.fp32
        assert "float32 fallback not taken: in float32 the memory model predicts" in caplog.text


class ClockedTrainer:
    """A trainer whose iterations take ``first_s`` (the first: loading, warm-up) then
    ``each_s`` seconds of the clock ``clock`` (a list holding the time), training nothing."""

    def __init__(self, method, clock, first_s, each_s):
        self.method, self.clock, self.first_s, self.each_s = method, clock, first_s, each_s
        self.nonfinite, self.steps = 0, 0
        self.group = type("Solo", (), {"any": staticmethod(lambda flag, what: flag)})()

    def step(self, it):
        self.clock[0] += self.first_s if self.steps == 0 else self.each_s
        self.steps += 1
        return {"it": it, "sds": 0.0, "arap": 0.0, "cfg": 1.0}


@pytest.mark.parametrize(("early_stop", "final"), [(True, 20), (False, 30)])
def test_the_log_projects_the_run_time_and_warns_past_the_tiers_runtime(
    early_stop, final, monkeypatch, caplog
):
    """After the first iteration (100 s) and PROJECT_AFTER = 3 more (10 s each), the run of
    iterations 1..final (⌊2N/3⌋ = 20 of N = 30 with early_stop) is projected at 130 s so far
    plus 10 s for each of the final - 4 left; beyond the tier's runtime_h it warns, naming it."""
    clock = [0.0]
    monkeypatch.setattr(run_loop.time, "perf_counter", lambda: clock[0])
    m = method(iterations=30, early_stop=early_stop)
    projected = 130.0 + 10.0 * (final - 4)
    for runtime_h, warned in ((projected / 3600 * 0.99, True), (projected / 3600 * 1.01, False)):
        caplog.clear()
        with caplog.at_level("INFO", logger="chord.training.run_loop"):
            last = run_loop.run(
                ClockedTrainer(m, clock, 100.0, 10.0),
                1,
                31,
                config_hash="h",
                runtime_h=runtime_h,
                tier="split",
            )
        assert last == final
        info = [r.getMessage() for r in caplog.records if "projected run time" in r.getMessage()]
        assert info == [
            f"projected run time of iterations 1..{final}: {projected / 3600:.2f} h "
            "(10.0 s per iteration after the first, 100.0 s)"
        ]
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == warned, warnings
        if warned:
            assert "tiers.split.runtime_h" in warnings[0] and f"1..{final}" in warnings[0]
    assert run_loop.project_run_time(130.0, 100.0, 3, 16) == pytest.approx(290.0)
    assert run_loop.check_projection(3600.0, 1, 20, None, "full") is None  # no limit known


class FakeTime:
    """run_loop's clock: the wall clock and the timer both read ``clock[0]`` seconds."""

    def __init__(self, clock):
        self.clock = clock

    def time(self):
        return self.clock[0]

    def perf_counter(self):
        return self.clock[0]


# What the stop at the time limit leaves for after the checkpoint's write: scontrol requeue
# and the exit of the job's processes (slurm_time_limit.time_limit). A job still running at
# its limit is killed, its last checkpoint perhaps half written.
REQUEUE_AND_EXIT_S = 20.0


def run_to_the_limit(monkeypatch, deadline: float, each_s=10.0, write_s=5.0):
    """A run of iterations 1..30 on a fake clock from 0 s: each iteration takes ``each_s``,
    each checkpoint write ``write_s`` more, the job ends at ``deadline``. Returns (the
    TimeLimit raised, the iteration and the end time of each checkpoint written)."""
    clock, written = [0.0], []
    monkeypatch.setattr(run_loop, "time", FakeTime(clock))
    monkeypatch.setattr(run_loop.checkpoint, "contents", lambda tr, it, h: {"iteration": it})

    def write(path, ckpt):
        clock[0] += write_s
        written.append((ckpt["iteration"], clock[0]))

    monkeypatch.setattr(run_loop, "save_checkpoint", write)
    tr = ClockedTrainer(method(iterations=30, early_stop=False), clock, each_s, each_s)
    with pytest.raises(run_loop.TimeLimit) as stop:
        run_loop.run(tr, 1, 31, config_hash="h", checkpoint_dir=Path("unused"), deadline=deadline)
    return stop.value, written


@pytest.mark.parametrize("phase", [0.0, 2.5, 5.0, 7.5, 10.0, 12.5])
def test_the_time_limit_stop_writes_its_checkpoint_with_time_to_spare(phase, monkeypatch):
    """Iterations of 10 s, checkpoints of 5 s, the deadline anywhere in an iteration: the run
    stops with its last iteration's checkpoint written at least REQUEUE_AND_EXIT_S before the
    deadline, and not an iteration earlier than it must."""
    deadline = 300.0 + phase
    stop, written = run_to_the_limit(monkeypatch, deadline)
    last, done = written[-1]
    assert f"stopped after iteration {last}" in str(stop)
    assert deadline - done >= REQUEUE_AND_EXIT_S, (last, done, deadline)
    # and it kept no more than the rule's two iterations (15 s each) of slack besides
    assert deadline - done < REQUEUE_AND_EXIT_S + 2 * 15.0


def test_the_stop_keeps_two_of_the_slowest_iterations_and_the_margin_free(monkeypatch):
    """The rule (run_loop.run): stop after the first iteration that leaves less than two of the
    slowest iterations (15 s with the checkpoint) plus STOP_MARGIN_S = 20 s before the
    deadline. Iteration k's work ends at 15k - 5 s: with the deadline half a second short of
    iteration 10's 145 + 50 s it stops after 10; half a second past it, after 11."""
    stop, written = run_to_the_limit(monkeypatch, 145.0 + 50.0 - 0.5)
    assert written[-1][0] == 10 and "after iteration 10" in str(stop)
    stop, written = run_to_the_limit(monkeypatch, 145.0 + 50.0 + 0.5)
    assert written[-1][0] == 11 and "after iteration 11" in str(stop)


def test_the_time_limit_stop_says_how_much_time_was_left(monkeypatch):
    stop, written = run_to_the_limit(monkeypatch, 194.0)  # stops after 10, written at 150 s
    assert written[-1] == (10, 150.0)
    assert str(stop) == (
        "time limit in 44 s, the slowest iteration took 15.0 s: stopped after iteration 10; "
        "checkpoint written"
    )


def test_each_iteration_logs_its_count_of_non_finite_entries(tmp_path):
    """The loss log's nonfinite_entries: the NaN or ±inf entries of the teacher's velocities
    plus those of the averaged gradients, every iteration (0 when finite). NaNs in the
    velocity are zeroed by sds_grad (the gradients stay finite: 3 entries in all); an infinite
    velocity makes every entry of it and the gradients it reaches non-finite."""
    from chord.training.loss_log import LossLog

    tr = make_trainer(method(iterations=6, batch_size=1, save_interval=2))
    teacher = NaNTeacher(tr.guidance)
    tr.guidance = teacher
    log = LossLog(tmp_path / "losses.tsv", 1)
    teacher.fp32 = True  # finite
    log(tr.step(1))
    teacher.fp32 = False  # 3 NaN entries per velocity
    log(tr.step(2))
    log.close()
    rows = (tmp_path / "losses.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    col, nan = head.index("nonfinite_entries"), head.index("nan")
    assert [(r.split("\t")[nan], r.split("\t")[col]) for r in rows[1:]] == [("0", "0"), ("3", "3")]
    inf = make_trainer(method(iterations=4, batch_size=1))
    size = []

    def infinite(z_t, *a, **k):
        size.append(z_t.numel())
        return torch.full_like(z_t, float("inf"))

    inf.guidance.velocity = infinite
    rec = inf.step(2)
    grads = sum(
        p.numel() for p in inf.scene.dynamic["obj_0"].param_groups().values() if p.requires_grad
    )
    assert rec["skipped"] == 1 and rec["nan"] == 0
    assert sum(size) < rec["nonfinite_entries"] <= sum(size) + grads


def contact_scene():
    """The tiny block on its slab, with 8 control points through the block and 400 surface
    samples of it as its surface set (the contact loss acts on that set)."""
    from chord.evaluation import metrics

    mesh, dyn = box_splats((0.3, 0.5, 0.3), (0.0, 0.25, 0.0), 300, 0)
    slab_mesh, slab = box_splats((1.2, 0.05, 1.0), (0.0, -0.025, 0.0), 150, 1)
    surface = metrics.surface_samples(mesh.vertices, mesh.faces, 400, seed=1)
    corners = [[x, y, z] for x in (-0.07, 0.07) for y in (0.1, 0.4) for z in (-0.07, 0.07)]
    obj = DynamicObject(
        "obj_0",
        dyn["means"],
        dyn["quats"],
        torch.tensor(corners, dtype=torch.float32),
        torch.as_tensor(surface, dtype=torch.float32),
        frame_num=T,
        arap_sample_num=64,
    )
    return MotionScene(["obj_0", "obj_1"], [dyn, slab], {"obj_0": obj}), mesh, slab_mesh


def shifted_oracle(scene, dy):
    """The oracle toward the block moved ``dy`` up (down: into the slab) after frame 0."""
    means = scene.means[None].repeat(T, 1, 1)
    means[1:, scene.slices["obj_0"], 1] += dy
    target = {"means": means, "quats": scene.quats[None].expand(T, -1, -1)}
    target.update({k: getattr(scene, k) for k in ("scales", "opacities", "sh", "sh_degree")})
    return OracleGuidance(target, width=W, height=H, pool=4)


def trained_interaction(dy: float, **weights) -> tuple[dict, list[dict]]:
    """The evaluate stage's interaction summary of the block after 20 iterations toward a
    teacher that moves it ``dy`` up, with the contact ``weights``, and the logged losses."""
    from chord.evaluation import metrics
    from chord.motion import contact

    scene, mesh, slab_mesh = contact_scene()
    grid = contact.signed_distance_grid([(slab_mesh.vertices, slab_mesh.faces)])
    m = method(iterations=20, batch_size=1, **weights)
    S = metrics.surface_samples(mesh.vertices, mesh.faces, 1024, seed=0)
    tr = make_trainer(
        m,
        scene,
        mesh,
        guidance=shifted_oracle(scene, dy),
        contact_grid=grid,
        contact_points={"obj_0": S},
    )
    logged = [tr.step(it) for it in range(1, 21)]
    with torch.no_grad():
        x = torch.as_tensor(S, dtype=torch.float32)
        P, _ = scene.dynamic["obj_0"].deform(range(T), x, with_rotations=False)
    pair = metrics.pair_interaction(P.double().numpy(), slab_mesh.vertices, slab_mesh.faces)
    summary = metrics.interaction_summary(
        [{"object": "obj_0", "other": "obj_1", **pair}], rest_tolerance=0.005
    )
    return summary, logged


def test_the_contact_loss_keeps_a_block_out_of_the_slab_its_teacher_pushes_it_into():
    """Issue 36: with a teacher that sinks the block 0.04 into the slab, the evaluate stage's
    penetration_excess of the trained motion is far smaller with lambda_contact than without;
    the loss is logged, and 0 when off."""
    excess, logged = {}, {}
    for lam in (0.0, 1e8):
        summary, log = trained_interaction(-0.04, lambda_contact=lam, lambda_support=0.0)
        excess[lam], logged[lam] = summary["penetration_excess"], [r["contact"] for r in log]
    assert excess[0.0] > 0.003  # the teacher does push it in (0.0049 when written)
    assert excess[1e8] < excess[0.0] / 5  # 0.0003 when written
    assert set(logged[0.0]) == {0.0} and max(logged[1e8]) > 0


def test_the_support_loss_keeps_a_resting_block_on_the_slab_its_teacher_lifts_it_off():
    """Issue 36's support term: with a teacher that lifts the resting block 0.1, the evaluate
    stage's float_gap of the trained motion is far smaller with lambda_support than without,
    and the contact loss (its default) keeps it from being pulled into the slab instead;
    logged, and 0 when off."""
    gap, sunk, logged = {}, {}, {}
    for lam in (0.0, 1e7):
        summary, log = trained_interaction(0.1, lambda_contact=1e8, lambda_support=lam)
        gap[lam], sunk[lam] = summary["float_gap"], summary["penetration_excess"]
        logged[lam] = [r["support"] for r in log]
    assert gap[0.0] > 0.005  # the teacher does lift it (0.0096 when written)
    assert gap[1e7] < gap[0.0] / 5, gap  # 0.0010 when written
    assert sunk[1e7] < 0.001, sunk  # 0.0001 when written
    assert set(logged[0.0]) == {0.0} and max(logged[1e7]) > 0


# --- the loop's bookkeeping on a trainer that trains nothing ------------------------------


class ScriptedTrainer:
    """A trainer that trains nothing: iteration ``it``'s step is non-finite once for each time
    ``it`` is in ``fail_once``, always if in ``fail_always``. ``run`` lists the iterations
    stepped (more than 40 fails the test: a loop that does not end)."""

    def __init__(self, method, fail_once=(), fail_always=(), guidance=None):
        self.method, self.fail_once, self.fail_always = method, list(fail_once), set(fail_always)
        self.run, self.nonfinite, self.guidance = [], 0, guidance
        self.float32_fallback, self.gpu_memory_bytes, self.host_memory_bytes = False, None, None
        self.group = type("Solo", (), {"any": staticmethod(lambda flag, what: flag)})()

    def step(self, it):
        self.run.append(it)
        assert len(self.run) <= 40, f"the run loop does not end: {self.run}"
        failed = it in self.fail_always or it in self.fail_once
        if it in self.fail_once:
            self.fail_once.remove(it)
        self.nonfinite = self.nonfinite + 1 if failed else 0
        return {"it": it, "sds": 0.0, "arap": 0.0, "cfg": 1.0}


@pytest.fixture
def light_checkpoints(monkeypatch):
    """checkpoint.contents and restore of a ScriptedTrainer (its iteration only, in the real
    file format); returns the iterations restored."""
    restored = []

    def contents(trainer, it, config_hash):
        return {"format": checkpoint.CKPT_FORMAT, "iteration": it, "config_hash": config_hash}

    def restore(trainer, ckpt):
        restored.append(ckpt["iteration"])
        return ckpt["iteration"] + 1

    monkeypatch.setattr(checkpoint, "contents", contents)
    monkeypatch.setattr(checkpoint, "restore", restore)
    return restored


def saved(folder):
    return sorted(int(p.stem.removeprefix("ckpt_")) for p in folder.glob("ckpt_*.pt"))


def test_save_points_and_the_last_iteration_follow_method_19():
    assert run_loop.save_points(method(iterations=30, save_interval=100)) == {1, 5, 20}
    assert run_loop.save_points(method(iterations=9, save_interval=4)) == {1, 4, 5, 6, 8}
    early, full = method(iterations=9, early_stop=True), method(iterations=9, early_stop=False)
    assert (run_loop.last_iteration(early, 10), run_loop.last_iteration(full, 10)) == (6, 9)
    assert run_loop.last_iteration(early, 4) == 3  # a run stopped before ⌊2N/3⌋
    ten = run_loop.last_iteration(method(iterations=10, early_stop=True), 11)
    assert ten == 6 and type(ten) is int  # ⌊20/3⌋, an iteration
    # a SIGTERM's exit status is the shell's for it, which Slurm and Snakemake read
    assert run_loop.Interrupted.exit_code == 128 + 15
    assert issubclass(run_loop.TimeLimit, run_loop.Interrupted)


def test_a_run_keeps_its_save_points_and_its_last_iteration(tmp_path, light_checkpoints):
    m = method(iterations=10, save_interval=4, early_stop=False)
    tr = ScriptedTrainer(m)
    assert run_loop.run(tr, 1, 11, config_hash="h", checkpoint_dir=tmp_path / "a") == 10
    assert tr.run == list(range(1, 11)) and saved(tmp_path / "a") == [1, 4, 5, 6, 8, 10]
    # the last iteration is saved even when its step was non-finite
    bad_end = ScriptedTrainer(m, fail_once=[10])
    run_loop.run(bad_end, 1, 11, config_hash="h", checkpoint_dir=tmp_path / "z")
    assert saved(tmp_path / "z") == [1, 4, 5, 6, 8, 10]
    m = method(iterations=9, save_interval=4, early_stop=False)
    resumed = ScriptedTrainer(m)
    assert run_loop.run(resumed, 7, 10, config_hash="h", checkpoint_dir=tmp_path / "b") == 9
    assert resumed.run == [7, 8, 9] and saved(tmp_path / "b") == [8, 9]
    run_loop.run(ScriptedTrainer(m), 1, 10, config_hash="h", checkpoint_dir=tmp_path / "c",
                 writer=False)  # fmt: skip
    assert saved(tmp_path / "c") == []  # only rank 0 writes
    early = ScriptedTrainer(method(iterations=9, save_interval=4, early_stop=True))
    assert run_loop.run(early, 1, 10, config_hash="h", checkpoint_dir=tmp_path / "d") == 6
    assert early.run == [1, 2, 3, 4, 5, 6] and saved(tmp_path / "d") == [1, 4, 5, 6]


class Teacher:
    """A guidance with a float32 switch."""

    fp32 = False

    def use_float32(self):
        self.fp32 = True


class Events:
    """A Progress that records the events only."""

    def __init__(self):
        self.events = []

    def step(self, it, rec, seconds):
        pass

    def event(self, kind, it, **kw):
        self.events.append((kind, it, kw))


def test_non_finite_steps_roll_back_to_the_newest_checkpoint(tmp_path, light_checkpoints):
    """Two non-finite steps in a row (4 and 5) roll back to the newest checkpoint (3), the
    guidance falls back to float32, and the count starts again from there."""
    m = method(iterations=8, save_interval=100, early_stop=False)
    tr = ScriptedTrainer(m, fail_once=[4, 5, 6], guidance=Teacher())
    watch = Events()
    last = run_loop.run(
        tr, 1, 9, config_hash="h", checkpoint_dir=tmp_path, max_nonfinite_steps=2, progress=watch
    )
    assert last == 8 and light_checkpoints == [3]
    assert tr.run == [1, 2, 3, 4, 5, 4, 5, 6, 7, 8] and tr.nonfinite == 0
    assert tr.guidance.fp32 and tr.float32_fallback
    assert watch.events == [
        ("rollback", 5, {"to": 3, "nonfinite": 2}),
        ("float32", 4, {"taken": True}),
    ]
    kept = ScriptedTrainer(m, fail_once=[4, 5], guidance=Teacher())
    watch = Events()
    run_loop.run(kept, 1, 9, config_hash="h", checkpoint_dir=tmp_path / "none",
                 max_nonfinite_steps=2, fallback="none", progress=watch)  # fmt: skip
    assert not kept.guidance.fp32 and [e[0] for e in watch.events] == ["rollback"]


def test_non_finite_steps_that_persist_after_a_roll_back_stop_the_run(tmp_path, light_checkpoints):
    m = method(iterations=8, save_interval=100, early_stop=False)
    tr = ScriptedTrainer(m, fail_always=[4, 5])
    with pytest.raises(RuntimeError, match="iteration 5: 2 non-finite steps in a row persist"):
        run_loop.run(tr, 1, 9, config_hash="h", checkpoint_dir=tmp_path, max_nonfinite_steps=2)
    assert tr.run == [1, 2, 3, 4, 5, 4, 5] and light_checkpoints == [3]
    nowhere = ScriptedTrainer(m, fail_always=[2, 3])  # no checkpoint to roll back to
    with pytest.raises(RuntimeError, match="iteration 3"):
        run_loop.run(nowhere, 1, 9, config_hash="h", max_nonfinite_steps=2)
    assert light_checkpoints == [3]


def test_the_projection_averages_the_iterations_right_after_the_first(monkeypatch, caplog):
    """The projection comes after the first iteration and PROJECT_AFTER (3) more: a slow
    fifth iteration is not in it."""
    clock = [0.0]
    monkeypatch.setattr(run_loop.time, "perf_counter", lambda: clock[0])
    tr = ClockedTrainer(method(iterations=30, early_stop=False), clock, 100.0, 10.0)
    step = tr.step

    def slow_fifth(it):
        clock[0] += 990.0 if it == 5 else 0.0
        return step(it)

    tr.step = slow_fifth
    with caplog.at_level("INFO", logger="chord.training.run_loop"):
        run_loop.run(tr, 1, 31, config_hash="h")
    assert "(10.0 s per iteration after the first, 100.0 s)" in caplog.text
