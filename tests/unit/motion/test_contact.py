"""chord.motion.contact: the static objects' signed-distance grid and the contact loss (issue 36):
zero apart and at the rest pose's own overlap, growing with depth, its gradient pushing a point
out, and inside where the evaluation's metric says inside."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

from chord.evaluation import metrics
from chord.motion import contact


def slab():
    """The demo's kind of table: 1.2 x 0.05 x 1.0, top face at y = 0."""
    mesh = trimesh.creation.box((1.2, 0.05, 1.0))
    mesh.apply_translation((0.0, -0.025, 0.0))
    return mesh.vertices, mesh.faces


@pytest.fixture(scope="module")
def grid():
    return contact.signed_distance_grid([slab()])


def frames(rest, *offsets):
    """X [1 + len(offsets), V, 3]: the rest points, then moved by each offset [3]."""
    rest = torch.as_tensor(rest, dtype=torch.float32)
    return torch.stack([rest, *[rest + torch.tensor(o, dtype=torch.float32) for o in offsets]])


def test_the_grid_is_the_signed_distance_near_a_surface(grid):
    p = torch.tensor([[0.1, 0.02, 0.1], [0.1, -0.01, 0.1], [-0.3, 0.004, 0.2], [3, 3, 3]])
    d = grid(p)
    assert d[:3].tolist() == pytest.approx([0.02, -0.01, 0.004], abs=1e-4)  # linear there
    assert d[3] > 0  # off the grid: outside
    # above the grid's top (4 cells over the slab) the distance goes on, exact above a plane,
    # with a gradient pointing back: the support term pulls a block lifted that far down
    far = torch.tensor([[0.1, 0.3, 0.1], [0.1, 0.6, 0.1]], requires_grad=True)
    assert float(grid.hi[1]) < 0.1
    assert grid(far).tolist() == pytest.approx([0.3, 0.6], abs=1e-4)
    (g,) = torch.autograd.grad(grid(far).sum(), far)
    assert g.flatten().tolist() == pytest.approx([0.0, 1.0, 0.0] * 2, abs=1e-4)


def test_separated_objects_cost_nothing(grid):
    rest = np.array([[0.0, 0.05, 0.0], [0.2, 0.3, 0.1], [-0.4, 0.01, 0.3]])
    X = frames(rest, (0.1, 0.0, 0.0), (0.0, -0.009, 0.0), (0.0, 0.2, -0.3))  # never inside
    rest_depth = contact.depth(grid, X[0])
    assert float(contact.contact_loss(grid, X, rest_depth)) == 0.0


def test_the_rest_pose_own_overlap_costs_nothing(grid):
    # a block whose bottom sits 0.01 into the slab at rest, sliding along it at that depth
    rest = np.array([[0.0, -0.01, 0.0], [0.1, -0.01, 0.0], [0.0, 0.2, 0.0]])
    X = frames(rest, (0.05, 0.0, 0.0), (0.1, 0.0, -0.1), (0.0, 0.005, 0.0))
    rest_depth = contact.depth(grid, X[0])
    assert rest_depth[:2].tolist() == pytest.approx([0.01, 0.01], abs=1e-4)
    assert float(contact.contact_loss(grid, X, rest_depth)) == 0.0
    deeper = frames(rest, (0.0, -0.005, 0.0))  # what the motion adds is penalised
    assert float(contact.contact_loss(grid, deeper, rest_depth)) > 0


def test_the_loss_grows_with_depth(grid):
    rest = np.array([[0.0, 0.0, 0.0], [0.2, 0.0, 0.1]])
    rest_depth = contact.depth(grid, frames(rest)[0])
    losses = [
        float(contact.contact_loss(grid, frames(rest, (0.0, -d, 0.0)), rest_depth))
        for d in (0.0, 0.002, 0.005, 0.01, 0.02)
    ]
    assert losses[0] == pytest.approx(0.0, abs=1e-10)
    assert all(b > a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[3] == pytest.approx(0.01**2, rel=0.05)  # both points 0.01 deep, one frame


def test_the_loss_band_is_the_metrics():
    assert contact.CONTACT_BAND == metrics.CONTACT_BAND


def test_the_gradient_pushes_a_penetrating_point_out(grid):
    """Autograd's gradient is the loss's finite difference, and a step against it raises a
    point sunk into the slab's top toward the surface."""
    rest = torch.tensor([[0.05, 0.0, 0.02]], dtype=torch.float64)
    rest_depth = contact.depth(grid, rest)
    moved = torch.tensor([[0.05, -0.012, 0.02]], dtype=torch.float64, requires_grad=True)

    def loss(p):
        return contact.contact_loss(grid, torch.stack([rest, p]), rest_depth)

    (g,) = torch.autograd.grad(loss(moved), moved)
    h = 1e-5
    fd = []
    for a in range(3):
        e = torch.zeros(1, 3, dtype=torch.float64)
        e[0, a] = h
        fd.append(float(loss(moved.detach() + e) - loss(moved.detach() - e)) / (2 * h))
    assert g[0].tolist() == pytest.approx(fd, rel=1e-3, abs=1e-9)
    assert g[0, 1] < 0 and abs(g[0, 0]) < 1e-6 and abs(g[0, 2]) < 1e-6  # straight up
    stepped = moved.detach() - 0.2 * g
    assert contact.depth(grid, stepped) < contact.depth(grid, moved.detach())


@pytest.mark.parametrize("shape", ["slab", "sphere"])
def test_the_loss_and_the_metric_agree_on_which_points_are_inside(shape):
    """Random points around a mesh: the loss counts a point (depth > 0) exactly where the
    evaluate stage's metric calls it inside, but within a cell's diagonal of the surface
    (where the grid interpolates)."""
    if shape == "slab":
        V, F = slab()
        cells = contact.GRID_CELLS
    else:
        sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.3)
        V, F = sphere.vertices, sphere.faces
        # the agreement holds outside a cell's diagonal at any resolution: a quarter of the
        # cells (41^3 nodes, not 137^3: a 60th of the winding numbers) still leaves most of the
        # 400 points that far (> 100 asserted below)
        cells = contact.GRID_CELLS // 4
    grid = contact.signed_distance_grid([(V, F)], cells=cells)
    cell = float((grid.hi - grid.lo).max()) / (max(grid.values.shape) - 1)
    rng = np.random.default_rng(0)
    lo, hi = np.asarray(V).min(0) - 0.05, np.asarray(V).max(0) + 0.05
    P = rng.uniform(lo, hi, size=(400, 3))
    dist = np.sqrt(trimesh.proximity.closest_point(trimesh.Trimesh(V, F), P)[1] ** 2)
    far = dist > np.sqrt(3) * cell
    assert far.sum() > 100
    loss_inside = (contact.depth(grid, torch.as_tensor(P, dtype=torch.float32)) > 0).numpy()
    metric_inside = np.array([metrics.penetration(p[None], V, F)["fraction"] == 1.0 for p in P])
    assert metric_inside[far].any() and not metric_inside[far].all()
    assert (loss_inside[far] == metric_inside[far]).all()


def test_several_static_objects_are_their_union():
    a = trimesh.creation.box((0.2, 0.2, 0.2))
    b = trimesh.creation.box((0.2, 0.2, 0.2))
    b.apply_translation((0.5, 0.0, 0.0))
    grid = contact.signed_distance_grid([(a.vertices, a.faces), (b.vertices, b.faces)])
    d = grid(torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [0.25, 0.0, 0.0]]))
    assert d[0] < 0 and d[1] < 0 and d[2] > 0


# --- the support term ------------------------------------------------------------------------


def resting_block():
    """A block's bottom points 0.004 above the slab's top (resting), and its top 0.2 above."""
    return np.array([[0.0, 0.004, 0.0], [0.1, 0.004, 0.0], [0.05, 0.004, 0.1], [0.05, 0.2, 0.05]])


def test_the_support_band_is_the_evaluations_rest_tolerance():
    from chord.evaluation import interaction

    assert contact.SUPPORT_BAND == interaction.REST_TOLERANCE


def test_support_costs_nothing_while_the_object_slides_or_turns_on_its_support(grid):
    rest = resting_block()
    X = frames(rest, (0.2, 0.0, -0.1), (-0.3, 0.0, 0.0))  # slides along the top
    c, a = torch.tensor(rest[:3].mean(0), dtype=torch.float32), torch.tensor(0.7)
    turn = torch.tensor(  # about the vertical axis through its base
        [[torch.cos(a), 0.0, torch.sin(a)], [0.0, 1.0, 0.0], [-torch.sin(a), 0.0, torch.cos(a)]]
    )
    X = torch.cat([X, ((X[0] - c) @ turn.T + c)[None]])
    sdf0 = grid(X[0])
    assert float(contact.support_loss(grid, X, sdf0)) == 0.0


def test_support_penalises_rocking_off_an_edge(grid):
    rest = resting_block()
    rocked = frames(rest)[0].clone()
    rocked[1, 1] += 0.05  # one bottom point lifts while the others stay down
    X = torch.stack([frames(rest)[0], rocked])
    loss = float(contact.support_loss(grid, X, grid(X[0])))
    assert loss == pytest.approx((0.05 - contact.SUPPORT_BAND) ** 2 / 3, rel=0.02)  # 1 of 3


def test_support_penalises_rising_off_the_support_and_grows_with_the_gap(grid):
    rest = resting_block()
    sdf0 = grid(frames(rest)[0])
    gaps = (0.0, 0.004, 0.01, 0.02, 0.05)
    losses = [float(contact.support_loss(grid, frames(rest, (0.0, g, 0.0)), sdf0)) for g in gaps]
    assert losses[:2] == [0.0, 0.0]  # within the band: resting still
    assert all(b > a for a, b in zip(losses[1:], losses[2:], strict=False)), losses
    # the gap beyond the band, squared, at each resting point (one frame); a plane's grid is
    # exact
    assert losses[3] == pytest.approx((0.02 - contact.SUPPORT_BAND) ** 2, rel=0.02)


def test_an_object_not_resting_at_rest_has_no_support(grid):
    rest = resting_block() + [0.0, 3 * grid.cell, 0.0]  # hovering: more than the gate above
    sdf0 = grid(frames(rest)[0])
    assert float(sdf0.min()) > contact.SUPPORT_GATE_CELLS * grid.cell
    assert float(contact.support_loss(grid, frames(rest, (0.0, 0.3, 0.0)), sdf0)) == 0.0


def test_the_support_gradient_pulls_a_lifted_object_down(grid):
    rest = torch.as_tensor(resting_block(), dtype=torch.float64)
    sdf0 = grid(rest)
    lifted = (rest + torch.tensor([0.0, 0.03, 0.0], dtype=torch.float64)).requires_grad_()
    loss = contact.support_loss(grid, torch.stack([rest, lifted]), sdf0)
    (g,) = torch.autograd.grad(loss, lifted)
    assert (g[:3, 1] > 0).all() and float(g[3].abs().sum()) == 0.0  # resting points down
    h = 1e-5
    for i in range(3):
        e = torch.zeros_like(rest)
        e[i, 1] = h
        up = contact.support_loss(grid, torch.stack([rest, lifted.detach() + e]), sdf0)
        down = contact.support_loss(grid, torch.stack([rest, lifted.detach() - e]), sdf0)
        assert float(g[i, 1]) == pytest.approx(float(up - down) / (2 * h), rel=1e-3)
    stepped = lifted.detach() - 0.2 * g
    assert contact.support_loss(grid, torch.stack([rest, stepped]), sdf0) < loss


def test_the_grid_cell_is_its_node_spacing(grid):
    W = grid.values.shape[-1]
    assert grid.cell == pytest.approx(float(grid.hi[0] - grid.lo[0]) / (W - 1))
    a = grid(torch.tensor([[0.1, 0.02, 0.1]]))
    b = grid(torch.tensor([[0.1, 0.02 + grid.cell, 0.1]]))
    assert float(b - a) == pytest.approx(grid.cell, rel=1e-3)  # a plane's distance: linear


def test_the_contact_points_are_the_evaluations_samples():
    from chord.evaluation import interaction

    assert contact.CONTACT_SAMPLES == interaction.INTERACTION_SAMPLES
    assert metrics.surface_samples is contact.surface_samples
