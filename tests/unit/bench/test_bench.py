"""bench/fixtures.py: the block scene, a scene's method from the config, the method timer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench import fixtures


def test_the_block_scene_has_12_control_points_and_a_dynamic_half():
    scene = fixtures.block_scene(4000, 41)
    obj = scene.dynamic["obj_0"]
    assert obj.layer1.centres.shape == (12, 3)
    assert scene.slices["obj_0"].stop - scene.slices["obj_0"].start == 2000
    assert scene.means.shape[0] == 4000
    assert obj.frame_num == 41 and not obj.layer1.cp_deform.any()
    moved = fixtures.block_scene(4000, 41, deform=0.02).dynamic["obj_0"].layer1.cp_deform
    again = fixtures.block_scene(4000, 41, deform=0.02).dynamic["obj_0"].layer1.cp_deform
    assert moved.abs().max() > 0 and torch.equal(moved, again)  # seeded


def test_scene_config_is_the_workflows_method_with_overrides():
    cfg = fixtures.load_config()
    method, guidance = fixtures.scene_config("hop")
    assert method == cfg.scenes["hop"].method and guidance == cfg.guidance
    assert (method.size, method.frame_num) == ("128*80", 21)  # the sheet's cpu_demo preset
    short, _ = fixtures.scene_config("hop", overrides={"iterations": 6})
    assert short == dataclasses.replace(method, iterations=6)
    with pytest.raises(SystemExit, match="not in"):
        fixtures.scene_config("nosuch")


def test_the_method_timer_sums_each_phase_over_calls():
    class Box:
        def work(self, x):
            return x + 1

    box, ticks = Box(), iter(range(100))
    timer = fixtures.MethodTimer(clock=lambda: next(ticks))
    timer.wrap(box, "work", "work")
    assert box.work(1) == 2 and box.work(2) == 3
    assert timer.times == {"work": 2}  # two calls of one tick each
