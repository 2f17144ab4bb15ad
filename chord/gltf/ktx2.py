"""KTX2 textures (glTF's ``KHR_texture_basisu``) to PNG: Basis Universal's transcoder, as three.js
ships it, bundled with its wasm into ``chord/basis/dist/ktx2_rgba.cjs`` and run with Node.js
(no Python binding of libktx or of the transcoder installs from PyPI without a compiler and
libktx; ``pyktx`` needs both). The base mip level is decoded to RGBA8: the texel values as
stored (sRGB for a base colour), which a glTF viewer samples."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

from chord.core.errors import InputError

BUNDLE = (Path(__file__).resolve().parent / "../basis/dist/ktx2_rgba.cjs").resolve()
NODE_MIN = 18
TIMEOUT_S = 120


def node_executable() -> str | None:
    """``$CHORD_NODE``, else ``node`` on PATH."""
    return os.environ.get("CHORD_NODE") or shutil.which("node")


@cache
def _node_major(node: str) -> int | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def unavailable_reason() -> str | None:
    """Why KTX2 textures cannot be decoded here, or None."""
    node = node_executable()
    if node is None:
        return f"decoding them needs Node.js {NODE_MIN} or later (`node` on PATH)"
    major = _node_major(node)
    if major is None or major < NODE_MIN:
        return f"decoding them needs Node.js {NODE_MIN} or later; {node} is version {major}"
    if not BUNDLE.is_file():
        return f"the transcoder bundle {BUNDLE} is missing (reinstall chord-pipeline)"
    return None


def to_rgba(data: bytes, where: str) -> np.ndarray:
    """A KTX2 image's base level as uint8 RGBA ``[H, W, 4]``; ``where`` names it in errors."""
    reason = unavailable_reason()
    if reason:
        raise InputError(f"{where}: a KTX2 texture (KHR_texture_basisu): {reason}")
    run = subprocess.run(
        [node_executable(), str(BUNDLE)], input=data, capture_output=True, timeout=TIMEOUT_S
    )
    if run.returncode != 0:
        message = run.stderr.decode(errors="replace").strip() or f"exit status {run.returncode}"
        raise InputError(f"{where}: cannot decode its KTX2 texture ({message})")
    if len(run.stdout) < 8:
        raise InputError(f"{where}: the KTX2 transcoder returned {len(run.stdout)} bytes")
    width, height = struct.unpack_from("<II", run.stdout, 0)
    header = struct.unpack_from("<II", data, 20) if len(data) >= 28 else None
    header = header and (header[0], max(header[1], 1))  # a 1D texture's height is 0
    if header is not None and (width, height) != header:
        raise InputError(
            f"{where}: the KTX2 transcoder returned {width}x{height}, not the header's "
            f"{header[0]}x{header[1]}"
        )
    pixels = np.frombuffer(run.stdout, dtype=np.uint8, offset=8)
    if pixels.size != width * height * 4:
        raise InputError(
            f"{where}: the KTX2 transcoder returned {pixels.size} bytes for {width}x{height}"
        )
    return pixels.reshape(height, width, 4)


def to_png(data: bytes, where: str) -> bytes:
    """A KTX2 image as PNG bytes (its base level, RGBA8)."""
    buf = io.BytesIO()
    Image.fromarray(to_rgba(data, where)).save(buf, format="PNG")
    return buf.getvalue()
