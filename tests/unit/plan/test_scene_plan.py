"""chord.plan.scene_plan: a scene's files, objects by role, training stages and each stage's inputs,
asked of the plan directly (no Snakemake, no torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chord.config import settings
from chord.plan import results_layout, scene_plan
from tests.conftest import REPO, box, write_scene, write_still_motion


def load(tmp_path: Path, rows: list[tuple[str, Path]], **config) -> settings.Config:
    """The shipped config over a sheet of ``rows`` (scene, data folder), merged with
    ``config``; results under tmp_path/results."""
    sheet = tmp_path / "scenes.tsv"
    sheet.write_text("scene\tdata\tprompt\n" + "".join(f"{s}\t{d}\tp\n" for s, d in rows))
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    base.update(scenes=str(sheet), results=str(tmp_path / "results"), **config)
    return settings.load(base)


def three_objects(folder: Path) -> Path:
    meshes = [
        box((1, 0.2, 1), (0, -0.5, 0)),
        box((0.2, 0.2, 0.2), (0, 0, 0)),
        box((0.1,) * 3, (0.4, 0, 0)),
    ]
    return write_scene(folder, meshes)


def test_named_and_record_are_each_others_inverse():
    rec = {
        "scene_json": Path("r/s/scene.json"),
        "plys": {"obj_0": Path("a.ply"), "obj_1": Path("b.ply")},
        "voxels": {"obj_1": Path("b.npz")},
        "sources": {},
        "loss_logs": {"coarse": Path("l.tsv")},
        "metrics": {},
        "videos": {"1": Path("r/s/seed_1/export/ref_view.mp4")},
        "external": [Path("x.bin"), Path("y.png")],
    }
    flat = scene_plan.named(rec)
    assert flat["ply_obj_1"] == "b.ply" and flat["vox_obj_1"] == "b.npz"
    assert flat["losses_coarse"] == "l.tsv" and flat["external"] == ["x.bin", "y.png"]
    assert flat["video_1"] == "r/s/seed_1/export/ref_view.mp4"
    assert scene_plan.record(flat) == rec
    assert scene_plan.record(iter(flat.items())) == rec  # snakemake.input.items(): a generator


def test_roles_stages_and_the_training_inputs_of_a_scene(tmp_path):
    data = three_objects(tmp_path / "data" / "toy")
    write_still_motion(data, ("obj_1",))
    conf = load(
        tmp_path,
        [("toy", data)],
        scene_overrides={
            "toy": {"static_id": 0, "avoid_objs": ["obj_2"], "add_cp_objs": ["obj_1"]}
        },
    )
    p = scene_plan.scene(conf, "toy")
    assert p.roles == {"obj_0": "static", "obj_1": "dynamic", "obj_2": "avoided"}
    assert p.stages == ("coarse", "fine") and p.final_stage == "fine"
    results = tmp_path / "results"
    train = p.train_inputs()
    assert train["plys"] == {
        o: results_layout.gaussians_ply(results, "toy", o) for o in ("obj_0", "obj_1")
    }
    assert train["voxels"] == {"obj_1": results_layout.voxels_npz(results, "toy", "obj_1")}
    assert train["motion"] == data / "motion.json"  # the oracle's target
    exported = p.export_inputs()
    assert set(exported["sources"]) == {"obj_0", "obj_1"}  # the avoided object is not exported
    assert exported["state"] == results_layout.train_state(results, "toy", "fine")
    assert set(p.evaluate_inputs()["loss_logs"]) == {"coarse", "fine"}
    assert p.evaluate_inputs()["meshes"] == results_layout.meshes_dir(
        results, "toy"
    )  # interaction checks
    wan = {
        "backend": "wan",
        "ckpt_dir": str(tmp_path / "wan"),
        "tiny_vae_path": str(tmp_path / "t"),
    }
    p = scene_plan.scene(load(tmp_path, [("toy", data)], guidance=wan), "toy")
    assert "motion" not in p.train_inputs()


def test_the_oracle_without_a_motion_plans_the_geometry_but_not_the_training(tmp_path):
    data = three_objects(tmp_path / "data" / "mine")
    p = scene_plan.scene(load(tmp_path, [("mine", data)]), "mine")
    assert p.geometry_inputs()["scene_json"] == results_layout.scene_json(
        tmp_path / "results", "mine"
    )
    for inputs in (p.train_inputs, p.preview_inputs):
        with pytest.raises(
            settings.ConfigError, match=r"scene mine \(scene sheet .*line 2\).*oracle"
        ):
            inputs()
    assert "motion" not in p.evaluate_inputs()  # no ground truth to compare with
    wan = {"backend": "wan", "ckpt_dir": str(tmp_path / "w"), "tiny_vae_path": str(tmp_path / "t")}
    p = scene_plan.scene(load(tmp_path, [("mine", data)], guidance=wan), "mine")
    assert p.motion_problem is None and "motion" not in p.train_inputs()  # wan needs none


def test_a_gltf_object_brings_its_external_files_to_ingest_and_export(tmp_path):
    data = three_objects(tmp_path / "data" / "g")
    (data / "obj_2.glb").unlink()
    box((0.1,) * 3, (0.4, 0, 0)).export(data / "obj_2.gltf")  # with obj_2's .bin beside it
    externals = sorted(str(f) for f in data.iterdir() if f.suffix == ".bin")
    assert externals
    p = scene_plan.scene(load(tmp_path, [("g", data)]), "g")
    assert set(externals) <= set(p.ingest_inputs()["data"])
    exported = p.export_inputs()
    assert exported["sources"]["obj_2"] == str(data / "obj_2.gltf")
    assert sorted(exported["external"]) == externals


def test_a_static_id_outside_the_objects_names_the_scene(tmp_path):
    data = three_objects(tmp_path / "data" / "toy")
    conf = load(tmp_path, [("toy", data)], scene_overrides={"toy": {"static_id": 5}})
    with pytest.raises(settings.ConfigError, match=r"scene toy: method: static_id: 5 is outside"):
        scene_plan.scene(conf, "toy")


def test_missing_or_gapped_object_ids_leave_the_roles_to_ingest(tmp_path):
    data = three_objects(tmp_path / "data" / "gap")
    (data / "obj_1.glb").unlink()
    p = scene_plan.scene(load(tmp_path, [("gap", data)]), "gap")
    assert p.roles == {} and p.gaussians() == {} and p.voxels() == {}
    assert p.ingest_inputs()["data"]  # ingest runs, and names the gap


def test_the_demo_scenes_plan_from_the_registry_and_the_default_target_covers_them(tmp_path):
    conf = load(tmp_path, [("hop", "resources/demo/hop"), ("sway", "resources/demo/sway")])
    plans = {s: scene_plan.scene(conf, s) for s in conf.scenes}
    assert plans["hop"].demo == "hop" and all(f.endswith(".glb") for f in plans["hop"].files)
    assert plans["hop"].scripted_motion() == Path("resources/demo/hop/motion.json")
    assert plans["hop"].motion_problem is None  # the workflow writes the demo's motion
    targets = scene_plan.all_targets(plans, conf.results)
    assert str(results_layout.metrics_tsv(conf.results)) in targets
    for s, p in plans.items():
        assert (
            str(p.final_state()) in targets
            and str(results_layout.viewer_html(conf.results, s)) in targets
        )
    flat = scene_plan.named(scene_plan.aggregate_inputs(plans))
    assert set(flat) == {"metrics_hop", "metrics_sway", *(f"losses_{s}_coarse" for s in plans)}


def test_the_plan_imports_no_torch():
    code = (
        "import sys, chord.plan.scene_plan, chord.resources.job_size; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def swept(tmp_path: Path, seeds_cell: str | None, **config) -> settings.Config:
    """A one-scene sheet with a ``seeds`` column (``seeds_cell``; None: the column empty)."""
    data = three_objects(tmp_path / "data" / "toy")
    write_still_motion(data, ("obj_1", "obj_2"))
    sheet = tmp_path / "scenes.tsv"
    sheet.write_text(f"scene\tdata\tprompt\tseeds\ntoy\t{data}\tp\t{seeds_cell or ''}\n")
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    base.update(scenes=str(sheet), results=str(tmp_path / "results"), **config)
    return settings.load(base)


def test_a_seed_sweep_plans_one_run_per_seed_sharing_everything_before_training(tmp_path):
    conf = swept(tmp_path, "3 1,2")
    p = scene_plan.scene(conf, "toy")
    results = tmp_path / "results"
    assert [r.run for r in p.runs()] == ["toy/seed_3", "toy/seed_1", "toy/seed_2"]
    for run in p.runs():
        seed = run.seed
        assert run.final_state() == results / "toy" / f"seed_{seed}" / "train" / "coarse.pt"
        train = run.train_inputs()  # the scene's files, the same for every seed
        assert train == p.train_inputs()
        assert train["plys"]["obj_0"] == results_layout.gaussians_ply(results, "toy", "obj_0")
        assert run.evaluate_inputs()["ref"] == results_layout.reference_png(results, "toy")
        assert run.evaluate_inputs()["state"] == run.final_state()
        assert scene_plan.run_spec(conf, run.run).method.seed == seed
        assert p.for_run(run.run) == run
    targets = p.targets()
    assert len(targets) == len(set(targets))
    shared = [
        results_layout.scene_json(results, "toy"),
        results_layout.reference_png(results, "toy"),
    ]
    assert all(str(f) in targets for f in shared)
    for seed in (1, 2, 3):
        assert str(results_layout.metrics_json(results, f"toy/seed_{seed}")) in targets
        assert str(results_layout.viewer_html(results, f"toy/seed_{seed}")) in targets
    assert str(results_layout.metrics_json(results, "toy")) not in targets  # no unswept run
    assert str(results_layout.best_json(results, "toy")) in targets
    sweep = p.sweep_inputs()
    assert sweep["metrics"] == {
        str(s): results_layout.metrics_json(results, f"toy/seed_{s}") for s in (3, 1, 2)
    }
    agg = scene_plan.aggregate_inputs({"toy": p})
    assert list(agg["metrics"]) == ["toy/seed_3", "toy/seed_1", "toy/seed_2"]
    with pytest.raises(settings.ConfigError, match="seed 7 is not one of its seeds"):
        scene_plan.run_spec(conf, "toy/seed_7")


def test_the_config_sweeps_every_scene_and_a_sheet_cell_overrides_it(tmp_path):
    conf = swept(tmp_path, None, sweep={"seeds": [5, 6]})
    assert [r.run for r in scene_plan.scene(conf, "toy").runs()] == ["toy/seed_5", "toy/seed_6"]
    conf = swept(tmp_path, "9", sweep={"seeds": [5, 6]})
    assert [r.run for r in scene_plan.scene(conf, "toy").runs()] == ["toy/seed_9"]
    unswept = scene_plan.scene(swept(tmp_path, None), "toy")
    assert [r.run for r in unswept.runs()] == ["toy"]  # today's paths, unchanged
    assert unswept.final_state() == tmp_path / "results" / "toy" / "train" / "coarse.pt"
    assert str(results_layout.best_json(tmp_path / "results", "toy")) not in unswept.targets()


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("1 x", "seeds: '1 x' does not match"),
        ("0 1 0", "scene 'toy': seeds: '0 1 0' repeats seed\\(s\\) 0"),
    ],
)
def test_a_bad_seeds_cell_names_the_sheet_line(tmp_path, cell, message):
    with pytest.raises(settings.ConfigError, match=f"scenes.tsv, line 2: {message}"):
        swept(tmp_path, cell)


def test_run_names_and_their_parts_are_inverse():
    assert results_layout.run_parts(results_layout.run_name("a-b_c", None)) == ("a-b_c", None)
    assert results_layout.run_parts(results_layout.run_name("a", 12)) == ("a", 12)
    import re

    assert re.fullmatch(results_layout.RUN_PATTERN, "hop/seed_3") and re.fullmatch(
        results_layout.RUN_PATTERN, "hop"
    )
    assert not re.fullmatch(results_layout.RUN_PATTERN, "hop/seed_x")
