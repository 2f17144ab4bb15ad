"""Time to deform Gaussians with one control-point layer over all frames, forward and
backward, on a CPU (METHOD §5–§6).

    python bench/motion.py [--gaussians 100000] [--cps 60] [--frames 41] [--repeat 3]

Gaussians are random points in a 0.6-wide box with random rotations; the table is random
(small), so every frame moves. The loss sums the squared positions and rotations of every
frame; gradients reach the table, radii and rotations. Prints best wall times and the peak
resident memory of the process. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import time

import torch

from chord.core import quaternion as quat
from chord.motion.model import DynamicObject

if __package__:
    from bench import fixtures
else:
    import fixtures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gaussians", type=int, default=100_000)
    p.add_argument("--cps", type=int, default=60)
    p.add_argument("--frames", type=int, default=41)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    means = (torch.rand(args.gaussians, 3, generator=g) - 0.5) * 0.6
    quats = quat.normalize(torch.randn(args.gaussians, 4, generator=g))
    centres = (torch.rand(args.cps, 3, generator=g) - 0.5) * 0.5
    obj = DynamicObject("obj_0", means, quats, centres, means[:8000], frame_num=args.frames)
    with torch.no_grad():
        obj.layer1.cp_deform.normal_(0, 0.02, generator=g)
    obj.neighbours("gaussians")  # the KD-tree query is cached across iterations
    frames = torch.arange(args.frames)
    fwd, both = [], []
    for _ in range(args.repeat):
        obj.zero_grad(set_to_none=True)
        start = time.perf_counter()
        pos, rot = obj.deform(frames)
        mid = time.perf_counter()
        (pos.square().sum() + rot.square().sum()).backward()
        end = time.perf_counter()
        fwd.append(mid - start)
        both.append(end - start)
    peak = fixtures.maxrss_mb()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{args.gaussians} Gaussians, {args.cps} control points (K=3), {args.frames} frames")
    print(
        f"forward {min(fwd):.3f} s, forward+backward {min(both):.3f} s (best of "
        f"{args.repeat}), peak RSS {peak:.0f} MB"
    )


if __name__ == "__main__":
    main()
