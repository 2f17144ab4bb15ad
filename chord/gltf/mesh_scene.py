"""The source meshes of an animated scene (METHOD §20), for the mesh writers
(:mod:`chord.gltf.morphed`, :mod:`chord.gltf.skinned`): every source object's glTF (nodes,
meshes, materials, textures, samplers, skins, cameras) copied into one file, as plain glTF read
through :func:`chord.gltf.reader.read` (as ingest reads it), on the JSON and binary chunk
directly (trimesh and pygltflib have no morph-target or skin animation writer); an animated
object's mesh nodes and world matrices; one POSITION morph target per frame k ≥ 1 of a
deformed mesh; and the buffer views' targets.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from chord.core.errors import InputError
from chord.gltf import reader
from chord.gltf.animated_scene import Deformer, Skinning
from chord.gltf.container import (
    ARRAY_BUFFER,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    GltfBuilder,
    read_accessor,
    world_matrices,
)

logger = logging.getLogger(__name__)

DROPPED = {"KHR_lights_punctual", "KHR_materials_variants"}  # root-level data we do not copy


def _remap_texture_refs(value, tex: Callable[[int], int]):
    """Material JSON with every ``*Texture: {"index": i}`` remapped (extensions included)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k.endswith("Texture") and isinstance(v, dict) and "index" in v:
                v = {**v, "index": tex(v["index"])}
            out[k] = _remap_texture_refs(v, tex)
        return out
    if isinstance(value, list):
        return [_remap_texture_refs(v, tex) for v in value]
    return value


def merge_gltf(out: GltfBuilder, path: Path, name: str) -> tuple[dict, int]:
    """Copy the default scene of the glTF ``path``, made plain as ingest reads it
    (:func:`chord.gltf.reader.read`), into ``out`` under a new root node ``name``.

    Returns (the node index map {source index: new index}, the new root's index). Animations
    are not copied (the output is animated by its morph targets); lights and material
    variants are dropped.
    """
    path = Path(path)
    source = reader.read(path)
    doc, blob = source.doc, source.blob
    used = set(doc.get("extensionsUsed", []))
    if doc.get("animations"):
        logger.warning("%s: its %d animation(s) are not exported", path, len(doc["animations"]))
    dropped = sorted(used & DROPPED)
    if dropped:
        logger.warning("%s: %s are not exported", path, dropped)
    # 1. the plain file's one buffer, kept aligned
    base = [out.add_bytes(blob)] if doc.get("buffers") else []
    offs = {key: len(out.doc.get(key, [])) for key in _ARRAYS}

    def idx(key: str, i: int) -> int:
        return offs[key] + i

    for v in doc.get("bufferViews", []):
        v = {**v, "buffer": 0, "byteOffset": base[v["buffer"]] + v.get("byteOffset", 0)}
        out.add("bufferViews", v)
    for a in doc.get("accessors", []):
        a = copy.deepcopy(a)
        if "bufferView" in a:
            a["bufferView"] = idx("bufferViews", a["bufferView"])
        if "sparse" in a:
            for part in ("indices", "values"):
                a["sparse"][part]["bufferView"] = idx(
                    "bufferViews", a["sparse"][part]["bufferView"]
                )
        out.add("accessors", a)
    for im in doc.get("images", []):
        im = dict(im)
        im["bufferView"] = idx("bufferViews", im["bufferView"])
        out.add("images", im)
    for s in doc.get("samplers", []):
        out.add("samplers", dict(s))
    for t in doc.get("textures", []):
        t = copy.deepcopy(t)
        if "sampler" in t:
            t["sampler"] = idx("samplers", t["sampler"])
        if "source" in t:
            t["source"] = idx("images", t["source"])
        for ext in t.get("extensions", {}).values():
            if isinstance(ext, dict) and "source" in ext:
                ext["source"] = idx("images", ext["source"])
        out.add("textures", t)
    for m in doc.get("materials", []):
        out.add("materials", _remap_texture_refs(m, lambda i: idx("textures", i)))
    for mesh in doc.get("meshes", []):
        mesh = copy.deepcopy(mesh)
        for p in mesh["primitives"]:
            p["attributes"] = {k: idx("accessors", v) for k, v in p["attributes"].items()}
            if "indices" in p:
                p["indices"] = idx("accessors", p["indices"])
            if "material" in p:
                p["material"] = idx("materials", p["material"])
            if "targets" in p:
                p["targets"] = [
                    {k: idx("accessors", v) for k, v in t.items()} for t in p["targets"]
                ]
            for ext in DROPPED:
                p.get("extensions", {}).pop(ext, None)
            if "extensions" in p and not p["extensions"]:
                del p["extensions"]
        out.add("meshes", mesh)
    for c in doc.get("cameras", []):
        out.add("cameras", dict(c))
    for sk in doc.get("skins", []):
        sk = dict(sk)
        sk["joints"] = [idx("nodes", j) for j in sk["joints"]]
        if "skeleton" in sk:
            sk["skeleton"] = idx("nodes", sk["skeleton"])
        if "inverseBindMatrices" in sk:
            sk["inverseBindMatrices"] = idx("accessors", sk["inverseBindMatrices"])
        out.add("skins", sk)
    node_map = {}
    for i, n in enumerate(doc.get("nodes", [])):
        n = copy.deepcopy(n)
        for key, arr in (("mesh", "meshes"), ("skin", "skins"), ("camera", "cameras")):
            if key in n:
                n[key] = idx(arr, n[key])
        if "children" in n:
            n["children"] = [idx("nodes", c) for c in n["children"]]
        for ext in DROPPED:
            n.get("extensions", {}).pop(ext, None)
        if "extensions" in n and not n["extensions"]:
            del n["extensions"]
        node_map[i] = out.add("nodes", n)
    scenes = doc.get("scenes", [])
    roots = scenes[doc.get("scene", 0)].get("nodes", []) if scenes else []
    root = out.add("nodes", {"name": name, "children": [node_map[r] for r in roots]})
    for ext in sorted(used - DROPPED):
        if ext not in out.doc.setdefault("extensionsUsed", []):
            out.doc["extensionsUsed"].append(ext)
    for ext in sorted(set(doc.get("extensionsRequired", [])) - DROPPED):
        if ext not in out.doc.setdefault("extensionsRequired", []):
            out.doc["extensionsRequired"].append(ext)
    return node_map, root


_ARRAYS = (
    "bufferViews",
    "accessors",
    "images",
    "samplers",
    "textures",
    "materials",
    "meshes",
    "cameras",
    "skins",
    "nodes",
)


def morph_mesh(
    out: GltfBuilder,
    mesh_index: int,
    M: np.ndarray,
    centre: np.ndarray,
    scale: float,
    deformer: Deformer,
    frames: int,
    where: str,
) -> None:
    """Give every primitive of mesh ``mesh_index`` (placed by world matrix M) one POSITION
    morph target per frame k ≥ 1 (METHOD §20's vertex mapping); its default weights are 0."""
    mesh = out.doc["meshes"][mesh_index]
    A_inv = np.linalg.inv(M[:3, :3])
    cache: dict[int, list[int]] = {}
    for p in mesh["primitives"]:
        if "POSITION" not in p["attributes"]:
            raise InputError(f"{where}: a primitive of mesh {mesh_index} has no POSITION")
        if p.get("targets"):
            logger.warning("%s: replacing the source's morph targets of mesh %d", where, mesh_index)
        pos = p["attributes"]["POSITION"]
        if pos not in cache:
            if out.doc["accessors"][pos]["componentType"] != FLOAT:
                raise InputError(f"{where}: quantised POSITION in mesh {mesh_index}")
            v_l = read_accessor(out.doc, bytes(out.blob), pos)  # [n, 3]
            v_n = ((v_l @ M[:3, :3].T + M[:3, 3]) - centre) * scale  # [n, 3]
            X = np.asarray(deformer(v_n), dtype=np.float64)  # [F, n, 3]
            if X.shape != (frames, *v_n.shape):
                raise ValueError(f"deformer returned {X.shape}, expected {(frames, *v_n.shape)}")
            # v_l^k − v_l = M⁻¹·(v_n^k/s + c) − M⁻¹·(v_n^0/s + c) = A⁻¹·(v_n^k − v_n^0)/s
            delta = ((X[1:] - X[:1]) / scale) @ A_inv.T  # [F-1, n, 3]
            cache[pos] = [out.add_accessor(d, "VEC3", target=ARRAY_BUFFER) for d in delta]
        p["targets"] = [{"POSITION": a} for a in cache[pos]]
    mesh["weights"] = [0.0] * (frames - 1)


def set_view_targets(doc: dict) -> None:
    """Mark a buffer view read by a single vertex-attribute accessor, or only by index
    accessors, as such where a source left ``target`` out (the validator's
    BUFFER_VIEW_TARGET_MISSING hint); views with any other use are left alone."""
    role: dict[int, int] = {}  # accessor -> its use in a mesh
    for mesh in doc.get("meshes", []):
        for p in mesh["primitives"]:
            for a in [
                *p["attributes"].values(),
                *(a for t in p.get("targets", []) for a in t.values()),
            ]:
                role[a] = ARRAY_BUFFER
            if "indices" in p:
                role[p["indices"]] = ELEMENT_ARRAY_BUFFER
    users: dict[int, list] = {}  # view -> the uses of the accessors and images that read it
    for i, a in enumerate(doc.get("accessors", [])):
        if "bufferView" in a:
            users.setdefault(a["bufferView"], []).append(role.get(i))
        for part in ("indices", "values") if "sparse" in a else ():
            users.setdefault(a["sparse"][part]["bufferView"], []).append(None)
    for im in doc.get("images", []):
        if "bufferView" in im:
            users.setdefault(im["bufferView"], []).append(None)
    for view, uses in users.items():
        if "target" in doc["bufferViews"][view] or None in uses or len(set(uses)) != 1:
            continue
        if uses[0] == ELEMENT_ARRAY_BUFFER or len(uses) == 1:
            doc["bufferViews"][view]["target"] = uses[0]


class Moving(NamedTuple):
    """An animated object merged into the output: its mesh nodes (one mesh each) and their
    world matrices [4, 4] in the output."""

    name: str
    path: Path
    motion: Deformer | Skinning
    root: int
    nodes: list[int]
    world: dict[int, np.ndarray]


def merged_objects(out: GltfBuilder, objects: list, frames: int, roots: list[int]):
    """Merge each object's GLB into ``out`` (its root node appended to ``roots``) and yield
    every animated one (a motion and F ≥ 2) right after merging it, with a mesh shared by
    several of its nodes duplicated per node (METHOD §20: the deformation of a vertex depends
    on its placement)."""
    for name, path, motion in objects:
        _, root = merge_gltf(out, Path(path), name)
        roots.append(root)
        if motion is None or frames < 2:
            continue
        world = world_matrices(out.doc, [root])
        placed = [n for n in sorted(world) if "mesh" in out.doc["nodes"][n]]
        seen: set[int] = set()
        for n in placed:
            node = out.doc["nodes"][n]
            if node["mesh"] in seen:
                node["mesh"] = out.add("meshes", copy.deepcopy(out.doc["meshes"][node["mesh"]]))
            seen.add(node["mesh"])
        yield Moving(name, Path(path), motion, root, placed, world)


def morph_object(
    out: GltfBuilder, obj: Moving, centre: np.ndarray, scale: float, frames: int
) -> list[int]:
    """Morph every mesh node of ``obj`` by its deformer (:func:`morph_mesh`); returns the
    morphed nodes."""
    for n in obj.nodes:
        mesh = out.doc["nodes"][n]["mesh"]
        morph_mesh(out, mesh, obj.world[n], centre, scale, obj.motion, frames, str(obj.path))
    return obj.nodes
