"""Object trajectories (chord.export.trajectories): the rigid fit recovers a scripted rigid
motion to float precision, proper rotations only, a bend leaves a residual, and
trajectories.npz opens with numpy alone (no pickles) in both unit systems."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from chord.export import trajectories as tj
from chord.motion.model import DynamicObject
from tests.conftest import box

F64, F32 = float(np.finfo(np.float64).eps), float(np.finfo(np.float32).eps)


def fit_tolerance(eps: float, rest: np.ndarray, tracks: np.ndarray) -> tuple[float, float]:
    """(rotation, translation) tolerances of a fit to data rounded at ``eps``: each of the 3K
    coordinates off by up to eps·|x| (|x| the largest magnitude) perturbs the cross-covariance
    by at most √(3K)·eps·|x|·(the rest points' spread); the rotation moves by that over the
    sum of the two smallest singular values of the centred rest points (the weakest rotation
    axis); twice that for the fit's own arithmetic. The translation: that rotation error at the
    points plus their rounding."""
    mag = max(1.0, float(np.abs(tracks).max()), float(np.abs(rest).max()))
    sv = np.linalg.svd(rest - rest.mean(0), compute_uv=False)
    perturb = np.sqrt(3 * len(rest)) * eps * mag
    rot = 2 * perturb / (sv[1] + sv[2])
    return rot, rot * mag + 2 * perturb


def scripted(F: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A rigid motion: rotations [F, 3, 3] (frame 0 the identity) and translations [F, 3]."""
    rng = np.random.default_rng(seed)
    R = Rotation.from_rotvec(rng.normal(scale=0.8, size=(F, 3))).as_matrix()
    t = rng.normal(scale=0.3, size=(F, 3))
    R[0], t[0] = np.eye(3), 0.0
    return R, t


def test_a_scripted_rigid_motion_is_recovered_to_float64_precision():
    rng = np.random.default_rng(1)
    rest = rng.uniform(-0.5, 0.5, size=(40, 3)) + [2.0, -1.0, 0.5]
    R, t = scripted(12)
    tracks = np.einsum("fij,kj->fki", R, rest) + t[:, None]
    poses = tj.rigid_poses(rest, tracks)
    rot_tol, pos_tol = fit_tolerance(F64, rest, tracks)
    np.testing.assert_allclose(poses.T[:, :3, :3], R, rtol=0, atol=rot_tol)
    origin = rest.mean(0)
    np.testing.assert_allclose(poses.origin, origin)
    # the body frame's position is where its origin went: the tracks' centroid
    np.testing.assert_allclose(poses.position, tracks.mean(1), rtol=0, atol=pos_tol)
    np.testing.assert_allclose(poses.T[:, :3, 3], R @ origin + t, rtol=0, atol=pos_tol)
    assert poses.residual.max() <= pos_tol
    # frame 0 is the rest pose exactly; T[t]·T[0]⁻¹ moves rest points onto the tracks
    np.testing.assert_array_equal(poses.T[0], [[1, 0, 0, *origin[:1]], [0, 1, 0, origin[1]],
                                               [0, 0, 1, origin[2]], [0, 0, 0, 1]])  # fmt: skip
    moved = np.einsum("fij,kj->fki", poses.T @ np.linalg.inv(poses.T[0]), np.c_[rest, np.ones(40)])
    np.testing.assert_allclose(moved[..., :3], tracks, rtol=0, atol=pos_tol)
    # quaternions (w, x, y, z) of the same rotations, continuous in time
    want = Rotation.from_matrix(R).as_quat()[:, [3, 0, 1, 2]]
    dots = np.abs(np.sum(poses.quaternion * want, axis=1))
    np.testing.assert_allclose(dots, 1.0, rtol=0, atol=rot_tol)
    assert poses.quaternion[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (np.sum(poses.quaternion[1:] * poses.quaternion[:-1], axis=1) >= 0).all()
    got = Rotation.from_quat(poses.quaternion[:, [1, 2, 3, 0]]).as_matrix()
    np.testing.assert_allclose(got, R, rtol=0, atol=rot_tol)


def test_a_given_origin_places_the_body_frame():
    rest = np.random.default_rng(2).normal(size=(9, 3))
    R, t = scripted(4, seed=3)
    tracks = np.einsum("fij,kj->fki", R, rest) + t[:, None]
    o = np.array([0.3, -0.2, 1.0])
    poses = tj.rigid_poses(rest, tracks, origin=o)
    _, pos_tol = fit_tolerance(F64, rest, tracks)
    np.testing.assert_allclose(poses.position, R @ o + t, rtol=0, atol=pos_tol)


def test_the_fit_returns_proper_rotations_for_a_mirrored_set():
    """A reflection fits mirrored points best; the fit keeps det R = +1 and reports what the
    rotation cannot reach as residual."""
    rest = np.random.default_rng(4).normal(size=(10, 3))
    mirrored = rest * [1.0, 1.0, -1.0]
    R, _, residual = tj.fit_rigid(rest, mirrored[None])
    assert np.linalg.det(R[0]) == pytest.approx(1.0)
    np.testing.assert_allclose(R[0] @ R[0].T, np.eye(3), atol=1e-12)
    assert residual[0] > 0.1


def test_quaternions_of_matrices_match_scipy_in_every_branch():
    R = Rotation.random(500, random_state=5).as_matrix()
    R[:4] = [np.eye(3), np.diag([1.0, -1, -1]), np.diag([-1.0, 1, -1]), np.diag([-1.0, -1, 1])]
    q = tj.quaternion_from_matrix(R)
    want = Rotation.from_matrix(R).as_quat()[:, [3, 0, 1, 2]]
    np.testing.assert_allclose(np.abs(np.sum(q * want, axis=1)), 1.0, atol=1e-12)
    assert (q[:, 0] >= 0).all()


# --- a trained-like object: the project's own deformation ------------------------------------


def box_object(name: str, frames: int, centre=(0.0, 0.0, 0.0), extents=(0.4, 0.3, 0.2)):
    """A DynamicObject over a box's corners and centre (its Gaussians) with nine control
    points inside it; the motion starts at the identity."""
    mesh = box(extents, centre)
    pts = torch.as_tensor(mesh.vertices, dtype=torch.float32)
    c = torch.as_tensor(centre, dtype=torch.float32)
    centres = c + torch.as_tensor(mesh.vertices - centre, dtype=torch.float32) * 0.5
    centres = torch.cat([centres, c[None]])
    quats = torch.tensor([[1.0, 0, 0, 0]]).repeat(len(pts), 1)
    return DynamicObject(name, pts, quats, centres, pts, frame_num=frames)


def script_rigid(obj, R: np.ndarray, t: np.ndarray) -> None:
    """Give ``obj`` the rigid motion x -> R_f·x + t_f (normalised units) through a per-frame
    table: every control point turns by R_f and moves to R_f·c_k + t_f."""
    layer = obj.layer1
    q = Rotation.from_matrix(R).as_quat()[:, [3, 0, 1, 2]]
    c = layer.centres.double().numpy()
    tau = np.einsum("fij,kj->fki", R, c) + t[:, None] - c
    with torch.no_grad():
        layer.cp_deform.zero_()
        layer.cp_deform[1 : len(R) + 1, :, :4] = torch.as_tensor(q[:, None], dtype=torch.float32)
        layer.cp_deform[1 : len(R) + 1, :, 4:] = torch.as_tensor(tau, dtype=torch.float32)
    layer.per_frame = True


def shake(obj, sigma: float = 0.03, seed: int = 0) -> None:
    """A non-rigid (trained-like) motion: the first-layer table ~ N(0, σ²)."""
    with torch.no_grad():
        obj.layer1.cp_deform.normal_(0, sigma, generator=torch.Generator().manual_seed(seed))


def test_a_scripted_rigid_motion_of_an_object_is_recovered_to_float32_precision():
    """deform() in float32 of a rigid per-frame table: the poses are those scripted, to what
    float32 tracks allow."""
    F = 6
    obj = box_object("obj_0", F, centre=(0.1, 0.2, -0.1))
    R, t = scripted(F, seed=6)
    script_rigid(obj, R, t)
    rest, tracks = tj.control_point_tracks(obj, F)
    want = np.einsum("fij,kj->fki", R, rest) + t[:, None]
    assert np.abs(tracks - want).max() < 64 * F32  # deform() is that rigid motion
    poses = tj.object_poses(obj, F)
    rot_tol, pos_tol = fit_tolerance(F32, rest, tracks)
    np.testing.assert_allclose(poses.T[:, :3, :3], R, rtol=0, atol=rot_tol)
    np.testing.assert_allclose(poses.position, R @ rest.mean(0) + t, rtol=0, atol=pos_tol)
    assert poses.residual.max() <= pos_tol


def test_a_bend_shows_a_residual():
    """The top of a box turns while its bottom stays: no rigid pose reproduces that."""
    F = 5
    obj = box_object("obj_0", F, extents=(0.2, 0.6, 0.2))
    layer = obj.layer1
    c = layer.centres.double().numpy()
    angle = np.linspace(0.0, 0.8, F)[:, None] * (c[:, 1] > 0)  # [F, M]: the top row turns
    R = Rotation.from_rotvec(np.einsum("fm,i->fmi", angle, [0.0, 0.0, 1.0])).as_matrix()
    q = Rotation.from_matrix(R.reshape(-1, 3, 3)).as_quat()[:, [3, 0, 1, 2]].reshape(F, -1, 4)
    with torch.no_grad():
        layer.cp_deform[1 : F + 1, :, :4] = torch.as_tensor(q, dtype=torch.float32)
    layer.per_frame = True
    poses = tj.object_poses(obj, F)
    assert poses.residual[0] == 0.0
    assert (np.diff(poses.residual) > 0).all() and poses.residual[-1] > 0.01


def test_trajectories_npz_opens_without_pickles(tmp_path):
    F, fps = 4, 8.0
    objs = {"obj_0": box_object("obj_0", F, centre=(0.3, 0.0, 0.0)),
            "obj_2": box_object("obj_2", F, centre=(-0.3, 0.0, 0.0))}  # fmt: skip
    R, t = scripted(F, seed=7)
    script_rigid(objs["obj_0"], R, t)
    shake(objs["obj_2"])
    c, s = np.array([1.0, -2.0, 0.5]), 0.25
    doc = {
        "scene": "two",
        "normalisation": {"centre": c.tolist(), "scale": s},
        "objects": [
            {"name": n, "role": r, "source": f"/data/two/{n}.glb",
             "bounds": [[-0.5, -0.2, -0.1], [0.5, 0.2, 0.1]]}
            for n, r in (("obj_0", "dynamic"), ("obj_1", "static"), ("obj_2", "dynamic"))
        ],
    }  # fmt: skip
    sidecar = tj.write_trajectories(
        tmp_path / "trajectories.npz", tmp_path / "trajectories.json",
        doc=doc, scene=SimpleNamespace(dynamic=objs), frames=F, fps=fps,
    )  # fmt: skip
    with np.load(tmp_path / "trajectories.npz", allow_pickle=False) as z:
        a = {k: z[k] for k in z.files}
    assert a["names"].tolist() == ["obj_0", "obj_2"] and a["fps"] == fps
    np.testing.assert_array_equal(a["time"], np.arange(F) / fps)
    N = a["normalised_to_original"]
    for name in ("obj_0", "obj_2"):
        K = len(objs[name].layer1.centres)
        assert a[f"{name}/T"].shape == (F, 4, 4) and a[f"{name}/tracks"].shape == (F, K, 3)
        assert a[f"{name}/quaternion"].shape == (F, 4) and a[f"{name}/residual"].shape == (F,)
        # the two unit systems: T = N·T_n·S, tracks x_w = x_n/s + c, residuals / s
        S = np.diag([s, s, s, 1.0])
        np.testing.assert_allclose(a[f"{name}/T"], N @ a[f"{name}/T_normalised"] @ S, atol=1e-12)
        np.testing.assert_allclose(a[f"{name}/tracks"], a[f"{name}/tracks_normalised"] / s + c)
        np.testing.assert_allclose(a[f"{name}/residual"], a[f"{name}/residual_normalised"] / s)
        np.testing.assert_allclose(a[f"{name}/position"], a[f"{name}/T"][:, :3, 3])
        # the pose moves the rest tracks onto the tracks, up to the residual
        T, x = a[f"{name}/T"], a[f"{name}/tracks"]
        moved = np.einsum("fij,kj->fki", T @ np.linalg.inv(T[0]), np.c_[x[0], np.ones(K)])[..., :3]
        rms = np.sqrt(np.mean(np.sum((moved - x) ** 2, -1), -1))
        np.testing.assert_allclose(rms, a[f"{name}/residual"], rtol=1e-6, atol=1e-9)
    assert a["obj_0/residual"].max() < 1e-4 < a["obj_2/residual"].max()
    doc_json = json.loads(Path(tmp_path / "trajectories.json").read_text())
    assert doc_json == sidecar and doc_json["format"] == "chord-trajectories/1"
    assert doc_json["quaternion_order"].startswith("wxyz") and doc_json["fps"] == fps
    assert [o["name"] for o in doc_json["objects"]] == ["obj_0", "obj_1", "obj_2"]
    assert doc_json["objects"][0]["source"] == "obj_0.glb"
    assert doc_json["objects"][2]["residual_max"] == pytest.approx(a["obj_2/residual"].max())
    assert "residual_max" not in doc_json["objects"][1]  # static
    np.testing.assert_allclose(doc_json["normalisation"]["normalised_to_original"], N)
