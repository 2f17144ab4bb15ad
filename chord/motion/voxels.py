"""Voxelisation (METHOD §3).

Meshes are ``trimesh.Trimesh`` objects in normalised space. Nothing here reads or writes files:
functions take arrays or meshes and return arrays.

Voxel grids are dense boolean arrays over an origin-aligned lattice; only cells near the surface
get an exact point-to-triangle distance (:mod:`chord.motion.mesh_distance`; the rest are "far"),
so voxelising a 300^3 grid costs a flood fill plus work proportional to the surface area. An
open mesh's enclosed cells are found by winding numbers (:mod:`chord.motion.mesh_inside`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import trimesh
from scipy import ndimage

from chord.motion.mesh_distance import point_triangle_sqdist, row_dot, sliver_mask
from chord.motion.mesh_inside import inside_hull, is_closed, winding_numbers

logger = logging.getLogger(__name__)

BARRIER_FACTOR = 0.75  # τ = max(sdf_band, 0.75·v)
PAIR_CHUNK = 2_000_000  # (cell, triangle) pairs per distance chunk: bounds memory (~0.5 GB)
COLUMN_CHUNK = 1_000_000  # lattice columns enumerated at once
_CELL_EPS = 1e-6  # candidate ranges are widened by this many cells against rounding

__all__ = [
    "VoxelGrid",
    "bisect_surface_voxel_size",
    "solid_voxels",
    "surface_voxels",
    "voxelize",
]


@dataclass(frozen=True)
class VoxelGrid:
    """METHOD §3: one voxelisation of a mesh at voxel size ``voxel_size``.

    Cell (x, y, z) of the arrays is lattice cell ``origin_index + (x, y, z)``, centred at
    ``(origin_index + (x, y, z) + 1/2) · voxel_size``.

    Attributes:
        voxel_size: v, the cell side.
        origin_index: [3] int64 lattice index of the grid's first cell.
        occupied: [X, Y, Z] bool, cells not outside (barrier cells and enclosed cells).
        surface: [X, Y, Z] bool, occupied cells within ``br_range``·v of a triangle.
    """

    voxel_size: float
    origin_index: np.ndarray
    occupied: np.ndarray
    surface: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int]:
        """METHOD §3: the grid shape (X, Y, Z), cells along each axis."""
        return tuple(int(s) for s in self.occupied.shape)

    def centres(self, mask: np.ndarray) -> np.ndarray:
        """METHOD §3: centres [M, 3] float64 of the cells of ``mask`` [X, Y, Z], in C order."""
        mask = np.asarray(mask)
        if mask.shape != self.occupied.shape or mask.dtype != bool:
            raise ValueError(
                f"mask has shape {mask.shape} and dtype {mask.dtype}; expected a bool array of "
                f"the grid's shape {self.occupied.shape}"
            )
        idx = np.argwhere(mask)  # C (lattice) order
        return (idx + self.origin_index + 0.5) * self.voxel_size


def mesh_arrays(mesh: trimesh.Trimesh) -> tuple[np.ndarray, np.ndarray]:
    """Vertices [V, 3] float64 and faces [F, 3] int64 of a usable mesh, or a ValueError."""
    vertices = np.asarray(mesh.vertices, dtype=np.float64)
    faces = np.asarray(mesh.faces, dtype=np.int64)
    if faces.ndim != 2 or faces.shape[1] != 3 or len(faces) == 0:
        raise ValueError(f"mesh has faces of shape {faces.shape}; expected [F, 3] with F ≥ 1")
    if not np.all(np.isfinite(vertices)):
        raise ValueError("mesh has non-finite vertices; expected finite coordinates")
    return vertices, faces


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} is {value}; expected a finite number > 0")
    return value


def _chunk_bounds(counts: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Split ``range(len(counts))`` into runs whose ``counts`` sum to ≤ limit (≥ 1 item each)."""
    cum = np.cumsum(counts, dtype=np.int64)
    bounds = []
    start = 0
    n = len(counts)
    while start < n:
        base = cum[start - 1] if start > 0 else 0
        stop = int(np.searchsorted(cum, base + limit, side="right"))
        stop = max(stop, start + 1)
        bounds.append((start, stop))
        start = stop
    return bounds


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts [n]: owner [sum] (item of each slot) and offset [sum] (0..count-1 within it)."""
    owner = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    offset = np.arange(owner.size) - starts[owner]
    return owner, offset


def _near_cells(
    tris: np.ndarray, lo: np.ndarray, dims: np.ndarray, v: float, thresholds: list[float]
) -> list[np.ndarray]:
    """Cells within each threshold of any triangle, as flat C-order indices into the grid.

    Args:
        tris: [F, 3, 3] triangles.
        lo: [3] lattice index of the grid's first cell; dims: [3] cells per axis.
        v: voxel size.
        thresholds: distances ≤ band; returns one [n_j] array (possibly with repeats) per entry.

    Candidates: for each triangle, lattice columns along its dominant normal axis k over its
    AABB expanded by the band, and per column only the cells whose centre lies in the slab
    |n·(x − a)| ≤ band·|n| around its plane (the whole AABB range for slivers), widened by
    1e-6 cell against rounding. Each (cell, triangle) pair then gets an exact distance.
    """
    band = max(thresholds)
    sq_thresholds = [t * t for t in thresholds]
    hits: list[list[np.ndarray]] = [[] for _ in thresholds]
    hi = lo + dims - 1

    a = tris[:, 0]
    ab = tris[:, 1] - a
    ac = tris[:, 2] - a
    normal = np.cross(ab, ac)
    sliver = sliver_mask(ab, ac)
    k_axis = np.argmax(np.abs(normal), axis=1)
    # Candidate lattice range per triangle and axis: centres within [min − band, max + band].
    rng_lo = np.ceil((tris.min(axis=1) - band) / v - 0.5 - _CELL_EPS).astype(np.int64)
    rng_hi = np.floor((tris.max(axis=1) + band) / v - 0.5 + _CELL_EPS).astype(np.int64)
    rng_lo = np.maximum(rng_lo, lo)
    rng_hi = np.minimum(rng_hi, hi)
    strides = np.array([dims[1] * dims[2], dims[2], 1], dtype=np.int64)

    for k in range(3):
        sel = np.flatnonzero((k_axis == k) & np.all(rng_hi >= rng_lo, axis=1))
        if sel.size == 0:
            continue
        ia, ib = [ax for ax in range(3) if ax != k]
        na = rng_hi[sel, ia] - rng_lo[sel, ia] + 1
        nb = rng_hi[sel, ib] - rng_lo[sel, ib] + 1
        n_cols = na * nb
        for t0, t1 in _chunk_bounds(n_cols, COLUMN_CHUNK):
            tri_sel = sel[t0:t1]
            owner, off = _expand(n_cols[t0:t1])
            tri = tri_sel[owner]
            col_a = rng_lo[tri, ia] + off // nb[t0:t1][owner]
            col_b = rng_lo[tri, ib] + off % nb[t0:t1][owner]
            # Slab around the plane, solved for the centre coordinate along k.
            n = normal[tri]
            n_len = np.sqrt(row_dot(n, n))
            rhs = row_dot(n, a[tri]) - n[:, ia] * (col_a + 0.5) * v - n[:, ib] * (col_b + 0.5) * v
            with np.errstate(divide="ignore", invalid="ignore"):
                z0 = (rhs - band * n_len) / n[:, k]
                z1 = (rhs + band * n_len) / n[:, k]
                zlo = np.ceil(np.minimum(z0, z1) / v - 0.5 - _CELL_EPS)
                zhi = np.floor(np.maximum(z0, z1) / v - 0.5 + _CELL_EPS)
            flat_range = sliver[tri] | ~np.isfinite(zlo) | ~np.isfinite(zhi)
            k_lo, k_hi = rng_lo[tri, k], rng_hi[tri, k]
            zlo = np.where(flat_range, k_lo, np.clip(zlo, k_lo, k_hi + 1)).astype(np.int64)
            zhi = np.where(flat_range, k_hi, np.clip(zhi, k_lo - 1, k_hi)).astype(np.int64)
            n_cells = np.maximum(zhi - zlo + 1, 0)
            for c0, c1 in _chunk_bounds(n_cells, PAIR_CHUNK):
                c_owner, c_off = _expand(n_cells[c0:c1])
                t_idx = tri[c0:c1][c_owner]
                cell = np.empty((c_owner.size, 3), dtype=np.int64)
                cell[:, ia] = col_a[c0:c1][c_owner]
                cell[:, ib] = col_b[c0:c1][c_owner]
                cell[:, k] = zlo[c0:c1][c_owner] + c_off
                centre = (cell + 0.5) * v
                sq = point_triangle_sqdist(centre, a[t_idx], ab[t_idx], ac[t_idx], sliver[t_idx])
                flat = (cell - lo) @ strides
                for j, sq_t in enumerate(sq_thresholds):
                    hits[j].append(flat[sq <= sq_t])
    return [np.concatenate(h) if h else np.zeros(0, np.int64) for h in hits]


def voxelize(
    mesh: trimesh.Trimesh,
    voxel_size: float,
    *,
    br_range: float = 0.75,
    sdf_band: float = 0.0,
    fill_open: bool = True,
    surface_only: bool = False,
) -> VoxelGrid:
    """METHOD §3: occupied and surface cells of ``mesh`` on the lattice of voxel size v.

    The grid spans lattice cells [⌊a_min/v⌋, ⌈a_max/v⌉) per axis of the mesh's AABB (at least
    one cell per axis), with no padding. With d the exact unsigned distance from a cell centre
    to the nearest triangle: barrier is d ≤ τ = max(sdf_band, 0.75·v); outside is the free
    (non-barrier) cells 6-connected to a free cell on the grid boundary; occupied is every cell
    not outside (closed cavities count as inside); surface is occupied with d ≤ br_range·v.

    Our decision: an open (non-watertight) mesh lets the outside flood through its holes, so
    with ``fill_open`` a free cell also counts as occupied where the mesh's generalised winding
    number has |w| ≥ 0.5. Only cells inside the convex hull are tested (outside it |w| ≤ 0.5);
    a closed mesh skips the test, as flood fill is then exact. ``surface_only`` limits the
    test to cells within the surface band, for callers that read only ``surface``.

    Args:
        mesh: triangle mesh, [V, 3] vertices and [F, 3] faces; need not be watertight.
        voxel_size: v > 0.
        br_range: surface threshold in voxels (≥ 0).
        sdf_band: lower bound on the barrier distance τ (≥ 0).

    Returns:
        VoxelGrid with ``occupied`` and ``surface`` of shape [X, Y, Z].
    """
    v = _check_positive("voxel_size", voxel_size)
    if not np.isfinite(br_range) or br_range < 0:
        raise ValueError(f"br_range is {br_range}; expected a finite number ≥ 0")
    if not np.isfinite(sdf_band) or sdf_band < 0:
        raise ValueError(f"sdf_band is {sdf_band}; expected a finite number ≥ 0")
    vertices, faces = mesh_arrays(mesh)

    tris = vertices[faces]  # [F, 3, 3]; unreferenced vertices do not widen the AABB
    lo = np.floor(tris.min(axis=(0, 1)) / v).astype(np.int64)
    hi = np.ceil(tris.max(axis=(0, 1)) / v).astype(np.int64)
    hi = np.maximum(hi, lo + 1)  # flat object on a lattice plane: keep one cell
    dims = hi - lo
    shape = tuple(int(s) for s in dims)

    tau = max(float(sdf_band), BARRIER_FACTOR * v)
    surf_dist = float(br_range) * v
    barrier_flat, near_flat = _near_cells(tris, lo, dims, v, [tau, surf_dist])

    barrier = np.zeros(shape, dtype=bool)
    barrier.ravel()[barrier_flat] = True
    labels, n_labels = ndimage.label(~barrier, structure=ndimage.generate_binary_structure(3, 1))
    boundary = np.concatenate(
        [
            labels[0].ravel(), labels[-1].ravel(),
            labels[:, 0].ravel(), labels[:, -1].ravel(),
            labels[:, :, 0].ravel(), labels[:, :, -1].ravel(),
        ]
    )  # fmt: skip
    is_outside = np.zeros(n_labels + 1, dtype=bool)
    is_outside[boundary] = True
    is_outside[0] = False  # label 0 is the barrier
    occupied = ~is_outside[labels]

    near = np.zeros(shape, dtype=bool)
    near.ravel()[near_flat] = True
    if fill_open:
        candidates = ~occupied & near if surface_only else ~occupied
        if candidates.any() and not is_closed(vertices, faces):
            _fill_open(occupied, candidates, vertices, faces, lo, v)
    surface = occupied & near
    logger.debug(
        "voxelize v=%.6g: grid %s, %d occupied, %d surface cells",
        v, shape, int(occupied.sum()), int(surface.sum()),
    )  # fmt: skip
    return VoxelGrid(voxel_size=v, origin_index=lo, occupied=occupied, surface=surface)


def _fill_open(occupied, candidates, vertices, faces, lo, v) -> None:
    """Mark candidate cells with |winding number| ≥ 0.5 as occupied (in place)."""
    flat = np.flatnonzero(candidates)
    centres = (np.stack(np.unravel_index(flat, candidates.shape), axis=1) + lo + 0.5) * v
    keep = inside_hull(vertices[np.unique(faces)], centres)
    flat, centres = flat[keep], centres[keep]
    if len(flat):
        inside = np.abs(winding_numbers(vertices, faces, centres)) >= 0.5
        occupied.ravel()[flat[inside]] = True
        logger.debug("open mesh: %d of %d tested cells filled", int(inside.sum()), len(flat))


def solid_voxels(mesh: trimesh.Trimesh, voxel_size: float) -> np.ndarray:
    """METHOD §3: centres [N, 3] of the occupied cells at ``voxel_size``, in lattice (C) order."""
    grid = voxelize(mesh, voxel_size)
    return grid.centres(grid.occupied)


def surface_voxels(
    mesh: trimesh.Trimesh, voxel_size: float, *, br_range: float = 0.75
) -> np.ndarray:
    """METHOD §3: centres [S, 3] of the surface cells at ``voxel_size``, in lattice (C) order."""
    grid = voxelize(mesh, voxel_size, br_range=br_range, surface_only=True)
    return grid.centres(grid.surface)


def bisect_surface_voxel_size(
    mesh: trimesh.Trimesh,
    v_start: float,
    target_num: int,
    *,
    br_range: float = 0.75,
    tol: float = 1e-6,
) -> tuple[np.ndarray, float]:
    """METHOD §3: the surface set [S, 3] and voxel size v* found by bisection on |surface(v)|.

    l = v_start/10, r = 10·v_start, v* = v_start. While |r − l| > tol: m = (l + r)/2; if
    |surface(m)| > target_num then l = m, else r = m and v* = m. Returns (surface(v*), v*); v*
    stays v_start (and the set is surface(v_start)) when no midpoint meets the target.
    """
    v_start = _check_positive("v_start", v_start)
    tol = _check_positive("tol", tol)
    if int(target_num) != target_num or target_num < 1:
        raise ValueError(f"target_num is {target_num}; expected an integer ≥ 1")
    left, right, v_star = v_start / 10.0, 10.0 * v_start, v_start
    best = None  # surface(v*) once some midpoint met the target: never recomputed
    steps = 0
    while abs(right - left) > tol:
        mid = (left + right) / 2.0  # strictly inside (l, r): no midpoint repeats
        if not left < mid < right:  # tol below float resolution: the interval cannot shrink
            break
        centres = surface_voxels(mesh, mid, br_range=br_range)
        steps += 1
        if len(centres) > target_num:
            left = mid
        else:
            right, v_star, best = mid, mid, centres
    if best is None:
        best = surface_voxels(mesh, v_start, br_range=br_range)
    logger.info(
        "surface voxel size v*=%.6g after %d steps: %d cells (target %d)",
        v_star, steps, len(best), target_num,
    )  # fmt: skip
    return best, v_star
