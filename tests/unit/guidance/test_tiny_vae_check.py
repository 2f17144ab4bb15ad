"""The Tiny VAE's latent-scale check against a (tiny, random) full Wan VAE."""

from __future__ import annotations

import pytest
import torch

from chord.guidance.tiny_vae import TinyVAEEncoder
from chord.guidance.tiny_vae_check import compare_with_full_vae, format_comparison
from tests.unit.guidance.test_tiny_vae import _random_state, _video, enc  # noqa: F401


def test_compare_with_full_vae(enc):  # noqa: F811 (the module fixture of test_tiny_vae)
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1).eval()
    video = _video(1, 5, 64, 64)
    stats = compare_with_full_vae(video, enc, vae)
    assert stats["tiny_shape"] == stats["vae_shape"] == (1, 16, 2, 8, 8)
    for key in ("tiny_mean", "tiny_std", "vae_mean", "vae_std", "corr"):
        assert stats[key].shape == (16,), key
        assert torch.isfinite(stats[key]).all(), key
    assert (stats["corr"].abs() <= 1 + 1e-9).all()
    assert stats["verdict"] in ("raw", "normalised")
    table = format_comparison(stats)
    assert len(table.splitlines()) == 2 + 16 + 3


def test_compare_self_consistent():
    """A fake 'full VAE' that returns the tiny raw latents: correlation 1, verdict raw."""
    torch.manual_seed(0)
    tiny = TinyVAEEncoder()

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def encode(self, x):
            z = tiny.encode(x.permute(0, 2, 1, 3, 4) * 0.5 + 0.5, normalize=False)

            class Dist:
                mean = z

            class Out:
                latent_dist = Dist

            return Out

    stats = compare_with_full_vae(_video(1, 8, 16, 16), tiny, Fake())
    assert torch.allclose(stats["corr"], torch.ones(16, dtype=torch.float64), atol=1e-5)
    assert stats["rmse_raw"] < 1e-5
    assert stats["verdict"] == "raw"


def test_cli_prints_table(tmp_path, capsys):
    from diffusers import AutoencoderKLWan

    from chord.core.media import write_mp4
    from chord.guidance.tiny_vae_check import main, synthetic_clip

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    vae.save_pretrained(tmp_path / "model" / "vae")
    torch.save({"state_dict": _random_state()}, tmp_path / "tiny.pth")
    write_mp4(tmp_path / "clip.mp4", synthetic_clip(6, 32, 48)[0].permute(0, 2, 3, 1), fps=8)
    common = ["--tiny", str(tmp_path / "tiny.pth"), "--vae", str(tmp_path / "model")]
    main([*common, "--size", "32x16", "--frames", "5", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "synthetic pattern" in out and "(1, 16, 2, 2, 4)" in out and "verdict" in out
    main([*common, "--video", str(tmp_path / "clip.mp4"), "--size", "24x16", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "clip (1, 6, 3, 16, 24)" in out and "verdict" in out
    with pytest.raises(ValueError, match="--size"):
        main([*common, "--size", "30x16"])
