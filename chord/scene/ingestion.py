"""Scene ingestion (METHOD §1): object discovery, GLB loading, roles and normalisation."""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used, not here: the DAG build imports this module
    import trimesh

from chord.core.errors import InputError
from chord.gltf import reader
from chord.gltf.uri import file_problem

logger = logging.getLogger(__name__)

LONGEST_SIDE = 1.2
#: an object's file: obj_<i>.glb, or obj_<i>.gltf with its external files
OBJ_FILE = re.compile(r"^obj_(\d+)\.(glb|gltf)$")
SCENE_NAMES = ("scene.glb", "scene.gltf")


class SceneError(InputError):
    """Bad scene input; the message names the file or field and what is wrong."""


def object_files(folder: Path) -> dict[int, list[Path]]:
    """{object id: the obj_<id>.glb / .gltf entries in ``folder``}, as they are (folders and
    duplicates included; :func:`discover_objects` judges them)."""
    found: dict[int, list[Path]] = {}
    if Path(folder).is_dir():
        for p in sorted(Path(folder).iterdir()):
            if m := OBJ_FILE.match(p.name):
                found.setdefault(int(m[1]), []).append(p)
    return found


def scene_file(folder: Path) -> Path | None:
    """``scene.glb`` or ``scene.gltf`` in ``folder`` (the first present), else None."""
    return next((Path(folder) / n for n in SCENE_NAMES if os.path.lexists(Path(folder) / n)), None)


def is_scene_file(path: Path | str) -> bool:
    return Path(path).name in SCENE_NAMES


def data_files(folder: Path) -> list[Path]:
    """Every file of a scene folder that ingest reads: the scene file, the object files and the
    files a .gltf refers to (the workflow's inputs; what is missing, ingest reports)."""
    main = [scene_file(folder), *(p for ps in object_files(folder).values() for p in ps)]
    files = [p for p in main if p is not None and p.is_file()]
    return files + [x for p in files for x in _external_inputs(p) if x.is_file()]


def _external_inputs(path: Path) -> list[Path]:
    """:func:`chord.gltf.reader.external_files`, except that a URI leading outside the scene's
    folder is a warning (the one line ingest refuses the scene with) and none of that file's
    external files become inputs: the DAG reads nothing outside the folder, and the sheet's
    other scenes still run."""
    try:
        return reader.external_files(path)
    except InputError as exc:
        logger.warning("%s (ingest refuses this scene)", exc)
        return []


def discover_objects(folder: Path, obj_num: int = -1) -> list[Path]:
    """METHOD §1: ``obj_0`` … ``obj_<n-1>`` (``.glb``, or ``.gltf`` with its external files) in
    ``folder``, ids contiguous from 0, beside ``scene.glb`` (or ``scene.gltf``).

    ``obj_num`` −1 means n = highest id + 1; an explicit value must match the files.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise SceneError(f"{folder}: scene folder not found")
    scene = scene_file(folder)
    if scene is None:
        raise SceneError(
            f"{folder / 'scene.glb'}: missing (every scene folder needs scene.glb or scene.gltf)"
        )
    if problem := file_problem(scene):  # a folder, a FIFO, a link to /dev/zero, ...
        raise SceneError(f"{scene}: {problem}")
    found = object_files(folder)
    if not found:
        raise SceneError(f"{folder}: no obj_<i>.glb (or .gltf) files")
    for i, ps in sorted(found.items()):
        if len(ps) > 1:
            raise SceneError(f"{ps[1]}: obj_{i} is given twice ({ps[0].name} and {ps[1].name})")
        if problem := file_problem(ps[0]):
            raise SceneError(f"{ps[0]}: {problem}")
    ids = sorted(found)
    n = ids[-1] + 1
    missing = sorted(set(range(n)) - set(ids))
    if missing:
        raise SceneError(
            f"{folder / f'obj_{missing[0]}.glb'}: missing; object ids must be contiguous from 0 "
            f"(found {[f'obj_{i}' for i in ids]})"
        )
    if obj_num != -1 and obj_num != n:
        raise SceneError(f"{folder}: obj_num is {obj_num} but the folder holds {n} objects")
    return [found[i][0] for i in range(n)]


def load_mesh_parts(source: str | os.PathLike | trimesh.Scene) -> list[trimesh.Trimesh]:
    """METHOD §1. An object's triangle meshes in world space, one per scene node instance.

    ``source`` is a mesh file (GLB, glTF, OBJ, ...) or a loaded ``trimesh.Scene``. Like
    ``Scene.dump(concatenate=False)`` (node transforms baked into the vertices, each part
    keeping its own visual), but it also keeps a glTF ``COLOR_0`` that sits beside a material
    (``TextureVisuals.vertex_attributes["color"]``), which ``TextureVisuals.copy`` and hence
    ``dump`` drop. Non-triangle geometry (paths, point clouds) is skipped. Raises
    ``ValueError`` naming the file if it cannot be loaded or holds no triangle mesh.
    """
    import trimesh

    if isinstance(source, trimesh.Scene):
        scene, where = source, "scene"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise InputError(f"load_mesh_parts: {path} does not exist")
        try:
            if hasattr(trimesh, "load_scene"):
                scene = trimesh.load_scene(path)
            else:  # trimesh < 4.5
                scene = trimesh.load(path, force="scene")
        except Exception as exc:
            raise InputError(f"load_mesh_parts: cannot load {path} as a mesh ({exc})") from exc
    parts = []
    for node_name in scene.graph.nodes_geometry:
        transform, geom_name = scene.graph[node_name]
        src = scene.geometry[geom_name]
        if not isinstance(src, trimesh.Trimesh):
            logger.debug(
                "load_mesh_parts: %s: skipping %s (%s)", where, geom_name, type(src).__name__
            )
            continue
        part = src.copy()
        part.apply_transform(transform)
        part.metadata["name"] = geom_name
        part.metadata["node"] = node_name
        attrs = getattr(src.visual, "vertex_attributes", None)
        if (
            isinstance(part.visual, trimesh.visual.TextureVisuals)
            and attrs is not None
            and "color" in attrs
            and "color" not in part.visual.vertex_attributes
        ):
            part.visual.vertex_attributes["color"] = np.array(attrs["color"])
        parts.append(part)
    if not parts:
        raise InputError(f"load_mesh_parts: {where} holds no triangle mesh")
    return parts


def load_source(
    path: Path, mem_mb: int | None = None
) -> tuple[reader.Source, list[trimesh.Trimesh]]:
    """A glTF file made plain (:func:`chord.gltf.reader.read`) and flattened to world-space
    triangle meshes, one per primitive instance; visuals (UVs, materials, vertex colours)
    kept. Errors name the file: unreadable, an unsupported extension, no triangles, zero
    area, non-finite vertices, or an estimated peak memory over ``mem_mb``
    (:func:`chord.gltf.reader.read`)."""
    import trimesh

    path = Path(path)
    try:
        source = reader.read(path, mem_mb=mem_mb)
    except SceneError:
        raise
    except InputError as exc:
        raise SceneError(str(exc)) from exc
    try:
        scene = trimesh.load(
            io.BytesIO(source.glb_bytes()), file_type="glb", force="scene", process=False
        )
    except Exception as exc:  # trimesh raises many types on malformed files
        raise SceneError(f"{path}: unreadable glTF ({type(exc).__name__}: {exc})") from exc
    try:
        parts = [p for p in load_mesh_parts(scene) if len(p.faces)] if scene.geometry else []
    except InputError:
        parts = []
    if not parts:
        raise SceneError(f"{path}: holds no triangles (empty mesh)")
    for part in parts:
        if not np.isfinite(part.vertices).all():
            raise SceneError(f"{path}: vertex positions contain NaN or infinite values")
    if not sum(float(p.area) for p in parts) > 0:
        raise SceneError(f"{path}: its triangles have zero total area (every one is degenerate)")
    return source, parts


def load_parts(path: Path) -> list[trimesh.Trimesh]:
    """:func:`load_source`'s meshes."""
    return load_source(path)[1]


def bounds_of(parts: list[trimesh.Trimesh]) -> np.ndarray:
    """AABB ``[2, 3]`` (min, max) of all parts' vertices."""
    verts = np.concatenate([p.vertices for p in parts])
    return np.stack([verts.min(0), verts.max(0)])


def normalisation(bounds: np.ndarray, path: Path | str = "scene.glb") -> tuple[np.ndarray, float]:
    """METHOD §1: centre c = AABB centre, scale s = 1.2 / longest side; x_n = (x_w − c)·s."""
    extent = float((bounds[1] - bounds[0]).max())
    if not extent > 0:
        raise SceneError(f"{path}: all vertices coincide; the scene has no extent to normalise")
    return (bounds[0] + bounds[1]) / 2.0, LONGEST_SIDE / extent


def normalise_parts(parts: list[trimesh.Trimesh], centre, scale: float) -> list[trimesh.Trimesh]:
    """Apply x_n = (x_w − c)·s to ``parts`` in place and return them (visuals kept: a copy
    would drop a COLOR_0 that sits beside a material)."""
    matrix = np.eye(4)
    matrix[:3, :3] *= scale
    matrix[:3, 3] = -np.asarray(centre, dtype=np.float64) * scale
    for part in parts:
        part.apply_transform(matrix)
    return parts


def object_scale_factor(bounds_n: np.ndarray) -> float:
    """METHOD §1: s_obj = longest side of the object's normalised AABB / 1.2."""
    return float((bounds_n[1] - bounds_n[0]).max()) / LONGEST_SIDE


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    index: int
    role: str  # "dynamic" | "static" | "avoided"
    source: str
    scale_factor: float
    bounds: list  # normalised AABB [[x,y,z],[x,y,z]]
    n_vertices: int
    n_faces: int

    def to_json(self, mesh: str | None) -> dict:
        return {
            "name": self.name,
            "id": self.index,
            "role": self.role,
            "source": self.source,
            "mesh": mesh,
            "scale_factor": self.scale_factor,
            "bounds": self.bounds,
            "n_vertices": self.n_vertices,
            "n_faces": self.n_faces,
        }


# --- scene.json (the ingest stage's output) --------------------------------------------------

SCENE_FORMAT = "chord-scene/1"


def read_scene_json(scene_json: Path) -> dict:
    """Load a scene.json written by the ingest stage, checking its format tag."""
    from chord.core.atomic_files import read_json

    doc = read_json(scene_json)
    if doc.get("format") != SCENE_FORMAT:
        raise SceneError(
            f"{scene_json}: format is {doc.get('format')!r}, expected {SCENE_FORMAT!r}"
        )
    return doc


def mesh_path(scene_json: Path, doc: dict, name: str) -> Path:
    """Path of a normalised mesh named in scene.json (relative to its folder)."""
    entry = next((o for o in doc["objects"] if o["name"] == name), None)
    if entry is None or entry["mesh"] is None:
        raise SceneError(f"{scene_json}: {name} has no normalised mesh (unknown or avoided)")
    return Path(scene_json).parent / entry["mesh"]


def object_mesh(scene_json: Path, doc: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """An object's normalised mesh from the ingest stage, its parts as one triangle soup:
    vertices [V, 3] (float64) and faces [F, 3] (int64)."""
    import trimesh

    parts = load_parts(mesh_path(scene_json, doc, name))
    mesh = trimesh.util.concatenate(
        [trimesh.Trimesh(p.vertices, p.faces, process=False) for p in parts]
    )
    return np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int64)
