"""Unit tests for chord.motion.voxels, mesh_distance, mesh_inside and control_points (METHOD §3,
§4): each test checks a known answer."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh
from trimesh.triangles import closest_point as trimesh_closest_point

from chord.motion import control_points, mesh_distance, mesh_inside
from chord.motion import voxels as vx

V = 0.015  # METHOD §3 init_voxel_size


def _rotated(mesh: trimesh.Trimesh, seed: int) -> trimesh.Trimesh:
    rng = np.random.default_rng(seed)
    out = mesh.copy()
    out.apply_transform(trimesh.transformations.random_rotation_matrix(rng.random(3)))
    return out


def _brute_distances(mesh: trimesh.Trimesh, grid: vx.VoxelGrid) -> np.ndarray:
    """[X, Y, Z] exact distances from every cell centre of the grid (trimesh reference)."""
    centres = grid.centres(np.ones(grid.shape, dtype=bool))
    _, dist, _ = trimesh.proximity.closest_point(mesh, centres)
    return dist.reshape(grid.shape)


def _box_cells(grid: vx.VoxelGrid, centre, half: float, tau: float) -> np.ndarray:
    """[X, Y, Z] analytic occupancy of a solid axis-aligned cube: centre within tau of it."""
    axes = []
    for ax in range(3):
        idx = grid.origin_index[ax] + np.arange(grid.shape[ax])
        c = (idx + 0.5) * grid.voxel_size
        axes.append(np.maximum(np.abs(c - centre[ax]) - half, 0.0))  # per-axis outside excess
    ex, ey, ez = np.meshgrid(*axes, indexing="ij")
    return ex**2 + ey**2 + ez**2 <= tau**2


def _drop_faces(mesh: trimesh.Trimesh, normal) -> trimesh.Trimesh:
    keep = ~np.all(np.isclose(mesh.face_normals, normal), axis=1)
    return trimesh.Trimesh(mesh.vertices, mesh.faces[keep], process=False)


# ---------------------------------------------------------------------------------------------
# Distance kernel
# ---------------------------------------------------------------------------------------------


def test_distance_matches_trimesh_on_random_points():
    rng = np.random.default_rng(0)
    tris = rng.normal(size=(5000, 3, 3))
    pts = rng.normal(size=(5000, 3)) * 2.0
    ref = np.linalg.norm(trimesh_closest_point(tris, pts) - pts, axis=1)
    np.testing.assert_allclose(mesh_distance.point_triangle_distance(pts, tris), ref, atol=1e-12)


def test_distance_upper_bounded_by_dense_samples():
    # Independent brute force: the minimum over dense barycentric samples is ≥ d and
    # exceeds d by at most the sample spacing.
    rng = np.random.default_rng(1)
    tris = rng.normal(size=(50, 3, 3))
    pts = rng.normal(size=(50, 3))
    n = 200
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    ok = i + j <= n
    u, w = i[ok] / n, j[ok] / n
    bary = np.stack([1 - u - w, u, w], axis=1)  # [B, 3]
    samples = np.einsum("bj,tjd->tbd", bary, tris)  # [T, B, 3]
    brute = np.linalg.norm(samples - pts[:, None], axis=2).min(axis=1)
    d = mesh_distance.point_triangle_distance(pts, tris)
    spacing = np.linalg.norm(tris - tris[:, [1, 2, 0]], axis=2).max(axis=1) / n
    assert np.all(d <= brute + 1e-12)
    assert np.all(brute - d <= spacing)


def test_distance_vertex_edge_and_face_regions():
    tri = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    cases = [
        ([-1.0, -2.0, 0.0], np.sqrt(5.0)),  # vertex a region
        ([2.0, -1.0, 3.0], np.sqrt(1 + 1 + 9)),  # vertex b region
        ([-0.5, 3.0, 0.0], np.sqrt(0.25 + 4.0)),  # vertex c region
        ([0.5, -0.7, 0.2], np.sqrt(0.49 + 0.04)),  # edge ab
        ([-0.3, 0.4, -0.4], 0.5),  # edge ac
        ([1.0, 1.0, 0.0], np.sqrt(0.5)),  # edge bc, in plane
        ([0.2, 0.3, -0.7], 0.7),  # face
        ([0.5, 0.0, 0.0], 0.0),  # on edge ab
        ([1.0, 0.0, 0.0], 0.0),  # on vertex b
        ([0.5, 0.5, 0.25], 0.25),  # above edge bc: face/edge boundary
    ]
    pts = np.array([p for p, _ in cases])
    expect = np.array([d for _, d in cases])
    got = mesh_distance.point_triangle_distance(pts, np.repeat(tri[None], len(pts), axis=0))
    np.testing.assert_allclose(got, expect, atol=1e-14)


def test_distance_points_projecting_onto_edges_and_vertices():
    # Points built to have a known closest feature on random triangles.
    rng = np.random.default_rng(2)
    tris = rng.normal(size=(400, 3, 3))
    a, b, c = tris[:, 0], tris[:, 1], tris[:, 2]
    n = np.cross(b - a, c - a)
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    # Vertex a: push along the outward bisector-ish direction −(ab̂ + aĉ), plus a normal offset.
    ab_hat = (b - a) / np.linalg.norm(b - a, axis=1, keepdims=True)
    ac_hat = (c - a) / np.linalg.norm(c - a, axis=1, keepdims=True)
    out = -(ab_hat + ac_hat)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    s, h = rng.uniform(0.1, 1.0, (2, 400))
    p_vertex = a + s[:, None] * out + h[:, None] * n
    # Edge ab midpoint: push away from c inside the plane, plus a normal offset.
    mid = 0.5 * (a + b)
    perp = np.cross(b - a, n)
    perp *= np.sign(np.sum(perp * (mid - c), axis=1))[:, None]
    perp /= np.linalg.norm(perp, axis=1, keepdims=True)
    p_edge = mid + s[:, None] * perp + h[:, None] * n
    pts = np.concatenate([p_vertex, p_edge])
    both = np.concatenate([tris, tris])
    expect = np.concatenate([np.hypot(s, h), np.hypot(s, h)])
    got = mesh_distance.point_triangle_distance(pts, both)
    ref = np.linalg.norm(trimesh_closest_point(both, pts) - pts, axis=1)
    # Only those whose constructed feature really is the closest one (obtuse angles excepted).
    exact = np.isclose(ref, expect)
    assert exact.mean() > 0.5
    np.testing.assert_allclose(got[exact], expect[exact], atol=1e-12)
    np.testing.assert_allclose(got, ref, atol=1e-12)


def test_distance_degenerate_triangles_are_segments():
    tris = np.array(
        [
            [[0.0, 0, 0], [2.0, 0, 0], [1.0, 0, 0]],  # collinear, c between a and b
            [[0.0, 0, 0], [1.0, 0, 0], [3.0, 0, 0]],  # collinear, c beyond b
            [[0.0, 0, 0], [0.0, 0, 0], [2.0, 0, 0]],  # a == b
            [[1.0, 1, 1], [1.0, 1, 1], [1.0, 1, 1]],  # a point
        ]
    )
    pts = np.array([[1.0, 1.0, 0.0], [2.5, 0.0, 2.0], [3.0, 0.0, 0.0], [1.0, 1.0, 4.0]])
    got = mesh_distance.point_triangle_distance(pts, tris)
    np.testing.assert_allclose(got, [1.0, 2.0, 1.0, 3.0], atol=1e-14)
    assert np.all(np.isfinite(got))


def test_distance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="points"):
        mesh_distance.point_triangle_distance(np.zeros((4, 2)), np.zeros((4, 3, 3)))
    with pytest.raises(ValueError, match="triangles"):
        mesh_distance.point_triangle_distance(np.zeros((4, 3)), np.zeros((5, 3, 3)))


# ---------------------------------------------------------------------------------------------
# Voxelisation
# ---------------------------------------------------------------------------------------------


def test_closed_cube_lattice_aligned_is_full_grid():
    grid = vx.voxelize(trimesh.creation.box((0.6, 0.6, 0.6)), V)
    # Faces at ±0.3 = ±20 v: the grid is exactly cells −20..19; every cell is occupied, and the
    # outer layer (centres 0.5 v from a face) is the surface; the next layer is 1.5 v away.
    assert grid.shape == (40, 40, 40)
    np.testing.assert_array_equal(grid.origin_index, [-20, -20, -20])
    assert grid.occupied.sum() == 40**3
    assert grid.surface.sum() == 40**3 - 38**3


def test_closed_cube_matches_analytic_count():
    # Off the lattice: the top faces lie 0.05, 0.08 and 0.03 v above a lattice plane, so the
    # grid's last cells reach 0.45, 0.42 and 0.47 v beyond them; only the far corner cell is
    # farther than τ (0.77 v) from the cube.
    centre = np.array([0.05, 0.08, 0.03]) * V
    box = trimesh.creation.box((0.6, 0.6, 0.6))
    box.apply_translation(centre)
    grid = vx.voxelize(box, V)
    # Analytic: lattice centres of the grid inside the cube expanded by τ = 0.75 v (faces),
    # with Euclidean distance at edges and corners; none outside it is enclosed.
    expect = _box_cells(grid, centre, 0.3, 0.75 * V)
    assert abs(int(grid.occupied.sum()) - int(expect.sum())) <= 0.02 * expect.sum()
    np.testing.assert_array_equal(grid.occupied, expect)  # here the sets agree exactly
    assert grid.shape == (41, 41, 41)  # cells −20..20: the cube spans −19.95 v..20.05 v
    assert grid.occupied.sum() == 41**3 - 1 and not grid.occupied[-1, -1, -1]


def test_open_bottom_box_is_still_filled():
    # The missing bottom lies on the grid boundary, so METHOD's flood fill alone reaches the
    # interior; the winding-number fill of open meshes restores the solid interior.
    closed = trimesh.creation.box((0.6, 0.6, 0.6))
    open_box = _drop_faces(closed, [0, 0, -1])
    assert len(open_box.faces) == 10 and not open_box.is_watertight
    grid = vx.voxelize(open_box, V)
    assert grid.shape == (40, 40, 40)
    assert grid.occupied[20, 20, 20]
    closed_count = int(vx.voxelize(closed, V).occupied.sum())
    assert abs(int(grid.occupied.sum()) - closed_count) <= 0.02 * closed_count


def test_open_bottom_box_without_fill_floods_through_opening():
    # fill_open=False is METHOD §3's flood fill alone: only the barrier shell is occupied.
    open_box = _drop_faces(trimesh.creation.box((0.6, 0.6, 0.6)), [0, 0, -1])
    grid = vx.voxelize(open_box, V, fill_open=False)
    assert not grid.occupied[20, 20, 20]
    np.testing.assert_array_equal(grid.occupied, grid.surface)
    dist = _brute_distances(open_box, grid)
    np.testing.assert_array_equal(grid.occupied, dist <= 0.75 * V)


def test_winding_numbers():
    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    points = np.array([[0, 0, 0], [0.2, 0.1, 0], [2, 0, 0]])
    w = mesh_inside.winding_numbers(sphere.vertices, sphere.faces, points)
    np.testing.assert_allclose(np.abs(w), [1, 1, 0], atol=1e-3)
    open_box = _drop_faces(trimesh.creation.box((0.6, 0.6, 0.6)), [0, 0, -1])
    # one of six faces missing: the centre sees 5/6 of the sphere of directions
    w = mesh_inside.winding_numbers(open_box.vertices, open_box.faces, np.zeros((1, 3)))
    assert abs(w[0]) == pytest.approx(5 / 6, abs=1e-3)


def test_open_sheet_is_not_filled():
    # A lone square sheet has |w| < 0.5 off its surface: only its barrier band is occupied.
    h = 0.3
    sheet = trimesh.Trimesh(
        [[-h, -h, 0.01], [h, -h, 0.01], [h, h, 0.01], [-h, h, 0.01]], [[0, 1, 2], [0, 2, 3]]
    )
    grid = vx.voxelize(sheet, V)
    np.testing.assert_array_equal(grid.occupied, _brute_distances(sheet, grid) <= 0.75 * V)


def test_box_with_crack_narrower_than_barrier_is_filled():
    # Not watertight, two disconnected parts: the bottom is a separate square inset by 0.5 v,
    # leaving a crack the barrier (τ = 0.75 v) seals. Filled like the closed box.
    closed = trimesh.creation.box((0.6, 0.6, 0.6))
    walls = _drop_faces(closed, [0, 0, -1])
    h = 0.3 - 0.5 * V
    floor = trimesh.Trimesh(
        [[-h, -h, -0.3], [h, -h, -0.3], [h, h, -0.3], [-h, h, -0.3]], [[0, 2, 1], [0, 3, 2]]
    )
    cracked = trimesh.util.concatenate([walls, floor])
    assert not cracked.is_watertight and len(cracked.split(only_watertight=False)) == 2
    grid = vx.voxelize(cracked, V)
    closed_count = vx.voxelize(closed, V).occupied.sum()
    assert abs(int(grid.occupied.sum()) - int(closed_count)) <= 0.02 * closed_count
    assert grid.occupied[20, 20, 20]


def test_hollow_sphere_interior_is_occupied():
    r = 0.5
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=r)
    v = 0.05
    grid = vx.voxelize(sphere, v)
    centres = grid.centres(np.ones(grid.shape, dtype=bool)).reshape(*grid.shape, 3)
    # Convex polyhedron: inside iff behind every face plane.
    planes = np.einsum("fd,xyzd->xyzf", sphere.face_normals, centres)
    offsets = np.sum(sphere.face_normals * sphere.triangles[:, 0], axis=1)
    inside = np.all(planes <= offsets, axis=-1)
    expect = inside | (_brute_distances(sphere, grid) <= 0.75 * v)
    np.testing.assert_array_equal(grid.occupied, expect)
    assert grid.occupied[tuple(s // 2 for s in grid.shape)]
    assert inside.sum() > 0.5 * grid.occupied.sum()  # mostly interior, not just a shell


def test_nested_shells_fill_closed_cavities():
    outer = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    inner = trimesh.creation.icosphere(subdivisions=2, radius=0.25)
    inner.invert()
    shell = trimesh.util.concatenate([outer, inner])
    a = vx.voxelize(shell, 0.04)
    b = vx.voxelize(outer, 0.04)
    np.testing.assert_array_equal(a.occupied, b.occupied)
    assert a.surface.sum() > b.surface.sum()  # the inner wall is surface too


@pytest.mark.parametrize(
    "mesh, v",
    [
        (trimesh.creation.icosphere(subdivisions=2, radius=0.5), 0.05),
        (_rotated(trimesh.creation.box((0.6, 0.4, 0.3)), seed=3), 0.03),
        (_rotated(trimesh.creation.annulus(0.2, 0.5, 0.3), seed=4), 0.04),
    ],
)
def test_surface_equals_barrier_and_lies_in_occupied(mesh, v):
    grid = vx.voxelize(mesh, v)
    dist = _brute_distances(mesh, grid)  # every cell, exact: checks the sparse candidates
    assert not np.any(grid.surface & ~grid.occupied)
    np.testing.assert_array_equal(grid.surface, dist <= 0.75 * v)
    # A wider br_range reaches free cells too, but surface stays inside occupied.
    wide = vx.voxelize(mesh, v, br_range=1.6)
    np.testing.assert_array_equal(wide.occupied, grid.occupied)
    np.testing.assert_array_equal(wide.surface, grid.occupied & (dist <= 1.6 * v))
    assert wide.surface.sum() > grid.surface.sum()


def test_sdf_band_widens_barrier():
    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    v = 0.05
    thin = vx.voxelize(sphere, v)
    thick = vx.voxelize(sphere, v, sdf_band=2.0 * v)
    dist = _brute_distances(sphere, thick)
    # The box is the same AABB, so the grids align; barrier cells d ≤ 2 v are all occupied.
    assert thick.shape == thin.shape
    assert np.all(thick.occupied[dist <= 2.0 * v])
    assert np.all(thin.occupied <= thick.occupied)


def test_flat_object_on_lattice_plane_keeps_one_cell():
    tri = trimesh.Trimesh([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0, 0.3, 0.0]], [[0, 1, 2]])
    grid = vx.voxelize(tri, 0.03)
    assert grid.shape == (10, 10, 1)
    assert grid.occupied[0, 0, 0] and grid.surface[0, 0, 0]


def test_centres_are_lattice_ordered_cell_centres():
    grid = vx.voxelize(trimesh.creation.box((0.6, 0.6, 0.6)), 0.1)
    c = grid.centres(grid.occupied)
    assert c.shape == (216, 3)
    np.testing.assert_allclose(c[0], [-0.25, -0.25, -0.25])
    np.testing.assert_allclose(c[1], [-0.25, -0.25, -0.15])  # z varies fastest: C order
    np.testing.assert_allclose(vx.solid_voxels(trimesh.creation.box((0.6, 0.6, 0.6)), 0.1), c)
    with pytest.raises(ValueError, match="mask"):
        grid.centres(np.ones((2, 2, 2), dtype=bool))


def test_surface_voxels_match_grid():
    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    grid = vx.voxelize(sphere, 0.05, br_range=1.0)
    np.testing.assert_array_equal(
        vx.surface_voxels(sphere, 0.05, br_range=1.0), grid.centres(grid.surface)
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"voxel_size": 0.0}, "voxel_size"),
        ({"voxel_size": float("nan")}, "voxel_size"),
        ({"voxel_size": 0.1, "br_range": -1.0}, "br_range"),
        ({"voxel_size": 0.1, "sdf_band": -0.1}, "sdf_band"),
    ],
)
def test_voxelize_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vx.voxelize(trimesh.creation.box((0.6, 0.6, 0.6)), **kwargs)


def test_voxelize_rejects_empty_mesh():
    with pytest.raises(ValueError, match="faces"):
        vx.voxelize(trimesh.Trimesh(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64)), 0.1)


# ---------------------------------------------------------------------------------------------
# Bisection
# ---------------------------------------------------------------------------------------------


def test_bisection_finds_largest_set_within_target(monkeypatch):
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    calls: list[tuple[float, int]] = []
    real = vx.surface_voxels

    def spy(mesh, voxel_size, *, br_range=0.75):
        out = real(mesh, voxel_size, br_range=br_range)
        calls.append((voxel_size, len(out)))
        return out

    monkeypatch.setattr(vx, "surface_voxels", spy)
    target, tol = 2000, 1e-6
    centres, v_star = vx.bisect_surface_voxel_size(sphere, V, target)
    sizes = [m for m, _ in calls]
    assert len(set(sizes)) == len(sizes)  # no voxel size evaluated twice
    assert v_star in sizes and len(centres) == dict(calls)[v_star]
    assert 0.85 * target <= len(centres) <= target
    # The last size that exceeded the target lies within tol below v*: v* sits on the boundary.
    above = [m for m, n in calls if n > target and m < v_star]
    assert above and v_star - max(above) <= tol
    np.testing.assert_array_equal(centres, real(sphere, v_star))


def test_bisection_keeps_v_start_when_target_is_never_met():
    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    centres, v_star = vx.bisect_surface_voxel_size(sphere, 0.05, 1, tol=1e-3)
    assert v_star == 0.05
    np.testing.assert_array_equal(centres, vx.surface_voxels(sphere, 0.05))


def test_bisection_rejects_bad_target():
    with pytest.raises(ValueError, match="target_num"):
        vx.bisect_surface_voxel_size(trimesh.creation.box(), 0.1, 0)


# ---------------------------------------------------------------------------------------------
# Control points
# ---------------------------------------------------------------------------------------------


def test_fps_on_a_line_picks_ends_then_middle():
    line = np.stack([np.arange(11.0), np.zeros(11), np.zeros(11)], axis=1)
    np.testing.assert_array_equal(control_points.farthest_point_sampling(line, 3), [0, 10, 5])
    # Ten points: 4 and 5 tie at distance 4 from {0, 9}; the lowest index wins.
    np.testing.assert_array_equal(control_points.farthest_point_sampling(line[:10], 3), [0, 9, 4])
    assert (
        control_points.farthest_point_sampling(line, 50).tolist()
        == control_points.farthest_point_sampling(line, 11).tolist()
    )
    assert len(control_points.farthest_point_sampling(line, 50)) == 11
    assert control_points.farthest_point_sampling(line, 0).shape == (0,)


def _min_pairwise(points: np.ndarray) -> float:
    d = np.linalg.norm(points[:, None] - points[None], axis=2)
    return float(d[np.triu_indices(len(points), 1)].min())


def test_fps_is_deterministic_distinct_and_spread():
    g = np.arange(12.0)
    pts = np.stack(np.meshgrid(g, g, g, indexing="ij"), axis=-1).reshape(-1, 3)
    picks = control_points.farthest_point_sampling(pts, 40)
    np.testing.assert_array_equal(picks, control_points.farthest_point_sampling(pts, 40))
    assert picks.dtype == np.int64 and picks[0] == 0
    assert len(np.unique(picks)) == 40
    rng = np.random.default_rng(0)
    random_best = max(
        _min_pairwise(pts[rng.choice(len(pts), 40, replace=False)]) for _ in range(20)
    )
    assert _min_pairwise(pts[picks]) > random_best


def test_kmeans_centres_recovers_blob_means():
    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0, 0], [5.0, 0, 0], [0.0, 5.0, 0]])
    pts = np.concatenate([m + 0.1 * rng.normal(size=(200, 3)) for m in means])
    got = control_points.kmeans_centres(pts, means + 0.5)
    expect = pts.reshape(3, 200, 3).mean(axis=1)
    np.testing.assert_allclose(got, expect, atol=1e-12)


def test_place_control_points_count_and_determinism():
    solid = vx.solid_voxels(trimesh.creation.box((0.6, 0.4, 0.3)), 0.03)
    a = control_points.place_control_points(solid, 60)
    b = control_points.place_control_points(solid, 60)
    assert a.shape == (60, 3)
    np.testing.assert_array_equal(a, b)
    assert len(np.unique(a.round(9), axis=0)) == 60
    assert np.all(a.min(axis=0) >= solid.min(axis=0)) and np.all(a.max(axis=0) <= solid.max(0))


def test_place_control_points_with_few_cells_uses_every_cell():
    solid = vx.solid_voxels(trimesh.creation.box((0.2, 0.2, 0.1)), 0.05)
    assert len(solid) == 32
    np.testing.assert_array_equal(control_points.place_control_points(solid, 60), solid)
    np.testing.assert_array_equal(control_points.place_control_points(solid, 32), solid)
    with pytest.raises(ValueError, match="cp_num"):
        control_points.place_control_points(solid, 0)


def test_surface_control_points_on_surface_and_area_weighted():
    big = trimesh.Trimesh(
        [[0.0, 0, 0], [2.0, 0, 0], [2.0, 2, 0], [0.0, 2, 0]], [[0, 1, 2], [0, 2, 3]]
    )
    small = trimesh.Trimesh(
        [[0.0, 0, 1], [1.0, 0, 1], [1.0, 1, 1], [0.0, 1, 1]], [[0, 1, 2], [0, 2, 3]]
    )
    mesh = trimesh.util.concatenate([big, small])  # areas 4 and 1
    pts = control_points.surface_control_points(mesh, 20000, seed=7)
    assert pts.shape == (20000, 3)
    np.testing.assert_array_equal(pts, control_points.surface_control_points(mesh, 20000, seed=7))
    assert not np.array_equal(pts, control_points.surface_control_points(mesh, 20000, seed=8))
    on_big = np.abs(pts[:, 2]) < 1e-12
    assert np.all(on_big | (np.abs(pts[:, 2] - 1.0) < 1e-12))
    assert abs(on_big.mean() - 0.8) < 0.02
    assert np.all(pts[on_big, :2] >= 0) and np.all(pts[on_big, :2] <= 2)
    assert np.all(pts[~on_big, :2] >= 0) and np.all(pts[~on_big, :2] <= 1)
    # Uniform within a face: the mean of the big square's samples is its centre.
    np.testing.assert_allclose(pts[on_big, :2].mean(axis=0), [1.0, 1.0], atol=0.03)


def test_prune_control_points_hand_built():
    centres = np.array(
        [
            [0.0, 0.0, 0.0],  # 0: near Gaussians and surface: kept
            [1.0, 0.0, 0.0],  # 1: kept
            [0.0, 1.0, 0.0],  # 2: kept
            [10.0, 10.0, 10.0],  # 3: near a surface voxel, far from every Gaussian: pruned
            [-10.0, 0.0, 0.0],  # 4: near a Gaussian, far from every surface voxel: pruned
        ]
    )
    gaussians = np.array([[0.1, 0.0, 0.0], [0.0, 1.1, 0.0], [-10.0, 0.1, 0.0]])
    surface = np.array([[0.4, 0.1, 0.0], [0.0, 0.9, 0.0], [9.5, 9.4, 9.5]])
    keep = control_points.prune_control_points(centres, gaussians, surface, 2)
    np.testing.assert_array_equal(keep, [True, True, True, False, False])
    # K = min(n_cp_num, M): with K = M every centre is a neighbour of every point.
    assert control_points.prune_control_points(centres, gaussians, surface, 10).all()
    # K = 1: only the single nearest centre counts.
    np.testing.assert_array_equal(
        control_points.prune_control_points(centres, gaussians, surface, 1),
        [True, False, True, False, False],
    )


def test_check_control_point_count():
    control_points.check_control_point_count(2, obj="obj_3")
    with pytest.raises(ValueError) as err:
        control_points.check_control_point_count(1, obj="obj_3")
    assert str(err.value) == (
        "obj_3: only 1 control point(s) survive pruning; at least 2 are needed, raise cp_num"
    )
    with pytest.raises(ValueError, match="only 0 control point"):
        control_points.check_control_point_count(0, obj="obj_0")
