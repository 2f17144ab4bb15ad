"""chord.resources.tiers: tier parsing, auto choice, escalation, size handling, out-of-memory
records,
the OOM exit status, and GPU assignment for concurrent jobs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from chord.config import result_keys as rk
from chord.config import settings
from chord.resources import gpus, job_size, out_of_memory, tiers
from chord.stages import adapter
from tests.conftest import REPO

MEM = settings.memory_from_mapping({})  # the memory section's defaults


def card(gib, count=1):
    """A node of ``count`` GPUs that report ``gib`` GiB each (None: no GPU, a CPU run)."""
    return None if gib is None else gpus.Node(count, gpus.Card(f"a {gib} GiB GPU", gib * 1024))


@pytest.fixture
def default_tiers():
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    settings.validate_config(conf)
    return tiers.parse(conf["tiers"])


def test_default_tiers_follow_the_seed_document(default_tiers):
    """full / split (48 GB) / offload (24 GB, mmgp) / lowres 576*320 then 416*240."""
    t = default_tiers
    assert list(t)[:4] == ["full", "split", "offload", "lowres"]
    assert t["full"].flags == {} and t["full"].gpu_mem_gb == 80
    assert t["split"].gpu_mem_gb == 48 and t["split"].flags == {
        "split_sds_backward": True,
        "split_render_backward": True,
        "split_render_chunk_size": 21,
        "checkpoint_tiny_vae": True,  # ours: memory only, ~0.4x the Tiny VAE's graph
    }
    assert t["offload"].gpu_mem_gb == 24 and t["offload"].flags["enable_mmgp"] is True
    assert t["offload"].host_mem_gb > t["split"].host_mem_gb  # mmgp keeps the DiT in host RAM
    assert [t[n].size for n in list(t)[3:]] == ["576*320", "416*240"]
    assert t["offload"].mem_mb == 96 * 1024 and t["full"].runtime_min == 12 * 60


def test_a_tier_takes_the_schemas_defaults_and_is_shared_unchanged():
    t = tiers.parse({"t": {"gpu_mem_gb": 24}})["t"]
    assert (t.host_mem_gb, t.runtime_h, t.cpus_per_gpu, t.gpus) == (32.0, 24.0, 8, 1)
    assert (t.flags, t.size, t.gpu_model, t.slurm_partition) == ({}, None, None, None)
    assert t == tiers.Tier(name="t", gpu_mem_gb=24.0)  # one set of defaults, made or parsed
    with pytest.raises(dataclasses.FrozenInstanceError):  # one Tier serves every scene's jobs
        t.gpus = 2


def test_the_log_says_where_a_tier_came_from(default_tiers):
    assert tiers.start("split", default_tiers, card(48)).describe() == (
        "split (the sheet's tier column)"
    )
    assert tiers.start("auto", default_tiers, None).describe() == (
        "full (no GPU: a CPU run takes the first tier)"
    )
    assert tiers.start("auto", default_tiers, card(48)).describe().startswith("split on 1 x")


def test_a_gpu_smaller_than_every_tier_takes_the_leanest_naming_why_not_the_others(
    default_tiers,
):
    choice = tiers.choose(default_tiers, card(8), allow_lowres=True)
    assert choice.tier == "lowres_min"
    assert [name for name, _ in choice.skipped] == ["full", "split", "offload", "lowres"]


def test_parse_rejects_tiers_out_of_escalation_order():
    with pytest.raises(settings.ConfigError, match="fullest first"):
        tiers.parse({"small": {"gpu_mem_gb": 24}, "big": {"gpu_mem_gb": 80}})
    with pytest.raises(settings.ConfigError, match="reserved"):
        tiers.parse({"auto": {"gpu_mem_gb": 24}})
    with pytest.raises(settings.ConfigError, match="multiples of 16"):
        tiers.parse({"odd": {"gpu_mem_gb": 24, "size": "100*50"}})
    # a tier's other keys are memory flags, checked against the memory section
    with pytest.raises(
        settings.ConfigError, match=r"tiers.fast: .*'split_sds_bakward' was unexpected"
    ):
        tiers.parse({"fast": {"gpu_mem_gb": 24, "split_sds_bakward": True}})
    with pytest.raises(settings.ConfigError, match=r"tiers.fast: split_render_chunk_size"):
        tiers.parse({"fast": {"gpu_mem_gb": 24, "split_render_chunk_size": "21"}})


@pytest.mark.parametrize(
    "gpu_mem_gb, expected",
    [(None, "full"), (141, "full"), (80, "full"), (48, "split"), (40, "offload"), (24, "offload")]
    + [(16, "lowres"), (12, "lowres_min"), (8, "lowres_min")],
)
def test_auto_picks_the_first_tier_that_fits(default_tiers, gpu_mem_gb, expected):
    lowres = default_tiers[expected].size is not None  # changes the result: only if allowed
    assert tiers.auto(default_tiers, card(gpu_mem_gb), allow_lowres=lowres) == expected
    picked = tiers.start("auto", default_tiers, card(gpu_mem_gb), allow_lowres=lowres)
    assert picked.tier == expected
    assert tiers.start("split", default_tiers, card(gpu_mem_gb)).tier == "split"  # explicit wins
    if lowres:
        with pytest.raises(settings.ConfigError, match="auto_lowres: true"):
            tiers.auto(default_tiers, card(gpu_mem_gb))


def test_escalation_moves_past_tiers_that_ran_out_of_memory(default_tiers):
    t = default_tiers
    assert tiers.for_attempt("full", 1, t, {"full"}) == "full"  # attempt 1: the start tier
    assert tiers.for_attempt("full", 2, t, {"full"}) == "split"
    assert tiers.for_attempt("full", 3, t, {"full", "split"}) == "offload"
    assert tiers.for_attempt("full", 2, t, set()) == "full"  # other failure: same tier
    assert tiers.for_attempt("split", 2, t, {"full"}) == "split"
    leanest = list(t)[-1]
    assert tiers.for_attempt(leanest, 4, t, set(t)) == leanest  # nowhere leaner to go


def test_memory_flags_keep_the_hash_and_a_lower_size_changes_it(default_tiers):
    method = settings.method_from_mapping({"size": "832*480"})
    mem = settings.memory_from_mapping({})
    guidance = settings.guidance_from_mapping({})
    h = rk.training_hash(method, guidance)
    for name in ("full", "split", "offload"):
        applied, _ = tiers.apply(method, mem, default_tiers[name])
        assert applied == method and rk.training_hash(applied, guidance) == h, name
    _, offload = tiers.apply(method, mem, default_tiers["offload"])
    assert offload.enable_mmgp and offload.split_render_chunk_size == 21
    lowres, _ = tiers.apply(method, mem, default_tiers["lowres"])
    assert lowres.size == "576*320" and rk.training_hash(lowres, guidance) != h
    # the size only ever goes down: a small method size is kept
    small = settings.method_from_mapping({"size": "64*32"})
    assert tiers.apply(small, mem, default_tiers["lowres"])[0].size == "64*32"


def test_tier_flags_left_out_keep_the_memory_sections_value(default_tiers):
    method = settings.method_from_mapping({})
    mem = settings.memory_from_mapping({"split_sds_backward": True, "mmgp_transformer_budget": 500})
    assert tiers.apply(method, mem, default_tiers["full"])[1].split_sds_backward is True
    assert tiers.apply(method, mem, default_tiers["offload"])[1].mmgp_transformer_budget == 500
    with pytest.raises(settings.ConfigError, match="split_sds_backward"):  # never a method key
        settings.method_from_mapping({"split_sds_backward": True})


def test_out_of_memory_record_notes_the_tier_and_clears_on_success(tmp_path):
    record = tmp_path / "ckpt" / out_of_memory.RECORD
    with pytest.raises(torch.OutOfMemoryError):
        with out_of_memory.recorded(record, "full"):
            out_of_memory.inject("full, split", "full")
    with pytest.raises(RuntimeError):  # any other error leaves no record
        with out_of_memory.recorded(record, "split"):
            raise RuntimeError("not memory")
    assert out_of_memory.read(record) == {"full"}
    with out_of_memory.recorded(record, "split"):
        out_of_memory.inject("full", "split")  # not listed: no error
    assert not record.exists()
    assert out_of_memory.read(record) == set()


def test_each_retry_moves_past_every_tier_that_ran_out_of_memory(default_tiers, tmp_path):
    """A training that runs out of memory on every tier: each attempt reads the record the ones
    before wrote (as the workflow's attempt_tier does), so attempt n runs on the n-th tier (the
    third not back on the first) and the leanest is kept once every tier has failed."""
    record = tmp_path / "ckpt" / out_of_memory.RECORD
    names = list(default_tiers)
    tried = []
    for attempt in range(1, len(names) + 2):
        oom = out_of_memory.read(record) if attempt > 1 else ()
        tier = tiers.for_attempt(names[0], attempt, default_tiers, oom)
        tried.append(tier)
        with pytest.raises(torch.OutOfMemoryError):
            with out_of_memory.recorded(record, tier, order=names):
                out_of_memory.inject(",".join(names), tier)
    assert tried == [*names, names[-1]]
    assert out_of_memory.read(record) == set(names)


def test_out_of_memory_exits_with_its_own_status(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        with adapter.stage_logging(str(tmp_path / "x.log")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert exc.value.code == adapter.EXIT_OUT_OF_MEMORY == 3
    assert "out of GPU memory" in capsys.readouterr().err
    assert "out of GPU memory" in (tmp_path / "x.log").read_text()
    from chord.core.errors import InputError

    with pytest.raises(SystemExit) as exc:
        with adapter.stage_logging(str(tmp_path / "y.log")):
            raise InputError("bad input")
    assert exc.value.code == adapter.EXIT_INPUT
    # an internal error is not "bad input": it propagates with its traceback (exit 1)
    with pytest.raises(ValueError, match="a bug"):
        with adapter.stage_logging(str(tmp_path / "z.log")):
            raise ValueError("a bug")
    assert "Traceback" in (tmp_path / "z.log").read_text()


def test_lowres_size_is_recorded_and_the_fine_stage_continues_at_it(tmp_path):
    """A lowres tier's size enters the hash and checkpoint folder and is recorded in the
    hand-off; the fine stage, on a fuller tier, continues at that size."""
    from chord.scene import demo
    from chord.stages import train as train_stage
    from chord.training.run_settings import RunSettings
    from tests.stages.test_geometry_stages import TINY_TRAINING, train_inputs

    data = demo.write_demo_scene("hop", tmp_path / "data", frame_num=5)
    smaller = {"gs_init_num": 600, "cp_num": 8}
    fine = {"add_cp_objs": ["obj_0"], "add_cp_layer_iter": 3, "add_cp_num": 12}
    m = settings.method_from_mapping({**TINY_TRAINING, **smaller, **fine})
    inputs = train_inputs(data, tmp_path / "results", "hop", m)
    guidance = settings.guidance_from_mapping({"backend": "oracle"})
    t = tiers.parse({"full": {"gpu_mem_gb": 80}, "tiny": {"gpu_mem_gb": 8, "size": "32*16"}})
    lean, _ = tiers.apply(m, MEM, t["tiny"])
    ckpts = tmp_path / "ckpt"
    for stage, tier in (("coarse", "tiny"), ("fine", "full")):
        method, mem = tiers.apply(m, MEM, t[tier])
        train_stage.run_stage(
            stage,
            inputs=inputs,
            out=tmp_path / f"{stage}.pt",
            loss_log=tmp_path / f"{stage}.tsv",
            checkpoint_dir=ckpts / stage,
            method=method,
            memory=mem,
            guidance=guidance,
            handoff=tmp_path / "coarse.pt" if stage == "fine" else None,
            run_settings=RunSettings(tier=tier),
        )
    coarse = torch.load(tmp_path / "coarse.pt", weights_only=True)
    fine = torch.load(tmp_path / "fine.pt", weights_only=True)
    assert (coarse["tier"], coarse["size"], coarse["iteration"]) == ("tiny", "32*16", 2)
    assert (fine["tier"], fine["size"], fine["iteration"]) == ("full", "32*16", 4)
    h = rk.training_hash(lean, guidance)
    assert h != rk.training_hash(m, guidance) and coarse["config_hash"] == fine["config_hash"] == h
    assert [p.name for p in (ckpts / "coarse").iterdir()] == [h]
    assert [p.name for p in (ckpts / "fine").iterdir()] == [h]


# --- tier: auto and the peak-memory model (issue 9) -----------------------------------------


class Rejects:
    """A ``fits`` predicate rejecting the tiers named; records the tiers it was asked about."""

    def __init__(self, *names):
        self.names, self.asked = set(names), []

    def __call__(self, tier):
        self.asked.append(tier.name)
        return tier.name not in self.names

    def describe(self, tier):
        return f"{tier.name} predicted 99.9 GiB"


def test_auto_skips_tiers_the_model_rejects(default_tiers):
    fits = Rejects("split")
    assert tiers.auto(default_tiers, card(48), fits) == "offload"
    assert fits.asked == ["split", "offload"]  # full (80 GB declared) is never a candidate
    assert tiers.start("auto", default_tiers, card(48), Rejects("split")).tier == "offload"
    assert (
        tiers.start("split", default_tiers, card(48), Rejects("split")).tier == "split"
    )  # explicit wins
    assert tiers.auto(default_tiers, card(48), Rejects()) == "split"
    # a GPU smaller than every tier: the leanest, when the model accepts it and lower sizes
    # are allowed; auto never lowers the size by itself
    assert (
        tiers.auto(default_tiers, card(8), Rejects("full", "split"), allow_lowres=True)
        == "lowres_min"
    )
    with pytest.raises(settings.ConfigError, match=r"fits only tiers that lower the SDS size"):
        tiers.auto(default_tiers, card(8), Rejects("full", "split"))
    # ... unless the method's size is already that small: then lowres_min changes nothing
    small = settings.method_from_mapping({"size": "128*80"})
    assert tiers.auto(default_tiers, card(8), Rejects(), method=small) == "lowres_min"


def test_auto_falls_back_to_the_declared_choice_when_the_model_rejects_every_tier(
    default_tiers, caplog
):
    fits = Rejects(*default_tiers)
    with caplog.at_level("WARNING", logger="chord.resources.tiers"):
        assert tiers.auto(default_tiers, card(48), fits) == "split"
    assert fits.asked == ["split", "offload", "lowres", "lowres_min"]
    [record] = caplog.records
    text = record.getMessage()
    assert record.levelname == "WARNING" and "no tier fits 1 x a 48 GiB GPU" in text
    assert "split predicted 99.9 GiB" in text and "starting on split" in text
    assert "; leanest: offload predicted" in text  # the leanest at the method's size
    assert "use_tiny_vae: true" in text and "size, frame_num or batch_size" in text
    caplog.clear()
    with caplog.at_level(
        "WARNING", logger="chord.resources.tiers"
    ):  # a plain predicate: no description
        assert tiers.auto(default_tiers, card(24), lambda tier: False) == "offload"
    assert (
        "no tier fits 1 x a 24 GiB GPU (24576 MiB = 25.8 GB) (nvidia-smi) (tier offload"
        in caplog.text
    )


def test_auto_without_a_gpu_ignores_the_model(default_tiers):
    def never(tier):
        raise AssertionError("a CPU run must not consult the memory model")

    assert tiers.auto(default_tiers, card(None), never) == "full"
    assert tiers.start("auto", default_tiers, card(None), never).tier == "full"


def test_gaussian_counts_before_the_gaussians_stage():
    """gs_init_num per object, gs_init_nums overriding it, avoided objects left out; the
    dynamic count is that of the dynamic objects; an imported PLY's count wins."""
    m = settings.method_from_mapping(
        {"gs_init_num": 1000, "gs_init_nums": {"obj_0": 50, "obj_3": 7}, "avoid_objs": ["obj_3"]}
    )
    roles = settings.object_roles(m, 4)
    assert roles == {"obj_0": "dynamic", "obj_1": "static", "obj_2": "dynamic", "obj_3": "avoided"}
    assert job_size.gaussian_counts(m, roles) == (50 + 1000 + 1000, 50 + 1000)
    assert job_size.gaussian_counts(m, roles, {"obj_2": 300}) == (50 + 1000 + 300, 50 + 300)
    assert job_size.gaussian_counts(m, {"obj_0": "static"}) == (50, 0)
    assert job_size.gaussian_counts(m, {}) == (0, 0)


def test_imported_counts_read_the_fitted_ply_headers(tmp_path):
    ply = tmp_path / "fitted/obj_1/point_cloud/iteration_7000/point_cloud.ply"
    ply.parent.mkdir(parents=True)
    header = "ply\nformat binary_little_endian 1.0\nelement vertex 123456\nproperty float x\n"
    ply.write_bytes((header + "end_header\n").encode() + b"\0" * 12)
    assert job_size.ply_vertex_count(ply) == 123456
    counts = job_size.imported_counts(tmp_path / "fitted", ["obj_0", "obj_1"])
    assert counts == {"obj_1": 123456}  # obj_0 has none: its gaussians stage reports it
    assert job_size.imported_counts(None, ["obj_0"]) == {}
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"ply\nend_header\n")
    with pytest.raises(ValueError, match="element vertex"):
        job_size.ply_vertex_count(bad)


def test_memory_shape_and_flags_follow_the_tier(default_tiers):
    from chord.resources import peak_memory

    m = settings.method_from_mapping({"size": "832*480", "frame_num": 41, "batch_size": 4})
    mem = settings.memory_from_mapping({})
    lowres, lean = tiers.apply(m, mem, default_tiers["lowres"])
    assert lean.enable_mmgp is True and lean.split_render_chunk_size == 21
    shape = job_size.memory_shape(lowres, 200, 100)
    assert shape == {
        "width": 576,
        "height": 320,
        "frames": 41,
        "batch": 4,
        "gpus": 1,
        "gaussians": 200,
        "dynamic_gaussians": 100,
        "use_tiny_vae": m.use_tiny_vae,
    }
    e = job_size.estimate(m, mem, default_tiers["lowres"], 200, 100)
    assert e == peak_memory.estimate(lean, **shape)
    assert job_size.estimate(lowres, lean, None, 200, 100) == e  # already applied


def documented(**values):
    """The method at the documented shapes: 832*480, 41 frames, batch 4, the Tiny VAE."""
    base = {"size": "832*480", "frame_num": 41, "batch_size": 4, "use_tiny_vae": True}
    return settings.method_from_mapping({**base, **values})


@pytest.mark.parametrize("gpu, expected", [(80, "full"), (48, "split"), (24, "offload")])
def test_the_model_agrees_with_the_default_tiers_at_the_documented_shapes(
    default_tiers, gpu, expected, caplog
):
    """~200k Gaussians (two objects of the default 100k, one dynamic): each declared tier is
    predicted to fit its GPU class, so the model changes nothing there."""
    m = documented()
    roles = {"obj_0": "dynamic", "obj_1": "static"}
    fits = job_size.scene_fits(m, MEM, roles, card(gpu), backend="wan", label="scene s")
    assert (fits.gaussians, fits.dynamic_gaussians) == (200_000, 100_000)
    with caplog.at_level("INFO", logger="chord.resources.tiers"):
        assert tiers.auto(default_tiers, card(gpu), fits) == expected
    assert "memory model" not in caplog.text  # one INFO line: the choice by label


def test_the_contact_loss_is_in_the_tier_choice_and_the_training_log(default_tiers, caplog):
    """With lambda_contact or lambda_support the model counts the contact terms of each dynamic
    object's surface samples (CONTACT_SAMPLES, the evaluation's) wherever a scene's estimate is
    made: the tier fit, its description and a training's log (with its built grid's nodes)."""
    from types import SimpleNamespace

    from chord.motion import contact
    from chord.resources import peak_memory
    from chord.training import device_report

    roles = {"obj_0": "static", "obj_1": "dynamic", "obj_2": "dynamic"}
    m = documented(lambda_contact=1.0)
    assert job_size.CONTACT_SAMPLES == contact.CONTACT_SAMPLES
    n = 2 * contact.CONTACT_SAMPLES
    assert job_size.contact_points(m, roles) == n
    off = documented(lambda_contact=0.0, lambda_support=0.0)
    assert job_size.contact_points(off, roles) == 0
    assert job_size.contact_points(documented(lambda_contact=0.0, lambda_support=1.0), roles) == n
    assert job_size.contact_points(m, {"obj_0": "avoided", "obj_1": "dynamic"}) == 0  # no grid
    fits = job_size.scene_fits(m, MEM, roles, card(48), backend="wan")
    assert fits.contact_points == n and "contact loss" in fits.describe(default_tiers["split"])
    e = job_size.estimate(m, MEM, default_tiers["split"], 300_000, 200_000, contact_points=16_000)
    split, lean = tiers.apply(m, MEM, default_tiers["split"])
    shape = job_size.memory_shape(split, 300_000, 200_000, contact_points=16_000)
    assert e == peak_memory.estimate(lean, **shape) and "contact_graph" in e["parts"]
    off = job_size.estimate(off, MEM, default_tiers["split"], 300_000, 200_000)
    assert "contact_graph" not in off["parts"] and e["gpu_bytes"] > off["gpu_bytes"]
    # a training: its scene's objects and its grid's own node count
    scene = SimpleNamespace(
        names=list(roles),
        means=torch.zeros(300, 3),
        slices={"obj_0": slice(0, 100), "obj_1": slice(100, 200), "obj_2": slice(200, 300)},
        dynamic={"obj_1": None, "obj_2": None},
    )
    grid = SimpleNamespace(values=torch.zeros(5, 6, 7))
    assert job_size.trained_contact(m, scene, None) == {}
    sizes = job_size.trained_contact(m, scene, grid)
    assert sizes == {"contact_points": n, "contact_grid_nodes": 210}
    trainer = SimpleNamespace(scene=scene, memory=MEM, contact_grid=grid)
    wan = settings.guidance_from_mapping({"backend": "wan"})
    with caplog.at_level("INFO", logger="chord.training.device_report"):
        logged = device_report.log_memory_estimate(trainer, m, wan, None)
    assert logged["parts"]["contact_grid"] == 4 * (210 + n)
    mib = 2**20
    per_point = peak_memory.CONTACT_PER_POINT + peak_memory.CPU_PROXY["deform_per_gaussian"]
    grid_mib, graph_mib = 4 * (210 + n) / mib, per_point * m.frame_num * n / mib
    line = f"; contact loss {grid_mib:.1f} MiB resident (grid), {graph_mib:.1f} MiB in the"
    assert line in caplog.text


def test_the_model_rejects_tiers_whose_declared_memory_is_optimistic(default_tiers, caplog):
    """Where a tier's declared GPU memory is optimistic for the scene's shapes, the model
    moves past it: with 1M Gaussians per object (render and deformation graphs ~40 GiB) full
    is predicted over 80 GB and split over 48 GB. With the Wan VAE as the video encoder
    (use_tiny_vae false) at 832*480 every tier but lowres_min at 416*240 is predicted over
    80 GB (its encoder graph alone is ~180 GiB): a 48 GB GPU falls back to split with a
    warning. On an 80 GB GPU only lowres_min at 416*240 is predicted to fit: auto does not
    change the result by itself, so that is an error naming the peak and the remedies, and
    with auto_lowres it starts there, warned as a change of the result."""
    roles = {"obj_0": "dynamic", "obj_1": "static"}
    dense = documented(gs_init_num=1_000_000)
    for gpu, skipped, expected in ((80, "full", "split"), (48, "split", "offload")):
        caplog.clear()
        with caplog.at_level("INFO", logger="chord.resources.tiers"):
            fits = job_size.scene_fits(dense, MEM, roles, card(gpu), backend="wan")
            assert tiers.auto(default_tiers, card(gpu), fits) == expected
        [record] = caplog.records
        assert record.levelname == "INFO"  # a skip to a tier of the same size: no warning
        text = record.getMessage()
        assert text.startswith(f"tier auto: {expected} on 1 x a {gpu} GiB GPU"), text
        assert f"; {skipped}: the memory model predicts it would not fit: tier {skipped}" in text
    caplog.clear()
    wan_vae = documented(use_tiny_vae=False)
    with caplog.at_level("WARNING", logger="chord.resources.tiers"):
        fits48 = job_size.scene_fits(wan_vae, MEM, roles, card(48), backend="wan")
        assert tiers.auto(default_tiers, card(48), fits48) == "split"
    assert "no tier fits 1 x a 48 GiB GPU" in caplog.text and "starting on split" in caplog.text
    caplog.clear()
    fits80 = job_size.scene_fits(wan_vae, MEM, roles, card(80), backend="wan", label="scene s")
    with pytest.raises(settings.ConfigError) as err:
        tiers.auto(default_tiers, card(80), fits80, method=wan_vae)
    msg = str(err.value)
    assert (
        "no tier at the method's size fits 1 x a 80 GiB GPU" in msg and "scene s, tier full" in msg
    )
    assert "lowres_min at size 416*240, which changes the result" in msg
    assert "use_tiny_vae: true" in msg and "auto_lowres: true" in msg
    with caplog.at_level("WARNING", logger="chord.resources.tiers"):
        assert tiers.auto(default_tiers, card(80), fits80, method=wan_vae, allow_lowres=True) == (
            "lowres_min"
        )
    assert "at size 416*240, which changes the result" in caplog.text


def test_scene_fits_applies_to_the_wan_teacher_on_a_gpu_only():
    m = documented()
    roles = {"obj_0": "dynamic", "obj_1": "static"}
    assert (
        job_size.scene_fits(m, MEM, roles, card(48), backend="oracle") is None
    )  # no Wan weights resident
    assert job_size.scene_fits(m, MEM, roles, card(None), backend="wan") is None  # a CPU run
    assert job_size.scene_fits(m, MEM, {}, card(48), backend="wan") is None  # objects not known yet
    assert (
        job_size.scene_fits(m, MEM, roles, card(48), backend="wan", label="scene s")
        .describe(tiers.Tier("t", 48))
        .startswith("scene s, tier t predicted 832x480: peak")
    )


def test_training_logs_the_model_estimate_of_its_tier(caplog):
    from types import SimpleNamespace

    from chord.training import device_report

    scene = SimpleNamespace(
        means=torch.zeros(300, 3),
        slices={"obj_0": slice(0, 100), "obj_1": slice(100, 300)},
        dynamic={"obj_0": None},
    )
    trainer = SimpleNamespace(scene=scene, memory=MEM)
    m = documented()
    wan = settings.guidance_from_mapping({"backend": "wan"})
    with caplog.at_level("INFO", logger="chord.training.device_report"):
        e = device_report.log_memory_estimate(trainer, m, wan, "split")
    assert e == job_size.estimate(m, MEM, None, 300, 100)
    assert "memory model on tier split (experts: 40 layers x 5120 (A14B)" in caplog.text
    assert "): 832x480: peak" in caplog.text
    oracle = settings.guidance_from_mapping({"backend": "oracle"})
    assert device_report.log_memory_estimate(trainer, m, oracle, "split") is None


def test_a_job_needing_more_host_ram_than_its_tier_allows_is_an_error_naming_both():
    """The README's 2 x 48 GB node: `split` with gpus: 2 holds two experts (~65 GiB by the
    model, ~72 GB with the request's margin). The tier's host_mem_gb of 64 used to cap the
    request silently (a job killed for its memory hours in); now it is an error naming the
    need, the ceiling and the host_mem_gb that fits, which then gives the job its need."""
    import dataclasses
    import math

    m = documented()
    roles = {"obj_0": "dynamic", "obj_1": "static"}  # two objects of 100k Gaussians
    shipped = yaml.safe_load((REPO / "config/config.yaml").read_text())["tiers"]
    split = tiers.parse(shipped)["split"]
    duo = dataclasses.replace(split, gpus=2)
    host = job_size.estimate(m, MEM, duo, 200_000, 100_000)["host_bytes"]
    need_mb = math.ceil(host * 1.1 / 2**20)  # the request: the model's need and a 10% margin
    assert duo.host_mem_gb == 64 and need_mb > duo.mem_mb
    with pytest.raises(settings.ConfigError) as err:
        job_size.job_request(duo, backend="wan", method=m, mem=MEM, roles=roles)
    msg = str(err.value)
    assert f"tier split: the memory model puts a training's host RAM at {host / 2**30:.1f}" in msg
    assert f"{need_mb} MB" in msg and "host_mem_gb 64 (65536 MB)" in msg
    fits = math.ceil(need_mb / 1024)
    assert f"raise tiers.split.host_mem_gb to at least {fits}" in msg
    enough = dataclasses.replace(duo, host_mem_gb=fits)
    request = job_size.job_request(enough, backend="wan", method=m, mem=MEM, roles=roles)
    assert request["mem_mb"] == need_mb <= enough.mem_mb
    # the oracle's nominal need stays capped by the tier: no model, no error
    small = dataclasses.replace(duo, host_mem_gb=1)
    assert job_size.job_request(small, backend="oracle")["mem_mb"] == small.mem_mb


def test_the_shipped_tiers_hold_the_shipped_methods_training_with_the_wan_teacher(
    default_tiers,
):
    """Every tier of config/config.yaml has the host RAM the memory model gives the shipped
    method (one 14B expert, mmgp's staging on the offload tiers) for a demo scene."""
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    m = settings.method_from_mapping(conf["method"])
    roles = {"obj_0": "dynamic", "obj_1": "static"}
    for tier in default_tiers.values():
        request = job_size.job_request(tier, backend="wan", method=m, mem=MEM, roles=roles)
        assert request["mem_mb"] <= tier.mem_mb
