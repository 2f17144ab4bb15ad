"""The trained Gaussians in USD (issue 48): one ``UsdVol.ParticleField3DGaussianSplat`` prim
``/World/<name>/splats`` per object, in a layer of their own (``splats.usd`` beside
``scene.usda``, which sublayers it), in the Xform frame of :mod:`chord.export.usd`.

The conversions from the trained Gaussians (raw 3DGS parameters, normalised space, glTF's
Y-up; METHOD §2) to the schema's conventions are DESIGN §9's:

- ``positions`` (point3f): x_w = x_n/s + c, turned to Z-up and into the object's Xform frame;
- ``orientations`` (quatf): the unit quaternion, turned to Z-up (A·R·Aᵀ) and into the Xform
  frame; Gf.Quatf is (w, x, y, z) but a ``Vt.QuatfArray`` as numpy is (x, y, z, w);
- ``scales`` (float3): linear, exp(log-scale)/s, in the Gaussian's own axes (unchanged by
  the axis change);
- ``opacities`` (float): linear in [0, 1], sigmoid(logit);
- ``radiance:sphericalHarmonicsCoefficients`` (float3): per Gaussian its (d+1)² coefficients
  contiguous, degree l = 0..d and within it m = −l..l (gsplat's and KHR_gaussian_splatting's
  order), the raw coefficients (colour = 0.5 + Σ c·Y, the DC term without the 0.5), each
  degree's block turned to Z-up (:func:`sh_rotation`), ``radiance:sphericalHarmonicsDegree``
  the object's degree.

A static object's prim is unanimated. A dynamic object written ``rigid`` by
:func:`chord.export.usd.motion_kind` keeps its rest values under its time-sampled Xform (the
pose is its motion, up to the residual bound there); any other has ``positions``,
``orientations`` and ``extent`` sampled at every time code, each frame's Gaussians (the PLY
sequence's) in the Xform's frame at that code. The SH are the training's, evaluated there with
world-space view directions and not turned by the motion; in the prim's frame at rest (the
Xform unrotated at frame 0).

The layer is text (``usda``) up to :data:`TEXT_NUMBERS` numbers, else USD's binary crate:
text costs about 12 bytes a number against the crate's 4 (BENCHMARKS.md, ``bench/usd_size.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from chord.core import quaternion
from chord.export import trajectories
from chord.gaussians.gaussian_set import GaussianSet
from chord.gltf import splats as gltf_splats
from chord.render import sh as sh_basis

#: numbers (floats) above which the splat layer is written as a crate: 10⁶ numbers are about
#: 12 MB of text (the demo scenes stay well under it; a 100k-Gaussian object is over it)
TEXT_NUMBERS = 1_000_000
#: a Gaussian's extent: its centre ± this many of its largest standard deviation
EXTENT_SIGMAS = 3.0


def sh_rotation(degree: int, A: np.ndarray) -> np.ndarray:
    """The [K, K] matrix M (K = (degree+1)²) with Y(d)·M = Y(Aᵀ·d) for every direction d,
    Y the row of gsplat's real SH basis (:mod:`chord.render.sh`): coefficients c of a colour
    in the old frame are M·c in the frame turned by A. Block-diagonal by degree; solved by
    least squares on a spread of directions (exact to rounding: the equations hold)."""
    K = (degree + 1) ** 2
    n = 4 * K + 8  # more directions than unknowns per degree
    i = np.arange(n) + 0.5
    z = 1.0 - 2.0 * i / n
    phi = np.pi * (1.0 + 5.0**0.5) * i  # a Fibonacci sphere
    r = np.sqrt(1.0 - z * z)
    dirs = np.stack([r * np.cos(phi), r * np.sin(phi), z], 1)

    def basis(d: np.ndarray) -> np.ndarray:
        d = torch.as_tensor(d, dtype=torch.float64)
        cols = []
        for k in range(K):
            c = torch.zeros(n, K, 3, dtype=torch.float64)
            c[:, k, 0] = 1.0
            cols.append(sh_basis.spherical_harmonics(degree, d, c)[:, 0])
        return torch.stack(cols, 1).numpy()

    M, *_ = np.linalg.lstsq(basis(dirs), basis(dirs @ A), rcond=None)  # dirs @ A = (Aᵀ·d)ᵀ
    return M


def rotate_sh(sh: np.ndarray, A: np.ndarray) -> np.ndarray:
    """SH coefficients [n, K, 3] of colours in one frame as those in the frame turned by A."""
    K = sh.shape[1]
    M = sh_rotation(int(round(np.sqrt(K))) - 1, A)
    return np.einsum("jk,nkc->njc", M, sh)


def _qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of (w, x, y, z) quaternions, float64 (:mod:`chord.core.quaternion`)."""
    return quaternion.multiply(torch.as_tensor(a), torch.as_tensor(b)).numpy()


def _extent(p: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[2, 3] bounds of Gaussians at ``p`` [n, 3] with linear ``scales`` [n, 3]."""
    reach = EXTENT_SIGMAS * scales.max(1, keepdims=True)
    return np.stack([(p - reach).min(0), (p + reach).max(0)])


def _vec(a: np.ndarray, kind):
    return kind.FromNumpy(np.ascontiguousarray(a, dtype=np.float32))


def _quats(q_wxyz: np.ndarray):
    """A quatf[] value of unit quaternions (w, x, y, z) [n, 4]: numpy's view of
    ``Vt.QuatfArray`` is (x, y, z, w), Gf.Quatf's memory order."""
    from pxr import Vt

    return _vec(np.asarray(q_wxyz)[:, [1, 2, 3, 0]], Vt.QuatfArray)


class SplatFrames:
    """One object's Gaussians in world units and Y-up: positions [F, n, 3] and unit
    quaternions (w, x, y, z) [F, n, 4] per frame (F = 1 for a static object) and the values
    the motion leaves alone (:func:`chord.gltf.splats.splat_values`: scale, opacity, SH)."""

    def __init__(self, g: GaussianSet, centre, scale: float, motion=None, where: str = ""):
        v = gltf_splats.splat_values(g, np.asarray(centre, np.float64), scale, g.sh_degree, where)
        self.scales, self.opacities, self.sh = v["scale"], v["opacity"], v["sh"]
        if motion is None:
            self.positions = v["position"][None]
            self.quats = v["rotation"][None][..., [3, 0, 1, 2]]
        else:
            X, Q = motion  # normalised, [F, n, 3] and [F, n, 4] (w, x, y, z)
            self.positions = np.asarray(X, np.float64) / scale + np.asarray(centre, np.float64)
            Q = np.asarray(Q, np.float64)
            self.quats = Q / np.linalg.norm(Q, axis=-1, keepdims=True)


def object_motion(obj, frames: int):
    """deform() of ``obj``'s Gaussians over frames 0..F−1 (the PLY sequence's values)."""
    with torch.no_grad():
        X, Q = obj.deform(torch.arange(frames, device=obj.rest_means.device))
    return X.double().cpu().numpy(), Q.double().cpu().numpy()


def add_splats(stage, path: str, s: SplatFrames, *, A, origin, pose=None) -> int:
    """Define ``path`` as a ParticleField3DGaussianSplat of ``s`` in the frame of its parent
    Xform: at rest at ``origin`` (world, Y-up) for a static object (``pose`` None), else with
    the Xform's pose per frame, ``pose`` = (R_u [F, 3, 3], p_u [F, 3]) as pxr evaluates the
    file's ops, Z-up; sampled per frame when ``s`` has more than one. Returns the numbers
    written."""
    from pxr import UsdVol, Vt

    prim = UsdVol.ParticleField3DGaussianSplat.Define(stage, path)
    F = len(s.positions)
    q_axes = np.concatenate([s.quats[..., :1], s.quats[..., 1:] @ A.T], -1)  # A·R·Aᵀ
    if pose is None:
        local = [(s.positions[0] - origin) @ A.T]
        q_local = [q_axes[0]]
    else:
        R_u, p_u = pose
        q_inv = trajectories.quaternion_from_matrix(R_u) * [1.0, -1.0, -1.0, -1.0]
        moved = s.positions @ A.T - p_u[:F, None]
        local = np.einsum("fji,fnj->fni", R_u[:F], moved)  # R_uᵀ·(x − p_u)
        q_local = _qmul(q_inv[:F, None], q_axes)
    positions, orientations = prim.CreatePositionsAttr(), prim.CreateOrientationsAttr()
    extent = prim.CreateExtentAttr()
    for t in range(F):
        code = t if F > 1 else None
        args = () if code is None else (code,)
        positions.Set(_vec(local[t], Vt.Vec3fArray), *args)
        orientations.Set(_quats(q_local[t]), *args)
        extent.Set(_vec(_extent(local[t], s.scales), Vt.Vec3fArray), *args)
    prim.CreateScalesAttr(_vec(s.scales, Vt.Vec3fArray))
    prim.CreateOpacitiesAttr(_vec(s.opacities, Vt.FloatArray))
    degree = int(round(np.sqrt(s.sh.shape[1]))) - 1
    prim.CreateRadianceSphericalHarmonicsDegreeAttr(degree)
    sh = rotate_sh(s.sh, A)
    prim.CreateRadianceSphericalHarmonicsCoefficientsAttr(_vec(sh.reshape(-1, 3), Vt.Vec3fArray))
    prim.CreateProjectionModeHintAttr("perspective")  # gsplat's projection (METHOD §2)
    prim.CreateSortingModeHintAttr("zDepth")  # gsplat sorts by view-space depth
    n = len(s.scales)
    return F * n * 7 + F * 6 + n * (3 + 1) + sh.size
