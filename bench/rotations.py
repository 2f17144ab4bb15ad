"""Time of METHOD §16's ARAP rotations on a CPU: chord.core.procrustes.best_rotations (Horn's
quaternion, float64 inside) against the batched float32 SVD that states them
(``procrustes.kabsch``, as training ran it before), on the batch one
ARAP term solves at the demo's sizes (40 frames after the rest, 4 videos of 1200 sampled
vertices), and their largest difference.

    python bench/rotations.py [--problems 192000] [--repeat 5] [--threads N]

S is random (float32, as in training): the rotation is unique almost surely. Prints best wall
times of each and their ratio. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import time

import torch

from chord.core import procrustes


def best_time(fn, S: torch.Tensor, repeat: int) -> float:
    fn(S)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(S)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", type=int, default=40 * 4 * 1200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    S = torch.randn(args.problems, 3, 3, generator=torch.Generator().manual_seed(0))
    horn = best_time(procrustes.best_rotations, S, args.repeat)
    svd = best_time(procrustes.kabsch, S, args.repeat)  # float32, as the SVD ran before
    diff = (procrustes.best_rotations(S) - procrustes.kabsch(S.double()).float()).abs().max()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.problems} problems")
    print(f"Horn {horn:.3f} s, SVD {svd:.3f} s (best of {args.repeat}): {svd / horn:.1f}x")
    print(f"largest difference of the rotations' entries: {float(diff):.2e}")


if __name__ == "__main__":
    main()
