"""bench/gpu_check.py in this process: its rows, each failure a row (fail soft), its budgets
and report (the --tiny run as a user runs it, in its own process: tests/processes/
test_gpu_check_run.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch

from bench import fixtures
from bench import gpu_check as mod
from chord.resources import peak_memory
from tests import components

RUN_TIER = mod.run_tier  # the real one, for tests that replace it in main()


@pytest.fixture(autouse=True)
def no_collections(monkeypatch):
    """The check collects garbage between its rows, to measure each tier from a clean heap; in
    this process (torch, diffusers and the suite loaded) a collection takes about a second,
    and the tests' rows allocate nothing: the in-process tests skip them (the --tiny run in its
    own process collects)."""
    monkeypatch.setattr(mod, "gc", SimpleNamespace(collect=lambda *a: 0))


@pytest.fixture(scope="module")
def contact():
    """The check's contact inputs (meshes, the slab's distance grid, the block's points) at the
    tiny size, for tests that hand tier_rows a context of their own (the grid takes ~0.5 s)."""
    method = mod.workflow_method(64, 48, 9, 2)
    return mod.fake_iteration.block_on_slab(method, gaussians=100)[1:]


def test_an_out_of_memory_tier_is_a_row_and_the_next_tier_runs(monkeypatch, capsys, contact):
    calls = []

    def fake_run_tier(name, flags, size, ctx):
        calls.append(name)
        if name == "split":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if name == "offload":
            raise RuntimeError("something else broke")
        return {"status": "ok", "allocated": 1, "reserved": 2, "s_it": 1.0}

    monkeypatch.setattr(mod, "run_tier", fake_run_tier)
    ctx = {
        "tiny": True,
        "cuda": False,
        "width": 64,
        "height": 48,
        "frames": 9,
        "batch": 2,
        "gaussians": 2000,
        "peak": mod.Peak(False),
        "shape": peak_memory.A14B,
        "tiers": mod.tier_table(64, 48),
        "verbose": False,
        "method": mod.workflow_method(64, 48, 9, 2),
    }
    ctx["contact"] = contact
    rows = mod.tier_rows(ctx, ["full", "split", "offload", "lowres"])
    assert calls == ["full", "split", "offload", "lowres"]
    assert [r["status"] for r in rows] == [
        "ok",
        "out of memory",
        "error: RuntimeError: something else broke",
        "ok",
    ]
    assert "out of memory" in capsys.readouterr().out


def test_extra_parts_fail_soft():
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 57.00 GiB")

    assert mod.soft(oom) == {"status": "out of memory"}
    assert mod.soft(lambda: 1 / 0)["status"] == "error: ZeroDivisionError: division by zero"
    # the float32 row without an expert on disk is a row with the reason, not a crash
    ctx = {"saved": {"status": "skipped: 1.0 GiB free"}, "folder": None, "device": "cpu"}
    guidance = mod.float32_guidance(ctx, {})
    assert "no expert on disk" in mod.soft(guidance, None)["status"]


def test_render_timing_code_path_with_the_torch_rasteriser(monkeypatch):
    """The GPU-only timing loop, run on the CPU with the torch rasteriser alone (CUDA's
    synchronisation and memory counters stubbed)."""
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(mod.torch.cuda, name, lambda: None)
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(mod.torch.cuda, name, lambda: 0)
    scene = fixtures.block_scene(200, 8)
    out = mod.render_timing(scene, 32, 24, torch.device("cpu"), runs=2, backends=("torch",))
    assert out["status"] == "ok" and "gsplat" not in out
    for mode in ("forward", "backward"):
        assert out["torch"][mode]["s"] > 0 and out["torch"][mode]["runs"] == 2
    mod.print_render_timing(out)


def test_without_a_gpu_the_full_check_asks_for_tiny():
    if torch.cuda.is_available():
        components.missing(components.CPU_ONLY, "this machine has a GPU")
    with pytest.raises(SystemExit):
        mod.main([])


def test_the_tier_table_is_the_configs_tiers_with_split_plain():
    cfg = fixtures.load_config()  # the workflow's loading, scene sheet and all
    table = mod.tier_table(832, 480)
    assert list(table) == ["full", "split", "split_plain", "offload", "lowres", "lowres_min"]
    assert table["full"] == (cfg.memory, (832, 480))
    split, plain = table["split"][0], table["split_plain"][0]
    assert split.split_sds_backward and split.split_render_backward and split.checkpoint_tiny_vae
    assert split.split_render_chunk_size == 21
    assert plain == dataclasses.replace(split, checkpoint_tiny_vae=False)
    offload = table["offload"][0]
    assert offload == dataclasses.replace(split, enable_mmgp=True)
    assert (offload.mmgp_profile, offload.mmgp_transformer_budget) == (4.0, 100)
    assert table["lowres"] == (offload, (576, 320))
    assert table["lowres_min"] == (offload, (416, 240))
    # a tier's size only ever lowers the method's
    assert mod.tier_table(64, 48)["lowres"][1] == (64, 48)


def test_the_tiny_expert_has_the_parameters_the_memory_model_counts():
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        tiny = WanTransformer3DModel(
            **peak_memory.transformer_kwargs(mod.TINY, rope_max_seq_len=64)
        )
    assert sum(p.numel() for p in tiny.parameters()) == peak_memory.dit_params(mod.TINY)


@pytest.fixture
def quick_main(monkeypatch, tmp_path):
    """main() on the CPU (--tiny) with the tiers' training replaced by ``fake(name, ctx)``:
    returns (run(args, fake) -> report, calls)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    out = tmp_path / "check.json"
    calls = []

    def run(args, fake):
        def fake_run_tier(name, mem, size, ctx):
            on_disk = json.loads(out.read_text()) if out.exists() else {}
            calls.append((name, [r["tier"] for r in on_disk.get("rows", [])], ctx))
            return fake(name, ctx)

        monkeypatch.setattr(mod, "run_tier", fake_run_tier)
        assert mod.main(["--tiny", "--extras", "", "--json", str(out), *args]) == 0
        return json.loads(out.read_text())

    return run, calls


def test_the_json_holds_every_row_as_soon_as_it_is_measured(quick_main):
    run, calls = quick_main
    report = run([], lambda name, ctx: {"status": "ok", "s_it": 0.1})
    names = ["full", "split", "split_plain", "offload", "lowres", "lowres_min"]
    # when a tier starts, the file already holds every earlier row (a run cut short keeps them)
    assert [(name, before) for name, before, _ in calls] == [
        (name, names[:i]) for i, name in enumerate(names)
    ]
    assert [r["tier"] for r in report["rows"]] == names
    # the production allocator, set before CUDA starts
    assert "expandable_segments:True" in report["allocator"]
    assert "expandable_segments:True" in mod.os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    assert report["gsplat"]["status"] == "skipped: no CUDA GPU"


def test_render_backend_torch_reaches_the_training_and_skips_gsplat(quick_main, monkeypatch):
    run, calls = quick_main
    report = run(["--render-backend", "torch"], lambda name, ctx: {"status": "ok"})
    assert {ctx["render_backend"] for _, _, ctx in calls} == {"torch"}
    assert report["render_backend"] == "torch"
    assert report["gsplat"]["status"] == "skipped: --render-backend torch"
    assert report["parity"]["status"] == "skipped: --render-backend torch"

    class Stop(Exception):
        pass

    seen = {}

    def trainer(**kwargs):  # the real run_tier hands the backend to chord.training.trainer.Trainer
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(mod.trainer, "Trainer", trainer)
    ctx = {**calls[0][2], "guidance": lambda mem: None}
    with pytest.raises(Stop):
        RUN_TIER("full", ctx["tiers"]["full"][0], (64, 48), ctx)
    assert seen["backend"] == "torch"


def test_a_section_past_its_budget_is_cut_and_the_next_keeps_its_own(quick_main):
    run, calls = quick_main

    def slow(name, ctx):
        time.sleep(0.7)
        return {"status": "ok"}

    report = run(["--budget", "tiers=0.5", "--budget", "mmgp=0.5"], slow)
    status = {r["tier"]: r["status"] for r in report["rows"]}
    # each section starts its first row, then is over its budget
    assert [name for name, _, _ in calls] == ["full", "offload"]
    assert status["full"] == status["offload"] == "ok"
    for name in ("split", "split_plain"):
        assert status[name] == "skipped: over the tiers section's 0 s budget (--budget tiers=S)"
    for name in ("lowres", "lowres_min"):
        assert status[name] == "skipped: over the mmgp section's 0 s budget (--budget mmgp=S)"
    assert run(["--budget", "tiers=0"], slow)["rows"][0]["status"].startswith("skipped: over")


def test_a_bad_budget_names_the_sections(capsys):
    for bad in ("gsplat=10", "tiers=soon"):
        with pytest.raises(SystemExit):
            mod.main(["--tiny", "--budget", bad])
        assert f"--budget {bad}" in capsys.readouterr().err


def test_the_random_expert_keeps_diffusers_float32_modules():
    """As from_pretrained in bf16 leaves them; the mmgp tiers' check counts them after mmgp."""
    config = peak_memory.transformer_kwargs(mod.TINY, rope_max_seq_len=64)
    expert = mod.random_expert(config, "cpu", torch.bfloat16)
    kept, total = mod.kept_float32(expert)
    assert total > 0 and kept == total
    assert expert.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    assert mod.kept_float32(expert.to(torch.bfloat16)) == (0, total)  # what mmgp's cast did


def test_the_trace_of_the_same_run_goes_beside_the_measured_peak(tmp_path, capsys, contact):
    """A row takes the faked trace's peak of its own tier, size, flags, frames, batch and
    Gaussians (bench/gpu_trace.json), and no other's."""
    tiers = mod.tier_table(64, 48)
    flags = lambda name: dataclasses.asdict(tiers[name][0])  # noqa: E731
    row = {"ok": True, "frames": 9, "batch": 2, "gaussians": 2000, "size": "64*48"}
    trace = {"tiers": [
        {**row, "tier": "full", "flags": flags("full"), "traced_peak_bytes": 1000},
        {**row, "tier": "split", "flags": flags("full"), "traced_peak_bytes": 7},  # other flags
        {**row, "tier": "split_plain", "flags": flags("split_plain"), "traced_peak_bytes": 9,
         "batch": 4},  # another batch
    ]}  # fmt: skip
    path = tmp_path / "gpu_trace.json"
    path.write_text(json.dumps(trace))
    peaks = mod.traced_peaks(path, frames=9, batch=2, gaussians=2000)
    key = lambda name, f: (name, "64x48", json.dumps(flags(f), sort_keys=True))  # noqa: E731
    assert peaks == {key("full", "full"): 1000, key("split", "full"): 7}
    assert mod.traced_peaks(tmp_path / "none.json", 9, 2, 2000) == {}
    for damaged in ("[1, 2]", '{"tiers": [{"ok": true}]}', "{", '{"tiers": 3}'):
        path.write_text(damaged)  # a damaged trace is one line and no column, not a traceback
        assert mod.traced_peaks(path, 9, 2, 2000) == {}
        assert f"gpu_check: {path}: not " in capsys.readouterr().out

    ctx = {
        "tiny": True, "cuda": False, "frames": 9, "batch": 2, "gaussians": 2000,
        "peak": mod.Peak(False), "shape": peak_memory.A14B, "tiers": tiers, "verbose": False,
        "method": mod.workflow_method(64, 48, 9, 2), "traced": peaks,
    }  # fmt: skip
    ctx["contact"] = contact
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "run_tier", lambda *a: {"status": "ok", "allocated": 1100})
        rows = mod.tier_rows(ctx, ["full", "split"])
    assert [r["traced"] for r in rows] == [1000, None]
    assert "allocated / trace 1.100" in capsys.readouterr().out
