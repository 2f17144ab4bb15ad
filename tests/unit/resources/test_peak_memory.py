"""The peak-memory model: exact weights, the documented tier figures, growth and fits()."""

from __future__ import annotations

import pytest
import torch

from chord.resources import job_memory, peak_memory

SEED_SPLIT = {  # the seed document's split flags
    "split_sds_backward": True,
    "split_render_backward": True,
    "split_render_chunk_size": 21,
}
SPLIT = {**SEED_SPLIT, "checkpoint_tiny_vae": True}
OFFLOAD = {**SPLIT, "enable_mmgp": True}
TIERS = {  # config/config.yaml's tiers' flags
    "full": {},
    "split": SPLIT,
    "offload": OFFLOAD,
    "lowres": OFFLOAD,
    "lowres_min": OFFLOAD,
}
# METHOD §21's documented command: 832x480, 41 frames, batch 4, Tiny VAE, early stop
DOC = {"width": 832, "height": 480, "frames": 41, "batch": 4, "gaussians": 200_000}
SIZES = {"lowres": (576, 320), "lowres_min": (416, 240)}  # the tiers' lower sizes


def tier_doc(name: str, **over) -> dict:
    """DOC at the size tier ``name`` trains at."""
    w, h = SIZES.get(name, (DOC["width"], DOC["height"]))
    return {**DOC, "width": w, "height": h, **over}


SMALL = {"layers": 2, "heads": 3, "head_dim": 8, "ffn": 40, "text_dim": 24, "freq_dim": 32}


@pytest.mark.parametrize("shape, rope", [({}, 1024), (SMALL, 64)], ids=["A14B", "small"])
def test_expert_parameters_match_the_diffusers_model_exactly(shape, rope):
    from diffusers import WanTransformer3DModel

    s = peak_memory.ModelShape(**{**vars(peak_memory.A14B), **shape})
    with torch.device("meta"):
        m = WanTransformer3DModel(**peak_memory.transformer_kwargs(s, rope_max_seq_len=rope))
    assert peak_memory.dit_params(s) == sum(p.numel() for p in m.parameters())


def test_the_expert_arguments_come_from_the_model_shape():
    kwargs = peak_memory.transformer_kwargs(peak_memory.A14B)
    assert kwargs["num_layers"] == 40 and kwargs["num_attention_heads"] == 40
    assert (kwargs["attention_head_dim"], kwargs["ffn_dim"], kwargs["text_dim"]) == (
        128,
        13824,
        4096,
    )
    assert (kwargs["in_channels"], kwargs["out_channels"]) == (36, 16)
    assert kwargs["patch_size"] == (1, 2, 2) and kwargs["freq_dim"] == 256


def test_an_a14b_expert_has_14_3_billion_parameters():
    assert peak_memory.dit_params(peak_memory.A14B) == 14_288_901_184  # 26.6 GiB in bf16


def test_vae_parameter_counts_match_the_models():
    from diffusers import AutoencoderKLWan

    from chord.guidance.tiny_vae import TinyVAEEncoder

    with torch.device("meta"):
        vae = AutoencoderKLWan()
    assert peak_memory.A14B.vae_params == sum(p.numel() for p in vae.parameters())
    assert peak_memory.A14B.tiny_vae_params == sum(p.numel() for p in TinyVAEEncoder().parameters())


def test_tokens_follow_the_method_table():
    assert peak_memory.tokens(832, 480, 41) == 17_160
    assert peak_memory.tokens(576, 320, 41) == 7_920
    assert peak_memory.tokens(416, 240, 41) == 4_290


def test_documented_tier_figures():
    """METHOD §21: the default needs more than 48 GB; split fits 48 GB; split + mmgp 24 GB;
    the low-resolution tiers fit their smaller GPUs."""
    gpu = {"full": 80, "split": 48, "offload": 24, "lowres": 16, "lowres_min": 12}
    for name, flags in TIERS.items():
        assert peak_memory.fits(flags, gpu[name], **tier_doc(name)), name
    assert not peak_memory.fits(TIERS["full"], 48, **DOC)
    assert not peak_memory.fits(TIERS["split"], 24, **DOC)
    full = peak_memory.estimate(TIERS["full"], **DOC)
    split = peak_memory.estimate(TIERS["split"], **DOC)
    assert full["gpu_bytes"] > 48 * peak_memory.GiB
    assert split["gpu_bytes"] < 48 * peak_memory.GiB
    # mmgp keeps the expert in host RAM: it needs more host memory, far less GPU memory
    off = peak_memory.estimate(TIERS["offload"], **DOC)
    assert off["host_bytes"] > split["host_bytes"]
    assert off["parts"]["dit_weights"] < 2 * peak_memory.GiB < split["parts"]["dit_weights"]


def test_tiny_vae_checkpoints_lower_the_split_tiers_and_their_targets_pass():
    """checkpoint_tiny_vae: 366 instead of 994 bytes per frame and pixel for the graph, 226
    instead of 655 for the no-grad encode; the seed's figures hold with or without it."""
    for plain, lean in [(SEED_SPLIT, SPLIT), ({**SEED_SPLIT, "enable_mmgp": True}, OFFLOAD)]:
        a, b = peak_memory.estimate(plain, **DOC), peak_memory.estimate(lean, **DOC)
        assert b["gpu_bytes"] < a["gpu_bytes"]
        assert b["parts"]["encoder_graph"] < 0.4 * a["parts"]["encoder_graph"]
        assert b["parts"]["nograd_encode"] < 0.4 * a["parts"]["nograd_encode"]
    assert peak_memory.estimate(SEED_SPLIT, **DOC)["reserved_bytes"] < 48 * peak_memory.GiB
    assert peak_memory.estimate({**SEED_SPLIT, "enable_mmgp": True}, **DOC)["reserved_bytes"] < (
        24 * peak_memory.GiB
    )


def test_split_phases_do_not_overlap_the_dit_with_the_graphs():
    full = peak_memory.estimate(TIERS["full"], **DOC)
    split = peak_memory.estimate(TIERS["split"], **DOC)
    p = full["parts"]
    assert full["phase"] == "sds"
    assert full["phases"]["sds"] >= p["render_graph"] + p["encoder_graph"] + p["dit_weights"]
    assert set(split["phases"]) == {"regularisers", "sds_targets", "sds_backward"}
    # the target pass holds the expert and the largest no-grad transient (render, encode,
    # condition or DiT activations), but neither graph
    targets = split["phases"]["sds_targets"]
    q = split["parts"]
    weights = q["dit_weights"] + q["vae_weights"] + q["tiny_vae_weights"] + q["text"]
    transient = max(
        2 * q["video"], q["video"] + q["nograd_encode"], q["condition"], q["dit_activations"]
    )
    assert targets == weights + q["targets"] + transient
    assert targets < full["phases"]["sds"]
    assert targets >= p["dit_weights"] + p["dit_activations"]


@pytest.mark.parametrize("name", list(TIERS))
@pytest.mark.parametrize(
    "key,small,large",
    [("frames", 21, 41), ("batch", 1, 4), ("gaussians", 50_000, 400_000)],
)
def test_peak_grows_with_frames_batch_and_gaussians(name, key, small, large):
    lo = peak_memory.estimate(TIERS[name], **tier_doc(name, **{key: small}))
    hi = peak_memory.estimate(TIERS[name], **tier_doc(name, **{key: large}))
    assert hi["gpu_bytes"] >= lo["gpu_bytes"]
    assert sum(hi["parts"].values()) > sum(lo["parts"].values())


def test_peak_grows_with_size_and_lower_tiers_need_less():
    peaks = [
        peak_memory.estimate(TIERS["split"], **{**DOC, "width": w, "height": h})["gpu_bytes"]
        for w, h in [(416, 240), (576, 320), (832, 480)]
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    order = [peak_memory.estimate(TIERS[n], **tier_doc(n))["gpu_bytes"] for n in TIERS]
    assert order == sorted(order, reverse=True)


def test_fits_reads_the_flags_and_host_ram():
    # mmgp alone does not fit 24 GB: without split, the graphs overlap the DiT
    assert peak_memory.fits({**SPLIT, "enable_mmgp": True}, 24, **DOC)
    assert not peak_memory.fits({"enable_mmgp": True}, 24, **DOC)
    assert not peak_memory.fits({}, 48, **DOC)
    assert peak_memory.fits(TIERS["split"], 48, host_mem_gb=64, **DOC)
    assert not peak_memory.fits(TIERS["offload"], 24, host_mem_gb=32, **DOC)  # host RAM
    e = peak_memory.estimate(TIERS["lowres"], **tier_doc("lowres"))
    assert (e["width"], e["height"], e["tokens"]) == (576, 320, 7_920)
    with pytest.raises(ValueError, match="split_sds_bakward"):  # one list of flags: the schema
        peak_memory.estimate({"split_sds_bakward": True}, **DOC)


def test_full_vae_path_and_sequential_cfg():
    tiny = peak_memory.estimate(TIERS["split"], **DOC)
    full_vae = peak_memory.estimate(TIERS["split"], **DOC, use_tiny_vae=False)
    assert full_vae["parts"]["encoder_graph"] > tiny["parts"]["encoder_graph"]
    seq = peak_memory.estimate({**TIERS["split"], "sds_cfg_batch": False}, **DOC)
    assert seq["parts"]["dit_activations"] * 2 == tiny["parts"]["dit_activations"]


def test_invalid_shapes_are_errors():
    with pytest.raises(ValueError, match="positive"):
        peak_memory.estimate({}, **{**DOC, "batch": 0})
    assert "GiB" in peak_memory.describe(peak_memory.estimate({}, **DOC))


def test_the_model_takes_the_experts_shapes_from_the_wan_folder(tmp_path, caplog):
    """A run on a small model must not be described (logged, planned, checked) as A14B."""
    from types import SimpleNamespace

    import torch

    from chord.config import settings
    from chord.guidance import tiny_models
    from chord.resources import job_size
    from chord.training import device_report

    folder = tiny_models.write_tiny_wan(tmp_path / "wan")
    shape = peak_memory.ModelShape.from_folder(folder)
    assert (shape.layers, shape.heads, shape.head_dim, shape.ffn) == (1, 2, 8, 32)
    assert shape.vae_base_dim == 8 and shape.experts == 2
    vae = tiny_models.tiny_vae()
    assert shape.vae_params == sum(p.numel() for p in vae.parameters())
    expert = tiny_models.tiny_transformer()
    assert peak_memory.dit_params(shape) == sum(p.numel() for p in expert.parameters())
    assert (
        peak_memory.model_for(folder) == shape and peak_memory.model_for(None) is peak_memory.A14B
    )
    assert peak_memory.ModelShape.from_folder(tmp_path / "elsewhere") is peak_memory.A14B
    shape_kw = dict(width=64, height=32, frames=5, batch=1, gaussians=1000)
    small = peak_memory.estimate({}, model=shape, **shape_kw)
    assert (
        small["parts"]["dit_weights"]
        < peak_memory.MiB
        < peak_memory.estimate({}, **shape_kw)["parts"]["dit_weights"]
    )
    scene = SimpleNamespace(
        means=torch.zeros(300, 3), slices={"obj_0": slice(0, 300)}, dynamic={"obj_0": None}
    )
    m = settings.method_from_mapping({"size": "64*32", "frame_num": 5, "batch_size": 1})
    wan = settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)})
    with caplog.at_level("INFO", logger="chord.training.device_report"):
        mem = settings.memory_from_mapping({})
        trainer = SimpleNamespace(scene=scene, memory=mem)
        e = device_report.log_memory_estimate(trainer, m, wan, None)
    assert e == job_size.estimate(m, mem, None, 300, 300, shape)
    assert "experts: 1 layers x 16," in caplog.text and "dit_weights 26.6" not in caplog.text


def test_the_teacher_preview_holds_one_expert_whole_or_streamed_per_tier():
    """The preview (diffusers' pipeline, inference only): one expert's weights, whole on full /
    split, mmgp's window on the enable_mmgp tiers; CFG as two batch-1 passes (the training's
    activations with sds_cfg_batch off); the decode after the expert is released. Each tier's
    preview fits its GPU at its size (41 frames), and host RAM is one expert."""
    gpu = {"full": 80, "split": 48, "offload": 24, "lowres": 16, "lowres_min": 12}
    expert = peak_memory.dit_params(peak_memory.A14B) * 2
    for name, flags in TIERS.items():
        shape = {k: v for k, v in tier_doc(name).items() if k in ("width", "height", "frames")}
        e = job_memory.preview_estimate(flags, **shape)
        train = peak_memory.estimate({**flags, "sds_cfg_batch": False}, **tier_doc(name))
        assert e["parts"]["dit_activations"] == train["parts"]["dit_activations"], name
        assert e["parts"]["dit_weights"] == train["parts"]["dit_weights"], name
        assert e["mode"] == ("mmgp" if flags.get("enable_mmgp") else "gpu")
        p = e["parts"]
        assert e["phases"]["decode"] == p["vae_weights"] + p["text"] + p["latents"] + p["decode"]
        assert e["reserved_bytes"] + peak_memory.CUDA_CONTEXT_GIB * peak_memory.GiB < (
            gpu[name] * peak_memory.GiB
        ), name
        mmgp = expert // 2 if flags.get("enable_mmgp") else 0
        assert e["host_bytes"] == expert + peak_memory.HOST_BASE_GIB * peak_memory.GiB + mmgp
    full = job_memory.preview_estimate({}, width=832, height=480, frames=41)
    assert full["parts"]["dit_weights"] == expert  # one expert, not both
    assert full["gpu_bytes"] > 24 * peak_memory.GiB  # a whole expert does not fit 24 GB
    off = job_memory.preview_estimate(OFFLOAD, width=832, height=480, frames=41)
    assert off["phases"]["decode"] == full["phases"]["decode"]  # no expert during the decode


def test_the_preview_job_asks_for_one_experts_host_ram_below_the_tiers_ceiling():
    """mem_mb of the preview: its host RAM + 10%, the tier's host_mem_gb the ceiling (A14B:
    ~36 GB on full, below its 64; ~51 GB with mmgp's staging, below offload's 96; both
    below two bf16 experts, which the pipeline once held)."""
    expert = peak_memory.dit_params(peak_memory.A14B) * 2
    full = job_memory.preview_mem_mb({}, ceiling_mb=64 * 1024)
    off = job_memory.preview_mem_mb(OFFLOAD, ceiling_mb=96 * 1024)
    assert full == -(-int((expert + 6 * peak_memory.GiB) * 1.1) // peak_memory.MiB)
    assert 2 * expert / peak_memory.MiB > off > full > 1.1 * expert / peak_memory.MiB
    assert off < 96 * 1024 and full < 64 * 1024
    assert job_memory.preview_mem_mb(OFFLOAD, ceiling_mb=40_000) == 40_000
    tiny = peak_memory.ModelShape(**{**vars(peak_memory.A14B), "layers": 1})
    assert job_memory.preview_mem_mb({}, ceiling_mb=64 * 1024, model=tiny) < full


# The contact loss (issue 36): the default method's figures, 2 dynamic objects
CONTACT = {"frames": 41, "contact_points": 2 * 8000}


def contact_bytes(frames: int, points: int, nodes: int) -> tuple[int, int]:
    """(grid, graph) bytes of the contact loss from its shapes, float32: the grid's nodes and
    each point's depth at rest, resident; per frame and point the deformed point and
    grid_sample's normalised copy of it (3 + 3), the distance's gradient (1) and grid_sample's
    gradient w.r.t. the point (3), and the point's deformation graph (the model's a_d)."""
    deform = peak_memory.CPU_PROXY["deform_per_gaussian"]
    return 4 * (nodes + points), int((4 * (3 + 3 + 1 + 3) + deform) * frames * points)


@pytest.mark.parametrize("tier", ["full", "split", "offload"])
def test_the_contact_loss_adds_its_grid_and_graph_only_where_it_is_on(tier):
    from chord.motion import contact

    doc = {**tier_doc(tier), "frames": CONTACT["frames"]}
    off = peak_memory.estimate(TIERS[tier], **doc)
    assert off == peak_memory.estimate(TIERS[tier], **doc, contact_points=0)
    assert not any(k.startswith("contact") for k in off["parts"])
    assert "contact" not in peak_memory.describe(off)
    on = peak_memory.estimate(TIERS[tier], **doc, contact_points=CONTACT["contact_points"])
    side = contact.GRID_CELLS + 2 * contact.PAD_CELLS + 2  # a cube's, the worst case
    grid, graph = contact_bytes(CONTACT["frames"], CONTACT["contact_points"], side**3)
    assert (on["parts"]["contact_grid"], on["parts"]["contact_graph"]) == (grid, graph)
    # the grid is resident in every phase; the graph lives in the regularisers only
    for phase, b in off["phases"].items():
        assert on["phases"][phase] == b + grid + (graph if phase == "regularisers" else 0)
    assert on["gpu_bytes"] == max(on["phases"].values()) > off["gpu_bytes"]
    assert f"contact loss {grid / peak_memory.MiB:.1f} MiB resident" in peak_memory.describe(on)
    assert f"{graph / peak_memory.MiB:.1f} MiB in the regularisers" in peak_memory.describe(on)
    assert on["host_bytes"] == off["host_bytes"]
    # a built grid's own node count (the demo's slab: 137 x 15 x 116) replaces the worst case
    slab = peak_memory.estimate(
        TIERS[tier], **doc, contact_points=2000, contact_grid_nodes=137 * 15 * 116
    )
    assert slab["parts"]["contact_grid"] == contact_bytes(41, 2000, 137 * 15 * 116)[0]


def test_the_contact_graph_grows_with_the_surface_points_and_the_frames():
    def graph(frames, points):
        e = peak_memory.estimate(TIERS["split"], **{**DOC, "frames": frames}, contact_points=points)
        return e["parts"]["contact_graph"]

    assert graph(41, 8000) < graph(41, 16000) == 2 * graph(41, 8000)
    assert graph(21, 8000) < graph(41, 8000)
    assert graph(41, 8000) == contact_bytes(41, 8000, 0)[1]


def test_the_contact_grid_bound_holds_for_any_box():
    """The model's grid constants are the loss's, and its bound (a cube's node count, with the
    node a rounding ceil may add) holds for boxes of any shape, the rounding case included."""
    import trimesh

    from chord.motion import contact

    assert (peak_memory.CONTACT_GRID_CELLS, peak_memory.CONTACT_PAD_CELLS) == (
        contact.GRID_CELLS,
        contact.PAD_CELLS,
    )
    assert peak_memory.contact_grid_bound() == (128 + 8 + 2) ** 3  # 10.5 MB in float32
    bound = peak_memory.contact_grid_bound(8, 1)
    longest = []
    for extents in [(1, 1, 1), (1.2, 0.05, 1.0), (0.74, 0.39, 0.96), (0.3, 2.0, 0.7)]:
        box = trimesh.creation.box(extents=extents)
        box.apply_translation([e / 2 for e in extents])
        grid = contact.signed_distance_grid([(box.vertices, box.faces)], cells=8, pad=1)
        assert grid.values.numel() <= bound, extents
        longest.append(max(grid.values.shape))
    assert max(longest) ** 3 == bound  # (0.74, 0.39, 0.96): a ceil rounds past 8 + 1
