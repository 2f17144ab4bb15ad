"""Tests for chord.scene.demo: procedural demo scenes and their scripted ground-truth motion."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import trimesh

from chord.motion.scripted import apply_motion, load_motion
from chord.scene.demo import (
    DEMO_SCENES,
    SLAB_TOP_Y,
    STATIC_ID,
    demo_files,
    write_demo_scene,
    write_demo_scenes,
)

SCENES = sorted(DEMO_SCENES)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    write_demo_scenes(out)
    return out


def _world_vertices(scene: trimesh.Scene) -> np.ndarray:
    """All vertices ``[V, 3]`` of a scene with node world transforms applied."""
    parts = []
    for node in scene.graph.nodes_geometry:
        transform, gname = scene.graph[node]
        parts.append(trimesh.transform_points(scene.geometry[gname].vertices, transform))
    return np.concatenate(parts)


def _load(path: Path) -> trimesh.Scene:
    return trimesh.load(path, force="scene")


def _single_geometry(path: Path) -> trimesh.Trimesh:
    scene = _load(path)
    assert len(scene.geometry) == 1, path
    return next(iter(scene.geometry.values()))


def _dynamic_objects(name: str) -> list[str]:
    return [f"obj_{i}" for i in range(DEMO_SCENES[name]["objects"]) if i != STATIC_ID]


def _identity_rigid(obj_motion: dict) -> dict:
    out = copy.deepcopy(obj_motion)
    t = len(out["rigid"]["rotations"])
    out["rigid"]["rotations"] = np.tile([1.0, 0.0, 0.0, 0.0], (t, 1))
    out["rigid"]["translations"] = np.zeros((t, 3))
    return out


# ------------------------------------------------------------------------------------ layout


def test_scene_registry():
    assert {"hop", "sway"} <= set(DEMO_SCENES)
    assert DEMO_SCENES["sway"]["objects"] == 3
    assert any(spec["objects"] >= 3 for spec in DEMO_SCENES.values())
    for spec in DEMO_SCENES.values():
        assert spec["objects"] >= 2
        assert isinstance(spec["prompt"], str) and len(spec["prompt"]) > 20
        assert isinstance(spec["description"], str) and spec["description"]


@pytest.mark.parametrize("name", SCENES)
def test_demo_files_written(demo_dir, name):
    files = demo_files(name)
    n = DEMO_SCENES[name]["objects"]
    assert files == ["scene.glb", *[f"obj_{i}.glb" for i in range(n)], "motion.json"]
    folder = demo_dir / name
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)  # no temp files left
    for fname in files:
        if fname.endswith(".glb"):
            scene = _load(folder / fname)
            assert isinstance(scene, trimesh.Scene)
            assert len(scene.geometry) == (n if fname == "scene.glb" else 1)
            for geom in scene.geometry.values():
                assert 100 <= len(geom.faces) <= 5000


@pytest.mark.parametrize("name", SCENES)
def test_scene_bounds_are_union_of_objects(demo_dir, name):
    folder = demo_dir / name
    scene = _load(folder / "scene.glb")
    objs = [_load(folder / f"obj_{i}.glb") for i in range(DEMO_SCENES[name]["objects"])]
    lo = np.min([o.bounds[0] for o in objs], axis=0)
    hi = np.max([o.bounds[1] for o in objs], axis=0)
    np.testing.assert_allclose(scene.bounds, np.stack([lo, hi]), atol=1e-6)
    # scene.bounds agrees with explicitly transformed vertices
    verts = _world_vertices(scene)
    np.testing.assert_allclose(scene.bounds, [verts.min(0), verts.max(0)], atol=1e-6)
    extent = scene.extents.max()
    assert 1.0 <= extent <= 3.0


def test_some_placement_lives_in_node_transform(demo_dir):
    non_identity = 0
    for name in SCENES:
        for i in range(DEMO_SCENES[name]["objects"]):
            scene = _load(demo_dir / name / f"obj_{i}.glb")
            for node in scene.graph.nodes_geometry:
                transform, _ = scene.graph[node]
                non_identity += not np.allclose(transform, np.eye(4))
    assert non_identity >= 1


@pytest.mark.parametrize("name", SCENES)
def test_objects_rest_on_slab(demo_dir, name):
    folder = demo_dir / name
    slab = _world_vertices(_load(folder / f"obj_{STATIC_ID}.glb"))
    slab = slab[slab[:, 1] <= SLAB_TOP_Y + 1e-6]  # the slab without what stands on it (a wall)
    assert slab[:, 1].max() == pytest.approx(SLAB_TOP_Y, abs=1e-6)
    for key in _dynamic_objects(name):
        verts = _world_vertices(_load(folder / f"{key}.glb"))
        assert verts[:, 1].min() == pytest.approx(SLAB_TOP_Y, abs=1e-6), key
        # inside the slab's footprint
        assert np.all(verts[:, [0, 2]] >= slab[:, [0, 2]].min(0))
        assert np.all(verts[:, [0, 2]] <= slab[:, [0, 2]].max(0))


def test_colour_sources(demo_dir):
    sources: set[str] = set()
    for name in SCENES:
        for i in range(DEMO_SCENES[name]["objects"]):
            geom = _single_geometry(demo_dir / name / f"obj_{i}.glb")
            visual = geom.visual
            if visual.kind == "vertex":
                assert visual.vertex_colors.shape == (len(geom.vertices), 4)
                assert len(np.unique(visual.vertex_colors[:, :3], axis=0)) >= 4
                sources.add("vertex")
                continue
            assert isinstance(visual, trimesh.visual.TextureVisuals)
            material = visual.material
            image = getattr(material, "baseColorTexture", None)
            if image is not None:
                assert image.size[0] > 0 and image.size[1] > 0
                assert len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0)) >= 3
                assert visual.uv is not None and visual.uv.shape == (len(geom.vertices), 2)
                assert np.all((visual.uv >= 0) & (visual.uv <= 1))
                sources.add("texture")
            else:
                assert material.baseColorFactor is not None
                sources.add("factor")
    assert "texture" in sources
    assert sources & {"vertex", "factor"}


@pytest.mark.parametrize("name", SCENES)
def test_dynamic_objects_are_textured(demo_dir, name):
    geom = _single_geometry(demo_dir / name / "obj_0.glb")
    assert isinstance(geom.visual, trimesh.visual.TextureVisuals)
    assert geom.visual.material.baseColorTexture is not None
    assert geom.visual.uv is not None and len(geom.visual.uv) == len(geom.vertices)


def test_deterministic_bytes(tmp_path):
    a = write_demo_scenes(tmp_path / "a")
    b = write_demo_scenes(tmp_path / "b")
    for fa, fb in zip(a, b, strict=True):
        assert fa.name == fb.name
        for fname in demo_files(fa.name):
            assert (fa / fname).read_bytes() == (fb / fname).read_bytes(), fname
    # rewriting in place gives the same bytes too
    first = {f: (a[0] / f).read_bytes() for f in demo_files(a[0].name)}
    write_demo_scene(a[0].name, tmp_path / "a")
    for fname, data in first.items():
        assert (a[0] / fname).read_bytes() == data


def test_write_all_returns_every_scene_folder(tmp_path):
    """Without names, every registered scene is written; its folder is returned, in order."""
    folders = write_demo_scenes(tmp_path)
    assert folders == [tmp_path / name for name in DEMO_SCENES]
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == sorted(demo_files(folder.name))


def test_write_returns_folders_and_subset(tmp_path):
    folders = write_demo_scenes(tmp_path, ["sway"])
    assert folders == [tmp_path / "sway"]
    assert not (tmp_path / "hop").exists()
    assert write_demo_scene("hop", tmp_path) == tmp_path / "hop"


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="nope"):
        demo_files("nope")
    with pytest.raises(ValueError, match="nope"):
        write_demo_scene("nope", tmp_path)
    with pytest.raises(ValueError, match="nope"):
        write_demo_scenes(tmp_path, ["hop", "nope"])
    for bad in (40, 42, 1, 0, -3):
        with pytest.raises(ValueError, match="frame_num"):
            write_demo_scene("hop", tmp_path, frame_num=bad)
    with pytest.raises(ValueError, match="frame_num"):
        write_demo_scene("hop", tmp_path, frame_num=41.0)


# ------------------------------------------------------------------------------------ motion


@pytest.mark.parametrize("name", SCENES)
def test_motion_file_matches_scene(demo_dir, name):
    motion = load_motion(demo_dir / name / "motion.json")
    raw = json.loads((demo_dir / name / "motion.json").read_text())
    assert raw["format"] == "chord-scripted-motion/1"
    assert raw["frame_num"] == 41 and raw["fps"] == 10 and raw["space"] == "world"
    assert raw["up"] == [0.0, 1.0, 0.0]
    assert sorted(motion["objects"]) == _dynamic_objects(name)
    for obj in raw["objects"].values():
        assert len(obj["deformation"]["angles"]) == 41
        assert obj["deformation"]["angles"][0] == 0
        assert obj["rigid"]["rotations"][0] == [1, 0, 0, 0]
        assert obj["rigid"]["translations"][0] == [0, 0, 0]
        assert len(obj["rigid"]["rotations"]) == len(obj["rigid"]["translations"]) == 41


def test_scene_motion_kinds(demo_dir):
    hop = load_motion(demo_dir / "hop" / "motion.json")
    assert hop["objects"]["obj_0"]["deformation"]["kind"] == "none"
    rot = hop["objects"]["obj_0"]["rigid"]["rotations"]
    assert np.abs(rot[:, 1:]).max() > 0.1  # it rotates
    sway = load_motion(demo_dir / "sway" / "motion.json")
    kinds = {k: v["deformation"]["kind"] for k, v in sway["objects"].items()}
    assert kinds == {"obj_0": "bend", "obj_2": "twist"}


def test_the_slide_teacher_pushes_the_block_through_the_wall_by_the_overshoot(demo_dir):
    """Issue 36's contact scene: at rest the block is SLIDE_CONTACT from the wall; the scripted
    motion (what the oracle teacher renders) ends SLIDE_OVERSHOOT inside it, measured by the
    evaluate stage's own interaction metric in world units."""
    from chord.evaluation import metrics
    from chord.scene.demo import SLIDE_CONTACT, SLIDE_OVERSHOOT

    static = _single_geometry(demo_dir / "slide" / f"obj_{STATIC_ID}.glb")
    ((key, rest, frames, _),) = list(_trajectories(demo_dir, "slide"))
    block = _single_geometry(demo_dir / "slide" / f"{key}.glb")
    S = metrics.surface_samples(rest, block.faces, 2048, seed=0)
    moved = np.stack([S + (f - rest).mean(0) for f in frames])  # rigid translation only
    assert np.allclose(frames - frames[:, :1], rest - rest[:1], atol=1e-9)
    pair = metrics.pair_interaction(moved, static.vertices, static.faces)
    assert pair["depth"][0] == 0.0
    assert max(pair["depth"]) == pytest.approx(SLIDE_OVERSHOOT, abs=1e-6)
    travel = -(frames[:, 0, 2] - frames[0, 0, 2])
    assert travel.max() == pytest.approx(SLIDE_CONTACT + SLIDE_OVERSHOOT, abs=1e-9)
    inside = [d > 0 for d in pair["depth"]]
    assert inside == [bool(t > SLIDE_CONTACT + 1e-6) for t in travel]  # in once past contact
    assert sum(inside) >= len(inside) // 3  # and for long enough to matter


def test_other_frame_num(tmp_path):
    folder = write_demo_scene("sway", tmp_path, frame_num=21)
    motion = load_motion(folder / "motion.json")
    assert motion["frame_num"] == 21
    for obj in motion["objects"].values():
        assert obj["rigid"]["rotations"].shape == (21, 4)
        assert obj["deformation"]["angles"].shape == (21,)


def _trajectories(demo_dir: Path, name: str):
    """Yield (key, rest vertices [V, 3], per-frame vertices [T, V, 3], scene extent)."""
    folder = demo_dir / name
    motion = load_motion(folder / "motion.json")
    extent = _load(folder / "scene.glb").extents.max()
    for key, obj in motion["objects"].items():
        rest = _world_vertices(_load(folder / f"{key}.glb"))
        frames = np.stack(
            [apply_motion(rest, obj, t, motion["up"]) for t in range(motion["frame_num"])]
        )
        yield key, rest, frames, extent


@pytest.mark.parametrize("name", SCENES)
def test_frame_zero_is_rest_pose(demo_dir, name):
    motion = load_motion(demo_dir / name / "motion.json")
    raw = json.loads((demo_dir / name / "motion.json").read_text())
    for key, obj in motion["objects"].items():
        rest = _world_vertices(_load(demo_dir / name / f"{key}.glb"))
        assert np.array_equal(apply_motion(rest, obj, 0), rest)
        assert np.array_equal(apply_motion(rest, raw["objects"][key], 0), rest)  # raw lists
        rest32 = rest.astype(np.float32)
        out32 = apply_motion(rest32, obj, 0)
        assert out32.dtype == np.float32 and np.array_equal(out32, rest32)


@pytest.mark.parametrize("name", SCENES)
def test_motion_smooth_visible_and_above_slab(demo_dir, name):
    for key, _rest, frames, extent in _trajectories(demo_dir, name):
        steps = np.linalg.norm(np.diff(frames, axis=0), axis=-1).max(axis=1)  # [T-1]
        disp = np.linalg.norm(frames - frames[0], axis=-1).max()
        assert disp > 0.03 * extent, key  # visible
        assert disp < 0.5 * extent, key  # but not wild
        assert steps.max() < 0.05 * extent, key  # no jumps
        assert steps.max() < 0.25 * disp, key
        # second differences small too (no sudden velocity changes)
        accel = np.linalg.norm(np.diff(frames, 2, axis=0), axis=-1).max()
        assert accel < 0.01 * extent, key
        assert frames[..., 1].min() >= SLAB_TOP_Y - 1e-3, key


def test_bend_fixes_base_and_moves_top(demo_dir):
    motion = load_motion(demo_dir / "sway" / "motion.json")
    obj = _identity_rigid(motion["objects"]["obj_0"])
    assert obj["deformation"]["kind"] == "bend"
    rest = _world_vertices(_load(demo_dir / "sway" / "obj_0.glb"))
    y = rest[:, 1]
    base, top = np.isclose(y, y.min()), np.isclose(y, y.max())
    angles = obj["deformation"]["angles"]
    t = int(np.argmax(np.abs(angles)))
    moved = apply_motion(rest, obj, t)
    disp = np.linalg.norm(moved - rest, axis=1)
    assert disp[base].max() < 1e-9
    assert disp[top].min() > 0.1
    assert disp[top].min() >= disp[~top].max() - 1e-9
    # displacement grows with height (compare ring averages)
    order = np.unique(np.round(y, 6))
    ring_disp = [disp[np.isclose(y, h)].mean() for h in order]
    assert np.all(np.diff(ring_disp) > -1e-9)
    # the bend is about the horizontal axis: distances to that axis line are preserved
    pivot, axis = obj["deformation"]["pivot"], obj["deformation"]["axis"]
    axis = axis / np.linalg.norm(axis)
    assert abs(axis[1]) < 1e-9

    def dist(p):
        rel = p - pivot
        return np.linalg.norm(rel - np.outer(rel @ axis, axis), axis=1)

    np.testing.assert_allclose(dist(moved), dist(rest), atol=1e-9)
    np.testing.assert_allclose(moved @ axis, rest @ axis, atol=1e-9)


def test_twist_preserves_height_and_radius(demo_dir):
    motion = load_motion(demo_dir / "sway" / "motion.json")
    obj = _identity_rigid(motion["objects"]["obj_2"])
    assert obj["deformation"]["kind"] == "twist"
    rest = _world_vertices(_load(demo_dir / "sway" / "obj_2.glb"))
    pivot = obj["deformation"]["pivot"]
    angles = obj["deformation"]["angles"]
    t = int(np.argmax(np.abs(angles)))
    moved = apply_motion(rest, obj, t)

    def radius(p):
        return np.linalg.norm((p - pivot)[:, [0, 2]], axis=1)

    np.testing.assert_allclose(moved[:, 1], rest[:, 1], atol=1e-12)
    np.testing.assert_allclose(radius(moved), radius(rest), atol=1e-9)
    disp = np.linalg.norm(moved - rest, axis=1)
    y = rest[:, 1]
    assert disp[np.isclose(y, y.min())].max() < 1e-9
    assert disp[np.isclose(y, y.max())].max() > 0.05
    # the rotation angle at the top equals the scripted angle
    top = np.isclose(y, y.max()) & (radius(rest) > 1e-3)
    a0 = np.arctan2((rest - pivot)[top, 2], (rest - pivot)[top, 0])
    a1 = np.arctan2((moved - pivot)[top, 2], (moved - pivot)[top, 0])
    delta = np.angle(np.exp(1j * (a0 - a1)))  # rotation about +y maps (x, z) angle by -theta
    np.testing.assert_allclose(delta, angles[t], atol=1e-9)


def test_apply_motion_rigid_semantics():
    t = 3
    angle = 0.4
    obj = {
        "deformation": {"kind": "none"},
        "rigid": {
            "pivot": [1.0, 0.0, 0.0],
            "rotations": [[1, 0, 0, 0]] * t + [[np.cos(angle / 2), 0, np.sin(angle / 2), 0]],
            "translations": [[0, 0, 0]] * t + [[0.0, 0.5, 0.0]],
        },
    }
    pts = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    out = apply_motion(pts, obj, t)
    expected = np.array([[1.0 + np.cos(angle), 0.5, -np.sin(angle)], [1.0, 1.5, 0.0]])
    np.testing.assert_allclose(out, expected, atol=1e-12)
    with pytest.raises(ValueError, match="frame"):
        apply_motion(pts, obj, t + 1)
    with pytest.raises(ValueError, match="points"):
        apply_motion(pts[:, :2], obj, 0)
    with pytest.raises(ValueError, match="kind"):
        apply_motion(pts, {**obj, "deformation": {"kind": "wiggle"}}, 0)


def test_apply_motion_twist_and_bend_semantics():
    pts = np.array([[1.0, 2.0, 0.0], [1.0, 4.0, 0.0], [1.0, -1.0, 0.0]])
    rigid = {
        "pivot": [0.0, 0.0, 0.0],
        "rotations": [[1, 0, 0, 0]] * 2,
        "translations": [[0, 0, 0]] * 2,
    }

    def deformed(kind, axis, height, angles):  # about the origin, with no rigid motion
        d = dict(kind=kind, pivot=[0, 0, 0], axis=axis, height=height, angles=angles)
        return {"deformation": d, "rigid": rigid}

    out = apply_motion(pts, deformed("twist", [0, 1, 0], 4.0, [0.0, np.pi]), 1)
    # half height -> pi/2 about +y maps +x to -z; full height -> pi; below pivot -> unchanged
    np.testing.assert_allclose(
        out, [[0.0, 2.0, -1.0], [-1.0, 4.0, 0.0], [1.0, -1.0, 0.0]], atol=1e-12
    )
    bend = deformed("bend", [0, 0, 1], 2.0, [0.0, np.pi / 2])
    out = apply_motion(np.array([[0.0, 2.0, 0.0], [0.0, 1.0, 0.0]]), bend, 1)
    # full height: pi/2 about +z maps +y to -x; half height: pi/4
    s = np.sqrt(0.5)
    np.testing.assert_allclose(out, [[-2.0, 0.0, 0.0], [-s, s, 0.0]], atol=1e-12)


# ------------------------------------------------------------------------------------ load_motion


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "motion.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def raw_motion(demo_dir) -> dict:
    return json.loads((demo_dir / "sway" / "motion.json").read_text())


def test_load_motion_rejects_wrong_frame_count(tmp_path, raw_motion):
    raw_motion["objects"]["obj_0"]["deformation"]["angles"].pop()
    with pytest.raises(ValueError, match=r"motion\.json.*angles"):
        load_motion(_write(tmp_path, raw_motion))


def test_load_motion_rejects_wrong_rotation_count(tmp_path, raw_motion):
    raw_motion["objects"]["obj_2"]["rigid"]["rotations"].append([1, 0, 0, 0])
    with pytest.raises(ValueError, match="rotations"):
        load_motion(_write(tmp_path, raw_motion))


def test_load_motion_rejects_frame_num_mismatch(tmp_path, raw_motion):
    raw_motion["frame_num"] = 45
    with pytest.raises(ValueError, match="objects.obj_0"):
        load_motion(_write(tmp_path, raw_motion))


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("format",), "format"),
        (("frame_num",), "frame_num"),
        (("objects",), "objects"),
        (("objects", "obj_0", "rigid"), "rigid"),
        (("objects", "obj_2", "rigid", "translations"), "translations"),
        (("objects", "obj_0", "deformation", "height"), "height"),
        (("objects", "obj_0", "deformation", "kind"), "kind"),
    ],
)
def test_load_motion_rejects_missing_field(tmp_path, raw_motion, path, field):
    node = raw_motion
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(ValueError, match=field) as info:
        load_motion(_write(tmp_path, raw_motion))
    assert "motion.json" in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m.update(format="other/1"), "format"),
        (lambda m: m.update(space="camera"), "space"),
        (lambda m: m["objects"]["obj_0"]["deformation"].update(kind="wiggle"), "kind"),
        (lambda m: m["objects"]["obj_0"]["deformation"].update(height=0), "height"),
        (lambda m: m["objects"]["obj_2"]["rigid"]["rotations"][0].__setitem__(0, 0.5), "rotations"),
        (lambda m: m["objects"]["obj_2"]["rigid"]["translations"][0].__setitem__(0, 0.5), "rigid"),
        (lambda m: m["objects"]["obj_0"]["deformation"]["angles"].__setitem__(0, 0.1), "angles"),
        (lambda m: m["objects"].update(bogus=m["objects"]["obj_0"]), "bogus"),
    ],
)
def test_load_motion_rejects_bad_values(tmp_path, raw_motion, mutate, field):
    mutate(raw_motion)
    with pytest.raises(ValueError, match=field):
        load_motion(_write(tmp_path, raw_motion))


def test_load_motion_rejects_unreadable(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_motion(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_motion(bad)
