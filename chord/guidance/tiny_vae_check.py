"""The Tiny VAE's latent-scale check against the full Wan VAE (METHOD §10): are its outputs raw
Wan 2.1 latents (``guidance.tiny_vae_normalize: true``) or already normalised?

Checking the latent scale with the real files (one command)::

    python -m chord.guidance.tiny_vae_check --tiny lighttaew2_1.pth --vae /models/Wan2.2-TI2V-5B \\
        [--video clip.mp4] [--size 416x240] [--frames 41] [--device cuda]

``--vae`` is a diffusers folder holding ``AutoencoderKLWan`` (its ``vae/`` subfolder when there
is one). The same clip (the mp4, resized, or a synthetic moving pattern) is encoded by both; the
table lists per-channel means/stds of the tiny encoder's raw outputs and of the full VAE's
posterior means, their correlation, and the RMS difference under the two hypotheses (tiny
outputs are raw Wan latents, or are already normalised). Note the temporal alignment differs
slightly: the full VAE's first latent frame sees frame 0 only, the tiny encoder's sees frames
0-3, so correlations on a moving clip are a little below 1 even for a perfect match.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from chord.core.errors import InputError
from chord.core.media import read_mp4
from chord.guidance.tiny_vae import (
    LATENT_CHANNELS,
    SPATIAL_FACTOR,
    TinyVAEEncoder,
    load_tiny_vae,
)


def _channel_stats(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    flat = z.transpose(0, 1).reshape(LATENT_CHANNELS, -1).double()
    return flat.mean(1), flat.std(1, unbiased=False)


def compare_with_full_vae(video: torch.Tensor, tiny: TinyVAEEncoder, vae) -> dict:
    """METHOD §10. Per-channel statistics of tiny vs full Wan VAE latents of one clip.

    video: ``[N, T, 3, H, W]`` in [0, 1]. The tiny encoder's raw outputs and the full VAE's
    posterior means (``vae.encode(2·video - 1)`` in ``[B, 3, T, H, W]``) are both
    ``[N, 16, T', h, w]``. Returns (per-channel tensors are float64 ``[16]``): ``tiny_mean``,
    ``tiny_std``, ``vae_mean``, ``vae_std``, ``corr`` (Pearson, per channel), ``vae_norm_mean`` /
    ``vae_norm_std`` (full latents normalised with the tiny encoder's statistics),
    ``rmse_raw`` = RMS(tiny - vae), ``rmse_normalised`` = RMS(tiny - normalised vae),
    ``verdict`` ("raw" or "normalised", the hypothesis with the smaller RMS), ``tiny_shape``
    and ``vae_shape``.
    """
    vae_param = next(vae.parameters())
    with torch.no_grad():
        zt = tiny.encode(video.to(tiny.latents_mean.device), normalize=False).double().cpu()
        x = (video * 2 - 1).permute(0, 2, 1, 3, 4).to(vae_param.device, vae_param.dtype)
        zv = vae.encode(x).latent_dist.mean.double().cpu()
    if zt.shape != zv.shape:
        raise InputError(
            f"video: tiny latents {tuple(zt.shape)} and full VAE latents {tuple(zv.shape)} differ"
        )
    shape = (1, LATENT_CHANNELS, 1, 1, 1)
    mu = tiny.latents_mean.double().cpu().view(shape)
    sigma = tiny.latents_std.double().cpu().view(shape)
    zv_norm = (zv - mu) / sigma
    tiny_mean, tiny_std = _channel_stats(zt)
    vae_mean, vae_std = _channel_stats(zv)
    norm_mean, norm_std = _channel_stats(zv_norm)
    cov = _channel_stats((zt - tiny_mean.view(shape)) * (zv - vae_mean.view(shape)))[0]
    corr = cov / (tiny_std * vae_std).clamp_min(1e-12)
    rmse_raw = (zt - zv).square().mean().sqrt().item()
    rmse_norm = (zt - zv_norm).square().mean().sqrt().item()
    return {
        "tiny_mean": tiny_mean,
        "tiny_std": tiny_std,
        "vae_mean": vae_mean,
        "vae_std": vae_std,
        "corr": corr,
        "vae_norm_mean": norm_mean,
        "vae_norm_std": norm_std,
        "rmse_raw": rmse_raw,
        "rmse_normalised": rmse_norm,
        "verdict": "raw" if rmse_raw <= rmse_norm else "normalised",
        "tiny_shape": tuple(zt.shape),
        "vae_shape": tuple(zv.shape),
    }


def format_comparison(stats: dict) -> str:
    """METHOD §10. The table of ``compare_with_full_vae``'s result, one row per channel."""
    lines = [
        f"tiny latents {stats['tiny_shape']}, full VAE latents {stats['vae_shape']}",
        f"{'ch':>3} {'tiny mean':>10} {'tiny std':>9} {'vae mean':>9} {'vae std':>8} "
        f"{'corr':>6} {'vae norm mean':>14} {'vae norm std':>13}",
    ]
    for c in range(LATENT_CHANNELS):
        lines.append(
            f"{c:>3} {stats['tiny_mean'][c]:>10.4f} {stats['tiny_std'][c]:>9.4f} "
            f"{stats['vae_mean'][c]:>9.4f} {stats['vae_std'][c]:>8.4f} {stats['corr'][c]:>6.3f} "
            f"{stats['vae_norm_mean'][c]:>14.4f} {stats['vae_norm_std'][c]:>13.4f}"
        )
    lines += [
        f"RMS(tiny - vae raw)        = {stats['rmse_raw']:.4f}",
        f"RMS(tiny - vae normalised) = {stats['rmse_normalised']:.4f}",
        f"verdict: tiny outputs look {stats['verdict']}"
        + (
            " -> normalise them (encode(normalize=True))"
            if stats["verdict"] == "raw"
            else " -> do not normalise again (encode(normalize=False))"
        ),
    ]
    return "\n".join(lines)


def synthetic_clip(frames: int, height: int, width: int) -> torch.Tensor:
    """METHOD §10. A moving colour pattern ``[1, T, 3, H, W]`` in [0, 1] (drifting stripes, a
    travelling disc)."""
    t = torch.arange(frames, dtype=torch.float32).view(-1, 1, 1)
    y = torch.linspace(0, 1, height).view(1, -1, 1)
    x = torch.linspace(0, 1, width).view(1, 1, -1)
    r = 0.5 + 0.5 * torch.sin(2 * math.pi * (3 * x + 0.05 * t))
    g = 0.5 + 0.5 * torch.cos(2 * math.pi * (2 * y - 0.03 * t) + 4 * x)
    cx = 0.2 + 0.6 * (t / max(frames - 1, 1))
    disc = (((x - cx) * width / height) ** 2 + (y - 0.5) ** 2 < 0.04).float()
    b = (0.3 + 0.7 * disc) * (0.5 + 0.5 * y.expand_as(disc))
    r, g = r.expand_as(disc) * (1 - 0.5 * disc), g.expand_as(disc)
    return torch.stack([r, g, b], dim=1)[None].clamp(0, 1)


#: the preflight's clip: frames (two latent frames) and its longer side at most (pixels)
CHECK_FRAMES = 5
CHECK_LONG_SIDE = 256


def check_size(width: int, height: int, long_side: int = CHECK_LONG_SIDE) -> tuple[int, int]:
    """(w, h) of the preflight's clip for a W×H render: scaled down (never up) so the longer
    side is at most ``long_side``, each side a multiple of 16, at least 16."""
    scale = min(1.0, long_side / max(width, height))
    return tuple(max(16, int(v * scale) // 16 * 16) for v in (width, height))


def reference_clip(png: Path, frames: int = CHECK_FRAMES) -> torch.Tensor:
    """METHOD §10. A still clip ``[1, T, 3, h, w]`` in [0, 1] of the reference render ``png``
    (:func:`check_size` of its size). Still: both encoders then see the same frames in every
    latent frame (the Wan VAE's first latent frame sees frame 0 only, the Tiny VAE's 0-3)."""
    from PIL import Image

    try:
        with Image.open(png) as im:
            rgb = im.convert("RGB")
    except OSError as exc:
        raise InputError(f"{png}: not a readable image ({exc})") from exc
    w, h = check_size(*rgb.size)
    image = torch.from_numpy(np.array(rgb.resize((w, h), Image.BILINEAR))).float() / 255.0
    return image.permute(2, 0, 1)[None, None].expand(1, frames, 3, h, w).contiguous()


def scale_problem(stats: dict, normalize: bool, path, clip: str) -> tuple[str, str, str]:
    """(status word, detail, remedy) of the latent-scale check from
    :func:`compare_with_full_vae`'s ``stats``: "fail" when ``normalize`` (the configured
    ``guidance.tiny_vae_normalize``) is not the hypothesis with the smaller RMS difference."""
    raw, norm = stats["rmse_raw"], stats["rmse_normalised"]
    looks = "raw Wan 2.1 latents" if stats["verdict"] == "raw" else "already normalised latents"
    evidence = (
        f"on {clip} its latents are {looks}: RMS {raw:.3g} from the Wan VAE's raw latents, "
        f"{norm:.3g} from its normalised ones"
    )
    if (stats["verdict"] == "raw") == normalize:
        return "pass", f"{path}: {evidence}; tiny_vae_normalize {str(normalize).lower()}", ""
    if normalize:
        return (
            "fail",
            f"{path}: {evidence}, but guidance.tiny_vae_normalize is true: the DiT would see "
            "them normalised twice",
            "set guidance.tiny_vae_normalize: false for this file (taew2_1 emits normalised "
            "latents), or use the lighttaew2_1 weights",
        )
    return (
        "fail",
        f"{path}: {evidence}, but guidance.tiny_vae_normalize is false: the DiT would see "
        "them unnormalised",
        "set guidance.tiny_vae_normalize: true for this file (lighttaew2_1 emits raw Wan 2.1 "
        "latents)",
    )


def _load_clip(path: Path, frames: int, height: int, width: int) -> torch.Tensor:

    if not path.is_file():
        raise InputError(f"--video {path}: no such file")
    arr, _ = read_mp4(path)
    clip = torch.from_numpy(arr[:frames]).permute(0, 3, 1, 2).float() / 255.0
    clip = F.interpolate(clip, size=(height, width), mode="bilinear", antialias=True)
    return clip.clamp(0, 1)[None]


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError as exc:
        raise InputError(f"--size {text!r}: expected WIDTHxHEIGHT, e.g. 416x240") from exc
    if w <= 0 or h <= 0 or w % SPATIAL_FACTOR or h % SPATIAL_FACTOR:
        raise InputError(f"--size {text!r}: width and height must be positive multiples of 8")
    return w, h


def main(argv: Sequence[str] | None = None) -> None:
    """METHOD §10. CLI: compare the tiny encoder with the full Wan VAE on one clip."""
    p = argparse.ArgumentParser(
        prog="python -m chord.guidance.tiny_vae_check",
        description="Compare tiny VAE (lighttaew2_1) latents with the full Wan VAE's.",
    )
    p.add_argument("--tiny", required=True, type=Path, help="lighttaew2_1 .pth / .safetensors")
    p.add_argument("--vae", required=True, type=Path, help="diffusers folder with the Wan VAE")
    p.add_argument("--video", type=Path, help="an mp4 clip (default: a synthetic pattern)")
    p.add_argument("--size", default="416x240", help="WIDTHxHEIGHT, multiples of 8")
    p.add_argument("--frames", type=int, default=41)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from diffusers import AutoencoderKLWan

    w, h = _parse_size(args.size)
    if args.frames < 1:
        raise InputError(f"--frames {args.frames}: must be >= 1")
    if not args.vae.is_dir():
        raise InputError(f"--vae {args.vae}: not a folder")
    tiny = load_tiny_vae(args.tiny, device=args.device)
    sub = "vae" if (args.vae / "vae").is_dir() else None
    vae = AutoencoderKLWan.from_pretrained(
        args.vae, subfolder=sub, local_files_only=True, torch_dtype=torch.float32
    )
    vae = vae.to(args.device).eval()
    clip = (
        _load_clip(args.video, args.frames, h, w)
        if args.video
        else synthetic_clip(args.frames, h, w)
    )
    print(f"clip {tuple(clip.shape)} from {args.video or 'synthetic pattern'}")
    print(format_comparison(compare_with_full_vae(clip.to(args.device), tiny, vae)))


if __name__ == "__main__":
    main()
