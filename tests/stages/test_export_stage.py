"""Stages export (videos at export_size, the morph-target, the skinned and the splat GLB),
evaluate and aggregate, and ``chord render`` / ``chord export-glb``, on the demo scene `sway`
(two dynamic objects) trained for two oracle iterations."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from chord.cli import main, upstream_train
from chord.config import result_keys as rk
from chord.config import settings
from chord.core import media
from chord.export import trained_scene
from chord.gaussians import gaussian_set, ply
from chord.gltf import container
from chord.plan import results_layout
from chord.render import cameras
from chord.render.views import render_frames
from chord.scene import demo
from chord.stages import aggregate, evaluate, reference
from chord.stages import export as export_stage
from chord.stages import train as train_stage
from chord.training.run_settings import RunSettings
from tests.conftest import validate_glb
from tests.unit.gltf.test_animated import float32_tolerance, skinned_vertices
from tests.unit.gltf.test_splats import no_warnings, same_rotation, skinned_splats

T, W, H = 5, 32, 16
F32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def sway(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    data = demo.write_demo_scene("sway", root / "data", frame_num=T)
    m = settings.method_from_mapping(
        {
            "gs_init_num": 300,
            "surface_target_num": 200,
            "cp_num": 8,
            "size": f"{W}*{H}",
            "frame_num": T,
            "iterations": 2,
            "batch_size": 1,
            "seed": 1,
            "save_interval": 1,
            "prev_frame_number": 2,
            "back_iter": 3,
            "arap_sample_num": 32,
            "save_fps": 5,
            "deform_lr_init": 0.05,
        }
    )
    res, s = root / "results", "sway"
    out = upstream_train.prepare_geometry(data=data, results=res, scene=s, method=m)
    reference.run(
        scene_json=results_layout.scene_json(res, s),
        plys=out["plys"],
        out_png=results_layout.reference_png(res, s),
        out_orbit=results_layout.static_orbit_mp4(res, s),
        method=m,
    )
    inputs = {
        "scene_json": results_layout.scene_json(res, s),
        "plys": out["plys"],
        "voxels": out["voxels"],
    }
    train_stage.run_stage(
        "coarse",
        inputs={**inputs, "text_path": None, "data_dir": data},
        out=results_layout.train_state(res, s, "coarse"),
        loss_log=results_layout.train_losses(res, s, "coarse"),
        checkpoint_dir=results_layout.checkpoints(res, s, "coarse"),
        method=m,
        guidance=settings.guidance_from_mapping({"backend": "oracle"}),
        run_settings=RunSettings(tier="split"),  # recorded in the state and metrics.tsv
    )
    sources = {f"obj_{i}": data / f"obj_{i}.glb" for i in range(3)}
    return SimpleNamespace(root=root, data=data, m=m, res=res, s=s, inputs=inputs, sources=sources)


@pytest.fixture(scope="module")
def exported(sway):
    res, s = sway.res, sway.s
    outs = {
        "out_ref_view": results_layout.ref_view_mp4(res, s),
        "out_orbit": results_layout.orbit_mp4(res, s),
        "out_views": {
            v: results_layout.fixed_view_mp4(res, s, v) for v in results_layout.FIXED_VIEWS
        },
        "out_gif": results_layout.preview_gif(res, s),
        "out_glb": results_layout.dynamic_glb(res, s),
        "out_skinned_glb": results_layout.dynamic_skinned_glb(res, s),
        "out_ply_dir": results_layout.ply_sequence_dir(res, s),
        "out_splats_glb": results_layout.dynamic_splats_glb(res, s),
        "out_splats_rigid_glb": results_layout.dynamic_splats_rigid_glb(res, s),
        "out_trajectories": results_layout.trajectories_npz(res, s),
        "out_trajectories_json": results_layout.trajectories_json(res, s),
        "out_usd": results_layout.scene_usda(res, s),
        "out_usd_splats": results_layout.scene_splats_usd(res, s),
    }
    summary = export_stage.run(
        **sway.inputs,
        state_path=results_layout.train_state(res, s, "coarse"),
        sources=sway.sources,
        method=sway.m,
        **outs,
    )
    return summary, outs


def test_export_writes_videos_gif_and_ply_sequence(sway, exported):
    summary, outs = exported
    skinned = {"skinned": 2, "joints": summary["skinned"]["joints"], "morphed": 0, "targets": 0}
    assert summary == {
        "frames": T,
        "iteration": 2,
        "nodes": 2,
        "targets": T - 1,
        "skinned": {**skinned, "frames": T},
        "splats": {
            "gaussians": 3 * 300,
            "sh_degree": 0,
            **skinned,
            "frames": T,
        },
        "splats_rigid": {
            "gaussians": 3 * 300,
            "sh_degree": 0,
            "animated": 2,
            "frames": T,
            "residual_max": summary["splats_rigid"]["residual_max"],
            "residual_relative": summary["splats_rigid"]["residual_relative"],
        },
        "usd": summary["usd"],
    }
    assert summary["usd"]["frames"] == T and summary["usd"]["objects"]["obj_1"] == "static"
    assert set(summary["usd"]["objects"]) == {"obj_0", "obj_1", "obj_2"}
    videos = [outs["out_ref_view"], outs["out_orbit"], *outs["out_views"].values()]
    assert sorted(outs["out_views"]) == ["back", "front", "left", "right"]
    frames = {}
    for path in videos:
        frames[path.stem], meta = media.read_mp4(path)
        assert frames[path.stem].shape == (T, H, W, 3), path
        assert meta["fps"] == sway.m.save_fps and meta["codec"].startswith("h264")
    ref = np.asarray(
        Image.open(results_layout.reference_png(sway.res, sway.s)).convert("RGB"), float
    )
    assert np.abs(frames["ref_view"][0] - ref).mean() < 4  # frame 0 is the reference (H.264)
    assert np.abs(frames["front"][0].astype(float) - frames["back"][0]).mean() > 1  # other views
    with Image.open(outs["out_gif"]) as gif:
        assert gif.n_frames == T
    plys = sorted(outs["out_ply_dir"].iterdir())
    assert [p.name for p in plys] == [f"frame_{t:04d}.ply" for t in range(T)]
    rest = gaussian_set.concat([ply.read_ply(sway.inputs["plys"][f"obj_{i}"]) for i in range(3)])
    first, last = ply.read_ply(plys[0]), ply.read_ply(plys[-1])
    np.testing.assert_array_equal(first.means, rest.means)  # frame 0 is the rest pose
    assert np.abs(last.means - rest.means).max() > 1e-4  # the trained motion moves something
    np.testing.assert_array_equal(last.opacity_logits, rest.opacity_logits)


def test_exported_glb_follows_the_trained_motion(sway, exported):
    _, outs = exported
    doc, blob = container.read_glb(outs["out_glb"])
    names = [doc["nodes"][r]["name"] for r in doc["scenes"][0]["nodes"]]
    assert names == ["obj_0", "obj_1", "obj_2"]
    _, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    nd = json.loads(results_layout.scene_json(sway.res, sway.s).read_text())["normalisation"]
    c, s = np.asarray(nd["centre"]), nd["scale"]
    (anim,) = doc["animations"]
    for ch in anim["channels"]:  # one node per dynamic object (the demo GLBs place each once)
        n = ch["target"]["node"]
        obj = next(name for r, name in zip(doc["scenes"][0]["nodes"], names, strict=True)
                   if n in container.world_matrices(doc, [r]))  # fmt: skip
        assert obj in ("obj_0", "obj_2")
        M = container.world_matrices(doc, doc["scenes"][0]["nodes"])[n]
        (prim,) = doc["meshes"][doc["nodes"][n]["mesh"]]["primitives"]
        base = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
        to_n = lambda v, M=M: ((v @ M[:3, :3].T + M[:3, 3]) - c) * s  # noqa: E731
        with torch.no_grad():
            X, _ = scene.dynamic[obj].deform(
                torch.arange(T), torch.as_tensor(to_n(base), dtype=torch.float32)
            )
        assert len(prim["targets"]) == T - 1
        for k, target in enumerate(prim["targets"], start=1):
            moved = base + container.read_accessor(doc, blob, target["POSITION"])
            np.testing.assert_allclose(to_n(moved), X[k].numpy(), atol=2e-5)
    sampler = anim["samplers"][0]
    assert sampler["interpolation"] == "STEP"
    assert doc["accessors"][sampler["input"]]["count"] == T
    assert doc["accessors"][sampler["input"]]["max"] == [pytest.approx((T - 1) / sway.m.save_fps)]


def test_exported_glb_passes_the_khronos_validator(exported, gltf_validator, tmp_path):  # noqa: F811
    report = validate_glb(gltf_validator, exported[1]["out_glb"], tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_glb_honours_exclude_objs(sway, tmp_path):
    doc, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    out = tmp_path / "x.glb"
    summary = trained_scene.write_glb(
        out, doc=doc, scene=scene, sources=sway.sources, frames=3, fps=4, exclude_objs=["obj_2"]
    )
    assert summary == {"nodes": 1, "targets": 2, "frames": 3}
    got, _ = container.read_glb(out)
    assert [got["nodes"][r]["name"] for r in got["scenes"][0]["nodes"]] == ["obj_0", "obj_1"]
    with pytest.raises(ValueError, match=r"exclude_objs: \['obj_9'\] are not objects"):
        trained_scene.write_glb(
            out, doc=doc, scene=scene, sources=sway.sources, frames=3, fps=4, exclude_objs=["obj_9"]
        )


def test_evaluate_and_aggregate(sway, tmp_path):
    res, s = sway.res, sway.s
    kw = {
        **sway.inputs,
        "state_path": results_layout.train_state(res, s, "coarse"),
        "ref_png": results_layout.reference_png(res, s),
        "loss_logs": {"coarse": results_layout.train_losses(res, s, "coarse")},
        "method": sway.m,
        "out_frame0": tmp_path / "frame0.png",
        "out_losses": tmp_path / "losses.png",
        "out_interaction": tmp_path / "interaction.png",
    }
    out = evaluate.run(**kw, motion_json=sway.data / "motion.json", out_json=tmp_path / "a.json")
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc == out and doc["scene"] == "sway" and doc["iteration"] == 2 and doc["seed"] == 1
    assert doc["psnr_frame0"] == 100.0 and doc["ssim_frame0"] == pytest.approx(1.0)
    assert 0 < doc["mean_displacement"] < doc["max_displacement"]
    assert doc["arap_residual_mean"] >= 0 and doc["arap_residual_max"] >= doc["arap_residual_mean"]
    assert doc["ground_depth"] == 0.0 and doc["ground_fraction"] == 0.0
    assert 0.5 < doc["recovery_relative"] < 1.2  # two iterations recover little of the motion
    assert {len(v) for v in doc["per_frame"].values()} == {T}
    assert doc["per_frame"]["arap_residual"][0] == 0.0
    # both dynamic objects stand on the slab at rest; two iterations barely move them
    rest = {(p["object"], p["other"]) for p in doc["interaction"]["pairs"] if p["resting"]}
    assert {("obj_0", "obj_1"), ("obj_2", "obj_1")} <= rest and doc["resting_pairs"] == len(rest)
    assert len(doc["interaction"]["pairs"]) == 4  # 2 dynamic objects x 2 others
    for png in ("frame0.png", "losses.png", "interaction.png"):
        with Image.open(tmp_path / png) as im:
            assert im.format == "PNG" and im.size[0] > 300
    # without a scripted motion there is no recovery error
    bare = evaluate.run(**kw, motion_json=None, out_json=tmp_path / "b.json")
    assert bare["recovery_error"] is None
    # a reference of another size is an input error naming the file
    Image.new("RGB", (W * 2, H)).save(tmp_path / "ref.png")
    with pytest.raises(ValueError, match="ref.png: 64x16, but method size is 32x16"):
        evaluate.run(**{**kw, "ref_png": tmp_path / "ref.png"}, motion_json=None,
                     out_json=tmp_path / "c.json")  # fmt: skip

    logs = {"coarse": results_layout.train_losses(res, s, "coarse")}
    df = aggregate.run(
        metrics={"sway": tmp_path / "a.json", "sway_bare": tmp_path / "b.json"},
        loss_logs={"sway": logs, "sway_bare": logs},
        out_tsv=tmp_path / "metrics.tsv",
        out_metrics_png=tmp_path / "bars.png",
        out_losses_png=tmp_path / "all_losses.png",
    )
    table = pd.read_csv(tmp_path / "metrics.tsv", sep="\t", index_col="scene")
    assert list(table.index) == ["sway", "sway_bare"] and len(df) == 2
    assert table.loc["sway", "recovery_error"] == pytest.approx(doc["recovery_error"], rel=1e-5)
    assert np.isnan(table.loc["sway_bare", "recovery_error"])
    for png in ("bars.png", "all_losses.png"):
        with Image.open(tmp_path / png) as im:
            assert im.format == "PNG"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json: not a chord-metrics/1 file"):
        aggregate.table({"x": tmp_path / "bad.json"})


def test_cli_render_and_export_glb(sway, capsys):
    """CHORD's render_scene.py / save_dynamic_scene_glb.py flags on a run folder
    (<model>/<ex_name> holds scene/, gaussians/, voxels/, train/, checkpoints/)."""
    model, ex = str(sway.res), sway.s
    rc = main.main(
        ["render", "-m", model, "--ex_name", ex, "--image_width", "32", "--image_height", "16",
         "--azim", "30", "--elev", "10", "--lst_frame", "3", "--save_fps", "4"]
    )  # fmt: skip
    assert rc == 0
    out = sway.res / ex / "rendered_videos" / "iteration_2" / "azim_30_elev_10.mp4"
    frames, meta = media.read_mp4(out)
    assert frames.shape == (3, 16, 32, 3) and meta["fps"] == 4
    rc = main.main(
        ["render", "-m", model, "--ex_name", ex, "--image_width", "32", "--image_height", "16",
         "--checkpoint", "1", "--no_bg", "--exclude_objs", "obj_2"]
    )  # fmt: skip
    assert rc == 0
    frames, _ = media.read_mp4(sway.res / ex / "rendered_videos/iteration_1/azim_0_elev_-10.mp4")
    assert frames.shape == (T, 16, 32, 3)
    rc = main.main(
        ["export-glb", "-m", model, "--ex_name", ex, "--mesh_source_path", str(sway.data),
         "--exclude_objs", "obj_0", "--lst_frame", "4", "--static_id", "1"]
    )  # fmt: skip
    assert rc == 0
    doc, _ = container.read_glb(sway.res / ex / "saved_meshes/iteration_2/dynamic_scene.glb")
    assert [doc["nodes"][r]["name"] for r in doc["scenes"][0]["nodes"]] == ["obj_1", "obj_2"]
    (anim,) = doc["animations"]
    assert doc["accessors"][anim["samplers"][0]["input"]]["max"] == [pytest.approx(3 / 12)]
    rc = main.main(
        ["export-glb", "-m", model, "--ex_name", ex, "--mesh_source_path", str(sway.data),
         "--lst_frame", "4", "--skinned"]
    )  # fmt: skip
    assert rc == 0
    doc, _ = container.read_glb(
        sway.res / ex / "saved_meshes/iteration_2/dynamic_scene_skinned.glb"
    )
    assert sorted(_skinned_nodes(doc)) == ["obj_0", "obj_2"] and len(doc["skins"]) == 2
    capsys.readouterr()
    for argv, message in (
        (["--checkpoint", "7"], "no state of iteration 7"),
        (["--static_id", "0"], "--static_id: 0, but the run was trained with static_id 1"),
        (["--exclude_objs", "obj_5"], "--exclude_objs: ['obj_5'] are not objects"),
    ):
        base = [
            "render",
            "-m",
            model,
            "--ex_name",
            ex,
            "--image_width",
            "16",
            "--image_height",
            "16",
        ]
        assert main.main(base + argv) == main.EXIT_INPUT
        assert message in capsys.readouterr().err
    missing = ["export-glb", "-m", model, "--ex_name", "nothing", "--mesh_source_path", "x"]
    assert main.main(missing) == main.EXIT_INPUT
    assert "run folder" in capsys.readouterr().err


def test_exclude_plane_needs_static_obj_glb(sway, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(sway.data, data)
    with pytest.raises(ValueError, match="--exclude_plane: .*static_obj.glb does not exist"):
        upstream_train.export_glb_run(sway.res / sway.s, mesh_source_path=data, exclude_plane=True)
    shutil.copy(data / "obj_1.glb", data / "static_obj.glb")
    out = upstream_train.export_glb_run(
        sway.res / sway.s, mesh_source_path=data, exclude_plane=True, lst_frame=2
    )
    doc, _ = container.read_glb(out)
    assert len(doc["scenes"][0]["nodes"]) == 3


# --- the skinned GLB -------------------------------------------------------------------------


def _skinned_nodes(doc: dict) -> dict[str, int]:
    """{object: its skinned mesh node} of a skinned GLB (a skin is named <object>_skin)."""
    roots = doc["scenes"][0]["nodes"]
    return {
        doc["skins"][doc["nodes"][n]["skin"]]["name"].removesuffix("_skin"): n
        for n in roots
        if "skin" in doc["nodes"][n]
    }


def _source_vertices(path) -> np.ndarray:
    """World positions [n, 3] of the one mesh primitive of a source GLB."""
    src, blob = container.read_glb(path)
    world = container.world_matrices(src, src["scenes"][0]["nodes"])
    ((n, M),) = [(n, M) for n, M in world.items() if "mesh" in src["nodes"][n]]
    (prim,) = src["meshes"][src["nodes"][n]["mesh"]]["primitives"]
    v = container.read_accessor(src, blob, prim["attributes"]["POSITION"])
    return v @ M[:3, :3].T + M[:3, 3]


def _deformed_world(obj, v_w: np.ndarray, c: np.ndarray, s: float) -> np.ndarray:
    """``deform()`` of world points [n, 3] at every frame, back in world coordinates."""
    with torch.no_grad():
        X, _ = obj.deform(torch.arange(T), torch.as_tensor((v_w - c) * s, dtype=torch.float32))
    return X.double().numpy() / s + c  # [T, n, 3]


def _normalisation(sway) -> tuple[np.ndarray, float]:
    nd = json.loads(results_layout.scene_json(sway.res, sway.s).read_text())["normalisation"]
    return np.asarray(nd["centre"]), nd["scale"]


def test_exported_skinned_glb_follows_the_trained_motion(sway, exported):
    """The glTF skinning formula evaluated from the file equals deform() at every key."""
    _, outs = exported
    doc, blob = container.read_glb(outs["out_skinned_glb"])
    roots = doc["scenes"][0]["nodes"]
    assert [doc["nodes"][r]["name"] for r in roots if "skin" not in doc["nodes"][r]] == [
        "obj_0",
        "obj_1",
        "obj_2",
    ]
    _, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    c, s = _normalisation(sway)
    nodes = _skinned_nodes(doc)
    assert sorted(nodes) == ["obj_0", "obj_2"]
    for name, n in nodes.items():
        obj = scene.dynamic[name]
        assert len(doc["skins"][doc["nodes"][n]["skin"]]["joints"]) == len(obj.layer1.centres)
        (prim,) = doc["meshes"][doc["nodes"][n]["mesh"]]["primitives"]
        assert "targets" not in prim
        X = _deformed_world(obj, _source_vertices(sway.sources[name]), c, s)
        tol = float32_tolerance(np.abs(X).max(), np.abs(c).max())
        for k in range(T):
            (got,) = skinned_vertices(doc, blob, n, k)
            np.testing.assert_allclose(got, X[k], rtol=0, atol=tol, err_msg=f"{name} key {k}")
        assert np.abs(X[-1] - X[0]).max() > 1e-4  # the trained motion moves it
    (anim,) = doc["animations"]
    times = anim["samplers"][0]["input"]
    assert doc["accessors"][times]["max"] == [pytest.approx((T - 1) / sway.m.save_fps)]
    assert {s["interpolation"] for s in anim["samplers"]} == {"LINEAR"}


def test_exported_skinned_glb_passes_the_khronos_validator(exported, gltf_validator, tmp_path):  # noqa: F811
    report = validate_glb(gltf_validator, exported[1]["out_skinned_glb"], tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_exported_splats_follow_the_ply_sequence(sway, exported, gltf_validator, tmp_path):  # noqa: F811
    """dynamic_splats.glb evaluated by glTF's skinning rule and our rotation convention
    equals the exported PLY sequence at every key; the static object is not animated."""
    _, outs = exported
    doc, blob = container.read_glb(outs["out_splats_glb"])
    c, s = _normalisation(sway)
    frames = sorted(outs["out_ply_dir"].iterdir())
    start, rows = 0, {}
    for i in range(3):
        n = len(ply.read_ply(sway.inputs["plys"][f"obj_{i}"]))
        rows[f"obj_{i}"], start = slice(start, start + n), start + n
    names = {d.get("name"): i for i, d in enumerate(doc["nodes"])}
    assert "skin" not in doc["nodes"][names["obj_1"]]  # the static object
    for name in ("obj_0", "obj_2"):
        node = names[f"{name}_splats"]
        for k in range(T):
            seq = ply.read_ply(frames[k])
            want = seq.means[rows[name]].astype(np.float64) / s + c
            x, q, blend, _ = skinned_splats(doc, blob, node, k)
            # as in tests/unit/gltf/test_splats.py: 16 float32 roundings of the magnitudes
            mag = max(1.0, np.abs(want).max(), np.abs(c).max(), np.abs(seq.means).max() / s)
            np.testing.assert_allclose(x, want, rtol=0, atol=16 * F32 * mag, err_msg=f"{k}")
            err = same_rotation(q, seq.quats[rows[name]].astype(np.float64))
            assert err.max() <= 16 * F32 / blend, f"{name} key {k}"
        rest = ply.read_ply(frames[0]).means[rows[name]].astype(np.float64) / s + c
        assert np.abs(x - rest).max() > 1e-4  # the trained motion moves it
    report = validate_glb(gltf_validator, outs["out_splats_glb"], tmp_path)
    no_warnings(report)
    assert {m["code"] for m in report["messages"] if m["severity"] == 0} == {
        "MESH_PRIMITIVE_INVALID_ATTRIBUTE"  # KhronosGroup/glTF-Validator#252
    }


def test_skinned_glb_keeps_morph_targets_for_a_second_layer(
    sway,
    tmp_path,
    caplog,
    gltf_validator,  # noqa: F811
):
    doc, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    obj = scene.dynamic["obj_2"]
    obj.add_second_layer(obj.rest_means[::10], obj.surface)
    with torch.no_grad():
        obj.layer2.cp_deform.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    out = tmp_path / "skinned.glb"
    with caplog.at_level(logging.INFO, logger="chord.export.trained_scene"):
        summary = trained_scene.write_glb(
            out, doc=doc, scene=scene, sources=sway.sources, frames=T, fps=5, skinned=True
        )
    assert "obj_2 has a second control-point layer" in caplog.text
    assert summary["skinned"] == 1 and summary["morphed"] == 1 and summary["targets"] == T - 1
    got, blob = container.read_glb(out)
    assert sorted(_skinned_nodes(got)) == ["obj_0"]
    (anim,) = got["animations"]
    (ch,) = [ch for ch in anim["channels"] if ch["target"]["path"] == "weights"]
    n = ch["target"]["node"]
    M = container.world_matrices(got, got["scenes"][0]["nodes"])[n]
    (prim,) = got["meshes"][got["nodes"][n]["mesh"]]["primitives"]
    assert "JOINTS_0" not in prim["attributes"] and len(prim["targets"]) == T - 1
    c, s = _normalisation(sway)
    base = container.read_accessor(got, blob, prim["attributes"]["POSITION"])
    to_w = lambda v: v @ M[:3, :3].T + M[:3, 3]  # noqa: E731
    X = _deformed_world(obj, to_w(base), c, s)
    for k, target in enumerate(prim["targets"], start=1):
        moved = base + container.read_accessor(got, blob, target["POSITION"])
        np.testing.assert_allclose(to_w(moved), X[k], atol=2e-5)
    report = validate_glb(gltf_validator, out, tmp_path)
    assert report["numErrors"] == 0 and report["numWarnings"] == 0, report["messages"]


def test_exported_rigid_splats_play_the_trajectories_poses(sway, exported):
    """dynamic_splats_rigid.glb: each object's node at the centre of its Gaussians, the
    dynamic ones keyed with the rigid poses of trajectories.npz (the same rotations; the same
    motion of the rest points, T_k·T_0⁻¹), the residual it leaves out stated per object; no
    skin, no morph targets."""
    from tests.unit.export.test_rigid_motion import world_splats

    summary, outs = exported
    doc, blob = container.read_glb(outs["out_splats_rigid_glb"])
    assert "skins" not in doc and all("targets" not in m["primitives"][0] for m in doc["meshes"])
    c, s = _normalisation(sway)
    with np.load(outs["out_trajectories"], allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    rigid = summary["splats_rigid"]
    for name in ("obj_0", "obj_1", "obj_2"):
        (node,) = [d for d in doc["nodes"] if d["name"] == name]
        rest = ply.read_ply(sway.inputs["plys"][name]).means.astype(np.float64) / s + c
        np.testing.assert_allclose(
            node["translation"], (rest.min(0) + rest.max(0)) / 2, rtol=0, atol=1e-6
        )
        if name == "obj_1":
            assert "extras" not in node and name not in rigid["residual_max"]
            continue
        residual = float(a[f"{name}/residual"].max())
        assert rigid["residual_max"][name] == pytest.approx(residual, rel=1e-9, abs=1e-15)
        assert node["extras"]["CHORD_rigid_motion"]["residual_max"] == rigid["residual_max"][name]
        assert rigid["residual_relative"][name] >= 0
        T_ = a[f"{name}/T"]
        for k in range(T):
            M = T_[k] @ np.linalg.inv(T_[0])
            want = rest @ M[:3, :3].T + M[:3, 3]
            tol = 16 * F32 * max(1.0, np.abs(want).max())
            got = world_splats(doc, blob, name, k)
            np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"{name} {k}")


# --- trajectories and USD --------------------------------------------------------------------


def test_exported_trajectories_and_usd_follow_the_trained_motion(sway, exported):
    """trajectories.npz opens with numpy alone and fits the control points' tracks of
    deform(); scene.usda's points at each time code equal deform() of the source meshes."""
    from pxr import Usd

    from chord.export import usd
    from tests.unit.export.test_usd import _world_points

    _, outs = exported
    _, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    c, s = _normalisation(sway)
    with np.load(outs["out_trajectories"], allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    side = json.loads(outs["out_trajectories_json"].read_text())
    assert a["names"].tolist() == ["obj_0", "obj_2"] and side["frames"] == T
    assert a["fps"] == sway.m.save_fps == side["fps"]
    stage = Usd.Stage.Open(str(outs["out_usd"]))
    assert (stage.GetStartTimeCode(), stage.GetEndTimeCode()) == (0, T - 1)
    assert stage.GetTimeCodesPerSecond() == sway.m.save_fps
    for name in ("obj_0", "obj_1", "obj_2"):
        v_w, _, _ = usd.source_mesh(sway.sources[name])
        X = v_w[None].repeat(T, 0)
        if name in scene.dynamic:
            obj = scene.dynamic[name]
            X = _deformed_world(obj, v_w, c, s)
            with torch.no_grad():
                cp, _ = obj.deform(torch.arange(T), obj.layer1.centres)
            np.testing.assert_allclose(a[f"{name}/tracks"], cp.double().numpy() / s + c)
            assert a[f"{name}/T"].shape == (T, 4, 4) and a[f"{name}/residual"][0] == 0
        want = X @ usd.Y_UP_TO_Z_UP.T
        kind = stage.GetPrimAtPath(f"/World/{name}").GetCustomDataByKey("chord:motion")
        # exact but for the rigid kind, which leaves out at most its residual's worth
        tol = 64 * F32 * max(1.0, np.abs(want).max())
        if kind == "rigid":
            tol += 8 * float(a[f"{name}/residual"].max())
        for k in range(T):
            got = _world_points(stage, name, k)
            np.testing.assert_allclose(got, want[k], rtol=0, atol=tol, err_msg=f"{name} {k}")


def test_usd_splats_equal_the_exported_ply_sequence_frame_by_frame(sway, exported):
    """scene.usda's ParticleField3DGaussianSplat prims, evaluated by pxr at each time code,
    hold the exported PLY of that frame (Z-up, world units, linear scales and opacities, the
    SH's colours), to float32 storage; a rigid object's Gaussians move by its pose, within
    its residual of the PLYs (as its mesh in the test above)."""
    from pxr import Usd

    from chord.export import usd
    from tests.unit.export.test_usd_splats import attr, sh_colours, splat_prim, world

    summary, outs = exported
    assert summary["usd"]["splats"]["format"] == "usda"  # the demo's splats are text
    stage = Usd.Stage.Open(str(outs["out_usd"]))
    c, s = _normalisation(sway)
    A = usd.Y_UP_TO_Z_UP
    frames = sorted(outs["out_ply_dir"].iterdir())
    assert len(frames) == T
    with np.load(outs["out_trajectories"], allow_pickle=False) as z:
        residual = {n: float(z[f"{n}/residual"].max()) for n in z["names"].tolist()}
    d = np.random.default_rng(0).normal(size=(20, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    start, rows = 0, {}
    for i in range(3):
        n = len(ply.read_ply(sway.inputs["plys"][f"obj_{i}"], sh_degree_cap=sway.m.sh_degree))
        rows[f"obj_{i}"], start = slice(start, start + n), start + n
    for k in range(T):
        seq = ply.read_ply(frames[k], sh_degree_cap=sway.m.sh_degree)
        for name, rows_n in rows.items():
            prim, _ = splat_prim(stage, name)
            kind = stage.GetPrimAtPath(f"/World/{name}").GetCustomDataByKey("chord:motion")
            want = (seq.means[rows_n].astype(np.float64) / s + c) @ A.T
            tol = 64 * F32 * max(1.0, np.abs(want).max())
            p, R = world(prim, k)
            if kind == "rigid":
                tol += 8 * residual[name]
            else:
                R_want = np.einsum("ij,njk,lk->nil", A, usd.rotmat(seq.quats[rows_n]), A)
                np.testing.assert_allclose(R, R_want, rtol=0, atol=32 * F32)
            np.testing.assert_allclose(p, want, rtol=0, atol=tol, err_msg=f"{name} {k}")
            scale = np.exp(seq.log_scales[rows_n].astype(np.float64)) / s
            np.testing.assert_allclose(attr(prim, "scales", k), scale, rtol=2 * F32)
            alpha = 1.0 / (1.0 + np.exp(-seq.opacity_logits[rows_n].astype(np.float64)))
            np.testing.assert_allclose(attr(prim, "opacities", k), alpha, rtol=2 * F32)
            sh = seq.sh[rows_n].astype(np.float64)
            got = attr(prim, "radiance:sphericalHarmonicsCoefficients", k).reshape(sh.shape)
            tol_c = 8 * F32 * sh.shape[1] * 3.0 * max(np.abs(got).max(), 1e-30)
            np.testing.assert_allclose(
                sh_colours(got, d @ A.T), sh_colours(sh, d), rtol=0, atol=tol_c
            )


# --- export_size -----------------------------------------------------------------------------


def test_export_renders_its_videos_at_export_size(sway, tmp_path):
    m = settings.method_from_mapping({**dataclasses.asdict(sway.m), "export_size": "64*48"})
    assert rk.stage_params(m, "export")["export_size"] == "64*48"
    outs = {
        "out_ref_view": tmp_path / "ref_view.mp4",
        "out_orbit": tmp_path / "orbit.mp4",
        "out_views": {"front": tmp_path / "front.mp4"},
        "out_gif": tmp_path / "preview.gif",
        "out_glb": tmp_path / "d.glb",
        "out_skinned_glb": tmp_path / "s.glb",
        "out_ply_dir": tmp_path / "ply",
        "out_splats_glb": tmp_path / "splats.glb",
        "out_splats_rigid_glb": tmp_path / "splats_rigid.glb",
        "out_trajectories": tmp_path / "trajectories.npz",
        "out_trajectories_json": tmp_path / "trajectories.json",
        "out_usd": tmp_path / "scene.usda",
        "out_usd_splats": tmp_path / "splats.usd",
    }
    export_stage.run(
        **sway.inputs,
        state_path=results_layout.train_state(sway.res, sway.s, "coarse"),
        sources=sway.sources,
        method=m,
        **outs,
    )
    for path in (outs["out_ref_view"], outs["out_orbit"], outs["out_views"]["front"]):
        frames, _ = media.read_mp4(path)
        assert frames.shape == (T, 48, 64, 3), path
    with Image.open(outs["out_gif"]) as gif:
        assert gif.size == (64, 48)
    for bad in ("63*48", "0*48", "64"):
        with pytest.raises(ValueError, match="export_size"):
            settings.method_from_mapping({"export_size": bad})


def test_chunked_rendering_equals_unchunked(sway):
    _, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=results_layout.train_state(sway.res, sway.s, "coarse")
    )
    g = trained_scene.scene_frames(scene, T, objects=scene.names)
    m = sway.m
    view = cameras.reference_view(m.elev_l, m.elev_r, m.ref_azim, m.ref_cam_radius, [0, 0, 0])
    K = cameras.intrinsics(W, H, m.fovy)
    whole = render_frames(g, view, K, W, H, (1.0, 1.0, 1.0), chunk=T)
    for chunk in (1, 2):
        parts = render_frames(g, view, K, W, H, (1.0, 1.0, 1.0), chunk=chunk)
        torch.testing.assert_close(parts, whole, rtol=0, atol=1e-6)
    assert whole.shape == (T, H, W, 3) and whole.std() > 0
    assert export_stage.frames_per_chunk(832, 480) == 4  # the default SDS size
    assert export_stage.frames_per_chunk(1664, 960) == 1  # 2x: one frame per render
    assert export_stage.frames_per_chunk(256, 160) == 39
