"""The rigid part of a trained motion as node animation (chord.export.rigid_motion): a
scripted rigid motion plays exactly from the file's nodes (the splats at every key are the
project's deform() of their rest positions, to float32), a non-rigid one plays its
trajectories' rigid poses and the log and summary state how much motion that leaves out."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import torch

from chord.export import rigid_motion
from chord.export import trajectories as tj
from chord.gaussians import gaussian_set as gs
from chord.gltf import container
from tests.unit.export.test_trajectories import box_object, script_rigid, scripted, shake
from tests.unit.gltf.test_animated import posed_world
from tests.unit.gltf.test_splats import F32, node_of

C, S = np.array([0.4, -0.3, 1.1]), 0.7  # the normalisation: x_w = x_n/s + c


def gaussians_of(obj) -> gs.GaussianSet:
    """Gaussians at ``obj``'s rest points (the box's corners and centre), normalised units."""
    means = obj.rest_means.double().numpy()
    n = len(means)
    return gs.GaussianSet(
        means=means, log_scales=np.full((n, 3), -3.0), quats=np.tile([1.0, 0, 0, 0], (n, 1)),
        opacity_logits=np.zeros(n), sh=np.full((n, 1, 3), 0.3),
    )  # fmt: skip


def world_splats(doc: dict, blob: bytes, name: str, key: int) -> np.ndarray:
    """The splats of ``name`` in world units at animation key ``key``, from the file alone."""
    node = node_of(doc, name)
    (prim,) = doc["meshes"][doc["nodes"][node]["mesh"]]["primitives"]
    local = container.read_accessor(doc, blob, prim["attributes"]["POSITION"])
    M = posed_world(doc, blob, key)[node]
    return local @ M[:3, :3].T + M[:3, 3]


def test_rigid_and_bent_objects_play_their_rigid_poses(tmp_path, caplog):
    F, fps = 6, 4.0
    rigid = box_object("obj_0", F, centre=(0.1, 0.2, -0.1))
    script_rigid(rigid, *scripted(F, seed=3))
    bent = box_object("obj_2", F, centre=(-0.2, 0.0, 0.3), extents=(0.2, 0.5, 0.2))
    shake(bent, sigma=0.05, seed=4)
    still = box_object("obj_1", F, centre=(0.0, -0.4, 0.0), extents=(1.0, 0.1, 1.0))
    doc = {
        "normalisation": {"centre": C.tolist(), "scale": S},
        "objects": [{"name": n, "role": r} for n, r in
                    (("obj_0", "dynamic"), ("obj_1", "static"), ("obj_2", "dynamic"),
                     ("obj_3", "avoided"))],
    }  # fmt: skip
    scene = SimpleNamespace(dynamic={"obj_0": rigid, "obj_2": bent})
    sets = {o.name: gaussians_of(o) for o in (rigid, still, bent)}
    out = tmp_path / "dynamic_splats_rigid.glb"
    with caplog.at_level(logging.INFO, logger="chord.export.rigid_motion"):
        summary = rigid_motion.write_rigid_splats_glb(
            out, doc=doc, scene=scene, gaussians=sets, frames=F, fps=fps
        )
    doc_, blob = container.read_glb(out)
    assert [doc_["nodes"][i]["name"] for i in doc_["scenes"][0]["nodes"]] == [
        "obj_0", "obj_1", "obj_2"
    ]  # fmt: skip
    assert summary["animated"] == 2 and set(summary["residual_max"]) == {"obj_0", "obj_2"}
    # the rigid object: the file's splats are deform() of the Gaussians, to float32
    means = torch.as_tensor(sets["obj_0"].means, dtype=torch.float32)
    with torch.no_grad():
        X, _ = rigid.deform(torch.arange(F), means, with_rotations=False)
    for k in range(F):
        want = X[k].double().numpy() / S + C
        got = world_splats(doc_, blob, "obj_0", k)
        # float32 storage (positions, keys) and deform()'s float32 chain, as the skinned
        # splats' bound (tests/unit/gltf/test_splats.py): 16·eps of the magnitude
        tol = 16 * F32 * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"key {k}")
    assert summary["residual_relative"]["obj_0"] < 1e-5
    # the bent object: its trajectories' rotations and rigid poses about its Gaussians' centre
    m = sets["obj_2"].means
    origin = (m.min(0) + m.max(0)) / 2
    want_poses = tj.to_original(tj.object_poses(bent, F, origin), C, S)
    np.testing.assert_allclose(
        want_poses.quaternion, tj.object_poses(bent, F).quaternion, rtol=0, atol=1e-12
    )
    node = doc_["nodes"][node_of(doc_, "obj_2")]
    np.testing.assert_allclose(node["translation"], origin / S + C)
    rest = m / S + C
    for k in range(F):
        Tk = want_poses.T[k] @ np.linalg.inv(want_poses.T[0])
        got = world_splats(doc_, blob, "obj_2", k)
        want = rest @ Tk[:3, :3].T + Tk[:3, 3]
        tol = 16 * F32 * max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"key {k}")
    residual = float(want_poses.residual.max())
    assert summary["residual_max"]["obj_2"] == residual > 0.001
    size = float(np.ptp(m, axis=0).max())
    np.testing.assert_allclose(summary["residual_relative"]["obj_2"], residual * S / size)
    # the log states what each dynamic object's rigid pose leaves out
    pct = 100 * summary["residual_relative"]["obj_2"]
    assert f"obj_2 {residual:.4g} ({pct:.2f}% of its size)" in caplog.text
    assert "obj_0 " in caplog.text and "obj_1 " not in caplog.text.split("leaves out")[1]
