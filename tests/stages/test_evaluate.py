"""The evaluate stage's "it did not move" flag (static_warning) through to metrics.tsv and the
aggregate plot."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from chord.core.errors import InputError
from chord.evaluation import interaction, metrics, plots
from chord.export import trained_scene
from chord.motion.model import MotionScene
from chord.plan import results_layout
from chord.scene import ingestion
from chord.stages import aggregate, evaluate
from chord.training import checkpoint
from tests.stages.test_export_stage import sway  # noqa: F401 (a trained demo scene)


def unplotted():
    """evaluate.run's figures not drawn: for a run that repeats one already drawn (the same
    state, another threshold), where only the numbers differ (the drawing is most of a run)."""
    return mock.patch.multiple(plots, frame0_comparison=mock.DEFAULT, interaction=mock.DEFAULT,
                               loss_curves=mock.DEFAULT)  # fmt: skip


def test_a_scene_that_barely_moves_is_flagged(sway, tmp_path, caplog, monkeypatch):  # noqa: F811
    res, s = sway.res, sway.s
    kw = {
        **sway.inputs,
        "state_path": results_layout.train_state(res, s, "coarse"),
        "ref_png": results_layout.reference_png(res, s),
        "loss_logs": {"coarse": results_layout.train_losses(res, s, "coarse")},
        "motion_json": None,
        "out_frame0": tmp_path / "frame0.png",
        "out_losses": tmp_path / "losses.png",
        "out_interaction": tmp_path / "interaction.png",
    }
    moved = evaluate.run(**kw, method=sway.m, out_json=tmp_path / "a.json")["mean_displacement"]
    assert moved > 0
    results = {}
    for name, threshold in (("moves", moved / 2), ("static", moved * 2)):
        m = dataclasses.replace(sway.m, static_threshold=threshold)
        with caplog.at_level("WARNING", logger="chord.stages.evaluate"), unplotted():
            caplog.clear()
            results[name] = evaluate.run(**kw, method=m, out_json=tmp_path / f"{name}.json")
        assert results[name]["static_warning"] == (name == "static")
        assert ("barely move" in caplog.text) == (name == "static")
    shown = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: shown.setdefault("fig", fig))
    aggregate.run(
        metrics={n: tmp_path / f"{n}.json" for n in results},
        loss_logs={n: kw["loss_logs"] for n in results},
        out_tsv=tmp_path / "metrics.tsv",
        out_metrics_png=tmp_path / "bars.png",
        out_losses_png=tmp_path / "all_losses.png",
    )
    table = pd.read_csv(tmp_path / "metrics.tsv", sep="\t", index_col="scene")
    assert table["static_warning"].to_dict() == {"moves": False, "static": True}
    # the tier and device that produced each result
    assert table["tier"].to_dict() == {"moves": "split", "static": "split"}
    assert set(table["device"]) == {"cpu"}
    labels = [t.get_text() for t in shown["fig"].axes[0].get_xticklabels()]
    assert labels == ["moves", "static (static!)"]
    hatched = [bar.get_hatch() for bar in shown["fig"].axes[0].patches]
    assert hatched == [None, "//"]


U32, U64 = 2.0**-24, 2.0**-53  # unit roundoffs of float32 and float64


def scripted_state(run, path, steps: dict) -> None:
    """The sway scene's trained state with a scripted motion: each dynamic object's control
    points all translate by t·steps[name] in frame t (float32, as stored), with the identity
    rotation, in a per-frame table (METHOD §6: row t+1 holds frame t)."""
    ckpt = checkpoint.load_checkpoint(results_layout.train_state(run.res, run.s, "coarse"))
    assert set(ckpt["motion_meta"]["objects"]) == set(steps)
    for name, info in ckpt["motion_meta"]["objects"].items():
        assert not info["layer2"]  # one layer: the positions are that layer's blend alone
        key = f"{name}.layer1.cp_deform"
        table = torch.zeros_like(ckpt["motion"][key])  # [P+1, M, 7]
        table[..., 0] = 1.0
        v = torch.tensor(steps[name], dtype=table.dtype)
        for t in range(info["frame_num"]):
            table[t + 1, :, 4:] = t * v
        ckpt["motion"][key] = table
        info["layer1_per_frame"] = True
    checkpoint.save_checkpoint(path, ckpt)


def scripted_displacement(run, state) -> tuple[float, float]:
    """(d, ε): the mean displacement of the scripted motion over the dynamic Gaussians and
    frames t ≥ 1, from the stored translations τ_t (in float64), and the bound ε on the
    relative error of evaluate's float32 positions.

    With the identity rotation, each point's residual LBS is Σ_k w_k·τ_t exactly up to
    rounding (R(q)(x − c) − (x − c) is 0 exactly); the K normalised weights sum to 1 within
    K·u, their K products and K − 1 sums add K·u: |dx − τ| ≤ 2K·u·|τ| per component. x + dx
    rounds once more (u·(|x| + |τ|)); frame 0 is x itself and the float64 difference of
    float32 values is exact. So each ‖x_t − x_0‖ is within (2K + 1)·u·‖τ_t‖ + u·‖x‖ of
    ‖τ_t‖, and the mean within (2K + 1)·u·d + u·max‖x‖, plus float64 rounding of the norms
    and the mean; twice the first-order bound covers the second-order terms."""
    _, scene, _ = trained_scene.load_trained(
        **run.inputs, state_path=state, frame_num=run.m.frame_num
    )
    total, count, K, reach = 0.0, 0, 0, 0.0
    for obj in scene.dynamic.values():
        tau = obj.layer1.cp_deform.detach()[2 : obj.frame_num + 1, 0, 4:].double()  # t ≥ 1
        n = obj.rest_means.shape[0]
        total += n * float(tau.norm(dim=-1).sum())
        count += n * (obj.frame_num - 1)
        K = max(K, obj.layer1.k)
        reach = max(reach, float(obj.rest_means.double().norm(dim=-1).max()))
    d = total / count
    bound = (2 * K + 1) * U32 * d + U32 * reach + (count + 3) * U64 * d
    return d, 2 * bound / d


def test_static_warning_flips_exactly_at_the_scripted_displacement(sway, tmp_path, caplog):  # noqa: F811
    """A scripted motion of known mean displacement d (obj_0 moves 0.01 per frame, obj_2
    0.02, so d is the mean over their Gaussians and frames 1..T−1, not the maximum): the flag
    is off at static_threshold d·(1 − ε) and on at d·(1 + ε), ε the float32 rounding of the
    positions (:func:`scripted_displacement`), so a wrong unit, statistic or object set (the
    static slab diluting the mean) moves the measured value out of the window."""
    state = tmp_path / "scripted.pt"
    scripted_state(sway, state, {"obj_0": (0.006, 0.0, -0.008), "obj_2": (0.0, 0.012, 0.016)})
    d, eps = scripted_displacement(sway, state)
    assert eps < 1e-4  # the window is narrow: rounding only
    kw = {
        **sway.inputs,
        "state_path": state,
        "ref_png": results_layout.reference_png(sway.res, sway.s),
        "loss_logs": {"coarse": results_layout.train_losses(sway.res, sway.s, "coarse")},
        "motion_json": None,
        "out_frame0": tmp_path / "frame0.png",
        "out_losses": tmp_path / "losses.png",
        "out_interaction": tmp_path / "interaction.png",
    }
    for name, threshold, flagged in (
        ("above", d * (1 - eps), False),
        ("below", d * (1 + eps), True),
    ):
        m = dataclasses.replace(sway.m, static_threshold=threshold)
        drawn = unplotted() if name == "below" else contextlib.nullcontext()
        with caplog.at_level("WARNING", logger="chord.stages.evaluate"), drawn:
            caplog.clear()
            out = evaluate.run(**kw, method=m, out_json=tmp_path / f"{name}.json")
        # the returned value is rounded to 9 significant digits (≤ 5e-9 relative) after the flag
        assert abs(out["mean_displacement"] - d) <= (eps + 5e-9) * d, name
        assert out["static_warning"] is flagged, name
        assert ("barely move" in caplog.text) is flagged, name


def test_static_warning_measures_the_dynamic_objects_only(sway, tmp_path, monkeypatch):  # noqa: F811
    """The dynamic objects stand still (identity tables: their positions are the rest ones
    exactly) while the static slab is made to move 0.3 in every frame t ≥ 1: still flagged,
    with a mean displacement of exactly 0 over the dynamic Gaussians only."""
    state = tmp_path / "still.pt"
    scripted_state(sway, state, {"obj_0": (0.0, 0.0, 0.0), "obj_2": (0.0, 0.0, 0.0)})
    frame_gaussians = MotionScene.frame_gaussians
    moved = []

    def statics_move(self, frames, *, detach_weights=False, objects=None):
        g = frame_gaussians(self, frames, detach_weights=detach_weights, objects=objects)
        moving = torch.as_tensor(frames).reshape(-1) != 0
        means, start = g["means"].clone(), 0
        for name in objects or self.names:
            n = self.slices[name].stop - self.slices[name].start
            if name not in self.dynamic and moving.any():
                means[moving, start : start + n, 0] += 0.3
                moved.append(name)
            start += n
        return {**g, "means": means}

    monkeypatch.setattr(MotionScene, "frame_gaussians", statics_move)
    threshold = 0.01
    # the stand-in works: over every object (the slab too) the scene moves well past it
    _, scene, _ = trained_scene.load_trained(
        **sway.inputs, state_path=state, frame_num=sway.m.frame_num
    )
    with torch.no_grad():
        X = scene.frame_gaussians(range(sway.m.frame_num))["means"]
    assert float((X[1:] - X[:1]).norm(dim=-1).mean()) > 5 * threshold and moved == ["obj_1"]
    dynamic = sum(o.rest_means.shape[0] for o in scene.dynamic.values())
    out = evaluate.run(
        **sway.inputs,
        state_path=state,
        ref_png=results_layout.reference_png(sway.res, sway.s),
        loss_logs={"coarse": results_layout.train_losses(sway.res, sway.s, "coarse")},
        motion_json=None,
        method=dataclasses.replace(sway.m, static_threshold=threshold),
        out_json=tmp_path / "still.json",
        out_frame0=tmp_path / "frame0.png",
        out_losses=tmp_path / "losses.png",
        out_interaction=tmp_path / "interaction.png",
    )
    assert out["static_warning"] is True
    assert out["mean_displacement"] == 0.0 and out["max_displacement"] == 0.0
    assert out["dynamic_gaussians"] == dynamic < out["gaussians"]


# -- interaction: the block (obj_2) scripted into and off the slab (obj_1) --------------------


def run_scripted(run, tmp_path, state, name: str, **method) -> dict:
    """evaluate.run on a scripted state, writing <name>.json and <name>.png."""
    return evaluate.run(
        **run.inputs,
        state_path=state,
        ref_png=results_layout.reference_png(run.res, run.s),
        loss_logs={"coarse": results_layout.train_losses(run.res, run.s, "coarse")},
        motion_json=None,
        method=dataclasses.replace(run.m, **method),
        out_json=tmp_path / f"{name}.json",
        out_frame0=tmp_path / "frame0.png",
        out_losses=tmp_path / "losses.png",
        out_interaction=tmp_path / f"{name}.png",
    )


def pair(out: dict, a: str, b: str) -> dict:
    (p,) = [p for p in out["interaction"]["pairs"] if (p["object"], p["other"]) == (a, b)]
    return p


def block_geometry(run) -> dict:
    """The block's normalised mesh as areas by face direction (bottom, vertical sides, top),
    its height, and the slab's thickness and the largest coordinate of either mesh."""
    doc = json.loads(run.inputs["scene_json"].read_text())
    V, F = ingestion.object_mesh(run.inputs["scene_json"], doc, "obj_2")
    tri = V[F]
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = 0.5 * np.linalg.norm(n, axis=1)
    ny = n[:, 1] / np.linalg.norm(n, axis=1)
    parts = {"bottom": area[ny < -1 + 1e-6].sum(), "sides": area[np.abs(ny) < 1e-6].sum()}
    parts["top"] = area[ny > 1 - 1e-6].sum()
    assert sum(parts.values()) == pytest.approx(area.sum(), rel=1e-9)  # a box, upright
    S, _ = ingestion.object_mesh(run.inputs["scene_json"], doc, "obj_1")
    reach = max(np.abs(V).max(), np.abs(S).max())
    return {**parts, "total": area.sum(), "height": np.ptp(V[:, 1]), "slab": np.ptp(S[:, 1]),
            "reach": reach}  # fmt: skip


def stored_translations(state) -> tuple[np.ndarray, int]:
    """The block's scripted y translation per frame [T] as stored (float32, in float64), and
    a bound on its control-point neighbour count K (n_cp_num ≥ min(n_cp_num, M))."""
    ckpt = checkpoint.load_checkpoint(state)
    table = ckpt["motion"]["obj_2.layer1.cp_deform"]  # [P+1, M, 7], row t+1 is frame t
    T = ckpt["motion_meta"]["objects"]["obj_2"]["frame_num"]
    return table[1 : T + 1, 0, 5].double().numpy(), int(
        ckpt["motion_meta"]["objects"]["obj_2"]["n_cp_num"]
    )


def position_bound(tau: float, K: int, reach: float) -> float:
    """|error| of a moved sample's coordinate against rest + τ: the sample is cast to float32
    (u·reach), the LBS adds Σ_k w_k·τ with weights summing to 1 within K·u and K products and
    K − 1 sums ((2K + 1)·u·|τ|, as in :func:`scripted_displacement`), x + dx rounds once more
    (u·(reach + |τ|)); the block's bottom and the slab's top rest on float32 normalised
    coordinates of one world height (2u·reach). Twice the first-order sum."""
    return 2 * ((2 * K + 1) * U32 * abs(tau) + U32 * (reach + abs(tau)) + 3 * U32 * reach)


def share_bound(p: float, n: int) -> float:
    """Five binomial standard deviations of a share p from n i.i.d. area-uniform samples
    (probability below 1e-6 to exceed), plus one sample."""
    return 5 * (p * (1 - p) / n) ** 0.5 + 1 / n


def test_a_block_sinking_into_the_slab_by_known_depths(sway, tmp_path, caplog, monkeypatch):  # noqa: F811
    """The block translates down by t·δ (δ a twelfth of the slab's thickness: at most a
    third of it deep, so the slab's top face stays the nearest) while the column stands
    still. Its samples inside the slab are its bottom and the lower d_t − band of its sides:
    share (A_bottom + A_sides·(d_t − band)/h)/A; the deepest lies on its bottom at d_t; the
    column touches the slab without entering it. penetration_warning flips at the deepest
    added depth D·(1 ± ε), ε from the float32 rounding; through to metrics.tsv."""
    geo = block_geometry(sway)
    state = tmp_path / "sink.pt"
    delta = geo["slab"] / 12
    scripted_state(sway, state, {"obj_0": (0.0, 0.0, 0.0), "obj_2": (0.0, -delta, 0.0)})
    tau, K = stored_translations(state)
    T, n = len(tau), interaction.INTERACTION_SAMPLES
    D = abs(tau[-1])
    eps = position_bound(D, K, geo["reach"]) / D
    assert eps < 1e-4
    out = {}
    for name, threshold, flagged in (("deep", D * (1 - eps), True), ("ok", D * (1 + eps), False)):
        drawn = unplotted() if name == "deep" else contextlib.nullcontext()  # ok.png is read
        with caplog.at_level("WARNING", logger="chord.stages.evaluate"), drawn:
            caplog.clear()
            out[name] = run_scripted(sway, tmp_path, state, name, penetration_threshold=threshold)
        assert out[name]["penetration_warning"] is flagged, name
        assert ("obj_2 passes into obj_1" in caplog.text) is flagged, name
    o = out["ok"]
    sink = pair(o, "obj_2", "obj_1")
    assert sink["resting"] and sink["fraction"][0] == 0.0 and sink["depth"][0] == 0.0
    # the same samples at rest: inside at frame t exactly when their height above the
    # block's bottom is below d_t − band (the slab's footprint holds the block's); samples
    # within the rounding bound of that level may go either way
    doc = json.loads(sway.inputs["scene_json"].read_text())
    V, F = ingestion.object_mesh(sway.inputs["scene_json"], doc, "obj_2")
    above = metrics.surface_samples(V, F, n, seed=2)[:, 1] - V[:, 1].min()  # [S]
    for t in range(1, T):
        d = abs(tau[t])
        bound = position_bound(d, K, geo["reach"])
        assert abs(sink["depth"][t] - d) <= bound, t
        side = geo["sides"] * (d - metrics.CONTACT_BAND) / geo["height"]
        p = (geo["bottom"] + side) / geo["total"]
        assert abs(sink["fraction"][t] - p) <= share_bound(p, n), t
        level = d - metrics.CONTACT_BAND
        unsure = int((np.abs(above - level) <= bound).sum())
        count = round(sink["fraction"][t] * n)  # the JSON's 9 digits leave it an integer
        assert abs(count - int((above < level).sum())) <= unsure, t
    assert np.all(np.diff(sink["depth"]) > 0) and np.all(np.diff(sink["fraction"]) > 0)
    assert o["penetration_depth"] == o["penetration_excess"] == sink["depth"][-1]
    assert o["penetration_depth_rest"] == 0.0 and o["float_gap"] == 0.0
    still = pair(o, "obj_0", "obj_1")  # the column, in place: touching, never inside
    assert still["resting"] and still["fraction"] == still["depth"] == [0.0] * T
    assert still["gap"] == [0.0] * T
    assert o["per_frame"]["penetration_depth"] == sink["depth"]
    with Image.open(tmp_path / "ok.png") as im:
        assert im.format == "PNG" and im.size[0] > 600

    shown = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: shown.setdefault(path.name, fig))
    aggregate.run(
        metrics={name: tmp_path / f"{name}.json" for name in out},
        loss_logs={
            name: {"coarse": results_layout.train_losses(sway.res, sway.s, "coarse")}
            for name in out
        },
        out_tsv=tmp_path / "metrics.tsv",
        out_metrics_png=tmp_path / "bars.png",
        out_losses_png=tmp_path / "all_losses.png",
    )
    table = pd.read_csv(tmp_path / "metrics.tsv", sep="\t", index_col="scene")
    assert table["penetration_warning"].to_dict() == {"deep": True, "ok": False}
    assert table.loc["ok", "penetration_depth"] == pytest.approx(D, rel=eps + 1e-5)  # %.6g
    assert table.loc["ok", "resting_pairs"] == 2  # column and block on the slab
    ax = shown["bars.png"].axes[0]  # the warned scene is named and cross-hatched
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert ["(penetrates!)" in label for label in labels] == [True, False]
    assert ["xx" in (bar.get_hatch() or "") for bar in ax.patches] == [True, False]


def test_a_block_lifting_off_the_slab_floats_by_the_lift(sway, tmp_path):  # noqa: F811
    """The block rises t·0.01 (the column stays): the gap of its resting pair with the slab is
    the lift in every frame, nothing is inside anything, no warning."""
    geo = block_geometry(sway)
    state = tmp_path / "lift.pt"
    scripted_state(sway, state, {"obj_0": (0.0, 0.0, 0.0), "obj_2": (0.0, 0.01, 0.0)})
    tau, K = stored_translations(state)
    out = run_scripted(sway, tmp_path, state, "lift")
    lift = pair(out, "obj_2", "obj_1")
    assert lift["resting"] and lift["separation"][0] == 0.0
    for t, h in enumerate(tau):
        assert abs(lift["gap"][t] - h) <= position_bound(h, K, geo["reach"]), t
    assert out["float_gap"] == lift["gap"][-1] and out["per_frame"]["float_gap"] == lift["gap"]
    assert out["penetration_fraction"] == out["penetration_depth"] == 0.0
    assert out["penetration_warning"] is False
    apart = pair(out, "obj_2", "obj_0")  # block and column stand apart: not resting
    assert not apart["resting"] and apart["gap"] is None
    assert apart["separation"][0] > interaction.REST_TOLERANCE


def test_the_scripted_motions_penetration_is_measured_beside_the_trained(sway, tmp_path):  # noqa: F811
    """With a motion.json, evaluate measures the scripted motion's own interaction on the same
    samples (issue 36: whose doing a penetration is): a motion.json of the very sink the state
    holds gives the trained penetration_excess, within the state's float32 bound; without one,
    null."""
    from chord.motion import scripted

    geo = block_geometry(sway)
    state = tmp_path / "sink.pt"
    delta = geo["slab"] / 12
    scripted_state(sway, state, {"obj_0": (0.0, 0.0, 0.0), "obj_2": (0.0, -delta, 0.0)})
    tau, K = stored_translations(state)
    T = len(tau)
    doc = json.loads(sway.inputs["scene_json"].read_text())
    scale = doc["normalisation"]["scale"]
    motion = {
        "format": scripted.MOTION_FORMAT,
        "frame_num": T,
        "fps": 10,
        "space": "world",
        "up": [0.0, 1.0, 0.0],
        "objects": {
            "obj_2": {
                "deformation": {
                    "kind": "none",
                    "pivot": [0.0, 0.0, 0.0],
                    "axis": [0.0, 0.0, 1.0],
                    "height": 1.0,
                    "angles": [0.0] * T,
                },
                "rigid": {
                    "pivot": [0.0, 0.0, 0.0],
                    "rotations": [[1.0, 0.0, 0.0, 0.0]] * T,
                    "translations": [[0.0, float(h) / scale, 0.0] for h in tau],
                },
            }
        },
    }
    path = tmp_path / "motion.json"
    path.write_text(json.dumps(motion))
    out = evaluate.run(
        **sway.inputs,
        state_path=state,
        ref_png=results_layout.reference_png(sway.res, sway.s),
        loss_logs={"coarse": results_layout.train_losses(sway.res, sway.s, "coarse")},
        motion_json=path,
        method=sway.m,
        out_json=tmp_path / "sink.json",
        out_frame0=tmp_path / "frame0.png",
        out_losses=tmp_path / "losses.png",
        out_interaction=tmp_path / "sink.png",
    )
    D = abs(tau[-1])
    assert out["penetration_excess"] > 0.5 * D
    bound = position_bound(D, K, geo["reach"])
    assert abs(out["scripted_penetration_excess"] - out["penetration_excess"]) <= bound
    assert out["recovery_relative"] < 1e-4  # the state is the scripted motion
    with unplotted():
        assert run_scripted(sway, tmp_path, state, "none")["scripted_penetration_excess"] is None
    with Image.open(tmp_path / "sink.png") as im:  # dotted scripted depths drawn beside
        assert im.size[0] > 0


def test_a_missing_normalised_mesh_is_an_input_error_naming_it(sway, tmp_path):  # noqa: F811
    """The interaction checks read scene/meshes/: a mesh gone from there is named."""
    scene_dir = tmp_path / "scene"
    shutil.copytree(sway.inputs["scene_json"].parent, scene_dir)
    (scene_dir / "meshes" / "obj_2.glb").unlink()
    inputs = {**sway.inputs, "scene_json": scene_dir / "scene.json"}
    with pytest.raises(InputError, match=r"obj_2\.glb"):
        run_scripted(SimpleNamespace(**{**vars(sway), "inputs": inputs}), tmp_path,
                     results_layout.train_state(sway.res, sway.s, "coarse"), "missing")  # fmt: skip
