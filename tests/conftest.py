"""Shared fixtures: tiny scenes written as GLB, and workflow configs in a temporary folder."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import trimesh
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def box(extents, centre, colour=(200, 80, 40, 255)) -> trimesh.Trimesh:
    mesh = trimesh.creation.box(extents=extents)
    mesh.apply_translation(centre)
    mesh.visual.face_colors = colour
    return mesh


def write_scene(folder: Path, meshes: list[trimesh.Trimesh]) -> Path:
    """CHORD layout: obj_<i>.glb per mesh and scene.glb holding them all."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, mesh in enumerate(meshes):
        trimesh.Scene(mesh).export(folder / f"obj_{i}.glb", file_type="glb")
    trimesh.Scene(meshes).export(folder / "scene.glb", file_type="glb")
    return folder


@pytest.fixture
def toy_scene(tmp_path) -> Path:
    """A block (obj_0, dynamic) standing on a slab (obj_1, static)."""
    return write_scene(
        tmp_path / "data" / "toy",
        [box([0.4, 0.8, 0.4], [0, 0.45, 0]), box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))],
    )


def write_config(folder: Path, rows: list[dict], **extra) -> Path:
    """config.yaml + scenes.tsv in ``folder``; ``extra`` entries are merged into the config."""
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["scene", "data", "prompt", "n_prompt", "gaussians", "tier", "preset"]
    lines = ["\t".join(cols)] + ["\t".join(str(r.get(c, "")) for c in cols) for r in rows]
    (folder / "scenes.tsv").write_text("\n".join(lines) + "\n")
    conf = {"scenes": str(folder / "scenes.tsv"), "results": str(folder / "results")}
    for key, value in extra.items():
        conf[key] = value
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "Duck.glb").is_file():
        pytest.skip(f"third-party GLBs not found at {SHARED_DATA} (../shared absent)")
    return SHARED_DATA


def copy_glb(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)


def empty_glb() -> bytes:
    """A valid GLB container whose scene holds no mesh."""
    doc = json.dumps({"asset": {"version": "2.0"}, "scenes": [{"nodes": []}], "scene": 0})
    chunk = doc.encode().ljust((len(doc) + 3) // 4 * 4, b" ")
    body = struct.pack("<II", len(chunk), 0x4E4F534A) + chunk
    return struct.pack("<4sII", b"glTF", 2, 12 + len(body)) + body


def nan_mesh() -> trimesh.Trimesh:
    mesh = trimesh.creation.box(extents=[1, 1, 1])
    verts = mesh.vertices.copy()
    verts[0] = np.nan
    return trimesh.Trimesh(verts, mesh.faces, process=False)
