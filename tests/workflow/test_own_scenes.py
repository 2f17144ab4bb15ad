"""docs/own-scenes.md, as written: a scene folder of compressed, optimised files (Draco,
meshopt, a .gltf with external files), a sheet, a config file merged over the shipped one;
`chord validate` and a dry run. On the default oracle teacher, a row without a scripted
motion stops the DAG build naming the row and the remedy; `chord validate` says the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chord.guidance import tiny_models
from tests import gltf_corpus as corpus
from tests.conftest import REPO
from tests.workflow.test_scale import copy_workflow, snakemake

PROMPT = "a rubber duck bobs on a textured box"


def own_scene(work: Path, khronos: Path) -> Path:
    """data/duck: the duck Draco-compressed as scene.glb and obj_0.glb, and a box made plain
    again as obj_1.gltf with its .bin and PNG beside it, meshopt-compressed on the way."""
    data = work / "data" / "duck"
    duck = corpus.transform("draco", khronos / "Duck.glb", data / "obj_0.glb")
    box = corpus.write_glb(corpus.textured_box((3.0, 0.2, 3.0), (0, 0, 0)), work / "box.glb")
    meshopt = corpus.transform("meshopt", box, work / "box_meshopt.glb")
    corpus.transform("copy", meshopt, data / "obj_1.gltf")
    # the scene: both objects in one file (what a user's exporter writes beside them)
    corpus.run([corpus.gltf_transform(), "merge", duck, box, data / "scene.glb"])
    return data


def readme_steps(work: Path, *, wan: bool) -> Path:
    """Steps 2 and 3: the sheet and my.yaml (with the Wan teacher, over a tiny Wan folder
    standing in for Wan2.2-I2V-A14B-Diffusers, when ``wan``)."""
    (work / "my_scenes.tsv").write_text(f"scene\tdata\tprompt\nduck\tdata/duck\t{PROMPT}\n")
    conf = {"scenes": "my_scenes.tsv"}
    if wan:
        folder = tiny_models.write_tiny_wan(work / "models" / "Wan2.2-I2V-A14B-Diffusers")
        tiny = tiny_models.write_tiny_vae(work / "models" / "lighttaew2_1.safetensors", folder)
        conf["guidance"] = {"backend": "wan", "ckpt_dir": str(folder), "tiny_vae_path": str(tiny)}
    (work / "my.yaml").write_text(yaml.safe_dump(conf))
    return work / "my.yaml"


@pytest.fixture
def work(tmp_path, khronos) -> Path:
    copy_workflow(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text((REPO / "config/config.yaml").read_text())
    own_scene(tmp_path, khronos)
    return tmp_path


def chord_validate(work: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "chord.cli.main", "validate", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=work)


def test_the_readme_steps_for_ones_own_scenes_plan_the_workflow(work):
    my = readme_steps(work, wan=True)
    proc = chord_validate(work, "--configfile", str(my))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 scene(s) valid" in proc.stderr
    dry = snakemake(work, "-n", "--configfile", str(my))
    for rule in ("ingest", "gaussians", "voxelize", "condition", "export"):
        assert f"rule {rule}:" in dry.stdout, dry.stdout[-3000:]
    # the trainings are checkpoints (rule preview_strip lists their previews when done)
    train = dry.stdout.split("checkpoint train_coarse:", 1)[1].split("\n\n", 1)[0]
    assert "attempt=1" in train  # how a retry after a bad input knows it is one


def test_a_bad_input_runs_once(work):
    """The default profile does not retry a job that stopped on bad input (exit 2)."""
    my = readme_steps(work, wan=True)
    corpus.zero_area(work / "data/duck/obj_0.glb")
    proc = snakemake(work, "results/duck/scene/scene.json", "--configfile", str(my), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count("Error in rule ingest") == 1, out[-3000:]
    assert "Trying to restart" not in out
    log = (work / "results/duck/logs/ingest.log").read_text()
    assert "obj_0.glb: its triangles have zero total area" in log


def test_the_default_oracle_without_a_scripted_motion_stops_the_dag_build(work):
    my = readme_steps(work, wan=False)
    proc = snakemake(work, "-n", "--configfile", str(my), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "MissingInputException" not in out
    expected = (
        "scene duck (scene sheet my_scenes.tsv, line 2): the teacher is the oracle",
        "data/duck/motion.json does not exist",
        "set guidance.backend: wan with guidance.ckpt_dir",
        "or add a motion.json",
    )
    for part in expected:
        assert part in out, out[-3000:]
    # the geometry needs no teacher: its stages still plan without a motion
    geometry = snakemake(work, "-n", "results/duck/voxels/obj_0.npz", "--configfile", str(my))
    assert "ingest" in geometry.stdout
    check = chord_validate(work, "--configfile", str(my))
    assert check.returncode == 2
    assert all(part in check.stderr for part in expected), check.stderr
