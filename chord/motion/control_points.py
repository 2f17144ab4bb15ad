"""Control points of a dynamic object (METHOD §4): farthest-point seeds refined by k-means on
its solid voxels (or surface samples for ``cp_surface_only_objs``), pruned to those that some
Gaussian or surface voxel has among its K nearest."""

from __future__ import annotations

import logging

import numpy as np
import trimesh
from scipy.spatial import cKDTree

from chord.motion.mesh_distance import row_dot
from chord.motion.voxels import mesh_arrays

logger = logging.getLogger(__name__)


def _check_points(name: str, points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"{name} has shape {points.shape}; expected [N, 3]")
    if not np.all(np.isfinite(points)):
        raise ValueError(f"{name} has non-finite values; expected finite coordinates")
    return points


def farthest_point_sampling(points: np.ndarray, k: int) -> np.ndarray:
    """METHOD §4: indices [min(k, N)] int64 of k farthest-point samples of points [N, 3].

    Starts from index 0; each next pick maximises the distance to the picks so far, ties going
    to the lowest index. Deterministic.
    """
    points = _check_points("points", points)
    if int(k) != k or k < 0:
        raise ValueError(f"k is {k}; expected an integer ≥ 0")
    n_pick = min(int(k), len(points))
    picks = np.zeros(n_pick, dtype=np.int64)
    if n_pick == 0:
        return picks
    diff = points - points[0]
    min_sq = row_dot(diff, diff)
    for j in range(1, n_pick):
        nxt = int(np.argmax(min_sq))  # first maximum: lowest index on ties
        picks[j] = nxt
        diff = points - points[nxt]
        np.minimum(min_sq, row_dot(diff, diff), out=min_sq)
    return picks


def kmeans_centres(points: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """METHOD §4: k-means cluster means [K, 3] of points [N, 3], seeded with seeds [K, 3].

    One run of scikit-learn's ``KMeans`` (Lloyd, ``init=seeds``, at most 300 iterations,
    tolerance 1e-4); centres keep the order of their seeds.
    """
    from sklearn.cluster import KMeans

    points = _check_points("points", points)
    seeds = _check_points("seeds", seeds)
    if not 1 <= len(seeds) <= len(points):
        raise ValueError(
            f"seeds has {len(seeds)} rows; expected between 1 and the {len(points)} points"
        )
    km = KMeans(n_clusters=len(seeds), init=seeds, n_init=1, max_iter=300, tol=1e-4)
    km.fit(points)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def place_control_points(solid_centres: np.ndarray, cp_num: int) -> np.ndarray:
    """METHOD §4: control-point centres [M, 3], M = min(cp_num, N), from solid centres [N, 3].

    FPS picks ``cp_num`` seeds over the solid voxel centres (lattice order, from index 0), then
    k-means on the same centres gives the cluster means. With N ≤ cp_num every cell is a centre
    (returned in lattice order).
    """
    solid_centres = _check_points("solid_centres", solid_centres)
    if int(cp_num) != cp_num or cp_num < 1:
        raise ValueError(f"cp_num is {cp_num}; expected an integer ≥ 1")
    if len(solid_centres) == 0:
        raise ValueError("solid_centres is empty; expected at least one solid voxel")
    if len(solid_centres) <= cp_num:
        return solid_centres.copy()
    seeds = solid_centres[farthest_point_sampling(solid_centres, int(cp_num))]
    return kmeans_centres(solid_centres, seeds)


def surface_control_points(mesh: trimesh.Trimesh, cp_num: int, *, seed: int) -> np.ndarray:
    """METHOD §4: ``cp_num`` area-weighted surface samples [cp_num, 3] (cp_surface_only_objs).

    With ``rng = np.random.default_rng(seed)``: faces are drawn with probability ∝ area
    (``rng.choice``), then barycentrics uniformly over the triangle (two ``rng.random`` columns
    r1, r2; weights 1 − √r1, √r1·(1 − r2), √r1·r2).
    """
    if int(cp_num) != cp_num or cp_num < 1:
        raise ValueError(f"cp_num is {cp_num}; expected an integer ≥ 1")
    vertices, faces = mesh_arrays(mesh)
    tris = vertices[faces]
    area = 0.5 * np.linalg.norm(np.cross(tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0]), axis=1)
    total = area.sum()
    if not total > 0:
        raise ValueError(f"mesh has total area {total}; expected > 0 to sample its surface")
    rng = np.random.default_rng(seed)
    face = rng.choice(len(faces), size=int(cp_num), p=area / total)
    r = rng.random((int(cp_num), 2))
    s = np.sqrt(r[:, 0])
    w = np.stack([1.0 - s, s * (1.0 - r[:, 1]), s * r[:, 1]], axis=1)  # [cp_num, 3]
    return np.einsum("nj,njd->nd", w, tris[face])


def _nearest_hit(tree: cKDTree, queries: np.ndarray, k: int, m: int) -> np.ndarray:
    """[m] bool: centres that are among the k nearest of at least one query point [Q, 3]."""
    _, idx = tree.query(queries, k=k)
    hit = np.zeros(m, dtype=bool)
    hit[np.asarray(idx).ravel()] = True
    return hit


def prune_control_points(
    centres: np.ndarray, gaussian_means: np.ndarray, surface_voxels: np.ndarray, n_cp_num: int
) -> np.ndarray:
    """METHOD §4: keep mask [M] bool over control-point centres [M, 3], one pass.

    With K = min(n_cp_num, M), centre k is kept only if it is among the K nearest centres of
    at least one Gaussian mean [G, 3] and of at least one surface voxel [S, 3].
    """
    centres = _check_points("centres", centres)
    gaussian_means = _check_points("gaussian_means", gaussian_means)
    surface_voxels = _check_points("surface_voxels", surface_voxels)
    if int(n_cp_num) != n_cp_num or n_cp_num < 1:
        raise ValueError(f"n_cp_num is {n_cp_num}; expected an integer ≥ 1")
    for name, arr in [
        ("centres", centres),
        ("gaussian_means", gaussian_means),
        ("surface_voxels", surface_voxels),
    ]:
        if len(arr) == 0:
            raise ValueError(f"{name} is empty; expected at least one point")
    m = len(centres)
    k = min(int(n_cp_num), m)
    tree = cKDTree(centres)
    keep = _nearest_hit(tree, gaussian_means, k, m) & _nearest_hit(tree, surface_voxels, k, m)
    logger.debug("pruning keeps %d of %d control points", int(keep.sum()), m)
    return keep


def check_control_point_count(m: int, *, obj: str) -> None:
    """METHOD §4: guard against fewer than 2 control points M after pruning (ValueError)."""
    if m < 2:
        raise ValueError(
            f"{obj}: only {m} control point(s) survive pruning; at least 2 are needed, raise cp_num"
        )
