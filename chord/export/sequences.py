"""Exports of an animated scene (METHOD §19–§20): its per-frame renders
(:func:`chord.render.views.render_frames`) as a GIF, and per-frame 3DGS PLY sequences (the
animated glTF: :mod:`chord.gltf.morphed`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from chord.core.atomic_files import atomic_dir, atomic_path
from chord.gaussians import gaussian_set as gs
from chord.gaussians import ply


def write_gif(path: Path | str, frames, fps: float, *, max_side: int = 320) -> None:
    """An endlessly looping GIF preview of frames [T, H, W, 3] (uint8 or float in [0, 1]),
    downscaled so its longer side is at most ``max_side`` pixels."""
    from chord.core.media import to_uint8

    frames = frames if getattr(frames, "dtype", None) == np.uint8 else to_uint8(frames)
    T, H, W, _ = frames.shape
    if T == 0:
        raise ValueError(f"{path}: no frames to write")
    f = min(1.0, max_side / max(H, W))
    size = (max(1, round(W * f)), max(1, round(H * f)))
    images = [
        Image.fromarray(np.ascontiguousarray(fr)).resize(size, Image.LANCZOS) for fr in frames
    ]
    with atomic_path(path, suffix=".gif") as tmp:
        images[0].save(
            tmp,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            duration=round(1000.0 / fps),
            loop=0,
            disposal=1,
        )


def write_ply_sequence(folder: Path | str, rest: gs.GaussianSet, means, quats) -> list[Path]:
    """Per-frame 3DGS PLYs ``frame_<t>.ply`` (t zero-padded to 4 digits) in ``folder``: the
    rest Gaussians ``rest`` with the means [T, N, 3] and rotations [T, N, 4] (wxyz) of each
    frame; scales, opacities and SH stay those of ``rest``. The folder is replaced whole."""
    means = np.asarray(means.detach().cpu() if hasattr(means, "detach") else means)
    quats = np.asarray(quats.detach().cpu() if hasattr(quats, "detach") else quats)
    T, N = means.shape[:2]
    if N != len(rest) or quats.shape != (T, N, 4):
        raise ValueError(
            f"{folder}: {len(rest)} rest Gaussians but means {means.shape} and quats {quats.shape}"
        )
    names = []
    with atomic_dir(folder) as tmp:
        for t in range(T):
            g = gs.GaussianSet(
                means=means[t],
                log_scales=rest.log_scales,
                quats=quats[t],
                opacity_logits=rest.opacity_logits,
                sh=rest.sh,
            )
            name = f"frame_{t:04d}.ply"
            ply.write_ply(Path(tmp) / name, g)
            names.append(name)
    return [Path(folder) / n for n in names]
