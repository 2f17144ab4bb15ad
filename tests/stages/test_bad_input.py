"""Each bad input: a clear error naming the file or field, exit status 2, nothing under results/."""

from __future__ import annotations

import shutil

import pytest
import trimesh
import yaml

from chord import cli
from tests.conftest import empty_glb, nan_mesh, write_config


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def results_files(folder):
    root = folder / "results"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def project(tmp_path, toy_scene):
    """A config whose single scene `toy` is the valid two-object toy scene."""
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


@pytest.mark.parametrize(
    ("scene", "message"),
    [("../x", "scene: '../x' does not match"), ("a/b", "'a/b' does not match")],
)
def test_path_like_scene_names(capsys, tmp_path, scene, message):
    config = write_config(tmp_path, [{"scene": scene, "data": "d", "prompt": "p"}])
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and message in err and "scenes.tsv, line 2" in err


def test_duplicate_scene_names(capsys, tmp_path):
    config = write_config(tmp_path, [{"scene": "a", "data": "d", "prompt": "p"}] * 2)
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and "line 3: scene 'a' duplicates line 2" in err


def test_unknown_config_key(capsys, tmp_path):
    config = write_config(
        tmp_path, [{"scene": "a", "data": "d", "prompt": "p"}], method={"cp_nmu": 10}
    )
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and "config: method: Additional properties are not allowed ('cp_nmu'" in err


def test_wrong_type(capsys, tmp_path):
    config = write_config(
        tmp_path, [{"scene": "a", "data": "d", "prompt": "p"}], method={"init_voxel_size": "fine"}
    )
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and "method.init_voxel_size: 'fine' is not of type 'number'" in err


def test_missing_prompt(capsys, tmp_path):
    config = write_config(tmp_path, [{"scene": "a", "data": "d", "prompt": ""}])
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 2 and "scene 'a': prompt is missing" in err


def test_valid_config_passes(capsys, project):
    config, _ = project
    code, err = run_cli(capsys, "validate", "--config", str(config))
    assert code == 0 and "1 scene(s) valid" in err


def test_config_file_not_yaml_mapping(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump([1, 2]))
    code, err = run_cli(capsys, "validate", "--config", str(path))
    assert code == 2 and "top level must be a mapping" in err
