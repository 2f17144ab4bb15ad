"""Forward + backward time and peak memory of the torch rasterizer (CPU).

    python bench/render.py [--repeat 3]

Gaussians are surface samples of the demo scene `sway` (its three objects) at 5k and 20k,
rendered for 1 and 8 frames at 208x120 from one camera per frame, with a loss on the image
and gradients w.r.t. means, quats, scales, opacities and colours. Prints the best wall time
over the repeats and the peak resident memory of a fresh process per configuration
(ru_maxrss) above that process's baseline after building the inputs. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from chord.gaussians import gaussian_set
from chord.render import cameras
from chord.render.rasterizer import rasterize, splat_tensors
from chord.scene import demo, ingestion

if __package__:
    from bench import fixtures
else:
    import fixtures


def demo_splats(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = demo.write_demo_scene("sway", Path(tmp))
        parts = ingestion.load_parts(folder / "scene.glb")
        centre, s = ingestion.normalisation(ingestion.bounds_of(parts))
        g = gaussian_set.init_from_mesh(ingestion.normalise_parts(parts, centre, s), n, seed=0)
    return splat_tensors(g)


def step(sp: dict, frames: int, width: int, height: int) -> None:
    leaves = {
        k: sp[k].clone().requires_grad_(True)
        for k in ("means", "quats", "scales", "opacities", "sh")
    }
    # a frame = the Gaussians slightly moved, seen from its own camera
    shift = torch.linspace(0, 0.05, frames)[:, None, None] * torch.tensor([1.0, 0.0, 0.0])
    means = leaves["means"][None] + shift  # [T, N, 3]
    rep = lambda t: t[None].expand(frames, *t.shape)  # noqa: E731
    view = cameras.orbit_viewmats(
        torch.full((frames,), 15.0), torch.linspace(0, 40, frames), 2.0
    ).float()[:, None]  # [T, 1, 4, 4]
    K = cameras.intrinsics(width, height).float().expand(frames, 1, 3, 3)
    bg = torch.ones(frames, 1, 3)
    rgb, _, _ = rasterize(
        means,
        rep(leaves["quats"]),
        rep(leaves["scales"]),
        rep(leaves["opacities"]),
        rep(leaves["sh"]),
        view,
        K,
        width,
        height,
        sh_degree=0,
        backgrounds=bg,
        backend="torch",
    )
    rgb.square().mean().backward()


def measure(n: int, frames: int, w: int, h: int, repeat: int) -> tuple[float, float]:
    sp = demo_splats(n)
    step(sp, 1, 16, 16)  # warm up torch's allocator and kernels
    base = fixtures.maxrss_mb()
    best = fixtures.best_of(lambda: step(sp, frames, w, h), repeat)
    return best, fixtures.maxrss_mb() - base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--size", default="208x120")
    p.add_argument("--one", nargs=2, type=int, metavar=("N", "FRAMES"), help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    w, h = (int(v) for v in args.size.split("x"))
    if args.one:
        print(*measure(*args.one, w, h, args.repeat))
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {w}x{h}, "
        f"best of {args.repeat}"
    )
    print(f"{'gaussians':>9s} {'frames':>6s} {'fwd+bwd s':>10s} {'peak RSS +MB':>13s}")
    for n in (5_000, 20_000):
        for frames in (1, 8):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    str(n),
                    str(frames),
                    "--size",
                    args.size,
                    "--repeat",
                    str(args.repeat),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            print(f"{n:9d} {frames:6d} {float(out[0]):10.3f} {float(out[1]):13.1f}")


if __name__ == "__main__":
    main()
