"""Contact and support losses (ours, issue 36; METHOD §16 penalises no penetration): a dynamic
object's surface entering the scene's static objects beyond the overlap its rest pose already
has, and an object resting on them rising off them.

The points are the evaluation's own: :func:`surface_samples` of the object's mesh (area-uniform,
seeded by the object's id), deformed as the Gaussians are, so the loss and the metric judge the
same points.

The static objects' signed distance (negative inside) is sampled once per run on a regular
grid of nodes (libigl, at build only); in the loop it is read by trilinear interpolation
(``torch.nn.functional.grid_sample``), differentiable in the query points and on the scene's
device. Inside is the evaluate stage's rule (``chord.evaluation.metrics.penetration``): a
generalised winding number |w| ≥ 1/2, robust to open, holed or self-intersecting meshes and to
either face orientation, so the loss and the metric agree on which points are inside (up to the
grid's interpolation, within a cell of a surface).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from chord.motion.mesh_inside import winding_numbers

# Cells along the longest side of the static objects' box: 1/128 of the scene's 1.2 is 0.0094
# scene units, about 2.5 pixels at the default reference camera; the box is padded by PAD_CELLS
# cells, so a point off the grid is outside every static object (its border value is positive).
GRID_CELLS = 128
PAD_CELLS = 4
# Scene units: depth added to the rest pose's within this is no penetration (float32 rounding of
# the interpolation and the deformation), as the evaluation's CONTACT_BAND (a test keeps them
# equal).
CONTACT_BAND = 1e-5
# Surface samples per dynamic object: the evaluation's INTERACTION_SAMPLES (a test keeps them
# equal), so the training's points are the metric's.
CONTACT_SAMPLES = 2048
# A dynamic object rests on the static ones when its lowest point is within SUPPORT_GATE_CELLS
# grid cells of them at frame 0 (the grid resolves a cell); its resting points are those within
# SUPPORT_BAND (scene units) of that lowest one, the evaluation's REST_TOLERANCE (a test keeps
# them equal).
SUPPORT_GATE_CELLS = 2.0
SUPPORT_BAND = 0.005


@dataclass
class DistanceGrid:
    """Signed distance [D, H, W] at the nodes of a regular grid (z, y, x order: node (k, j, i) at
    ``lo + (i, j, k)·cell``), negative inside; ``lo`` [3] its first node, ``hi`` [3] its last."""

    values: Tensor
    lo: Tensor
    hi: Tensor

    @property
    def cell(self) -> float:
        """The side of a cell (cubic)."""
        return float((self.hi[0] - self.lo[0]) / (self.values.shape[-1] - 1))

    def to(self, device) -> DistanceGrid:
        return DistanceGrid(self.values.to(device), self.lo.to(device), self.hi.to(device))

    def __call__(self, points: Tensor) -> Tensor:
        """Signed distance at points [..., 3]: trilinear inside the grid; beyond it, the
        nearest grid point's plus the way there (an upper bound of the true distance, exact
        above a plane), so a point far off keeps a gradient pointing back."""
        shape = points.shape[:-1]
        lo, hi = self.lo.to(points.dtype), self.hi.to(points.dtype)
        near = torch.minimum(torch.maximum(points, lo), hi)
        u = (near.reshape(1, -1, 1, 1, 3) - lo) / (hi - lo) * 2 - 1  # grid_sample's [-1, 1]
        vol = self.values.to(points.dtype)[None, None]
        out = F.grid_sample(vol, u, mode="bilinear", padding_mode="border", align_corners=True)
        beyond = (points - near).square().sum(-1).clamp(min=1e-30).sqrt()
        return out.reshape(shape) + torch.where(points.eq(near).all(-1), 0.0, beyond)


def surface_samples(vertices: np.ndarray, faces: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` points [n, 3] uniformly distributed over a triangle mesh's area ([V, 3], [F, 3]):
    a face with probability ∝ its area, then uniform barycentrics (square-root trick),
    deterministic for ``seed``. A ValueError when the mesh has zero area."""
    v = np.asarray(vertices, dtype=np.float64)
    tri = v[np.asarray(faces, dtype=np.int64)]  # [F, 3, 3]
    area = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    total = float(area.sum())
    if not np.isfinite(total) or total <= 0:
        raise ValueError("surface_samples: the mesh has zero (or non-finite) total area")
    rng = np.random.default_rng(seed)
    face = rng.choice(len(area), size=n, p=area / total)
    r1, r2 = np.sqrt(rng.random(n)), rng.random(n)
    a, b, c = tri[face, 0], tri[face, 1], tri[face, 2]  # [n, 3] each
    return (1 - r1)[:, None] * a + (r1 * (1 - r2))[:, None] * b + (r1 * r2)[:, None] * c


def signed_distance_grid(
    meshes: list[tuple[np.ndarray, np.ndarray]], *, cells: int = GRID_CELLS, pad: int = PAD_CELLS
) -> DistanceGrid:
    """The union of triangle meshes (vertices [V, 3], faces [F, 3]) as a :class:`DistanceGrid` of
    cubic cells, ``cells`` along its box's longest side, padded by ``pad`` cells: at each node
    the least signed distance over the meshes (−distance where |winding number| ≥ 1/2)."""
    import igl  # libigl: at build only, so that the loop and importing chord do not need it

    if not meshes:
        raise ValueError("signed_distance_grid: no meshes")
    every = np.concatenate([np.asarray(v, dtype=np.float64) for v, _ in meshes])
    lo, hi = every.min(0), every.max(0)
    cell = max(float((hi - lo).max()), 1e-6) / cells
    lo = lo - pad * cell
    n = [int(math.ceil((h - low) / cell)) + 1 + pad for low, h in zip(lo, hi, strict=True)]
    axes = [lo[a] + cell * np.arange(n[a]) for a in range(3)]
    z, y, x = np.meshgrid(axes[2], axes[1], axes[0], indexing="ij")
    nodes = np.ascontiguousarray(np.stack([x, y, z], -1).reshape(-1, 3))
    sdf = np.full(len(nodes), np.inf)
    for v, f in meshes:
        v = np.ascontiguousarray(v, dtype=np.float64)
        f = np.ascontiguousarray(f, dtype=np.int64)
        w = winding_numbers(v, f, nodes)
        d = np.sqrt(igl.point_mesh_squared_distance(nodes, v, f)[0])
        sdf = np.minimum(sdf, np.where(np.abs(w) >= 0.5, -d, d))
    values = torch.as_tensor(sdf.reshape(n[2], n[1], n[0]), dtype=torch.float32)
    last = torch.as_tensor([axes[a][-1] for a in range(3)], dtype=torch.float64)
    return DistanceGrid(values, torch.as_tensor(lo, dtype=torch.float64), last)


def depth(grid: DistanceGrid, points: Tensor) -> Tensor:
    """How deep points [..., 3] are inside the grid's objects: max(−signed distance, 0)."""
    return (-grid(points)).clamp(min=0)


def contact_loss(grid: DistanceGrid, X: Tensor, rest: Tensor) -> Tensor:
    """mean over frames t ≥ 1 and points i of max(depth(X_t[i]) − rest[i] − b, 0)² (b: the
    :data:`CONTACT_BAND`): X [T, V, 3] a
    dynamic object's contact points over frames (frame 0 the rest pose), ``rest`` [V] its depth at
    rest (:func:`depth` of X_0). A point already inside at rest may stay as deep (objects that
    touch or overlap at rest are not pushed apart); only what the motion adds is penalised, as
    the evaluation's ``penetration_excess`` measures it. Its gradient moves a point along the
    distance's gradient: out by the shortest way."""
    if X.shape[0] < 2 or X.shape[1] == 0:
        return X.sum() * 0.0
    excess = (depth(grid, X[1:]) - rest.to(X.dtype) - CONTACT_BAND).clamp(min=0)
    return excess.square().mean()


def support_loss(grid: DistanceGrid, X: Tensor, rest: Tensor) -> Tensor:
    """mean over frames t ≥ 1 and resting points i of max(d_t[i] − d_0[i] − b, 0)² (b:
    :data:`SUPPORT_BAND`), d_t[i] the signed distance of X_t[i]: X [T, V, 3] the object's
    contact points over frames, ``rest`` [V] their signed distance at frame 0. The resting
    points are those within b of the lowest one, d_0 ≤ s_0 + b; an object whose lowest point s_0
    is farther than :data:`SUPPORT_GATE_CELLS` cells from the static objects rests on none: 0.
    Each resting point may move along its support (the object slides or turns on it) but not
    away from it, so neither rising nor rocking on an edge lifts the object off: the
    evaluation's floating (``float_gap``, the pair's separation growing from frame 0) cannot
    open."""
    s0 = rest.min() if rest.numel() else rest.new_tensor(math.inf)
    if X.shape[0] < 2 or not bool(s0 <= SUPPORT_GATE_CELLS * grid.cell):
        return X.sum() * 0.0
    resting = rest <= s0 + SUPPORT_BAND
    rise = grid(X[1:, resting]) - rest[resting].to(X.dtype) - SUPPORT_BAND  # [T - 1, R]
    return rise.clamp(min=0).square().mean()
