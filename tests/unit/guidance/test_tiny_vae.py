"""Tiny VAE encoder (METHOD §10): lighttaew2_1 layout, time recurrence, loading."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from chord.guidance.tiny_vae import (
    WAN21_LATENTS_MEAN,
    WAN21_LATENTS_STD,
    MemBlock,
    TinyVAEEncoder,
    TPool,
    latent_stats_from_config,
    load_tiny_vae,
)


def _memblock_keys(i: int) -> dict[str, tuple]:
    return {
        f"encoder.{i}.conv.0.weight": (64, 128, 3, 3),
        f"encoder.{i}.conv.0.bias": (64,),
        f"encoder.{i}.conv.2.weight": (64, 64, 3, 3),
        f"encoder.{i}.conv.2.bias": (64,),
        f"encoder.{i}.conv.4.weight": (64, 64, 3, 3),
        f"encoder.{i}.conv.4.bias": (64,),
    }


# The TAEHV encoder's layer table (the team's TAEHV notes: madebyollin/taehv's layout), written out.
EXPECTED = {
    "encoder.0.weight": (64, 3, 3, 3),
    "encoder.0.bias": (64,),
    "encoder.2.conv.weight": (64, 128, 1, 1),
    "encoder.3.weight": (64, 64, 3, 3),
    **_memblock_keys(4),
    **_memblock_keys(5),
    **_memblock_keys(6),
    "encoder.7.conv.weight": (64, 128, 1, 1),
    "encoder.8.weight": (64, 64, 3, 3),
    **_memblock_keys(9),
    **_memblock_keys(10),
    **_memblock_keys(11),
    "encoder.12.conv.weight": (64, 64, 1, 1),
    "encoder.13.weight": (64, 64, 3, 3),
    **_memblock_keys(14),
    **_memblock_keys(15),
    **_memblock_keys(16),
    "encoder.17.weight": (16, 64, 3, 3),
    "encoder.17.bias": (16,),
}


@pytest.fixture(scope="module")
def enc() -> TinyVAEEncoder:
    torch.manual_seed(0)
    model = TinyVAEEncoder()
    # larger-than-default weights keep activations alive through 18 layers of random weights
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    return model


def _video(n: int, t: int, h: int, w: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, t, 3, h, w, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# layout and shapes
# --------------------------------------------------------------------------------------------


def test_state_dict_matches_taehv_table():
    sd = TinyVAEEncoder().state_dict()
    assert list(sd) == list(EXPECTED)  # order follows the sequence indices too
    assert {k: tuple(v.shape) for k, v in sd.items()} == EXPECTED
    assert all(v.dtype == torch.float32 for v in sd.values())


def test_frozen_by_default_and_optional():
    assert not any(p.requires_grad for p in TinyVAEEncoder().parameters())
    assert all(p.requires_grad for p in TinyVAEEncoder(frozen=False).parameters())


def test_41_frames_give_11_latents_and_padding_repeats_last_frame(enc):
    video = _video(1, 41, 64, 96)
    with torch.no_grad():
        z = enc.encode(video)
        padded = torch.cat([video, video[:, -1:].repeat(1, 3, 1, 1, 1)], dim=1)
        assert padded.shape[1] == 44
        z44 = enc.encode(padded)
        raw = enc(video)
    assert z.shape == (1, 16, 11, 8, 12)
    assert raw.shape == (1, 11, 16, 8, 12)
    assert torch.equal(z, z44)
    assert z.dtype == torch.float32


def test_other_lengths_and_batches(enc):
    with torch.no_grad():
        for t, expect in [(1, 1), (4, 1), (5, 2), (9, 3)]:
            assert enc(_video(1, t, 8, 16)).shape == (1, expect, 16, 1, 2)
        # clips in a batch are independent
        two = _video(2, 6, 8, 16)
        both = enc(two)
        assert torch.allclose(both[1:], enc(two[1:]), atol=1e-5)
        assert torch.allclose(both[:1], enc(two[:1]), atol=1e-5)


def test_bad_input_raises(enc):
    with pytest.raises(ValueError, match="video.*multiples of 8"):
        enc(_video(1, 4, 60, 64))
    with pytest.raises(ValueError, match="video.*multiples of 8"):
        enc(_video(1, 4, 64, 36))
    with pytest.raises(ValueError, match=r"video.*\[N, T, 3, H, W\]"):
        enc(torch.rand(4, 3, 16, 16))
    with pytest.raises(ValueError, match=r"video.*\[N, T, 3, H, W\]"):
        enc(torch.rand(1, 4, 4, 16, 16))
    with pytest.raises(ValueError, match="video.*floats"):
        enc(torch.zeros(1, 4, 3, 16, 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="latents_mean"):
        TinyVAEEncoder(latents_mean=[0.0] * 15)
    with pytest.raises(ValueError, match="latents_std"):
        TinyVAEEncoder(latents_std=[1.0] * 15 + [0.0])


def test_input_range_warning(caplog):
    model = TinyVAEEncoder()
    with caplog.at_level("WARNING", logger="chord.guidance.tiny_vae"), torch.no_grad():
        model(_video(1, 4, 16, 16) * 2 - 1)
    assert "expects [0, 1]" in caplog.text


# --------------------------------------------------------------------------------------------
# time recurrence
# --------------------------------------------------------------------------------------------


def test_causal_in_time(enc):
    video = _video(1, 14, 16, 16)
    with torch.no_grad():
        base = enc(video)
        for k in (0, 3, 4, 9, 13):
            changed = video.clone()
            changed[:, k] = torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(k))
            z = enc(changed)
            first = k // 4
            assert torch.allclose(z[:, :first], base[:, :first], rtol=0, atol=1e-6), k
            assert not torch.allclose(z[:, first], base[:, first], atol=1e-4), k


def _memblock_reference(block: MemBlock, seq: torch.Tensor) -> torch.Tensor:
    """[T, C, H, W] one step at a time; past = this block's input at the previous step."""
    past = torch.zeros_like(seq[0:1])
    out = []
    for t in range(seq.shape[0]):
        x = seq[t : t + 1]
        out.append(F.relu(block.conv(torch.cat([x, past], dim=1)) + x))
        past = x
    return torch.cat(out)


def test_memblock_matches_step_by_step_reference():
    torch.manual_seed(3)
    block = MemBlock(8)
    n, t = 2, 5
    x = torch.randn(n * t, 8, 6, 7)
    with torch.no_grad():
        fast = block(x, n)
        ref = torch.cat([_memblock_reference(block, x[i * t : (i + 1) * t]) for i in range(n)])
    assert torch.allclose(fast, ref, atol=1e-5)
    # a single step: past is zeros
    with torch.no_grad():
        one = block(x[:1], 1)
        body = block.conv(torch.cat([x[:1], torch.zeros_like(x[:1])], dim=1))
    assert torch.allclose(one, F.relu(body + x[:1]), atol=1e-6)


def test_tpool_puts_earlier_step_first():
    pool = TPool(4, 2)
    x = torch.randn(2 * 6, 4, 3, 3)  # N = 2, T = 6
    with torch.no_grad():
        out = pool(x, 2)
        ref = torch.cat(
            [pool.conv(torch.cat([x[i : i + 1], x[i + 1 : i + 2]], dim=1)) for i in range(0, 12, 2)]
        )
    assert out.shape == (6, 4, 3, 3)
    assert torch.allclose(out, ref, atol=1e-6)


def test_encoder_matches_streaming_reference(enc):
    """Whole encoder run one input frame at a time, as TAEHV streams it."""
    video = _video(1, 9, 16, 24)
    x = torch.cat([video, video[:, -1:].repeat(1, 3, 1, 1, 1)], dim=1)[0]  # [12, 3, H, W]
    layers = list(enc.encoder)
    past = {}  # MemBlock index -> previous input
    pending = {}  # TPool index -> frames waiting for their group
    outputs = []

    def run(i: int, frame: torch.Tensor) -> None:
        if i == len(layers):
            outputs.append(frame)
            return
        layer = layers[i]
        if isinstance(layer, MemBlock):
            prev = past.get(i, torch.zeros_like(frame))
            past[i] = frame
            run(i + 1, F.relu(layer.conv(torch.cat([frame, prev], dim=1)) + frame))
        elif isinstance(layer, TPool):
            pending.setdefault(i, []).append(frame)
            if len(pending[i]) == layer.stride:
                run(i + 1, layer.conv(torch.cat(pending.pop(i), dim=1)))
        else:
            run(i + 1, F.relu(frame) if isinstance(layer, torch.nn.ReLU) else layer(frame))

    with torch.no_grad():
        for t in range(x.shape[0]):
            run(0, x[t : t + 1])
        ref = torch.cat(outputs)[None]
        fast = enc(video)
    assert fast.shape == ref.shape == (1, 3, 16, 2, 3)
    assert torch.allclose(fast, ref, atol=1e-5 * ref.abs().max().item())


# --------------------------------------------------------------------------------------------
# gradients and normalisation
# --------------------------------------------------------------------------------------------


def test_gradients_reach_video_not_parameters(enc):
    video = _video(1, 7, 32, 32).requires_grad_()
    z = enc.encode(video)
    assert z.requires_grad
    z.sum().backward()
    assert video.grad is not None
    assert video.grad.abs().sum() > 0
    assert video.grad[:, -1].abs().sum() > 0  # the repeated last frame carries its copies' grads
    assert all(p.grad is None for p in enc.parameters())


def test_checkpointed_encoder_gives_the_same_latents_and_gradients():
    """checkpoint=True (checkpoint_tiny_vae) recomputes blocks in the backward; in float64 the
    latents and the video gradient equal the plain encoder's, for several clips and a length
    that needs padding."""
    torch.manual_seed(0)
    enc = TinyVAEEncoder().double()
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.05)
    video = torch.rand(2, 9, 3, 32, 48, dtype=torch.float64)
    weight = torch.randn(2, 16, 3, 4, 6, dtype=torch.float64)
    out = []
    for checkpoint in (False, True):
        v = video.clone().requires_grad_(True)
        z = enc.encode(v, checkpoint=checkpoint)
        (z * weight).sum().backward()
        out.append((z.detach(), v.grad))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-12, atol=1e-12)
    assert float(out[0][1].abs().sum()) > 0
    with torch.no_grad():  # without grad there is nothing to checkpoint: the plain path
        torch.testing.assert_close(enc.encode(video, checkpoint=True), out[0][0])


def test_normalisation(enc):
    video = _video(1, 8, 16, 16)
    with torch.no_grad():
        raw = enc.encode(video, normalize=False)
        norm = enc.encode(video)
    mu = torch.tensor(WAN21_LATENTS_MEAN).view(1, 16, 1, 1, 1)
    sigma = torch.tensor(WAN21_LATENTS_STD).view(1, 16, 1, 1, 1)
    assert torch.allclose(norm, (raw - mu) / sigma, atol=1e-6)
    assert torch.equal(raw, enc(video).permute(0, 2, 1, 3, 4))


def test_latent_stats_override():
    mean, std = list(range(16)), [2.0] * 16
    model = TinyVAEEncoder(latents_mean=mean, latents_std=std)
    assert model.latents_mean.tolist() == mean
    cfg = {"latents_mean": WAN21_LATENTS_MEAN, "latents_std": WAN21_LATENTS_STD}
    model.set_latent_stats(*latent_stats_from_config(cfg))
    assert torch.allclose(model.latents_std, torch.tensor(WAN21_LATENTS_STD))
    assert "latents_mean" not in model.state_dict()
    with pytest.raises(ValueError, match="latents_std"):
        latent_stats_from_config({"latents_mean": mean})


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def _random_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(7)
    sd = {k: v.clone() for k, v in TinyVAEEncoder().state_dict().items()}
    sd["decoder.0.weight"] = torch.randn(64, 16, 3, 3)
    sd["decoder.3.conv.0.bias"] = torch.randn(7)
    return sd


def test_load_round_trip(tmp_path):
    sd = _random_state()
    torch.save(sd, tmp_path / "plain.pth")
    torch.save({"state_dict": sd}, tmp_path / "wrapped.pth")
    save_file({k: v.half() for k, v in sd.items()}, tmp_path / "half.safetensors")
    save_file(sd, tmp_path / "w.safetensors")
    video = _video(1, 5, 16, 16)
    outs = {}
    for name in ("plain.pth", "wrapped.pth", "w.safetensors", "half.safetensors"):
        model = load_tiny_vae(tmp_path / name)
        assert not any(p.requires_grad for p in model.parameters())
        assert all(p.dtype == torch.float32 for p in model.parameters())
        with torch.no_grad():
            outs[name] = model.encode(video)
    assert torch.equal(outs["plain.pth"], outs["w.safetensors"])
    assert torch.equal(outs["plain.pth"], outs["wrapped.pth"])
    assert torch.allclose(outs["plain.pth"], outs["half.safetensors"], atol=0.05, rtol=0.05)


def test_load_errors(tmp_path):
    sd = _random_state()
    missing = dict(sd)
    del missing["encoder.9.conv.2.bias"]
    torch.save(missing, tmp_path / "missing.pth")
    with pytest.raises(ValueError, match=r"missing\.pth.*missing.*encoder\.9\.conv\.2\.bias"):
        load_tiny_vae(tmp_path / "missing.pth")

    extra = dict(sd, **{"encoder.99.weight": torch.zeros(1)})
    save_file(extra, tmp_path / "extra.safetensors")
    with pytest.raises(ValueError, match=r"extra\.safetensors.*unexpected.*encoder\.99\.weight"):
        load_tiny_vae(tmp_path / "extra.safetensors")

    wrong = dict(sd, **{"encoder.17.weight": torch.zeros(16, 64, 1, 1)})
    torch.save(wrong, tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match=r"wrong\.pth.*shape.*encoder\.17\.weight"):
        load_tiny_vae(tmp_path / "wrong.pth")

    with pytest.raises(ValueError, match=r"nope\.pth.*no such file"):
        load_tiny_vae(tmp_path / "nope.pth")

    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"junk\.pth"):
        load_tiny_vae(tmp_path / "junk.pth")
