"""The teacher preview (`snakemake preview`): the oracle's scripted target video, and Wan 2.2
through diffusers' image-to-video pipeline with our experts and cached conditioning."""

from __future__ import annotations

import functools
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from chord.cli import upstream_train
from chord.config import settings
from chord.core import media
from chord.guidance import mmgp_residency, text, tiny_models, wan_folder, wan_preview
from chord.plan import results_layout
from chord.resources import tiers
from chord.scene import demo
from chord.stages import condition, preview, reference
from tests import components
from tests.unit.guidance.test_wan_diffusers import diffusers_pipeline

W, H, T = 48, 32, 5
METHOD = {"gs_init_num": 600, "surface_target_num": 200, "cp_num": 8, "size": f"{W}*{H}"} | {
    "frame_num": T,
    "save_fps": 5,
}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview")
    data = demo.write_demo_scene("hop", root / "data", frame_num=T)
    m = settings.method_from_mapping(METHOD)
    res, s = root / "results", "hop"
    out = upstream_train.prepare_geometry(data=data, results=res, scene=s, method=m)
    reference.run(
        scene_json=results_layout.scene_json(res, s),
        plys=out["plys"],
        out_png=results_layout.reference_png(res, s),
        out_orbit=results_layout.static_orbit_mp4(res, s),
        method=m,
    )
    return root, data, m, res, s, out["plys"]


def test_the_oracle_previews_its_scripted_target_video(hop):
    root, data, m, res, s, plys = hop
    summary = preview.run(
        scene_json=results_layout.scene_json(res, s),
        plys=plys,
        ref_png=results_layout.reference_png(res, s),
        text_path=None,
        data_dir=data,
        method=m,
        guidance=settings.guidance_from_mapping({"backend": "oracle"}),
        settings=settings.PreviewConfig(),
        out_mp4=results_layout.teacher_mp4(res, s),
        out_png=results_layout.teacher_png(res, s),
    )
    frames, meta = media.read_mp4(results_layout.teacher_mp4(res, s))
    assert frames.shape == (T, H, W, 3) and meta["fps"] == 5 and summary["frames"] == T
    ref = np.asarray(Image.open(results_layout.reference_png(res, s)), dtype=np.float64)
    first, last = frames[0].astype(np.float64), frames[-1].astype(np.float64)

    def changed(a, b):  # the fraction of pixels that differ clearly (not by video coding)
        return float((np.abs(a - b).max(-1) > 40).mean())

    # frame 0 is the rest pose, the reference render; the last frame has moved
    assert changed(first, ref) < 0.002 < changed(last, first)
    with Image.open(results_layout.teacher_png(res, s)) as im:
        assert im.size == (3 * W, H)


@pytest.fixture(scope="module")
def wan_hop(hop, tmp_path_factory):
    """The hop scene with a tiny Wan folder, its cached text conditioning, and the shipped
    config (its tiers) with the Wan teacher."""
    root, data, m, res, s, plys = hop
    wan_root = tmp_path_factory.mktemp("wan")
    folder = tiny_models.write_tiny_wan(wan_root / "wan")
    conf = yaml.safe_load((REPO / "config/config.yaml").read_text())
    (wan_root / "scenes.tsv").write_text(f"scene\tdata\tprompt\ttier\n{s}\t{data}\tp\tfull\n")
    conf.update(
        scenes=str(wan_root / "scenes.tsv"), guidance={"backend": "wan", "ckpt_dir": str(folder)}
    )
    conf["scene_overrides"] = {s: METHOD | {"use_tiny_vae": False}}  # no Tiny VAE weights here
    conf["preview"] = {"steps": 4, "guidance_scale": 2.0, "seed": 3}
    conf = settings.load(conf)
    cond = wan_root / "text.safetensors"
    condition.run(
        out=cond, prompt="a block hops", n_prompt=".", guidance=conf.guidance, method=m, scene=s
    )
    inputs = {
        "scene_json": results_layout.scene_json(res, s),
        "plys": plys,
        "ref_png": results_layout.reference_png(res, s),
        "text_path": cond,
    }
    return conf, s, inputs


class Experts:
    """A spy on the preview's experts: every load from the folder, what is resident then, the
    device each runs on and whether diffusers' offload hooks wrap it, and what is resident when
    the VAE decodes."""

    def __init__(self, monkeypatch):
        from diffusers import AutoencoderKLWan

        self.loaded, self.events, self.runs = [], [], []
        load, decode = wan_folder.load_expert, AutoencoderKLWan.decode

        def spy_load(ckpt_dir, name, *, dtype):
            self.events.append(("load", name, self.resident()))
            model = load(ckpt_dir, name, dtype=dtype)
            self.loaded.append((name, model))
            model.register_forward_pre_hook(
                lambda mod, args: self.runs.append(
                    (name, mod.proj_out.weight.device.type, hasattr(mod, "_hf_hook"))
                )
            )
            return model

        def spy_decode(vae, *args, **kwargs):
            self.events.append(("decode", self.resident()))
            return decode(vae, *args, **kwargs)

        monkeypatch.setattr(wan_folder, "load_expert", spy_load)
        monkeypatch.setattr(AutoencoderKLWan, "decode", spy_decode)

    def resident(self) -> list[str]:
        """The loaded experts whose weights still hold memory (not released to meta)."""
        return [
            name
            for name, model in self.loaded
            if any(p.device.type != "meta" for p in model.parameters())
        ]


def fake_mmgp():
    """A stand-in for the mmgp package (it needs CUDA): ``offload.profile`` records which expert
    it wraps with which settings; its offload object records its release."""
    log = []

    def profile(modules, **kwargs):
        (model,) = modules.values()
        log.append(("profile", list(modules), model, kwargs))
        return types.SimpleNamespace(
            release=lambda: log.append(("release", model)), unload_all=lambda: None
        )

    return types.SimpleNamespace(offload=types.SimpleNamespace(profile=profile)), log


def preview_on(wan_hop, tier, tmp_path):
    conf, s, inputs = wan_hop
    return preview.run_job(
        conf=conf,
        scene=s,
        tier=tier,
        inputs=inputs,
        out_mp4=tmp_path / "teacher.mp4",
        out_png=tmp_path / "teacher.png",
        env={},
    )


def test_wan_previews_one_expert_at_a_time_on_the_device_on_a_full_tier(
    wan_hop, tmp_path, monkeypatch
):
    """Tier full: the real WanImageToVideoPipeline samples with the high-noise expert, then the
    low-noise one; the first is released before the second loads and the second before the VAE
    decodes, each runs whole on the job's device (no diffusers offload hooks, no mmgp)."""
    from diffusers import WanImageToVideoPipeline

    conf, s, inputs = wan_hop
    made, calls = [], []
    monkeypatch.setattr(mmgp_residency, "MMGPResidency", lambda *a, **k: made.append(a))
    call = WanImageToVideoPipeline.__call__

    def spy_call(pipe, **kw):
        calls.append(kw)
        return call(pipe, **kw)

    monkeypatch.setattr(WanImageToVideoPipeline, "__call__", spy_call)
    spy = Experts(monkeypatch)
    summary = preview_on(wan_hop, "full", tmp_path)
    # 4 steps at timesteps 999, 937 (high noise: >= 900), 833, 625 (low noise)
    assert spy.events == [
        ("load", "transformer", []),
        ("load", "transformer_2", []),
        ("decode", []),
    ]
    assert [r[0] for r in spy.runs] == ["transformer"] * 4 + ["transformer_2"] * 4  # CFG: 2 each
    assert {r[1:] for r in spy.runs} == {("cpu", False)} and made == []
    [kw] = calls
    cached, _ = text.read(inputs["text_path"])
    torch.testing.assert_close(kw["prompt_embeds"][0], cached["prompt"])
    torch.testing.assert_close(kw["negative_prompt_embeds"][0], cached["negative"])
    assert (kw["num_frames"], kw["height"], kw["width"]) == (T, H, W)
    assert (kw["num_inference_steps"], kw["guidance_scale"]) == (4, 2.0)
    assert kw["image"].size == (W, H)  # the reference render
    frames, _ = media.read_mp4(tmp_path / "teacher.mp4")
    assert frames.shape == (T, H, W, 3) and summary["frames"] == T


def test_wan_previews_with_mmgp_residency_on_an_enable_mmgp_tier(wan_hop, tmp_path, monkeypatch):
    """Tier offload (enable_mmgp): each expert is handed to mmgp, with the tier's profile and
    transformer budget, before it runs, and released before the next loads; only one is ever
    resident."""
    conf, s, inputs = wan_hop
    fake, log = fake_mmgp()
    monkeypatch.setattr(
        mmgp_residency,
        "MMGPResidency",
        functools.partial(mmgp_residency.MMGPResidency, module=fake, cuda_check=False),
    )
    spy = Experts(monkeypatch)
    preview_on(wan_hop, "offload", tmp_path)
    (high, m_high), (low, m_low) = spy.loaded
    assert (high, low) == ("transformer", "transformer_2")
    assert [(e[0], e[2] if e[0] == "profile" else e[1]) for e in log] == [
        ("profile", m_high),
        ("release", m_high),
        ("profile", m_low),
        ("release", m_low),
    ]
    _, mem = tiers.apply(conf.scenes[s].method, conf.memory, tiers.parse(conf.tiers)["offload"])
    assert mem.enable_mmgp
    for entry in log[::2]:
        kwargs = entry[3]
        assert entry[1] == ["transformer"]  # the key mmgp's budgets know the DiT by
        assert kwargs["profile_no"] == int(mem.mmgp_profile)
        assert kwargs["budgets"]["transformer"] == mem.mmgp_transformer_budget
    assert spy.events == [
        ("load", "transformer", []),
        ("load", "transformer_2", []),
        ("decode", []),
    ]
    frames, _ = media.read_mp4(tmp_path / "teacher.mp4")
    assert frames.shape == (T, H, W, 3)


def test_an_enable_mmgp_tier_without_cuda_says_why_and_writes_nothing(wan_hop, tmp_path):
    if torch.cuda.is_available():
        components.missing(components.CPU_ONLY, "this machine has CUDA")
    with pytest.raises(RuntimeError, match="enable_mmgp needs a CUDA GPU"):
        preview_on(wan_hop, "offload", tmp_path)
    assert not list(tmp_path.iterdir())


def test_one_expert_at_a_time_samples_what_the_pipeline_with_both_does(wan_hop, tmp_path):
    """The swap at the boundary changes memory, not the sample: the same frames as diffusers'
    pipeline holding both experts throughout."""
    conf, s, inputs = wan_hop
    folder = conf.guidance.ckpt_dir
    cached, _ = text.read(inputs["text_path"])
    image = Image.open(inputs["ref_png"]).convert("RGB")
    args = {"frames": T, "steps": 4, "guidance_scale": 2.0, "guidance_scale_2": 3.0, "seed": 3}
    ours = wan_preview.sample_video(folder, image, cached, **args)
    pipe = diffusers_pipeline(folder)
    both = pipe(
        image=image,
        prompt_embeds=cached["prompt"][None],
        negative_prompt_embeds=cached["negative"][None],
        height=H,
        width=W,
        num_frames=T,
        num_inference_steps=4,
        guidance_scale=2.0,
        guidance_scale_2=3.0,
        generator=torch.Generator().manual_seed(3),
        output_type="np",
    ).frames[0]
    np.testing.assert_array_equal(ours, (np.clip(both, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))


@pytest.mark.parametrize(
    ("boundary", "expected"),
    [(0.9995, ["transformer_2"]), (0.05, ["transformer"])],
)
def test_a_boundary_at_an_end_loads_only_the_expert_its_steps_use(
    wan_hop, monkeypatch, boundary, expected
):
    conf, s, inputs = wan_hop
    spy = Experts(monkeypatch)
    cached, _ = text.read(inputs["text_path"])
    image = Image.open(inputs["ref_png"]).convert("RGB")
    wan_preview.sample_video(
        conf.guidance.ckpt_dir,
        image,
        cached,
        frames=T,
        steps=3,
        guidance_scale=2.0,
        boundary_ratio=boundary,
    )
    assert [name for name, _ in spy.loaded] == expected
    assert spy.resident() == [] and [r[0] for r in spy.runs] == expected * 6
