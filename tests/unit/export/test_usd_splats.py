"""The trained Gaussians in scene.usda (issue 48, chord.export.usd_splats): pxr opens the
stage, each object has one prim of the schema's type with only the schema's attributes, and
at every time code the values pxr evaluates (the prim's attributes placed by its
local-to-world transform) equal the trained Gaussians at that frame in Z-up: positions,
rotations, linear scales, linear opacities and the colour the SH give in every direction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pxr import Usd, UsdVol

from chord.export import usd, usd_splats
from chord.render import sh as sh_basis
from tests.unit.export.test_usd import F32, C, F, S
from tests.unit.export.test_usd import scene as scene  # noqa: F401 (the fixture)

A = usd.Y_UP_TO_Z_UP


def splat_prim(stage, name: str):
    prim = stage.GetPrimAtPath(f"/World/{name}/splats")
    splat = UsdVol.ParticleField3DGaussianSplat(prim)
    assert splat and prim.GetTypeName() == "ParticleField3DGaussianSplat", name
    return prim, splat


def attr(prim, name: str, t=None) -> np.ndarray:
    """An attribute's value at time code t as float64 numpy (quatf[]: x, y, z, w)."""
    value = prim.GetAttribute(name).Get(Usd.TimeCode.Default() if t is None else t)
    return np.asarray(value, dtype=np.float64)


def world(prim, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions [n, 3] and rotation matrices [n, 3, 3] of a splat prim in the world at t."""
    M = np.array(UsdVol.ParticleField3DGaussianSplat(prim).ComputeLocalToWorldTransform(t))
    p = attr(prim, "positions", t) @ M[:3, :3] + M[3, :3]  # row vectors
    q = attr(prim, "orientations", t)[:, [3, 0, 1, 2]]  # numpy's quatf[] is x, y, z, w
    R_local = usd.rotmat(q)
    return p, np.einsum("ij,njk->nik", M[:3, :3].T, R_local)


def trained(scene, name: str):
    """The trained Gaussians of ``name`` per frame, world units, Z-up: positions [F, n, 3],
    rotation matrices [F, n, 3, 3] (A·R·Aᵀ)."""
    g = scene.gaussians[name]
    if name in scene.dyn:
        with torch.no_grad():
            X, Q = scene.dyn[name].deform(torch.arange(F))
        X, Q = X.double().numpy(), Q.double().numpy()
    else:
        X, Q = g.means[None].repeat(F, 0), g.quats[None].repeat(F, 0).astype(np.float64)
    x = (X / S + C) @ A.T
    R = np.einsum("ij,fnjk,lk->fnil", A, usd.rotmat(Q), A)
    return x, R


def sh_colours(coeffs: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """gsplat's SH colour (before +0.5) [n, m, 3] of coefficients [n, K, 3] in directions
    [m, 3]."""
    K = coeffs.shape[1]
    d = torch.as_tensor(dirs, dtype=torch.float64)[None].expand(len(coeffs), -1, -1)
    c = torch.as_tensor(coeffs, dtype=torch.float64)[:, None].expand(-1, len(dirs), -1, -1)
    return sh_basis.spherical_harmonics(int(round(K**0.5)) - 1, d, c).numpy()


def test_each_object_has_a_prim_of_the_schema_with_the_schemas_attributes(scene):
    stage = Usd.Stage.Open(str(scene.out))
    layer = scene.out.parent / "splats.usd"
    assert stage.GetRootLayer().subLayerPaths == ["./splats.usd"]
    assert layer.read_text().startswith("#usda")  # small: text (TEXT_NUMBERS)
    assert scene.summary["splats"]["format"] == "usda"
    definition = Usd.SchemaRegistry().FindConcretePrimDefinition("ParticleField3DGaussianSplat")
    names = set(definition.GetPropertyNames())  # the installed schema's, not ours
    # what a 3DGS renderer needs, as the schema names it
    sh = "radiance:sphericalHarmonics"
    need = {"positions", "orientations", "scales", "opacities", "extent", f"{sh}Degree",
            f"{sh}Coefficients"}  # fmt: skip
    assert need <= names
    for name, kind in scene.summary["objects"].items():
        prim, splat = splat_prim(stage, name)
        authored = {a.GetName() for a in prim.GetAuthoredAttributes()}
        assert need <= authored <= names, (name, authored - names)
        n = len(scene.gaussians[name])
        degree = scene.gaussians[name].sh_degree
        assert splat.GetRadianceSphericalHarmonicsDegreeAttr().Get() == degree
        assert len(attr(prim, "radiance:sphericalHarmonicsCoefficients")) == n * (degree + 1) ** 2
        sampled = kind in ("skinned", "points")
        for a in ("positions", "orientations", "extent"):
            want = list(range(F)) if sampled else []
            assert prim.GetAttribute(a).GetTimeSamples() == want, (name, a)
        for a in ("scales", "opacities", "radiance:sphericalHarmonicsCoefficients"):
            assert prim.GetAttribute(a).GetNumTimeSamples() == 0
    assert sorted(scene.summary["splats"]["sampled"]) == ["obj_2", "obj_3"]


def test_positions_and_rotations_at_every_time_code_are_the_trained_ones(scene):
    """Exact to float32 storage: the local values (16 roundings of the magnitudes) placed by
    the Xform's float32 orient; the rigid object moves by its pose, its scripted motion."""
    stage = Usd.Stage.Open(str(scene.out))
    for name in scene.summary["objects"]:
        prim, splat = splat_prim(stage, name)
        x, R = trained(scene, name)
        tol = 64 * F32 * max(1.0, np.abs(x).max())
        for t in range(F):
            p, Rw = world(prim, t)
            np.testing.assert_allclose(p, x[t], rtol=0, atol=tol, err_msg=f"{name} {t}")
            np.testing.assert_allclose(Rw, R[t], rtol=0, atol=32 * F32, err_msg=f"{name} {t}")
            lo, hi = attr(prim, "extent", t)
            local = attr(prim, "positions", t)
            assert (local >= lo).all() and (local <= hi).all()
        if name != "obj_1":
            assert np.abs(x[-1] - x[0]).max() > 1e-3, name  # it moves


def test_scales_opacities_and_colours_are_the_trained_ones_in_the_schemas_conventions(scene):
    """Scales linear (exp of the log-scales, input units), opacities linear (sigmoid of the
    logits), to float32 storage; the SH turned to Z-up give, in every direction A·d, the
    colour the trained SH give in d (float32 coefficients: a few roundings of Σ|c||Y|)."""
    stage = Usd.Stage.Open(str(scene.out))
    rng = np.random.default_rng(0)
    d = rng.normal(size=(50, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    for name in scene.summary["objects"]:
        prim, _ = splat_prim(stage, name)
        g = scene.gaussians[name]
        want_scale = np.exp(g.log_scales.astype(np.float64)) / S
        np.testing.assert_allclose(attr(prim, "scales"), want_scale, rtol=2 * F32, atol=0)
        want_opacity = 1.0 / (1.0 + np.exp(-g.opacity_logits.astype(np.float64)))
        np.testing.assert_allclose(attr(prim, "opacities"), want_opacity, rtol=2 * F32, atol=0)
        K = g.sh.shape[1]
        got = attr(prim, "radiance:sphericalHarmonicsCoefficients").reshape(len(g), K, 3)
        want = sh_colours(g.sh.astype(np.float64), d)
        tol = 8 * F32 * K * 3.0 * np.abs(got).max()  # |Y_k| ≤ 3 for degree ≤ 3
        np.testing.assert_allclose(sh_colours(got, d @ A.T), want, rtol=0, atol=tol)
        assert np.abs(sh_colours(got, d) - want).max() > 0.05  # the axis change matters


def test_a_large_layer_is_a_crate_with_the_same_values(scene, tmp_path, monkeypatch):
    """Above TEXT_NUMBERS numbers the splat layer is USD's crate; scene.usda (text) finds it
    and pxr reads the same values."""
    from types import SimpleNamespace

    monkeypatch.setattr(usd_splats, "TEXT_NUMBERS", scene.summary["splats"]["numbers"] - 1)
    out = tmp_path / "big" / "scene.usda"
    summary = usd.write_usd(
        out, doc=scene.doc, scene=SimpleNamespace(dynamic=scene.dyn), sources=scene.sources,
        gaussians=scene.gaussians, frames=F, fps=scene.summary["frames"] and 10.0,
        out_splats=out.parent / "splats.usd",
    )  # fmt: skip
    assert summary["splats"]["format"] == "usdc"
    assert (out.parent / "splats.usd").read_bytes()[:8] == b"PXR-USDC"
    assert out.read_text().startswith("#usda")
    small, big = Usd.Stage.Open(str(scene.out)), Usd.Stage.Open(str(out))
    for name in summary["objects"]:
        a, _ = splat_prim(small, name)
        b, _ = splat_prim(big, name)
        for t in range(F):
            for key in ("positions", "orientations", "scales", "opacities"):
                np.testing.assert_array_equal(attr(a, key, t), attr(b, key, t))


def test_sh_rotation_is_orthogonal_and_keeps_degrees_apart():
    """The matrix of a rotation on real SH is block-diagonal by degree and orthogonal."""
    M = usd_splats.sh_rotation(3, A)
    np.testing.assert_allclose(M @ M.T, np.eye(16), atol=1e-12)
    for lv in range(4):
        block = slice(lv * lv, (lv + 1) ** 2)
        off = np.delete(M[block], np.s_[lv * lv : (lv + 1) ** 2], axis=1)
        assert np.abs(off).max(initial=0.0) < 1e-12
    assert M[0, 0] == pytest.approx(1.0)
