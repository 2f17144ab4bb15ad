"""Per-call time of RF-SDS steps with the tiny random Wan components, and of the Tiny VAE
encode + backward, at 41 frames and two sizes, on a CPU.

    python bench/guidance.py [--repeat 3]

An SDS step: full-VAE latents of a 41-frame video (with gradient), the image condition
(no gradient), one batched CFG call of the tiny DiT, the RF-SDS gradient and the backward to
the video. The Tiny VAE row times its encoder (random weights, real layout) + backward.
Random weights: the figures measure the code paths, not the real models. Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from chord.guidance import rfsds, tiny_models, wan

if __package__:
    from bench import fixtures
else:
    import fixtures

SIZES = ((208, 112), (416, 240))
T = 41


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {T} frames, "
        f"best of {args.repeat}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_models.write_tiny_wan(Path(tmp) / "wan")
        guide = wan.WanGuidance(folder)
        txt = fixtures.tiny_text(folder)
        g = torch.Generator().manual_seed(0)
        print(f"{'what':28s} {'size':>8s} {'seconds':>8s}")
        for w, h in SIZES:
            video = torch.rand(T, 3, h, w, generator=g)

            def sds_step(video=video):
                v = video.clone().requires_grad_(True)
                z = guide.encode_video(v)
                y = guide.condition(v.detach())
                eps = rfsds.noise_like(z, g)
                t, weight = rfsds.timestep_at(1000, 3000, resample=True)
                v_hat = guide.velocity(rfsds.noisy_latents(z, eps, t)[None], t, [y], txt, 20.0)
                loss, _ = rfsds.sds_loss(z, rfsds.sds_grad(z, eps, v_hat[0], weight))
                loss.backward()

            print(
                f"{'tiny-Wan SDS step (full VAE)':28s} {w}x{h:<4d} "
                f"{fixtures.best_of(sds_step, args.repeat):8.3f}"
            )
        try:
            from chord.guidance.tiny_vae import TinyVAEEncoder
        except ImportError:  # pragma: no cover - the module is part of the package
            return
        tiny = TinyVAEEncoder()
        for w, h in SIZES:
            video = torch.rand(1, T, 3, h, w, generator=g)

            def tiny_step(video=video):
                v = video.clone().requires_grad_(True)
                tiny.encode(v).square().sum().backward()

            print(
                f"{'Tiny VAE encode+backward':28s} {w}x{h:<4d} "
                f"{fixtures.best_of(tiny_step, args.repeat):8.3f}"
            )


if __name__ == "__main__":
    main()
