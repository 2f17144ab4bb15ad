"""A user's glTF checked as it is read (for :mod:`chord.gltf.reader`): vertex indices below
the vertex count, sparse indices below the accessor's count, Draco's decoded rows as many as
the accessor declares, and an image's pixel count, from its header before decoding, at most
:data:`MAX_IMAGE_PIXELS`. The checks before a byte is used are
:mod:`chord.gltf.document_checks`'s; each refusal is one :class:`InputError` line naming the
file, the object and the numbers."""

from __future__ import annotations

import io
import struct

import numpy as np

from chord.core.errors import InputError

MAX_IMAGE_PIXELS = 1 << 27  # 134 M (11585^2): Pillow warns past 89.5 M, refuses past 179 M
KTX2_ID = b"\xabKTX 20\xbb\r\n\x1a\n"


# --- after reading ------------------------------------------------------------------------------


def check_indices(doc: dict, arrays: dict[int, np.ndarray], where: str) -> None:
    """Every primitive's vertex indices below its vertex count."""
    for m, mesh in enumerate(doc.get("meshes", [])):
        for p, prim in enumerate(mesh.get("primitives", [])):
            attrs = list(prim["attributes"].values())
            if "indices" not in prim or not attrs:
                continue
            n = len(arrays[attrs[0]])
            idx = arrays[prim["indices"]]
            if idx.size and idx.max() >= n:
                raise InputError(
                    f"{where}: mesh {m} primitive {p}: vertex index {int(idx.max())} (indices "
                    f"accessor {prim['indices']}) is beyond its {n} vertices"
                )


def check_decoded(where: str, i: int, rows: np.ndarray, acc: dict) -> None:
    """A Draco-decoded accessor has the rows its accessor declares."""
    if len(rows) != acc["count"]:
        raise InputError(
            f"{where}: accessor {i}: its Draco data decodes to {len(rows)} elements, but its "
            f"count is {acc['count']}"
        )


# --- images -------------------------------------------------------------------------------------


def _pixels(where: str, width: int, height: int) -> int:
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(
            f"{where}: {width} x {height} = {width * height} pixels, more than chord decodes "
            f"({MAX_IMAGE_PIXELS}); downscale the texture"
        )
    return width * height


def image_pixels(data: bytes, where: str) -> int:
    """An image's pixel count from its header (KTX2, or what Pillow opens), checked against
    :data:`MAX_IMAGE_PIXELS` before it is decoded; 0 where the header is unreadable (the
    decoding reports that)."""
    if data[:12] == KTX2_ID:
        if len(data) < 28:
            raise InputError(f"{where}: a KTX2 image cut short ({len(data)} bytes)")
        width, height = struct.unpack_from("<II", data, 20)
        return _pixels(where, max(width, 1), max(height, 1))
    from PIL import Image

    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # ours names the numbers
    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
    except Exception:  # Pillow raises several types; the decoding names it
        return 0
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    return _pixels(where, width, height)
