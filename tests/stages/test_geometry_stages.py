"""The ingest / gaussians / voxelize stages on tiny scenes and on real third-party GLBs."""

from __future__ import annotations

import numpy as np
import pytest

from chord.cli import upstream_train
from chord.config import settings
from chord.gaussians import gaussian_set as gs
from chord.gaussians import ply as plyio
from chord.plan import results_layout
from chord.stages import gaussians, ingest
from tests.conftest import copy_glb


def run_all(data, results, scene, method):
    out = upstream_train.prepare_geometry(data=data, results=results, scene=scene, method=method)
    return out["doc"], out["stats"]


#: the tiny training of the demo hop scene the training tests run (each adds its own keys)
TINY_TRAINING = {
    "gs_init_num": 800,
    "surface_target_num": 300,
    "cp_num": 12,
    "size": "48*32",
    "frame_num": 5,
    "iterations": 4,
    "batch_size": 1,
    "seed": 3,
    "prev_frame_number": 2,
    "back_iter": 3,
    "arap_sample_num": 64,
}


def train_inputs(data, results, scene, method) -> dict:
    """Run the geometry stages; the inputs of ``chord.training.scene_trainer.build`` (oracle
    guidance)."""
    return upstream_train.oracle_train_inputs(
        data=data, results=results, scene=scene, method=method
    )


def test_toy_scene_through_the_three_stages(toy_scene, tmp_path):
    method = settings.method_from_mapping({"gs_init_num": 3000, "surface_target_num": 1500})
    doc, stats = run_all(toy_scene, tmp_path / "results", "toy", method)
    assert [o["role"] for o in doc["objects"]] == ["dynamic", "static"]
    assert doc["normalisation"]["scale"] == pytest.approx(0.6)
    # ground = the static slab's normalised min y: (-0.05 - 0.4) * 0.6
    assert doc["ground_level"] == pytest.approx(-0.27, abs=1e-6)
    g = plyio.read_ply(results_layout.gaussians_ply(tmp_path / "results", "toy", "obj_0"))
    assert len(g) == 3000 and g.sh.shape == (3000, 1, 3)
    with np.load(results_layout.voxels_npz(tmp_path / "results", "toy", "obj_0")) as z:
        s_obj = doc["objects"][0]["scale_factor"]
        assert float(z["voxel_size"]) == pytest.approx(0.015 * s_obj)
        assert 0 < len(z["surface"]) <= 1500
        assert 2 <= len(z["control_points"]) <= 60
        assert z["solid"].dtype == np.float32 and z["solid"].shape[1] == 3
    assert not (tmp_path / "results/toy/voxels/obj_1.npz").exists()


def test_avoided_object_gets_nothing(toy_scene, tmp_path):
    method = settings.method_from_mapping({"gs_init_num": 500, "avoid_objs": ["obj_0"]})
    doc, stats = run_all(toy_scene, tmp_path / "r", "toy", method)
    assert doc["objects"][0]["role"] == "avoided" and doc["objects"][0]["mesh"] is None
    assert not (tmp_path / "r/toy/gaussians/obj_0.ply").exists()
    assert stats == {}


def test_fitted_gaussians_are_imported(toy_scene, tmp_path):
    """A CHORD trained/<scene>/obj_<i>/point_cloud/iteration_<k> folder, latest k, world space."""
    rng = np.random.default_rng(0)
    fitted = tmp_path / "trained"
    for k in (7000, 30000):
        g = gs.GaussianSet(
            means=rng.normal(size=(50, 3)).astype(np.float32),
            log_scales=np.full((50, 3), np.log(0.01), np.float32),
            quats=np.tile(np.float32([1, 0, 0, 0]), (50, 1)),
            opacity_logits=np.zeros(50, np.float32),
            sh=np.zeros((50, 16, 3), np.float32) + k,
        )
        ply = fitted / f"obj_0/point_cloud/iteration_{k}/point_cloud.ply"
        ply.parent.mkdir(parents=True)
        plyio.write_ply(ply, g)
    method = settings.method_from_mapping({"ply_space": "world", "sh_degree": 1})
    ingest.run(
        data=toy_scene,
        out_json=tmp_path / "s/scene.json",
        out_meshes=tmp_path / "s/m",
        method=method,
        scene="toy",
    )
    gaussians.run(
        scene_json=tmp_path / "s/scene.json",
        obj="obj_0",
        out=tmp_path / "g.ply",
        method=method,
        fitted=fitted,
    )
    out = plyio.read_ply(tmp_path / "g.ply")
    assert out.sh.shape == (50, 4, 3) and np.all(out.sh == 30000)  # latest iteration, capped
    np.testing.assert_allclose(out.means, (g.means - [0, 0.4, 0]) * 0.6, atol=1e-5)
    np.testing.assert_allclose(out.log_scales, np.log(0.01 * 0.6), atol=1e-5)


def test_real_models_duck_and_textured_box(khronos, tmp_path):
    """Two third-party glTF samples: the Duck dynamic on a textured box (static)."""
    data = tmp_path / "duckbox"
    copy_glb(khronos / "Duck.glb", data / "obj_0.glb")
    copy_glb(khronos / "BoxTextured.glb", data / "obj_1.glb")
    copy_glb(khronos / "Duck.glb", data / "scene.glb")
    method = settings.method_from_mapping({"gs_init_num": 20000})
    doc, stats = run_all(data, tmp_path / "r", "duckbox", method)
    duck = plyio.read_ply(results_layout.gaussians_ply(tmp_path / "r", "duckbox", "obj_0"))
    rgb = gs.sh_dc_to_rgb(duck.sh[:, 0])
    r, g, b = rgb.mean(0)
    assert r > 0.7 and g > 0.5 and b < 0.3, rgb.mean(0)  # the Duck's texture is yellow
    box = plyio.read_ply(results_layout.gaussians_ply(tmp_path / "r", "duckbox", "obj_1"))
    assert gs.sh_dc_to_rgb(box.sh[:, 0]).std(0).max() > 0.1  # textured, not a flat colour
    assert stats["obj_0"]["control_points"] >= 30 and stats["obj_0"]["solid"] > 1000
