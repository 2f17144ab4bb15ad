"""Cost of the evaluate stage's interaction checks (chord.evaluation.metrics.pair_interaction) per
frame: a dynamic object's surface samples against another object's mesh of F faces, static
(one query over every frame) or moved per frame (a tree built per frame).

    python bench/interaction.py [--samples 2048] [--frames 41] [--faces 1280 20480 327680]

The other mesh is an icosphere of about F faces, the samples a unit cube's (area-uniform),
translated through it over the frames. Prints seconds per frame per pair. Not collected by
pytest.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import trimesh

if __package__:
    from bench import fixtures  # noqa: F401  (the bench/ import convention)
else:
    import fixtures  # noqa: F401

from chord.evaluation import metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--frames", type=int, default=41)
    ap.add_argument("--faces", type=int, nargs="+", default=[1280, 20480, 327680])
    args = ap.parse_args()
    T = args.frames
    cube = trimesh.creation.box((0.5, 0.5, 0.5))
    S = metrics.surface_samples(cube.vertices, cube.faces, args.samples, seed=0)
    path = np.linspace(-1.0, 1.0, T)[:, None] * [1.0, 0.0, 0.0]  # [T, 3]
    P = S[None] + path[:, None]  # [T, S, 3]
    print(f"{args.samples} samples, {T} frames; seconds per frame per pair")
    print("faces\tstatic\tmoved")
    for faces in args.faces:
        level = max(0, round(np.log(faces / 20) / np.log(4)))
        sphere = trimesh.creation.icosphere(subdivisions=level, radius=0.6)
        V, F = np.asarray(sphere.vertices), np.asarray(sphere.faces)
        moving = np.broadcast_to(V, (T, *V.shape))  # per frame: a tree per frame
        times = []
        for other in (V, moving):
            start = time.perf_counter()
            r = metrics.pair_interaction(P, other, F)
            times.append((time.perf_counter() - start) / T)
        assert max(r["fraction"]) > 0  # the cube passes through the sphere
        print(f"{len(F)}\t{times[0]:.4f}\t{times[1]:.4f}")


if __name__ == "__main__":
    main()
