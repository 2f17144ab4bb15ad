"""The motion representation: Fenwick table, skinning, layers, scene container, state."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from chord.core import quaternion as quat
from chord.motion import fenwick, state
from chord.motion.layer import ControlPointLayer
from chord.motion.model import DynamicObject, MotionScene

D64 = torch.float64
T = 41


def random_points(n, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, generator=g, dtype=D64) - 0.5) * 2 * scale


def make_object(n=200, m=8, seed=0, frame_num=T):
    pts = random_points(n, seed)
    centres = random_points(m, seed + 1, 0.25)
    g = torch.Generator().manual_seed(seed + 2)
    quats = quat.normalize(torch.randn(n, 4, generator=g, dtype=D64))
    return DynamicObject(
        "obj_0", pts, quats, centres, random_points(50, seed + 3), frame_num=frame_num, n_cp_num=3
    )


def test_table_size_and_chains():
    assert fenwick.table_size(41) == 64 and fenwick.table_size(5) == 8
    assert fenwick.chain(12) == [12, 8] and fenwick.chain(41) == [41, 40, 32]


def test_query_equals_explicit_block_sums():
    g = torch.Generator().manual_seed(0)
    D = torch.randn(65, 5, 7, generator=g, dtype=D64)
    S = fenwick.raw_sums(D, torch.arange(T), T)
    for t in range(T):
        blocks = [j for j in range(1, 65) if j - 1 <= t < j - 1 + fenwick.lowbit(j)]
        torch.testing.assert_close(S[t], D[blocks].sum(0))


@pytest.mark.parametrize("j", [1, 2, 3, 8, 16, 32, 40, 41])
def test_entry_j_moves_exactly_its_block(j):
    D = torch.zeros(65, 2, 7, dtype=D64)
    D[j, :, 4] = 0.1  # a translation in x
    _, tau = fenwick.transforms(D, torch.arange(T), T)
    moved = {t for t in range(T) if float(tau[t].abs().max()) > 0}
    assert moved == set(range(j - 1, min(T, j - 1 + fenwick.lowbit(j))))


def test_zero_table_gives_the_rest_pose_at_every_frame():
    obj = make_object()
    pos, rot = obj.deform(range(T))
    assert torch.equal(pos, obj.rest_means.expand(T, -1, -1))
    torch.testing.assert_close(rot[1:], quat.normalize(obj.rest_quats).expand(T - 1, -1, -1))
    assert torch.equal(rot[0], obj.rest_quats)


def test_frame_zero_is_pinned_and_gets_no_gradient():
    obj = make_object()
    with torch.no_grad():
        obj.layer1.cp_deform.normal_(0, 0.05)
    pos, rot = obj.deform([0, 5])
    assert torch.equal(pos[0], obj.rest_means) and torch.equal(rot[0], obj.rest_quats)
    (pos[0].sum() + rot[0].sum() + 0 * pos[1].sum()).backward()
    for p in (obj.layer1.cp_deform, obj.layer1.cp_radius, obj.layer1.cp_rotation):
        assert float(p.grad.abs().max()) == 0.0
    obj.zero_grad(set_to_none=True)
    pos, _ = obj.deform(range(T))
    pos.square().sum().backward()
    assert float(obj.layer1.cp_deform.grad[1].abs().max()) == 0.0  # row 1 only feeds frame 0
    assert float(obj.layer1.cp_deform.grad[2].abs().max()) > 0


def test_progressive_reset_freezes_frames_after_p():
    g = torch.Generator().manual_seed(1)
    D = torch.randn(65, 4, 7, generator=g, dtype=D64) * 0.1
    before = fenwick.raw_sums(D, torch.arange(T), T).clone()
    rows = fenwick.progressive_reset(D, 29)
    after = fenwick.raw_sums(D, torch.arange(T), T)
    assert rows == list(range(31, 65))
    torch.testing.assert_close(after[:30], before[:30], atol=0, rtol=0)
    for t in range(30, T):
        torch.testing.assert_close(after[t], before[29], atol=1e-12, rtol=0)
    assert fenwick.reset_enabled(100, 3000, 29, 41)
    assert not fenwick.reset_enabled(0, 3000, 29, 41)
    assert not fenwick.reset_enabled(100, 3000, 40, 41)


def test_per_frame_conversion_keeps_every_frame():
    layer = ControlPointLayer(random_points(6, 4), T)
    with torch.no_grad():
        layer.cp_deform.normal_(0, 0.1)
    q0, t0 = layer.transforms(torch.arange(T))
    layer.convert_to_per_frame()
    q1, t1 = layer.transforms(torch.arange(T))
    torch.testing.assert_close(q1, q0)
    torch.testing.assert_close(t1, t0)


def test_weights_sum_to_one_and_use_the_exact_mahalanobis_distance():
    layer = ControlPointLayer(random_points(5, 7), T, n_cp_num=3)
    with torch.no_grad():
        layer.cp_radius.copy_(torch.log(torch.tensor([0.1, 0.2, 0.05], dtype=D64)).expand(5, 3))
        layer.cp_rotation.copy_(torch.tensor([0.9, 0.3, -0.2, 0.1], dtype=D64).expand(5, 4))
    x = random_points(30, 8)
    idx = layer.neighbours(x)
    w = layer.weights(x, idx)
    torch.testing.assert_close(w.sum(-1), torch.ones(30, dtype=D64))
    R = quat.to_rotmat(layer.cp_rotation[0])
    S_inv = torch.diag(1 / torch.exp(layer.cp_radius[0]))
    manual = torch.empty(30, 3, dtype=D64)
    for n in range(30):
        for k in range(3):
            y = S_inv @ R.T @ (x[n] - layer.centres[idx[n, k]])
            manual[n, k] = torch.exp(-0.5 * (y @ y)) + 1e-7
    torch.testing.assert_close(w, manual / manual.sum(-1, keepdim=True))


def rigid_table(layer, R_q, t, frame_from=1):
    """Per-frame table giving every control point the global rigid motion x -> R x + t."""
    layer.per_frame = True
    R = quat.to_rotmat(R_q)
    with torch.no_grad():
        layer.cp_deform.zero_()
        layer.cp_deform[1:, :, 0] = 1.0
        for f in range(frame_from, layer.frame_num):
            layer.cp_deform[f + 1, :, :4] = R_q
            layer.cp_deform[f + 1, :, 4:] = t + layer.centres @ R.T - layer.centres


def test_rigid_control_point_motion_moves_gaussians_rigidly():
    obj = make_object()
    R_q = quat.normalize(torch.tensor([0.8, 0.1, 0.5, -0.2], dtype=D64))
    t = torch.tensor([0.1, -0.2, 0.3], dtype=D64)
    rigid_table(obj.layer1, R_q, t)
    pos, rot = obj.deform([0, 3, 40])
    expect = obj.rest_means @ quat.to_rotmat(R_q).T + t
    torch.testing.assert_close(pos[1], expect, atol=1e-12, rtol=0)
    torch.testing.assert_close(pos[2], expect, atol=1e-12, rtol=0)
    torch.testing.assert_close(rot[1], quat.normalize(quat.multiply(R_q, obj.rest_quats)))
    surf, _ = obj.deform([3], points="surface")
    torch.testing.assert_close(surf[0], obj.surface @ quat.to_rotmat(R_q).T + t)


def test_second_layer_is_an_exact_identity_when_added():
    obj = make_object()
    with torch.no_grad():
        obj.layer1.cp_deform.normal_(0, 0.05)
    pos0, rot0 = obj.deform(range(T))
    obj.add_second_layer(random_points(12, 9, 0.25), random_points(80, 10), mult_rot_way=0)
    pos1, rot1 = obj.deform(range(T))
    assert float((pos1 - pos0).detach().abs().max()) == 0.0
    torch.testing.assert_close(rot1, rot0, atol=1e-12, rtol=0)
    assert obj.arap_sample_num == math.floor(1024 * 80 / 50)
    assert set(obj.param_groups()) == {
        "cp_deform",
        "cp_radius",
        "cp_rotation",
        "c_cp_deform",
        "c_cp_radius",
        "c_cp_rotation",
    }


def test_detach_first_stops_first_layer_gradients():
    obj = make_object()
    obj.add_second_layer(random_points(12, 9, 0.25), random_points(80, 10), detach_first=True)
    with torch.no_grad():
        obj.layer2.cp_deform.normal_(0, 0.05)
    pos, rot = obj.deform(range(T))
    (pos.square().sum() + rot.sum()).backward()
    assert obj.layer1.cp_deform.grad is None and obj.layer1.cp_radius.grad is None
    assert float(obj.layer2.cp_deform.grad.abs().max()) > 0


def splat(n, seed, sh_degree=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "means": random_points(n, seed),
        "quats": quat.normalize(torch.randn(n, 4, generator=g, dtype=D64)),
        "scales": torch.full((n, 3), 0.02, dtype=D64),
        "opacities": torch.full((n,), 0.9, dtype=D64),
        "sh": torch.rand(n, (sh_degree + 1) ** 2, 3, generator=g, dtype=D64),
        "sh_degree": sh_degree,
    }


def scene_with_motion():
    s0, s1 = splat(100, 0), splat(60, 1, sh_degree=1)
    dyn = DynamicObject(
        "obj_0",
        s0["means"],
        s0["quats"],
        random_points(6, 2, 0.25),
        random_points(40, 3),
        frame_num=T,
    )
    with torch.no_grad():
        dyn.layer1.cp_deform.normal_(0, 0.05)
    return MotionScene(["obj_0", "obj_1"], [s0, s1], {"obj_0": dyn})


def test_scene_container_repeats_static_objects_and_pads_sh():
    scene = scene_with_motion()
    out = scene.frame_gaussians([0, 7, 40])
    assert out["means"].shape == (3, 160, 3) and out["sh"].shape == (160, 4, 3)
    assert out["sh_degree"] == 1
    for f in range(3):  # the static object never moves
        assert torch.equal(out["means"][f, 100:], scene.means[100:])
    assert float((out["means"][2, :100] - out["means"][0, :100]).abs().max()) > 1e-3
    only = scene.frame_gaussians([7], objects=["obj_1"])
    assert only["means"].shape == (1, 60, 3)


def test_state_round_trip_gives_identical_renders(tmp_path):
    from chord.render import cameras
    from chord.render.rasterizer import rasterize

    scene = scene_with_motion()
    scene.dynamic["obj_0"].add_second_layer(random_points(10, 5, 0.25), random_points(70, 6))
    with torch.no_grad():
        scene.dynamic["obj_0"].layer2.cp_deform.normal_(0, 0.02)
        scene.dynamic["obj_0"].layer1.cp_rotation.add_(0.1)
    from chord.training import checkpoint

    tensors, meta = state.to_dict(scene, iteration=300)
    ckpt = {
        "format": checkpoint.CKPT_FORMAT,
        "iteration": 300,
        "motion": tensors,
        "motion_meta": meta,
    }
    checkpoint.save_checkpoint(tmp_path / "s.pt", ckpt)  # as every training state is written
    fresh = scene_with_motion()
    with torch.no_grad():
        fresh.dynamic["obj_0"].layer1.cp_deform.zero_()
    back = checkpoint.load_checkpoint(tmp_path / "s.pt")
    assert back["motion_meta"]["iteration"] == 300
    state.restore(fresh, back["motion"], back["motion_meta"])

    def render(sc):
        g = sc.frame_gaussians([0, 20, 40])
        view = cameras.orbit_viewmats(15.0, 30.0, 2.0)[None, None].expand(3, 1, 4, 4)
        K = cameras.intrinsics(32, 24)[None, None].expand(3, 1, 3, 3)
        rgb, _, _ = rasterize(
            g["means"],
            g["quats"],
            g["scales"][None].expand(3, -1, -1),
            g["opacities"][None].expand(3, -1),
            g["sh"][None].expand(3, -1, -1, -1),
            view,
            K,
            32,
            24,
            sh_degree=g["sh_degree"],
            backend="torch",
        )
        return rgb

    assert torch.equal(render(fresh), render(scene))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a state")
    with pytest.raises(ValueError, match="bad.pt: not a readable training checkpoint"):
        checkpoint.load_checkpoint(bad)


def test_plan_second_layer_on_a_box():
    import trimesh

    from chord.config import settings

    mesh = trimesh.creation.box(extents=(0.3, 0.5, 0.3))
    means = np.asarray(
        mesh.sample(3000, seed=0)
        if "seed" in mesh.sample.__code__.co_varnames
        else mesh.sample(3000)
    )
    method = settings.method_from_mapping({"add_cp_num": 40, "surface_target_num": 400})
    centres, surface, v = state_free_plan(mesh, means, method)
    assert 2 <= len(centres) <= 40
    assert 0 < len(surface) <= 400 * 40 // 20


def state_free_plan(mesh, means, method):
    from chord.motion.model import plan_second_layer

    return plan_second_layer(
        mesh, means, mem_init_voxel_size=0.02, first_layer_count=20, method=method
    )


def test_arap_energy_of_rigid_and_non_rigid_control_point_motion():
    from chord.motion import regularisers

    obj = make_object()
    nbr, mask = regularisers.arap_connectivity(obj.surface)
    sample = torch.arange(obj.surface.shape[0])
    R_q = quat.normalize(torch.tensor([0.9, 0.2, -0.3, 0.1], dtype=D64))
    rigid_table(obj.layer1, R_q, torch.tensor([0.2, 0.0, -0.1], dtype=D64))
    X, _ = obj.deform(range(T), points="surface", detach_weights=True)
    assert float(regularisers.arap_energy(X, nbr, mask, sample)) < 1e-20
    with torch.no_grad():  # now one control point drifts on its own
        obj.layer1.cp_deform[5:, 0, 4] += 0.2
    X, _ = obj.deform(range(T), points="surface", detach_weights=True)
    assert float(regularisers.arap_energy(X, nbr, mask, sample)) > 1e-4


def test_hand_set_table_renders_the_expected_motion(tmp_path):
    """A block whose table lifts it by 0.3 from frame 15 on (entry 16 covers 15–30, entry 32
    covers 31–40): rendered frames show it rising, frame 0 at rest."""
    import trimesh

    from chord.core import media
    from chord.gaussians import gaussian_set
    from chord.render import cameras
    from chord.render.rasterizer import rasterize, splat_tensors

    mesh = trimesh.creation.box(extents=(0.3, 0.5, 0.3))
    mesh.visual.face_colors = (220, 60, 40, 255)
    sp = splat_tensors(gaussian_set.init_from_mesh([mesh], 3000, seed=0), dtype=D64)
    obj = DynamicObject(
        "obj_0", sp["means"], sp["quats"], random_points(8, 3, 0.12), sp["means"][::60], frame_num=T
    )
    with torch.no_grad():
        obj.layer1.cp_deform[16, :, 5] = 0.3  # Δτ_y for frames 15..30
        obj.layer1.cp_deform[32, :, 5] = 0.3  # frames 31..40 (chain(32 + k) holds 32, not 16)
    frames = [0, 10, 15, 30, 40]
    means, quats = obj.deform(frames)
    W, H = 64, 64
    view = cameras.orbit_viewmats(0.0, 0.0, 2.0)[None, None].expand(len(frames), 1, 4, 4)
    K = cameras.intrinsics(W, H)[None, None].expand(len(frames), 1, 3, 3)
    rep = lambda t: t[None].expand(len(frames), *t.shape)  # noqa: E731
    rgb, alpha, _ = rasterize(
        means,
        quats,
        rep(sp["scales"]),
        rep(sp["opacities"]),
        rep(sp["sh"]),
        view,
        K,
        W,
        H,
        sh_degree=0,
        backgrounds=torch.ones(len(frames), 1, 3, dtype=D64),
        backend="torch",
    )
    a = alpha[:, 0, ..., 0]
    rows = torch.arange(H, dtype=D64)[:, None]
    cy = (a * rows).sum((1, 2)) / a.sum((1, 2))  # image row of the alpha centroid per frame
    fy = float(K[0, 0, 1, 1])
    shift = 0.3 * fy / 2.0  # 0.3 up at distance 2 -> pixels
    assert float(cy[1]) == pytest.approx(float(cy[0]), abs=1e-9)  # frames 1..14 at rest
    for f in (2, 3, 4):
        assert float(cy[0] - cy[f]) == pytest.approx(shift, rel=0.1)  # risen, up = −rows
    media.write_png(tmp_path / "frames.png", torch.cat(list(rgb[:, 0]), dim=1))
