"""Image and video files: PNG through Pillow, H.264 MP4 through imageio-ffmpeg. Each is
written under a temporary name and renamed when complete.

imageio-ffmpeg (its wheel holds an ffmpeg binary: 68 MB) is imported by the MP4 functions
alone, so that the training, which writes none, runs where it is not installed (the GPU
image, bench/gpu_wheels.txt)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from chord.core.atomic_files import atomic_path


def to_uint8(images) -> np.ndarray:
    """Float images in [0, 1] (any leading dims, channels last) -> uint8, clipped."""
    arr = images.detach().cpu().numpy() if hasattr(images, "detach") else np.asarray(images)
    return (np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def write_png(path: Path | str, image) -> None:
    """image: [H, W, 3] float in [0, 1] or uint8."""
    img = image if getattr(image, "dtype", None) == np.uint8 else to_uint8(image)
    with atomic_path(path, suffix=".png") as tmp:
        Image.fromarray(img).save(tmp, format="PNG")


def mp4_unavailable_reason() -> str | None:
    """Why MP4s cannot be written here (imageio-ffmpeg, the encoder's binding, missing: the GPU
    image carries no wheel of it), or None."""
    import importlib.util

    if importlib.util.find_spec("imageio_ffmpeg") is None:
        return "imageio-ffmpeg is not installed (pip install imageio-ffmpeg)"
    return None


def write_mp4(path: Path | str, frames, fps: float) -> None:
    """frames: [T, H, W, 3] float in [0, 1] or uint8; H.264 (yuv420p), so W and H must be even.
    Written with fast start (the index, ``moov``, before the data, ``mdat``), so a browser or
    player begins before the whole file has arrived."""
    frames = frames if getattr(frames, "dtype", None) == np.uint8 else to_uint8(frames)
    t, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"{path}: H.264 needs even frame sizes, got {w}x{h}")
    import imageio_ffmpeg

    with atomic_path(path, suffix=".mp4") as tmp:
        writer = imageio_ffmpeg.write_frames(
            str(tmp),
            (w, h),
            fps=fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=8,
            macro_block_size=1,
            ffmpeg_log_level="error",
            output_params=["-movflags", "+faststart"],
        )
        writer.send(None)  # start the generator
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
        writer.close()


def read_mp4(path: Path | str) -> tuple[np.ndarray, dict]:
    """All frames [T, H, W, 3] uint8 and the stream metadata (fps, size, codec, ...)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    frames = [np.frombuffer(f, dtype=np.uint8).reshape(h, w, 3) for f in reader]
    return np.stack(frames), meta
