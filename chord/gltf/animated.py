"""The animated glTFs of a scene (METHOD §20), written on the glTF JSON and binary chunk
directly (trimesh and pygltflib have no morph-target or skin animation writer): the shared
merge and writer and the morph-target file here, the skinned one in :mod:`chord.gltf.skinned`.
Both copy
every source object's glTF (nodes, meshes, materials, textures, samplers, skins, cameras) into
one file. ``dynamic_scene.glb`` gives each mesh node of a dynamic object one morph target per
frame k ≥ 1 plus a STEP animation of its weights; ``dynamic_scene_skinned.glb`` skins it on one
joint per control point with LINEAR translation/rotation keys (the control-point motion is
linear blend skinning, METHOD §5), keeping morph targets only for a motion one skin cannot
express. Each source is read through :func:`chord.gltf.reader.read`, as ingest reads it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from chord.core.errors import InputError
from chord.gltf import reader
from chord.gltf.container import (
    ARRAY_BUFFER,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    GltfBuilder,
    read_accessor,
    world_matrices,
)

if TYPE_CHECKING:
    from chord.gltf.skinned import Skinning

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

# A deformer maps normalised rest points [n, 3] to their positions [F, n, 3] in frames
# 0..F-1 (frame 0 the rest points themselves).
Deformer = Callable[[np.ndarray], np.ndarray]


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


def key_times(out: GltfBuilder, frames: int, fps: float) -> int:
    """The animation input: key k at k/fps for k = 0..F−1."""
    return out.add_accessor(np.arange(frames, dtype=np.float64) / fps, "SCALAR")


def weights_channels(out: GltfBuilder, nodes: list[int], frames: int, times: int) -> list:
    """(sampler, target) of each morphed node: STEP keys of one-hot weights on target k at key
    k (all zeros at key 0)."""
    onehot = np.zeros((frames, frames - 1))
    onehot[np.arange(1, frames), np.arange(frames - 1)] = 1.0
    w_acc = out.add_accessor(onehot.reshape(-1), "SCALAR")
    sampler = {"input": times, "output": w_acc, "interpolation": "STEP"}
    return [(dict(sampler), {"node": n, "path": "weights"}) for n in nodes]


def write_glb(out: GltfBuilder, out_path: Path | str, roots: list[int], channels: list) -> None:
    """The scene of ``roots``, one animation "motion" of ``channels`` ((sampler, target)
    pairs; none: no animation), written as a GLB."""
    out.doc["scenes"] = [{"nodes": roots}]
    out.doc["scene"] = 0
    if channels:
        anim = {"name": "motion", "samplers": [], "channels": []}
        for sampler, target in channels:
            anim["samplers"].append(sampler)
            anim["channels"].append({"sampler": len(anim["samplers"]) - 1, "target": target})
        out.doc["animations"] = [anim]
    for key in [k for k, v in out.doc.items() if v == []]:
        del out.doc[key]
    out.to_glb(out_path)


def dynamic_scene_glb(
    out_path: Path | str,
    objects: list[tuple[str, Path, Deformer | None]],
    *,
    centre,
    scale: float,
    frames: int,
    fps: float,
) -> dict:
    """METHOD §20: write the animated glTF of a scene.

    Args:
        objects: (name, source GLB, deformer or None for an unanimated object) in id order;
            excluded objects are simply not listed.
        centre, scale: the scene normalisation (x_n = (x_w − c)·s).
        frames: F = min(T, lst_frame) frames; frame k ≥ 1 is morph target k.
        fps: key k sits at k/fps; STEP interpolation.

    Returns a summary: {"nodes": animated node count, "targets": F − 1, "frames": F}.
    """
    if frames < 1:
        raise ValueError(f"frames: expected at least 1, got {frames}")
    if not objects:
        raise InputError(f"{out_path}: no objects to export")
    out = GltfBuilder()
    c = np.asarray(centre, dtype=np.float64)
    roots: list[int] = []
    animated: list[int] = []
    for obj in merged_objects(out, objects, frames, roots):
        for n in obj.nodes:
            mesh = out.doc["nodes"][n]["mesh"]
            morph_mesh(out, mesh, obj.world[n], c, scale, obj.motion, frames, str(obj.path))
        animated += obj.nodes
    set_view_targets(out.doc)
    channels = []
    if animated:
        channels = weights_channels(out, animated, frames, key_times(out, frames, fps))
    write_glb(out, out_path, roots, channels)
    return {"nodes": len(animated), "targets": frames - 1 if animated else 0, "frames": frames}
