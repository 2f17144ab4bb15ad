"""Per-scene metrics of a trained motion (docs/outputs.md, "Metrics"). Each is a small pure
function of tensors or arrays; lengths are in normalised scene units (longest side 1.2) and
time in frames.

Trajectories are Gaussian means X [T, N, 3] over frames t = 0..T−1, frame 0 the rest pose.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.ndimage import gaussian_filter
from torch import Tensor

from chord.motion import regularisers
from chord.motion.contact import surface_samples  # noqa: F401  (the training's contact points)

PSNR_CAP = 100.0  # dB, for identical images (MSE 0)


def displacement(X: Tensor) -> dict[str, float]:
    """Motion magnitude: ‖x_t − x_0‖ over frames t ≥ 1 and points -> mean and max."""
    T = X.shape[0]
    if T < 2 or X.shape[1] == 0:
        return {"mean_displacement": 0.0, "max_displacement": 0.0}
    d = (X[1:] - X[:1]).norm(dim=-1)  # [T-1, N]
    return {"mean_displacement": float(d.mean()), "max_displacement": float(d.max())}


def smoothness(X: Tensor) -> dict[str, float]:
    """Temporal smoothness: mean ‖x_{t+1} − 2x_t + x_{t−1}‖ (acceleration, per frame²) and
    mean ‖x_{t+2} − 3x_{t+1} + 3x_t − x_{t−1}‖ (jerk, per frame³); NaN with too few frames."""
    T = X.shape[0]
    acc = X[2:] - 2 * X[1:-1] + X[:-2] if T >= 3 else None  # [T-2, N, 3]
    jerk = X[3:] - 3 * X[2:-1] + 3 * X[1:-2] - X[:-3] if T >= 4 else None  # [T-3, N, 3]
    mean = lambda d: float(d.norm(dim=-1).mean()) if d is not None and d.numel() else math.nan  # noqa: E731
    return {"mean_acceleration": mean(acc), "mean_jerk": mean(jerk)}


def arap_residual(X: Tensor, nbr: Tensor, mask: Tensor) -> list[float]:
    """Rigidity per frame [T]: sqrt(Σ_i Σ_j ‖e_ij(t) − R_{i,t}·e_ij(0)‖² / Σ_i Σ_j ‖e_ij(0)‖²)
    over every point i and its kept ARAP edges (METHOD §16's energy with all points, as a
    fraction of the rest edge lengths); 0 for a locally rigid motion, frame 0 always 0.

    X: points over frames [T, V, 3]; nbr, mask [V, k] from
    :func:`chord.motion.regularisers.arap_connectivity`.
    """
    T, V = X.shape[:2]
    X = X.double()
    every = torch.arange(V)
    m = mask.to(X.dtype)[..., None]  # [V, k, 1]
    rest = float((((X[0][nbr] - X[0][:, None]) * m) ** 2).sum())
    if rest == 0.0:
        return [0.0] * T
    out = [0.0]
    for t in range(1, T):
        e = float(regularisers.arap_energy(X[[0, t]], nbr, mask, every))
        out.append(math.sqrt(max(e, 0.0) / rest))
    return out


def rigidity(scene, frames: int) -> list[float]:
    """:func:`arap_residual` per frame [``frames``] of a trained scene's dynamic objects, their
    surface voxels moved by the trained deformation, all together."""
    Xs, nbrs, masks, offset = [], [], [], 0
    with torch.no_grad():
        for obj in scene.dynamic.values():
            X, _ = obj.deform(torch.arange(frames), "surface", with_rotations=False)
            nbr, mask = regularisers.arap_connectivity(obj.surface)
            Xs.append(X)
            nbrs.append(nbr + offset)
            masks.append(mask)
            offset += X.shape[1]
    if not Xs:
        return [0.0] * frames
    k = max(n.shape[1] for n in nbrs)  # objects with fewer voxels have fewer neighbours
    nbr = torch.cat([torch.nn.functional.pad(n, (0, k - n.shape[1])) for n in nbrs])
    mask = torch.cat([torch.nn.functional.pad(m, (0, k - m.shape[1])) for m in masks])
    return arap_residual(torch.cat(Xs, 1), nbr, mask)


def ground_penetration(Y: Tensor, ground: float) -> dict[str, float]:
    """Ground penetration of heights Y [T, N]: the deepest point below ``ground`` (0 if none)
    and the fraction of (frame, point) pairs below it."""
    if Y.numel() == 0:
        return {"ground_depth": 0.0, "ground_fraction": 0.0}
    below = (ground - Y).clamp(min=0)
    return {
        "ground_depth": float(below.max()),
        "ground_fraction": float((Y < ground).double().mean()),
    }


def recovery_error(X: Tensor, X_true: Tensor) -> dict:
    """Distance to a scripted ground-truth motion X_true [T, N, 3] over frames t ≥ 1: mean,
    max and per frame [T] of ‖x_t − x*_t‖, and the mean error relative to the mean scripted
    displacement (0 = recovered, 1 = no better than standing still)."""
    if X.shape != X_true.shape:
        raise ValueError(f"trained {tuple(X.shape)} and scripted {tuple(X_true.shape)} differ")
    X, X_true = X.double(), X_true.double()
    err = (X - X_true).norm(dim=-1)  # [T, N]
    if X.shape[0] < 2 or X.shape[1] == 0:
        return {"recovery_error": 0.0, "recovery_max_error": 0.0, "recovery_relative": 0.0,
                "recovery_per_frame": [0.0] * X.shape[0]}  # fmt: skip
    moved = float((X_true[1:] - X_true[:1]).norm(dim=-1).mean())
    mean = float(err[1:].mean())
    return {
        "recovery_error": mean,
        "recovery_max_error": float(err[1:].max()),
        "recovery_relative": mean / moved if moved > 0 else math.nan,
        "recovery_per_frame": [float(e) for e in err.mean(1)],
    }


def _as_float(img) -> np.ndarray:
    a = np.asarray(img.detach().cpu() if hasattr(img, "detach") else img)
    return a.astype(np.float64) / 255.0 if a.dtype == np.uint8 else a.astype(np.float64)


def psnr(a, b) -> float:
    """PSNR in dB of images [H, W, 3] (uint8, or float in [0, 1]); capped at 100 dB."""
    a, b = _as_float(a), _as_float(b)
    if a.shape != b.shape:
        raise ValueError(f"psnr: image sizes differ, {a.shape} and {b.shape}")
    mse = float(((a - b) ** 2).mean())
    return PSNR_CAP if mse <= 10 ** (-PSNR_CAP / 10) else -10.0 * math.log10(mse)


def ssim(a, b, *, sigma: float = 1.5) -> float:
    """SSIM (Wang et al. 2004: Gaussian window σ = 1.5, K1 = 0.01, K2 = 0.03, data range 1)
    of images [H, W, 3], averaged over pixels and channels."""
    a, b = _as_float(a), _as_float(b)
    if a.shape != b.shape:
        raise ValueError(f"ssim: image sizes differ, {a.shape} and {b.shape}")
    C1, C2 = 0.01**2, 0.03**2
    blur = lambda x: gaussian_filter(x, sigma=(sigma, sigma, 0), truncate=3.5)  # noqa: E731
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    num = (2 * mu_a * mu_b + C1) * (2 * cov + C2)
    den = (mu_a**2 + mu_b**2 + C1) * (var_a + var_b + C2)
    return float((num / den).mean())


# -- interaction between objects: interpenetration and floating ------------------------------

# Scene units. A sample within this distance of another object's surface touches it: it is
# neither inside (penetrating) nor apart. It absorbs float32 rounding of the normalised meshes
# and of the deformation (~1e-7 at the scene's size), so a block resting on a slab is not
# "inside" it by a rounding error; it is far below a pixel (~0.004 at the default camera).
CONTACT_BAND = 1e-5


def _against(P: np.ndarray, V: np.ndarray, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points [S, 3] against a mesh: (inside [S] bool, distance to its surface [S])."""
    import igl  # libigl: here alone, so that importing chord does not need it

    P = np.ascontiguousarray(P, dtype=np.float64)
    V = np.ascontiguousarray(V, dtype=np.float64)
    F = np.ascontiguousarray(F, dtype=np.int64)
    w = igl.fast_winding_number(V, F, P)  # [S]
    dist = np.sqrt(igl.point_mesh_squared_distance(P, V, F)[0])  # [S]
    return (np.abs(w) >= 0.5) & (dist > CONTACT_BAND), dist


def _summary(inside: np.ndarray, dist: np.ndarray) -> dict[str, float]:
    return {
        "fraction": float(inside.mean()),
        "depth": float(dist[inside].max()) if inside.any() else 0.0,
        "separation": 0.0 if inside.any() else float(dist.min()),
    }


def penetration(points: np.ndarray, vertices: np.ndarray, faces: np.ndarray) -> dict[str, float]:
    """How points [S, 3] (one object's surface samples) sit against a mesh ([V, 3], [F, 3]):

    - ``fraction``: the share of the points inside it, i.e. with generalised winding number
      |w| ≥ 1/2 (libigl's fast winding numbers: robust to holes, open or self-intersecting
      user meshes, and to either face orientation) and farther than :data:`CONTACT_BAND`
      from its surface;
    - ``depth``: the largest distance of such an inside point to the surface (0 if none);
    - ``separation``: the smallest distance of any point to the surface, 0 when any point is
      inside (the two are in contact or overlap).
    """
    return _summary(*_against(points, vertices, faces))


def pair_interaction(P: np.ndarray, V: np.ndarray, faces: np.ndarray) -> dict[str, list[float]]:
    """:func:`penetration` per frame of an object's surface samples P [T, S, 3] against
    another object's mesh, vertices V [T, V, 3] (deformed per frame) or [V, 3] (static: every
    frame's samples in one query, one build of libigl's trees), faces [F, 3]: lists [T] of
    ``fraction``, ``depth`` and ``separation``."""
    T, S = P.shape[:2]
    if V.ndim == 2:
        inside, dist = _against(P.reshape(T * S, 3), V, faces)
        frames = [(inside[t * S : (t + 1) * S], dist[t * S : (t + 1) * S]) for t in range(T)]
    else:
        frames = [_against(P[t], V[t], faces) for t in range(T)]
    out = {"fraction": [], "depth": [], "separation": []}
    for inside, dist in frames:
        for k, v in _summary(inside, dist).items():
            out[k].append(v)
    return out


def interaction_summary(pairs: list[dict], *, rest_tolerance: float) -> dict:
    """Scene scalars and per-frame curves [T] from :func:`pair_interaction` records, each
    also holding ``object`` and ``other`` names. A pair *rests* when its separation at frame
    0 is at most ``rest_tolerance``; its ``gap`` per frame is separation(t) − separation(0),
    the floating that opens later (negative when it closes further). Adds ``resting`` and
    ``gap`` to each record. Scalars (frames t ≥ 1, every pair; 0 without pairs or with one
    frame):

    - ``penetration_fraction``, ``penetration_depth``: the largest share inside and the
      deepest inside sample;
    - ``penetration_depth_rest``: the deepest at frame 0 (the rest pose's own overlap);
    - ``penetration_excess``: max over pairs of depth(t) − depth(0), what the motion adds;
    - ``float_gap``: the largest gap of a resting pair (None without resting pairs);
    - ``resting_pairs``: how many pairs rest.
    """
    T = len(pairs[0]["depth"]) if pairs else 0
    for p in pairs:
        p["resting"] = bool(p["separation"][0] <= rest_tolerance)
        p["gap"] = [s - p["separation"][0] for s in p["separation"]] if p["resting"] else None
    later = range(1, T)
    big = lambda key: max((p[key][t] for p in pairs for t in later), default=0.0)  # noqa: E731
    resting = [p for p in pairs if p["resting"]]
    gaps = [p["gap"][t] for p in resting for t in later]
    curve = lambda key, ps: [max((p[key][t] for p in ps), default=0.0) for t in range(T)]  # noqa: E731
    return {
        "penetration_fraction": big("fraction"),
        "penetration_depth": big("depth"),
        "penetration_depth_rest": max((p["depth"][0] for p in pairs), default=0.0),
        "penetration_excess": max(
            (p["depth"][t] - p["depth"][0] for p in pairs for t in later), default=0.0
        ),
        "float_gap": max(gaps, default=0.0) if resting else None,
        "resting_pairs": len(resting),
        "per_frame": {
            "penetration_fraction": curve("fraction", pairs),
            "penetration_depth": curve("depth", pairs),
            "float_gap": curve("gap", resting) if resting else None,
        },
    }
