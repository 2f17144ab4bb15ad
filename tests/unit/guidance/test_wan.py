"""Wan guidance on tiny random components saved with save_pretrained and loaded back through
the real loader (local files only)."""

from __future__ import annotations

import shutil

import pytest
import torch

from chord.guidance import text, tiny_models, wan, wan_folder
from tests.fake_mmgp import FakeMMGP

T = 41
W, H = 32, 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_models.write_tiny_wan(tmp_path_factory.mktemp("wan") / "Wan2.2-I2V-A14B-Tiny")


@pytest.fixture(scope="module")
def guidance(folder):
    return wan.WanGuidance(folder, device="cpu")


@pytest.fixture(scope="module")
def embeddings(folder):
    tok, enc = wan_folder.load_text_encoder(folder)
    e, _ = text.encode_prompts(tok, enc, ["a block hops", text.resolve_negative(".")])
    return {"prompt": e[0], "negative": e[1]}


def video(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(T, 3, H, W, generator=g)


def test_folder_check_lists_what_is_missing(folder, tmp_path):
    with pytest.raises(ValueError, match="folder not found"):
        wan_folder.check_folder(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    shutil.rmtree(broken / "transformer_2")
    (broken / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ValueError) as err:
        wan_folder.check_folder(broken)
    msg = str(err.value)
    assert str(broken) in msg and "transformer_2/config.json" in msg and "vae/ weights" in msg
    assert wan_folder.check_folder(folder)["boundary_ratio"] == 0.9


def test_conditioning_layout_for_41_frames(guidance, embeddings):
    v = video()
    y = guidance.condition(v)
    assert y.shape == (20, 11, H // 8, W // 8)
    torch.testing.assert_close(y[:4, 0], torch.ones(4, H // 8, W // 8))
    assert float(y[:4, 1:].abs().max()) == 0.0
    # the image latent depends on frame 0 only
    v2 = v.clone()
    v2[1:] = torch.rand(T - 1, 3, H, W)
    torch.testing.assert_close(guidance.condition(v2), y)
    seen = []
    hook = lambda m, args, kwargs: seen.append(kwargs["hidden_states"].clone())  # noqa: E731
    z = guidance.encode_video(v)
    assert z.shape == (16, 11, H // 8, W // 8)
    z_t = torch.randn(1, *z.shape)
    guidance._activate("transformer")
    handle = guidance.experts["transformer"].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        guidance.velocity(z_t, 0.95, [y], embeddings, cfg_scale=5.0)
    finally:
        handle.remove()
    x = seen[0]  # [2B, 36, F', h, w]: 16 noisy | 4 mask | 16 image, for cond and uncond
    assert x.shape == (2, 36, 11, H // 8, W // 8)
    torch.testing.assert_close(x[0, :16], z_t[0])
    torch.testing.assert_close(x[0, 16:20], y[:4])
    torch.testing.assert_close(x[1, 20:], y[4:])


def test_one_expert_in_memory_routed_at_the_boundary_and_reloaded_after_a_switch(
    folder, embeddings, monkeypatch
):
    """Both A14B experts held at once are ~57 GB of host RAM: a switch drops the other one,
    and an expert needed again (after a roll-back) is loaded anew."""
    loaded, calls = [], []
    load = wan_folder.load_expert

    def counting_load(ckpt_dir, name, *, dtype):
        model = load(ckpt_dir, name, dtype=dtype)
        loaded.append(name)
        model.register_forward_hook(lambda m, a, o: calls.append(name))
        return model

    monkeypatch.setattr(wan_folder, "load_expert", counting_load)
    g = wan.WanGuidance(folder)
    z = torch.randn(1, 16, 11, H // 8, W // 8)
    y = g.condition(video())
    for t in (0.98, 0.9, 0.8999, 0.02, 0.95):  # the last: high noise again after a roll-back
        g.velocity(z, t, [y], embeddings, cfg_scale=1.0)
        assert list(g.experts) == [g.active]
    high, low = "transformer", "transformer_2"
    assert calls == [high, high, low, low, high]
    assert loaded == [high, low, high] and g.loads == 3


def test_cfg_arithmetic_and_batched_equals_sequential(folder, guidance, embeddings):
    z = torch.randn(2, 16, 11, H // 8, W // 8, generator=torch.Generator().manual_seed(1))
    ys = [guidance.condition(video(1)), guidance.condition(video(2))]
    v = guidance.velocity(z, 0.5, ys, embeddings, cfg_scale=7.5)
    model = guidance.experts["transformer_2"]
    x = torch.cat([z, torch.stack(ys)], 1)
    ts = torch.full((2,), 500.0)
    with torch.no_grad():
        v_c, v_u = (
            model(
                hidden_states=x,
                timestep=ts,
                encoder_hidden_states=embeddings[key][None].expand(2, -1, -1),
                return_dict=False,
            )[0]
            for key in ("prompt", "negative")
        )
    torch.testing.assert_close(v, v_u + 7.5 * (v_c - v_u), atol=1e-5, rtol=1e-5)
    sequential = wan.WanGuidance(folder, sds_cfg_batch=False)
    torch.testing.assert_close(
        sequential.velocity(z, 0.5, ys, embeddings, 7.5), v, atol=1e-5, rtol=1e-5
    )


def test_full_vae_latents_carry_gradients_to_the_video(guidance):
    v = video().requires_grad_(True)
    z = guidance.encode_video(v)
    z.square().sum().backward()
    assert v.grad is not None and float(v.grad.abs().sum()) > 0
    assert all(p.grad is None for p in guidance.vae.parameters())


def test_text_embeddings_are_zero_padded_to_512(embeddings):
    p = embeddings["prompt"]
    assert p.shape == (512, tiny_models.TINY_TEXT_DIM)
    n = int((p.abs().sum(-1) > 0).sum())
    assert 0 < n < 512 and float(p[n:].abs().max()) == 0.0
    assert text.resolve_negative(".") == text.resolve_negative("") == text.DEFAULT_NEGATIVE_PROMPT
    assert text.resolve_negative("blurry") == "blurry"


def test_from_config_with_the_tiny_vae(folder, tmp_path):
    from safetensors.torch import save_file

    from chord.config import settings
    from chord.guidance.tiny_vae import TinyVAEEncoder

    weights = tmp_path / "lighttaew2_1.safetensors"
    save_file(TinyVAEEncoder().state_dict(), str(weights))
    guidance = settings.guidance_from_mapping(
        {"backend": "wan", "ckpt_dir": str(folder), "tiny_vae_path": str(weights)}
    )
    mem = settings.memory_from_mapping({})
    g = wan.from_config(guidance, settings.method_from_mapping({"use_tiny_vae": True}), mem)
    v = video().requires_grad_(True)
    z = g.encode_video(v)
    assert z.shape == (16, 11, H // 8, W // 8)
    z.sum().backward()
    assert float(v.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="use_tiny_vae: set guidance.tiny_vae_path"):
        wan.from_config(
            settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)}),
            settings.method_from_mapping({"use_tiny_vae": True}),
            mem,
        )
    with pytest.raises(RuntimeError, match="enable_mmgp needs a CUDA GPU"):
        wan.from_config(
            settings.guidance_from_mapping({"backend": "wan", "ckpt_dir": str(folder)}),
            settings.method_from_mapping({}),
            settings.memory_from_mapping({"enable_mmgp": True}),
        )


def test_float32_fallback_computes_in_float32_not_under_bf16_autocast(folder, embeddings):
    """The experts run under autocast to their dtype (bf16: METHOD §9); after the fallback
    both the weights and the arithmetic are float32 (bf16 autocast over float32 weights would
    double the memory and change nothing)."""
    g = wan.WanGuidance(folder, dtype=torch.bfloat16)  # as on CUDA; autocast on the CPU here
    seen = []

    def probe(module, args, kwargs):
        dev = g.device.type
        seen.append(
            (
                torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev),
                module.proj_out.weight.dtype,  # (norms and the time embedder stay fp32)
            )
        )

    z = torch.randn(1, 16, 11, H // 8, W // 8)
    y = g.condition(video())
    g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)
    handle = g.experts["transformer_2"].register_forward_pre_hook(probe, with_kwargs=True)
    g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)
    assert g.compute_dtype == torch.bfloat16 and seen[-1] == (torch.bfloat16, torch.bfloat16)
    handle.remove()
    g.use_float32()  # drops the bf16 expert: the next pass loads it from the folder in float32
    assert g.experts == {}
    g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)
    handle = g.experts["transformer_2"].register_forward_pre_hook(probe, with_kwargs=True)
    v = g.velocity(z, 0.5, [y], embeddings, cfg_scale=2.0)
    handle.remove()
    assert g.compute_dtype == torch.float32 and seen[-1] == (False, torch.float32)
    assert v.dtype == torch.float32 and bool(torch.isfinite(v).all())
    g.velocity(z, 0.95, [y], embeddings, cfg_scale=2.0)  # an expert loaded after the switch
    assert g.experts["transformer"].proj_out.weight.dtype == torch.float32


def test_mmgp_gets_the_exact_timestep_and_fresh_experts(folder, embeddings):
    """mmgp casts float32 arguments to bf16: 1000·t = 907.2 would reach the time embedding as
    908. And after a switch the released expert is never handed to mmgp again."""
    from chord.guidance.mmgp_residency import MMGPResidency

    fake = FakeMMGP()  # casts what it wraps as mmgp does
    g = wan.WanGuidance(folder, mmgp=MMGPResidency(4.0, 100, module=fake, cuda_check=False))
    seen = []
    z = torch.randn(1, 16, 11, H // 8, W // 8)
    y = g.condition(video())
    t = 0.9072
    for step_t in (t, 0.5, t):  # high, low, then high again (a roll-back)
        g.velocity(z, step_t, [y], embeddings, cfg_scale=2.0)
        model = g.experts[g.active]
        if not seen:
            proj = model.condition_embedder.timesteps_proj
            proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
            g.velocity(z, step_t, [y], embeddings, cfg_scale=2.0)
    assert float(seen[0][0]) == pytest.approx(1000 * t, abs=1e-3)  # not 908
    assert len(fake.wrapped) == 3 and len({id(m) for m in fake.wrapped}) == 3
