"""Each bad input: a clear error naming the file or field, exit status 2 from `chord` (non-zero
from Snakemake), and nothing written under results/."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import trimesh
import yaml

from chord.cli import main
from chord.gltf import container
from tests.conftest import (
    box,
    empty_glb,
    nan_mesh,
    write_config,
    write_scene,
    write_still_motion,
)
from tests.workflow.test_scale import copy_workflow, snakemake


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main.main(list(argv))
    return code, capsys.readouterr().err


def results_files(folder):
    root = folder / "results"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def project(tmp_path, toy_scene):
    """A config whose single scene `toy` is the valid two-object toy scene (with a scripted
    motion for the default oracle teacher)."""
    write_still_motion(toy_scene)
    config = write_config(tmp_path / "proj", [{"scene": "toy", "data": toy_scene, "prompt": "p"}])
    return config, toy_scene


def ingest_error(capsys, config) -> str:
    code, err = run_cli(capsys, "ingest", "--config", str(config), "--scene", "toy")
    assert code == 2, err
    assert results_files(config.parent) == []
    return err


def test_missing_scene_glb(capsys, project):
    config, data = project
    (data / "scene.glb").unlink()
    assert f"{data / 'scene.glb'}: missing" in ingest_error(capsys, config)


def test_object_ids_with_a_gap(capsys, project):
    config, data = project
    shutil.move(data / "obj_1.glb", data / "obj_2.glb")
    assert f"{data / 'obj_1.glb'}: missing; object ids must be contiguous" in ingest_error(
        capsys, config
    )


def test_static_id_out_of_range(capsys, project, tmp_path):
    config, data = project
    write_config(
        config.parent, [{"scene": "toy", "data": data, "prompt": "p"}], method={"static_id": 5}
    )
    assert "static_id: 5 is outside [0, 2) objects" in ingest_error(capsys, config)


def test_empty_mesh(capsys, project):
    config, data = project
    (data / "obj_0.glb").write_bytes(empty_glb())
    assert f"{data / 'obj_0.glb'}: holds no triangles (empty mesh)" in ingest_error(capsys, config)


def test_nan_vertices(capsys, project):
    config, data = project
    trimesh.Scene(nan_mesh()).export(data / "obj_0.glb", file_type="glb")
    err = ingest_error(capsys, config)
    assert f"{data / 'obj_0.glb'}: vertex positions contain NaN" in err


def test_not_a_glb(capsys, project):
    config, data = project
    (data / "obj_1.glb").write_text("ply\nformat ascii 1.0\n")
    assert f"{data / 'obj_1.glb'}: not a GLB file" in ingest_error(capsys, config)


# --------------------------------------------------- hostile glTF (issue 39): one line each


def _two_billion(data: Path) -> None:
    doc, blob = container.read_glb(data / "obj_0.glb")
    doc["accessors"].append({"componentType": 5126, "type": "MAT3", "count": 2_000_000_000})
    container.write_glb(data / "obj_0.glb", doc, blob)


def _index_beyond(data: Path) -> None:
    doc, blob = container.read_glb(data / "obj_0.glb")
    acc = doc["accessors"][doc["meshes"][0]["primitives"][0]["indices"]]
    view = doc["bufferViews"][acc["bufferView"]]
    kind = container.COMPONENTS[acc["componentType"]]
    start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
    value = np.array([70000 if kind.endswith("4") else 9000], kind).tobytes()
    container.write_glb(data / "obj_0.glb", doc, blob[:start] + value + blob[start + len(value) :])


def _cut_short(data: Path) -> None:
    glb = data / "obj_0.glb"
    glb.write_bytes(glb.read_bytes()[:-40])


def _uri_outside(data: Path) -> None:
    (data / "obj_0.glb").unlink()
    trimesh.creation.box().export(data / "obj_0.gltf")
    doc = json.loads((data / "obj_0.gltf").read_text())
    outside = data.parent / "elsewhere" / "x.bin"
    outside.parent.mkdir()
    shutil.copy(data / doc["buffers"][0]["uri"], outside)
    doc["buffers"][0]["uri"] = "../elsewhere/x.bin"
    (data / "obj_0.gltf").write_text(json.dumps(doc))


def _gltf_bin(data: Path) -> Path:
    """obj_0 as a .gltf beside its .bin; the .bin."""
    (data / "obj_0.glb").unlink()
    trimesh.creation.box().export(data / "obj_0.gltf")
    return data / json.loads((data / "obj_0.gltf").read_text())["buffers"][0]["uri"]


def _bin_a_fifo(data: Path) -> None:
    path = _gltf_bin(data)
    path.unlink()
    os.mkfifo(path)


def _bin_larger(data: Path) -> None:
    os.truncate(_gltf_bin(data), 20 * 2**30)  # sparse


def _second_bin_chunk(data: Path) -> None:
    glb = data / "obj_0.glb"
    raw = glb.read_bytes()
    extra = struct.pack("<II", 4, container.CHUNK_BIN) + b"\0" * 4
    glb.write_bytes(raw[:8] + struct.pack("<I", len(raw) + len(extra)) + raw[12:] + extra)


HOSTILE = {
    "bin_a_fifo": (_bin_a_fifo, "obj_0.gltf: buffer 0 refers to ",
                   "gltf_buffer_0.bin, which is not a regular file (a FIFO)"),
    "bin_larger": (_bin_larger, "obj_0.gltf: buffer 0 refers to ",
                   f"gltf_buffer_0.bin, which holds {20 * 2**30} bytes, but its byteLength is 144"),
    "second_bin_chunk": (_second_bin_chunk, "obj_0.glb: a second BIN chunk at byte "),
    "uri_outside": (_uri_outside, "obj_0.gltf: buffer 0 has the URI '../elsewhere/x.bin', which "
                    "leads outside the scene's folder; buffer and image URIs must be relative"),
    "two_billion_elements": (_two_billion, "obj_0.glb: accessor 3: count 2000000000 without a "
                             "bufferView is more than the"),
    "index_beyond_the_vertices": (_index_beyond, "obj_0.glb: mesh 0 primitive 0: vertex index "),
    "cut_short": (_cut_short, "obj_0.glb: a GLB file cut short: its header gives"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_gltf_is_refused_in_one_line_by_ingest_and_validate(capsys, project, name):
    """Exit 2, the one line naming the file, the object and the numbers, no traceback and
    nothing under results/ (ingest_error); `chord validate` says the same."""
    config, data = project
    make, message, *tail = HOSTILE[name]
    make(data)
    err = ingest_error(capsys, config)
    assert f"{data}/{message}" in err and "Traceback" not in err, err
    assert all(f"{data}/{end}" in err for end in tail), err
    assert len([line for line in err.splitlines() if str(data) in line]) == 1, err
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and f"{data}/{message}" in err and "Traceback" not in err, err


def test_an_asset_over_the_ingest_memory_budget_is_refused_naming_the_figure(capsys, project):
    config, data = project
    code, err = run_cli(
        capsys, "ingest", "--config", str(config), "--scene", "toy", "--mem-mb", "0"
    )
    assert code == 2 and results_files(config.parent) == [], err
    size = (data / "scene.glb").stat().st_size  # the file alone is over 0 MB, unread
    assert (
        f"{data / 'scene.glb'}: holds {size} bytes, more than the ingest job's 0 MB (its mem_mb)"
        in err
    )
    assert "--set-resources ingest:mem_mb=1000" in err and "decimate" in err


# ------------------------------------------------------------------------ config bad inputs


class BadConfig(NamedTuple):
    rows: tuple[dict, ...]  # scene sheet rows, each over the valid row of `write_bad_config`
    config: dict | list  # entries merged into the config; a list is written as the whole file
    validate_says: tuple[str, ...]  # in `chord validate`'s error; () when it cannot check it
    snakemake_says: tuple[str, ...]  # in Snakemake's error


# Each with the valid toy scene as its data: the one fault is the one named.
BAD_CONFIGS = {
    "scene_name_dotdot": BadConfig(
        ({"scene": "../x"},),
        {},
        ("scene: '../x' does not match", "scenes.tsv, line 2"),
        ("'../x' does not match", "scenes.tsv, line 2"),
    ),
    "scene_name_slash": BadConfig(
        ({"scene": "a/b"},),
        {},
        ("'a/b' does not match", "scenes.tsv, line 2"),
        ("'a/b' does not match", "scenes.tsv, line 2"),
    ),
    "duplicate_scene_names": BadConfig(
        ({}, {}),
        {},
        ("line 3: scene 'a' duplicates line 2",),
        ("scenes.tsv, line 3: scene 'a' duplicates line 2",),
    ),
    "unknown_config_key": BadConfig(
        ({},),
        {"method": {"cp_nmu": 10}},
        ("config: method: Additional properties are not allowed ('cp_nmu'",),
        ("Additional properties are not allowed ('cp_nmu' was unexpected)", "['method']"),
    ),
    "wrong_type": BadConfig(
        ({},),
        {"method": {"init_voxel_size": "fine"}},
        ("method.init_voxel_size: 'fine' is not of type 'number'",),
        ("'fine' is not of type 'number'", "On instance['method']['init_voxel_size']"),
    ),
    "missing_prompt": BadConfig(
        ({"prompt": ""},),
        {},
        ("scene 'a': prompt is missing",),
        ("scenes.tsv, line 2: scene 'a': prompt is missing",),
    ),
    "config_not_a_mapping": BadConfig(
        ({},),
        [1, 2],
        ("top level must be a mapping",),
        ("Config file must be given as JSON or YAML with keys at top level",),
    ),
    # needs the scene's files: `chord validate` does not read them (ingest: see above)
    "static_id_out_of_range": BadConfig(
        ({},),
        {"method": {"static_id": 5}},
        (),
        ("scene a: method: static_id: 5 is outside [0, 2) objects",),
    ),
}


def write_bad_config(folder: Path, data: Path, case: BadConfig) -> Path:
    """config.yaml + scenes.tsv of ``case`` in ``folder``; results go to folder/../results."""
    rows = [{"scene": "a", "data": data, "prompt": "p", **row} for row in case.rows]
    extra = case.config if isinstance(case.config, dict) else {}
    path = write_config(folder, rows, results=str(folder.parent / "results"), **extra)
    if not isinstance(case.config, dict):
        path.write_text(yaml.safe_dump(case.config))
    return path


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, id=name) for name, case in BAD_CONFIGS.items() if case.validate_says],
)
def test_config_bad_input_fails_validate(capsys, tmp_path, toy_scene, case):
    write_still_motion(toy_scene)
    config = write_bad_config(tmp_path / "config", toy_scene, case)
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2, err
    for message in case.validate_says:
        assert message in err, err


def files_written(work: Path) -> list[Path]:
    """Files under ``work`` outside the workflow copy (wf/: its __pycache__) and Snakemake's
    own bookkeeping (.snakemake/: its log and metadata)."""
    return sorted(
        p.relative_to(work)
        for p in work.rglob("*")
        if p.is_file() and p.relative_to(work).parts[0] not in ("wf", ".snakemake")
    )


@pytest.fixture(scope="module")
def snakemake_runs(tmp_path_factory) -> dict:
    """Each bad config's real run (not -n) of the cheapest target, ingest, on a copy of the
    workflow: {case: (work folder, files before, process)}. The runs go side by side (each
    is a Snakemake start, ~1.5 s of CPU) and the tests below read them."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("bad_configs")
    data = write_scene(
        root / "data" / "toy",
        [box([0.4, 0.8, 0.4], [0, 0.45, 0]), box([2.0, 0.1, 2.0], [0, 0, 0], (90, 90, 90, 255))],
    )
    write_still_motion(data)

    def run(name: str):
        work = root / name
        copy_workflow(work)
        write_bad_config(work / "config", data, BAD_CONFIGS[name])
        before = files_written(work)
        target = str(work / "results/a/scene/scene.json")
        return work, before, snakemake(work, "--cores", "1", target, check=False)

    with ThreadPoolExecutor(max_workers=min(len(BAD_CONFIGS), os.cpu_count() or 1)) as pool:
        return dict(zip(BAD_CONFIGS, pool.map(run, BAD_CONFIGS), strict=True))


@pytest.mark.slow  # eight Snakemake starts, ~1.5 s of CPU each (run side by side)
@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_config_bad_input_stops_snakemake_before_any_job(snakemake_runs, name):
    """A non-zero exit naming the key or file, and nothing written, under results/ (not even
    a log) or anywhere else."""
    work, before, proc = snakemake_runs[name]
    assert before == [Path("config/config.yaml"), Path("config/scenes.tsv")]
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    for message in BAD_CONFIGS[name].snakemake_says:
        assert message in out, out[-3000:]
    assert not (work / "results").exists()
    assert files_written(work) == before


def test_valid_config_passes(capsys, project):
    config, _ = project
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 0 and "1 scene(s) valid" in err
