"""lit_constrained.physics.shapes: Disk / Ball / Polygon measures, normals and samples against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.physics import Ball, Disk, Polygon

RANDOM = ("uniform", "lhs", "sobol")
PI = math.pi


@pytest.mark.parametrize("method", RANDOM + ("grid",))
def test_circle_points_lie_on_it_with_radial_normals(method):
    disk = Disk((1.0, -2.0), 0.5)
    points, normals = disk.boundary_sample(64, method, seed=3)
    center = torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert points.shape == normals.shape == (64, 2) and points.dtype == torch.float64
    torch.testing.assert_close((points - center).norm(dim=1), torch.full((64,), 0.5, dtype=torch.float64))
    torch.testing.assert_close(normals, (points - center) / 0.5)
    torch.testing.assert_close(disk.normal(points), normals)
    assert torch.equal(points, disk.boundary(64, method, seed=3))


def test_circle_grid_is_the_equispaced_half_offset_angles():
    points = Disk((0.0, 0.0), 2.0).boundary(8, "grid")
    angles = 2 * PI * (np.arange(8) + 0.5) / 8
    expected = torch.tensor(np.stack([2 * np.cos(angles), 2 * np.sin(angles)], 1))
    torch.testing.assert_close(points, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("method", RANDOM)
def test_disk_interior_is_inside_uniform_in_area_and_seeded(method):
    disk = Disk((0.0, 0.0), 1.0)
    x = disk.interior(4096, method, seed=1)
    r = x.norm(dim=1)
    assert bool((r <= 1).all()) and disk.contains(x).all()
    # the area inside radius 1/2 is a quarter of the disk's (binomial sd for uniform: 0.0068)
    assert abs(float((r < 0.5).double().mean()) - 0.25) < 0.03
    assert torch.equal(x, disk.interior(4096, method, seed=1)) and not torch.equal(x, disk.interior(4096, method, seed=2))
    assert disk.interior(8, method, dtype=torch.float32).dtype == torch.float32


def test_sobol_disk_interior_fills_equal_area_rings_evenly():
    """The polar map r = sqrt(u1) is measure-preserving: the 16 rings of equal area hold 1024/16 points each."""
    x = Disk((0.0, 0.0), 1.0).interior(1024, "sobol", seed=0)
    ring = np.floor(x.norm(dim=1).numpy() ** 2 * 16).astype(int)
    assert np.bincount(ring, minlength=16).tolist() == [64] * 16


@pytest.mark.parametrize("dim", [1, 2, 3, 4, 5])
def test_ball_measures_are_the_closed_forms(dim):
    r = 1.5
    volume = {1: 2 * r, 2: PI * r**2, 3: 4 / 3 * PI * r**3, 4: PI**2 / 2 * r**4, 5: 8 / 15 * PI**2 * r**5}[dim]
    area = {1: 2.0, 2: 2 * PI * r, 3: 4 * PI * r**2, 4: 2 * PI**2 * r**3, 5: 8 / 3 * PI**2 * r**4}[dim]
    ball = Ball((0.0,) * dim, r, names=[f"x{i}" for i in range(dim)])
    assert math.isclose(ball.measure, volume, rel_tol=1e-14) and math.isclose(ball.boundary_measure, area, rel_tol=1e-14)


@pytest.mark.parametrize("dim", [3, 4])
@pytest.mark.parametrize("method", RANDOM)
def test_sphere_points_and_normals_and_ball_interior(dim, method):
    center = np.arange(dim, dtype=float)
    ball = Ball(center, 2.0, names=[f"x{i}" for i in range(dim)])
    points, normals = ball.boundary_sample(512, method, seed=0)
    offset = points - torch.tensor(center)
    torch.testing.assert_close(offset.norm(dim=1), torch.full((512,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(normals, offset / 2.0)
    # uniform on the sphere: each coordinate's mean is ~0 (sd 1/sqrt(3 * 512) = 0.026 for d = 3)
    assert float(normals.mean(0).abs().max()) < 0.13
    x = ball.interior(2048, method, seed=0)
    radius = (x - torch.tensor(center)).norm(dim=1)
    assert bool((radius <= 2.0).all())
    # the volume within radius 1 is 2^-d of the ball's
    assert abs(float((radius < 1.0).double().mean()) - 0.5**dim) < 0.03


def test_one_dimensional_ball_is_an_interval_with_two_end_points():
    ball = Ball((1.0,), 0.5, names=["t"])
    points, normals = ball.boundary_sample(3)
    assert points.flatten().tolist() == [0.5, 0.5, 1.5] and normals.flatten().tolist() == [-1.0, -1.0, 1.0]
    x = ball.interior(100, "lhs", seed=0)
    assert bool(((x >= 0.5) & (x <= 1.5)).all())


def test_disk_needs_two_coordinates_and_a_positive_radius():
    with pytest.raises(ValueError, match="use Ball in 3D"):
        Disk((0.0, 0.0, 0.0), 1.0)
    with pytest.raises(ValueError, match="radius > 0"):
        Disk((0.0, 0.0), 0.0)
    with pytest.raises(ValueError, match="no grid"):
        Disk((0.0, 0.0), 1.0).interior(16, "grid")


L_SHAPE = [(0.0, 0.0), (2.0, 0.0), (2.0, 1.0), (1.0, 1.0), (1.0, 2.0), (0.0, 2.0)]


@pytest.mark.parametrize("vertices", [L_SHAPE, L_SHAPE[::-1]], ids=["ccw", "cw"])
def test_polygon_measures_and_edge_normals(vertices):
    poly = Polygon(vertices)
    assert poly.measure == 3.0 and poly.boundary_measure == 8.0
    # one point in the middle of each edge, and the outward normals there
    mids = torch.tensor([[1.0, 0.0], [2.0, 0.5], [1.5, 1.0], [1.0, 1.5], [0.5, 2.0], [0.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[0, -1], [1, 0], [0, 1], [1, 0], [0, 1], [-1, 0]], dtype=torch.float64)
    assert torch.equal(poly.normal(mids), expected)
    assert poly.signed_distance(mids).abs().max() == 0
    inside = torch.tensor([[0.5, 0.5], [1.5, 0.5], [0.5, 1.5], [1.5, 1.5]], dtype=torch.float64)
    assert poly.contains(inside).tolist() == [True, True, True, False]
    torch.testing.assert_close(poly.signed_distance(inside), torch.tensor([-0.5, -0.5, -0.5, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("method", RANDOM)
def test_polygon_interior_is_inside_and_uniform_by_area(method):
    poly = Polygon(L_SHAPE)
    x = poly.interior(2048, method, seed=0)
    assert poly.contains(x).all() and bool((poly.signed_distance(x) < 0).all())
    # each of the L's three unit squares holds a third of the points (binomial sd for uniform: 0.0104)
    squares = [((x[:, 0] < 1) & (x[:, 1] < 1)), ((x[:, 0] >= 1) & (x[:, 1] < 1)), ((x[:, 0] < 1) & (x[:, 1] >= 1))]
    for square in squares:
        assert abs(float(square.double().mean()) - 1 / 3) < 0.035


@pytest.mark.parametrize("method", RANDOM + ("grid",))
def test_polygon_boundary_by_arc_length(method):
    poly = Polygon(L_SHAPE)
    points, normals = poly.boundary_sample(80, method, seed=0)
    assert poly.signed_distance(points).abs().max() < 1e-15
    torch.testing.assert_close(normals, poly.normal(points))
    # in proportion to length: the bottom edge (length 2 of 8) holds a quarter (exact for grid and LHS)
    bottom = int((points[:, 1] == 0).sum())
    assert bottom == 20 if method in ("grid", "lhs") else abs(bottom - 20) <= 12


def test_polygon_boundary_grid_is_the_arc_length_nodes():
    square = Polygon([(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)])
    points = square.boundary(4, "grid")
    assert points.tolist() == [[0.5, 0.0], [1.0, 0.5], [0.5, 1.0], [0.0, 0.5]]


def test_polygon_refuses_a_self_intersecting_or_degenerate_one():
    with pytest.raises(ValueError, match="must be simple"):
        Polygon([(0.0, 0.0), (1.0, 1.0), (1.0, 0.0), (0.0, 1.0)])  # a bow tie
    with pytest.raises(ValueError, match=">= 3"):
        Polygon([(0.0, 0.0), (1.0, 1.0)])
    with pytest.raises(ValueError, match="coincide"):
        Polygon([(0.0, 0.0), (1.0, 0.0), (1.0, 0.0), (0.0, 1.0)])
