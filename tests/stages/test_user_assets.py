"""Users' own assets through the stages: ingest reads compressed and optimised files as the
originals (scene.json records what it decoded and warns of what it does not render), the
Gaussians take the colours the material defines, the export writes what ingest read, and what
cannot be read stops ingest and `chord validate` with the same one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from chord.config import settings
from chord.core.errors import InputError
from chord.gaussians import ply
from chord.gltf import container, ktx2, morphed, reader
from chord.stages import gaussians, ingest
from chord.stages.adapter import input_error_once
from tests import components
from tests import gltf_corpus as corpus
from tests.conftest import validate_glb, write_config, write_still_motion
from tests.stages.test_bad_input import ingest_error, run_cli
from tests.unit.gltf.test_animated import bend

METHOD = settings.method_from_mapping({"gs_init_num": 400}, where="test")


def scene_folder(folder: Path, objects: list[Path]) -> Path:
    """A scene folder of ``objects`` (copied as obj_<i> with their suffix) and their merge as
    scene.glb."""
    folder.mkdir(parents=True)
    for i, src in enumerate(objects):
        shutil.copy(src, folder / f"obj_{i}{src.suffix}")
        for extra in reader.external_files(src):  # a .gltf's .bin and images, as named
            shutil.copy(extra, folder / extra.name)
    corpus.run([corpus.gltf_transform(), "merge", *objects, folder / "scene.glb"])
    return folder


def run_ingest(data: Path, out: Path) -> dict:
    return ingest.run(
        data=data, out_json=out / "scene.json", out_meshes=out / "meshes", method=METHOD,
        scene="own",
    )  # fmt: skip


def test_ingest_reads_a_compressed_scene_as_the_plain_one(tmp_path, khronos):
    """scene.glb and objects Draco- and meshopt-compressed: the normalisation and each object's
    bounds and faces as the plain files give them (within a step of the 14-bit grid), and
    scene.json names what was decoded."""
    duck = khronos / "Duck.glb"
    box = corpus.write_glb(corpus.textured_box((3.0, 0.2, 3.0), (0, 0, 0)), tmp_path / "box.glb")
    plain = run_ingest(scene_folder(tmp_path / "plain", [duck, box]), tmp_path / "out_plain")
    packed = [
        corpus.transform("draco", duck, tmp_path / "duck_draco.glb"),
        corpus.transform("meshopt", box, tmp_path / "box_meshopt.glb"),
    ]
    doc = run_ingest(scene_folder(tmp_path / "packed", packed), tmp_path / "out_packed")
    step = 1.2 / (2**14 - 1)  # normalised units: longest side 1.2
    np.testing.assert_allclose(doc["normalisation"]["scale"], plain["normalisation"]["scale"],
                               rtol=2 / (2**14 - 1))  # fmt: skip
    for got, want in zip(doc["objects"], plain["objects"], strict=True):
        assert got["n_faces"] == want["n_faces"]
        np.testing.assert_allclose(got["bounds"], want["bounds"], rtol=0, atol=4 * step)
    assert doc["objects"][0]["extensions"] == ["KHR_draco_mesh_compression"]
    assert doc["objects"][1]["extensions"] == ["EXT_meshopt_compression", "KHR_mesh_quantization"]
    assert doc["warnings"] == []


def test_material_warnings_reach_the_log_and_scene_json(tmp_path, caplog):
    box = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    glass = corpus.with_material_extension(
        box, tmp_path / "glass.glb", "KHR_materials_sheen", {"sheenColorFactor": [1, 1, 1]}
    )
    slab = corpus.write_glb(corpus.textured_box((2, 0.1, 2), (0, -0.1, 0), 1), tmp_path / "s.glb")
    with caplog.at_level("WARNING"):
        doc = run_ingest(scene_folder(tmp_path / "own", [glass, slab]), tmp_path / "out")
    (warning,) = doc["objects"][0]["warnings"]
    assert "obj_0.glb: material" in warning and "KHR_materials_sheen" in warning
    assert warning in doc["warnings"] and warning in caplog.text
    assert json.loads((tmp_path / "out/scene.json").read_text())["warnings"] == doc["warnings"]


def gaussian_colours(tmp_path: Path, obj: Path, name: str) -> np.ndarray:
    """The Gaussians of ``obj`` (over a plain slab) as the gaussians stage colours them."""
    slab = corpus.write_glb(corpus.textured_box((2, 0.1, 2), (0, -0.1, 0), 1), tmp_path / "s.glb")
    out = tmp_path / name
    run_ingest(scene_folder(tmp_path / f"{name}_data", [obj, slab]), out)
    ply_path = out / "obj_0.ply"
    gaussians.run(scene_json=out / "scene.json", obj="obj_0", out=ply_path, method=METHOD)
    g = ply.read_ply(ply_path)
    return np.concatenate([g.means, g.sh[:, 0]], axis=1)


@pytest.mark.parametrize("feature", ["ktx2", "texture_transform", "gltf"])
def test_the_gaussians_take_the_colours_the_material_defines(tmp_path, feature):
    """The same Gaussians (positions and colours) from a KTX2-textured object (UASTC of solid
    4x4 blocks: exact), one whose base colour reads its UVs through KHR_texture_transform, and
    a .gltf with external files, as from the plain GLB."""
    box = corpus.write_glb(corpus.textured_box(), tmp_path / "box.glb")
    if feature == "ktx2":
        if ktx2.unavailable_reason():
            components.missing(components.NODE, ktx2.unavailable_reason())
        obj = corpus.with_ktx2_textures(
            box, tmp_path / "k.glb", corpus.basisu(tmp_path / "bin"), tmp_path / "work"
        )
        tol = 0.0
    elif feature == "texture_transform":
        ext = {"offset": [0.3, 0.1], "rotation": -0.7, "scale": [2.0, 0.5]}
        obj = corpus.with_texture_transform(box, tmp_path / "t.glb", ext)
        tol = 1e-4  # float32 UVs: far below one 1/255 step of colour
    else:
        obj = corpus.transform("copy", box, tmp_path / "ext" / "box.gltf")
        tol = 0.0
    got = gaussian_colours(tmp_path, obj, "got")
    want = gaussian_colours(tmp_path, box, "want")
    np.testing.assert_allclose(got[:, :3], want[:, :3], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[:, 3:], want[:, 3:], rtol=0, atol=tol)
    assert np.ptp(want[:, 3:], axis=0).min() > 0.1  # textured, not one flat colour


@pytest.mark.parametrize("command", ["draco", "meshopt", "quantize", "instance"])
def test_the_export_writes_what_ingest_read(tmp_path, command, gltf_validator, request):
    """The animated GLB of a compressed, quantised or instanced source: validator-clean, with
    the rest pose (frame 0) at the plain source's vertices."""
    src = (
        corpus.shared_mesh_nodes(tmp_path / "shared.glb")[0]
        if command == "instance"
        else request.getfixturevalue("khronos") / "Duck.glb"
    )
    packed = corpus.transform(command, src, tmp_path / f"{command}.glb")
    outs = {}
    for name, path in (("plain", src), ("packed", packed)):
        out = tmp_path / f"{name}_out.glb"
        morphed.dynamic_scene_glb(
            out, [("obj_0", path, bend(3))], centre=[0, 0, 0], scale=1.0, frames=3, fps=10
        )
        outs[name] = out
        issues = validate_glb(gltf_validator, out, tmp_path)
        assert issues["numErrors"] == 0, issues["messages"][:5]
    rest = {name: rest_vertices(out) for name, out in outs.items()}
    assert len(rest["packed"]) == len(rest["plain"])
    step = float(np.ptp(rest["plain"], axis=0).max()) / (2**14 - 1)
    dist = np.linalg.norm(rest["packed"][:, None] - rest["plain"][None], axis=2).min(axis=1)
    assert dist.max() <= 2 * step


def rest_vertices(path: Path) -> np.ndarray:
    """Every mesh node's vertices in world space at rest, as one array."""
    doc, blob = container.read_glb(path)
    world = container.world_matrices(doc, doc["scenes"][0]["nodes"])
    out = []
    for n, m in world.items():
        if "mesh" not in doc["nodes"][n]:
            continue
        for prim in doc["meshes"][doc["nodes"][n]["mesh"]]["primitives"]:
            v = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
            out.append(v @ m[:3, :3].T + m[:3, 3])
    return np.unique(np.round(np.concatenate(out), 6), axis=0)


# --- refused at ingest and by chord validate, in the same line --------------------------------


def folder_for_a_file(data: Path) -> str:
    (data / "obj_0.glb").unlink()
    (data / "obj_0.glb").mkdir()
    return f"{data / 'obj_0.glb'}: is not a regular file (a folder)"


def lines(data: Path) -> str:
    corpus.lines_only(data / "obj_0.glb")
    return f"{data / 'obj_0.glb'}: holds no triangles, only LINES primitives"


def zero_area(data: Path) -> str:
    corpus.zero_area(data / "obj_0.glb")
    return f"{data / 'obj_0.glb'}: its triangles have zero total area"


def unknown_extension(data: Path) -> str:
    corpus.with_required_extension(data / "obj_1.glb", data / "obj_1.glb", "EXT_foo")
    return f"{data / 'obj_1.glb'}: uses EXT_foo, which chord cannot read; re-export it"


def static_id(data: Path) -> str:
    (data / "obj_1.glb").unlink()
    return "static_id: 1 is outside [0, 1) objects"


@pytest.mark.parametrize("fault", [folder_for_a_file, lines, zero_area, unknown_extension,
                                   static_id])  # fmt: skip
def test_ingest_and_validate_stop_on_the_same_bad_data(capsys, tmp_path, toy_scene, fault):
    write_still_motion(toy_scene)
    config = write_config(tmp_path / "proj", [{"scene": "toy", "data": toy_scene, "prompt": "p"}])
    message = fault(toy_scene)
    assert message in ingest_error(capsys, config)
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and message in err, err
    (line,) = [line for line in err.splitlines() if message in line]  # one line, naming it
    assert line.startswith("error: scene toy: ")


def test_a_retry_after_a_bad_input_stops_at_once(tmp_path):
    """A training's bad input is recorded; the retry (attempt 2) stops with it before running
    anything; a new run (attempt 1) starts afresh."""
    record = tmp_path / "input_error.txt"
    ran = []
    with pytest.raises(InputError, match="bad motion"):
        with input_error_once(record, attempt=1):
            ran.append(1)
            raise InputError("bad motion")
    with pytest.raises(InputError, match="^not retried: bad motion"):
        with input_error_once(record, attempt=2):
            ran.append(2)
    with input_error_once(record, attempt=1):
        ran.append(3)
    assert ran == [1, 3] and not record.exists()
