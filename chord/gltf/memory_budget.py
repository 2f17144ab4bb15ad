"""The memory a user's glTF needs to be read, estimated from its headers before any array is
allocated (for :mod:`chord.gltf.reader`): :func:`peak_bytes` is the estimated peak of the
reader and the scene-graph load after it (trimesh's scene, one world-space mesh per primitive
instance: :func:`chord.scene.ingestion.load_source`), and :func:`check_budget` refuses a file
whose estimate exceeds the ingest job's ``mem_mb`` (:func:`mem_budget_mb`; the workflow's
ingest rule reads :data:`INGEST_MEM_MB`). What a file asks for by count (nodes, primitives,
world-space parts, joints, morph targets: :func:`counts`) is also capped (:data:`CAPS`,
:func:`check_counts`): the scene-graph load takes time per node and per part that no memory
figure bounds, so a small file asking for a million of them is refused in one line, naming
the count and the setting that raises its cap, before anything is built."""

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
#: bytes per pixel at the peak: trimesh decodes a texture to RGBA8 when a part is copied (8 B
#: a pixel with its copy) and ingest's GLB export of the parts re-encodes it on top. Measured
#: (bench/gltf_costs.py png): an 11000 x 11000 RGBA PNG of zeros (0.47 MB) peaks 1.46 GB above
#: the loaded modules in read, load, parts and export, 12.7 B a pixel (12.1 B the slope from
#: 4000 x 4000); a grey PNG 4.1 B. The 8 B this was before left the peak 1.6x the estimate.
PIXEL_BYTES = 13
# What each thing a file asks for by count costs the reader and the scene-graph load: peak RSS
# per item, the slope between 10,000 and 20,000 items of a one-triangle mesh, measured with
# `python bench/gltf_costs.py` (CPython 3.11, trimesh 4; BENCHMARKS.md "glTF costs"): a node
# 1281 B (its JSON, the plain copy, trimesh's graph edge; 0.016 ms); a mesh node 5030 B and an
# EXT_mesh_gpu_instancing instance 5382 B (a node and a part: the world-space copy of its
# mesh that load_mesh_parts makes, beside its elements at PART_ELEMENT_BYTES; 0.47 ms); a
# primitive 11.3 kB (trimesh's geometry of it and its part; 1.1 ms); a skin joint 654 B with
# its inverse-bind matrix (an accessor, 448 B of it counted there); a morph target 541 B
# beside its accessors. Each constant is the measured figure rounded up by about a tenth.
NODE_BYTES = 1400
PART_BYTES = 4200
PART_ELEMENT_BYTES = 16  # the part's float64 copy and its transformed vertices
PRIMITIVE_BYTES = 8300
JOINT_BYTES = 240
TARGET_BYTES = 600
#: the most of each count a file may ask for, and the environment variable that raises it:
#: 100,000 parts load in about 50 s and 0.5 GB, 200,000 empty nodes in about 3 s, 100,000
#: primitives in about 2 minutes (above); joints at what an unsigned short JOINTS_0 indexes.
#: Checked before anything is built, so a file over one is refused in seconds.
CAPS = {
    "nodes": (200_000, "CHORD_MAX_NODES"),
    "primitives": (100_000, "CHORD_MAX_PRIMITIVES"),
    "parts": (100_000, "CHORD_MAX_PARTS"),
    "joints": (65_536, "CHORD_MAX_JOINTS"),
    "targets": (100_000, "CHORD_MAX_TARGETS"),
}
NOUNS = {
    "nodes": "nodes",
    "primitives": "mesh primitives",
    "parts": "world-space mesh parts (a mesh node's primitives, once per instance)",
    "joints": "skin joints",
    "targets": "morph targets",
}


def _copies(node: dict, accs: list) -> int:
    """How many instances of its mesh a node draws (EXT_mesh_gpu_instancing's count, else 1)."""
    ext = node.get("extensions", {}).get(INSTANCING, {})
    attrs = ext.get("attributes", {}) if isinstance(ext, dict) else {}
    return max((accs[i]["count"] for i in attrs.values() if type(i) is int), default=1)


def _items(value) -> list:
    """The objects of a JSON list (none where it is not a list: the checks name that)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _length(value) -> int:
    return len(value) if isinstance(value, list) else 0


def counts(doc: dict, checked: bool = True) -> dict[str, int]:
    """What the document asks for by count: nodes (with one per instance that
    EXT_mesh_gpu_instancing makes), mesh primitives, parts (each mesh node's primitives, once
    per instance), skin joints and morph targets, with ``instances`` (the nodes instancing
    makes) for the messages. Unchecked (``checked`` False: right after the JSON is parsed, so
    that a file of a million nodes is refused before a walk over them), the lists' lengths
    alone, without instances and parts (which follow accessor and mesh indices)."""
    meshes = _items(doc.get("meshes"))
    prims = [p for m in meshes for p in _items(m.get("primitives"))]
    found = {
        "nodes": _length(doc.get("nodes")),
        "primitives": len(prims),
        "parts": 0,
        "joints": sum(_length(s.get("joints")) for s in _items(doc.get("skins"))),
        "targets": sum(_length(p.get("targets")) for p in prims),
        "instances": 0,
    }
    if not checked:
        return found
    accs = doc.get("accessors", [])
    for node in doc.get("nodes", []):
        if "mesh" in node:
            copies = _copies(node, accs)
            found["instances"] += copies if INSTANCING in node.get("extensions", {}) else 0
            found["parts"] += copies * len(doc["meshes"][node["mesh"]]["primitives"])
    found["nodes"] += found["instances"]
    return found


def cap(name: str) -> int:
    """The cap of count ``name``: its environment variable (:data:`CAPS`), else the default."""
    default, env = CAPS[name]
    try:
        return int(os.environ.get(env, default))
    except ValueError:
        raise InputError(f"{env}: {shown(os.environ[env], 40)} is not a whole number") from None


def check_counts(where: str, doc: dict, checked: bool = True) -> dict[str, int]:
    """Refuse a file that asks for more of a count (:func:`counts`, ``checked`` as there) than
    its cap, naming the count, the cap and the setting that raises it; the counts otherwise."""
    found = counts(doc, checked)
    for name, (_, env) in CAPS.items():
        limit = cap(name)
        if found[name] > limit:
            made = found["instances"] if name in ("nodes", "parts") else 0
            by = f", {made} of them made by {INSTANCING}" if made else ""
            raise InputError(
                f"{where}: asks for {found[name]} {NOUNS[name]}{by}, more than chord reads "
                f"({limit}); raise the cap with {env}=N if the machine has the time and "
                "memory, or simplify the asset"
            )
    return found


def peak_bytes(doc: dict, file_bytes: int, buffer_bytes: int, pixels: int = 0) -> int:
    """The estimated peak of reading and loading the file, from the headers: the file and its
    buffers, the flat bufferViews (meshopt decoded), every accessor at :data:`ELEMENT_BYTES`
    an element, each count of :func:`counts` at its cost (:data:`NODE_BYTES`, ...), one mesh
    copy per part, and the images' pixels."""
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
    copied = sum(
        _copies(node, accs) * mesh_elements[node["mesh"]]
        for node in doc.get("nodes", [])
        if "mesh" in node
    )
    n = counts(doc)
    return (
        file_bytes
        + buffer_bytes
        + views
        + elements * ELEMENT_BYTES
        + copied * PART_ELEMENT_BYTES
        + n["nodes"] * NODE_BYTES
        + n["primitives"] * PRIMITIVE_BYTES
        + n["parts"] * PART_BYTES
        + n["joints"] * JOINT_BYTES
        + n["targets"] * TARGET_BYTES
        + pixels * PIXEL_BYTES
    )


def budget_fix(peak: int) -> str:
    """How to read a file needing ``peak`` bytes: the mem_mb to give (a quarter over, in
    thousands), or decimating it."""
    need = math.ceil(peak / 2**20 * 1.25 / 1000) * 1000
    return (
        f"give ingest more memory (snakemake --set-resources ingest:mem_mb={need}, or chord "
        f"ingest --mem-mb {need}) or decimate the asset (e.g. `npx @gltf-transform/cli "
        "simplify IN OUT`)"
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
        raise InputError(
            f"{where}: reading it needs an estimated {peak / 2**30:.1f} GiB, more than the "
            f"ingest job's {mem_mb} MB (its mem_mb); {budget_fix(peak)}"
        )
