"""Which points are inside a mesh: generalised winding numbers, whether a mesh is closed, and
its convex hull as a cheap first test (the voxelisation's fill of an open mesh, METHOD §3)."""

from __future__ import annotations

import numpy as np
import trimesh
from scipy.spatial import ConvexHull, Delaunay, QhullError

__all__ = ["inside_hull", "is_closed", "winding_numbers"]


def winding_numbers(vertices: np.ndarray, faces: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Generalised winding number [P] of points [P, 3] w.r.t. a mesh ([V, 3], [F, 3]).

    ±1 inside and 0 outside a closed surface; across holes it degrades gracefully (about 5/6
    at the centre of a box missing one face). libigl's fast (hierarchical) evaluation, imported
    here: only an open mesh's fill and the metrics need it, so importing chord (the training,
    the GPU check) does not.
    """
    import igl

    return igl.fast_winding_number(
        np.ascontiguousarray(vertices, dtype=np.float64),
        np.ascontiguousarray(faces, dtype=np.int64),
        np.ascontiguousarray(points, dtype=np.float64),
    )


def is_closed(vertices: np.ndarray, faces: np.ndarray) -> bool:
    """Every edge shared by exactly two faces once coincident vertices are merged."""
    merged = trimesh.Trimesh(vertices, faces, process=True)
    return bool(merged.is_watertight)


def inside_hull(vertices: np.ndarray, points: np.ndarray) -> np.ndarray:
    """[P] bool: points inside the convex hull of ``vertices`` (all True if it is flat)."""
    try:
        hull = ConvexHull(vertices)
        return Delaunay(vertices[hull.vertices]).find_simplex(points) >= 0
    except QhullError:  # flat or degenerate object: keep every point as a candidate
        return np.ones(len(points), dtype=bool)
