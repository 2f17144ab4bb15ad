"""The oracle teacher: scripted target Gaussians and the exact RF-SDS gradient (z − z*)/t."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chord.config import settings
from chord.gaussians import gaussian_set
from chord.guidance import rfsds
from chord.guidance.oracle import OracleGuidance, scripted_gaussians
from chord.motion import scripted
from chord.plan import results_layout
from chord.render import cameras
from chord.render.rasterizer import splat_tensors
from chord.scene import demo, ingestion
from chord.stages import ingest

D64 = torch.float64


@pytest.fixture(scope="module")
def hop(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    data = demo.write_demo_scene("hop", root / "data")
    method = settings.method_from_mapping({})
    doc = ingest.run(
        data=data,
        out_json=results_layout.scene_json(root, "hop"),
        out_meshes=results_layout.meshes_dir(root, "hop"),
        method=method,
        scene="hop",
    )
    rest = {}
    for o in doc["objects"]:
        parts = ingestion.load_parts(
            ingestion.mesh_path(results_layout.scene_json(root, "hop"), doc, o["name"])
        )
        rest[o["name"]] = splat_tensors(
            gaussian_set.init_from_mesh(parts, 1500, seed=o["id"]), dtype=D64
        )
    motion = scripted.load_motion(data / "motion.json")
    return doc, rest, motion


def test_scripted_targets_follow_motion_json(hop):
    doc, rest, motion = hop
    means, quats = scripted_gaussians(doc, rest, motion, 41)
    n0 = rest["obj_0"]["means"].shape[0]
    assert means.shape == (41, n0 + rest["obj_1"]["means"].shape[0], 3)
    torch.testing.assert_close(means[0, :n0], rest["obj_0"]["means"])  # frame 0 at rest
    assert torch.equal(quats[0, :n0], rest["obj_0"]["quats"])
    assert torch.equal(means[:, n0:], rest["obj_1"]["means"].expand(41, -1, -1))  # static
    c = np.asarray(doc["normalisation"]["centre"])
    s = doc["normalisation"]["scale"]
    world = rest["obj_0"]["means"].numpy() / s + c
    expect = (scripted.apply_motion(world, motion["objects"]["obj_0"], 20) - c) * s
    np.testing.assert_allclose(means[20, :n0].numpy(), expect, atol=1e-9)
    # hop is rigid: every Gaussian turns by the scripted rotation
    rot = torch.as_tensor(np.asarray(motion["objects"]["obj_0"]["rigid"]["rotations"][20]))
    from chord.core import quaternion as quat

    expect_q = quat.normalize(quat.multiply(rot, quat.normalize(rest["obj_0"]["quats"])))
    dots = (quats[20, :n0] * expect_q).sum(-1).abs()
    assert float(dots.min()) > 1 - 1e-6
    with pytest.raises(ValueError, match="motion.json has 41 frames but frame_num is 21"):
        scripted_gaussians(doc, rest, motion, 21)


def test_oracle_sds_gradient_is_z_minus_target_over_t(hop):
    doc, rest, motion = hop
    means, quats = scripted_gaussians(doc, rest, motion, 41)
    cat = lambda k: torch.cat([rest[n][k] for n in rest])  # noqa: E731
    target = {
        "means": means,
        "quats": quats,
        "scales": cat("scales"),
        "opacities": cat("opacities"),
        "sh": cat("sh"),
        "sh_degree": 0,
    }
    oracle = OracleGuidance(target, width=32, height=24, pool=4, backend="torch")
    view = cameras.orbit_viewmats(15.0, 60.0, 2.0)
    K = cameras.intrinsics(32, 24)
    bg = torch.ones(3, dtype=D64)
    z_star = oracle.condition(None, viewmat=view, K=K, background=bg)
    assert z_star.shape == (3, 41, 6, 8)
    g = torch.Generator().manual_seed(0)
    z = torch.rand(3, 41, 6, 8, generator=g, dtype=D64)
    eps = torch.randn(z.shape, generator=g, dtype=D64)
    t = 0.7
    z_t = rfsds.noisy_latents(z, eps, t)
    v = oracle.velocity(z_t[None], t, [z_star])
    grad = rfsds.sds_grad(z, eps, v[0], 1.0)
    torch.testing.assert_close(grad, (z - z_star) / t, atol=1e-12, rtol=1e-12)
    # the target video moves: the last frame differs from the first
    video = oracle.render_target(view, K, bg)
    assert float((video[-1] - video[0]).abs().max()) > 0.1
    # the gain scales the latent (so the target and the gradient) and must be positive
    strong = OracleGuidance(target, width=32, height=24, pool=4, gain=3.0, backend="torch")
    torch.testing.assert_close(
        strong.condition(None, viewmat=view, K=K, background=bg), 3.0 * z_star, rtol=1e-12, atol=0
    )
    with pytest.raises(ValueError, match="gain must be positive"):
        OracleGuidance(target, width=32, height=24, pool=4, gain=0.0)
