"""The memory a user's glTF needs to be read, estimated from its headers before any array is
allocated (for :mod:`chord.gltf.reader`): :func:`peak_bytes` is the reader's estimated peak,
and :func:`check_budget` refuses a file whose estimate exceeds the ingest job's ``mem_mb``
(:func:`mem_budget_mb`; the workflow's ingest rule reads :data:`INGEST_MEM_MB`)."""

from __future__ import annotations

import math
import os

from chord.core.errors import InputError
from chord.gltf.container import WIDTH
from chord.gltf.document_checks import INSTANCING
from chord.gltf.uri import shown

INGEST_MEM_MB = 8000  # the ingest rule's mem_mb (snakemake --set-resources ingest:mem_mb=N)


#: bytes per accessor element at the peak: the float64 array, its dtype cast and the float32
#: output, and trimesh's float64 copy of the plain file
ELEMENT_BYTES = 8 + 8 + 4 + 8
PIXEL_BYTES = 8  # an RGBA8 decode and its PNG re-encode


def peak_bytes(doc: dict, file_bytes: int, buffer_bytes: int, pixels: int = 0) -> int:
    """The reader's estimated peak from the headers: the file and its buffers, the flat
    bufferViews (meshopt decoded), every accessor at :data:`ELEMENT_BYTES` an element, one
    mesh copy per node instance, and the images' pixels."""
    accs = doc.get("accessors", [])
    views = sum(v["byteLength"] for v in doc.get("bufferViews", []))
    elements = sum(a["count"] * WIDTH[a["type"]] for a in accs)
    mesh_elements = []
    for mesh in doc.get("meshes", []):
        mesh_elements.append(
            sum(
                accs[i]["count"] * WIDTH[accs[i]["type"]]
                for prim in mesh["primitives"]
                for i in [*prim["attributes"].values(), prim.get("indices")]
                if i is not None
            )
        )
    instances = 0
    for node in doc.get("nodes", []):
        if "mesh" not in node:
            continue
        ext = node.get("extensions", {}).get(INSTANCING, {})
        attrs = ext.get("attributes", {}) if isinstance(ext, dict) else {}
        copies = max((accs[i]["count"] for i in attrs.values() if type(i) is int), default=1)
        instances += copies * max(mesh_elements[node["mesh"]], 1) * 16 + copies * 1024
    return (
        file_bytes
        + buffer_bytes
        + views
        + elements * ELEMENT_BYTES
        + instances
        + pixels * PIXEL_BYTES
    )


def mem_budget_mb(mem_mb: int | None = None) -> int:
    """``mem_mb``, else ``$CHORD_MEM_MB``, else :data:`INGEST_MEM_MB`."""
    if mem_mb is not None:
        return int(mem_mb)
    try:
        return int(os.environ.get("CHORD_MEM_MB", INGEST_MEM_MB))
    except ValueError:
        raise InputError(
            f"CHORD_MEM_MB: {shown(os.environ['CHORD_MEM_MB'], 40)} is not a whole number of MB"
        ) from None


def check_budget(where: str, peak: int, mem_mb: int) -> None:
    """Refuse a file whose estimated peak exceeds ``mem_mb``, naming the figure and the fix."""
    if peak > mem_mb * 2**20:
        need = math.ceil(peak / 2**20 * 1.25 / 1000) * 1000
        raise InputError(
            f"{where}: reading it needs an estimated {peak / 2**30:.1f} GiB, more than the "
            f"ingest job's {mem_mb} MB (its mem_mb); give ingest more memory (snakemake "
            f"--set-resources ingest:mem_mb={need}, or chord ingest --mem-mb {need}) or "
            "decimate the asset (e.g. `npx @gltf-transform/cli simplify IN OUT`)"
        )
