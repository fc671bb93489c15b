"""lit_constrained.physics.geometry's constructive geometry: differences, unions and intersections against closed-form areas, lengths
and normals (a plate with holes, a disk cut by an edge, the lens of two disks, an L from two rectangles)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.physics import Ball, Box, Difference, Disk, Intersection, Polygon, Union

PI = math.pi
RANDOM = ("uniform", "lhs", "sobol")
HOLES = [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)]
R = 0.1


def plate() -> Difference:
    domain = Box((0.0, 0.0), (1.0, 1.0))
    for center in HOLES:
        domain = domain - Disk(center, R)
    return domain


def hole_of(points: torch.Tensor) -> torch.Tensor:
    """The index of the hole each point is on (-1: the outer square), from the geometry's closed form."""
    distance = torch.stack([(points - torch.tensor(c, dtype=points.dtype)).norm(dim=1) for c in HOLES], 1)
    nearest = distance.argmin(1)
    return torch.where(distance.min(1).values < R + 1e-9, nearest, -1)


def test_plate_with_four_holes_measures():
    domain = plate()
    assert math.isclose(domain.measure, 1 - 4 * PI * R**2, rel_tol=1e-13)
    assert math.isclose(domain.boundary_measure, 4 + 8 * PI * R, rel_tol=1e-13)


@pytest.mark.parametrize("method", RANDOM + ("grid",))
def test_plate_boundary_points_normals_and_shares(method):
    domain, n = plate(), 4096
    points, normals = domain.boundary_sample(n, method, seed=0)
    assert points.shape == normals.shape == (n, 2)
    hole = hole_of(points)
    outer = hole == -1
    # on the boundary: the square's sides or a circle of radius R
    side = (points[outer] == 0) | (points[outer] == 1)
    assert bool(side.any(1).all())
    for i, c in enumerate(HOLES):
        on = hole == i
        offset = points[on] - torch.tensor(c, dtype=torch.float64)
        torch.testing.assert_close(offset.norm(dim=1), torch.full((int(on.sum()),), R, dtype=torch.float64))
        torch.testing.assert_close(normals[on], -offset / R)  # outward from the plate: into the hole
    expected_side = torch.where(points[outer] == 1, 1.0, 0.0) - torch.where(points[outer] == 0, 1.0, 0.0)
    torch.testing.assert_close(normals[outer], expected_side.to(torch.float64))
    torch.testing.assert_close(normals.norm(dim=1), torch.ones(n, dtype=torch.float64))
    # in proportion to length: each hole 2 pi R / (4 + 8 pi R) of the points
    share = n * 2 * PI * R / (4 + 8 * PI * R)
    counts = torch.bincount(hole + 1, minlength=5).tolist()
    slack = 1.5 if method in ("grid", "lhs", "sobol") else 4 * math.sqrt(share)
    assert all(abs(c - share) <= slack for c in counts[1:]), counts
    assert torch.equal(points, domain.boundary(n, method, seed=0))


def test_plate_boundary_is_seeded_and_typed():
    domain = plate()
    a = domain.boundary_sample(100, seed=5)
    assert torch.equal(a.points, domain.boundary_sample(100, seed=5).points)
    assert not torch.equal(a.points, domain.boundary_sample(100, seed=6).points)
    assert domain.boundary_sample(10, dtype=torch.float32).normals.dtype == torch.float32


@pytest.mark.parametrize("method", RANDOM)
def test_plate_interior_points_lie_in_it(method):
    domain = plate()
    x = domain.interior(1000, method, seed=0)
    assert x.shape == (1000, 2) and domain.contains(x).all()
    assert bool((hole_of(x) == -1).all()) and bool(((x > 0) & (x < 1)).all())
    # uniform in area: the fraction in the left half is a half
    assert abs(float((x[:, 0] < 0.5).double().mean()) - 0.5) < 0.06


def test_a_disk_cut_by_an_edge():
    """The unit square minus a disk of radius 1/4 centered on its bottom edge: a half disk removed."""
    domain = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.0), 0.25)
    assert math.isclose(domain.measure, 1 - PI / 32, rel_tol=1e-13)
    assert math.isclose(domain.boundary_measure, 4 - 0.5 + PI * 0.25, rel_tol=1e-13)
    points, normals = domain.boundary_sample(2000, "sobol", seed=1)
    on_arc = (points - torch.tensor([0.5, 0.0], dtype=torch.float64)).norm(dim=1) < 0.25 + 1e-12
    assert bool((points[on_arc, 1] >= 0).all())  # only the half inside the square
    torch.testing.assert_close(normals[on_arc], -(points[on_arc] - torch.tensor([0.5, 0.0], dtype=torch.float64)) / 0.25)
    bottom = points[:, 1] == 0
    assert bool(((points[bottom, 0] <= 0.25) | (points[bottom, 0] >= 0.75)).all())


def test_lens_of_two_disks_intersection_and_union():
    d = 1.0
    lens = 2 * math.acos(d / 2) - d / 2 * math.sqrt(4 - d * d)  # two unit disks, centers d apart
    a, b = Disk((0.0, 0.0), 1.0), Disk((d, 0.0), 1.0)
    both = a & b
    assert isinstance(both, Intersection) and math.isclose(both.measure, lens, rel_tol=1e-10)
    assert math.isclose(both.boundary_measure, 2 * 2 * math.acos(d / 2), rel_tol=1e-10)
    either = a | b
    assert isinstance(either, Union) and math.isclose(either.measure, 2 * PI - lens, rel_tol=1e-10)
    assert math.isclose(either.boundary_measure, 2 * (2 * PI - 2 * math.acos(d / 2)), rel_tol=1e-10)
    points, normals = both.boundary_sample(500, seed=0)
    # a lens point is on the circle of the disk it is NOT the inside of; its normal is that circle's
    from_b = (points - torch.tensor([d, 0.0], dtype=torch.float64)).norm(dim=1).sub(1).abs() < 1e-12
    from_a = points.norm(dim=1).sub(1).abs() < 1e-12
    assert bool((from_a | from_b).all())
    torch.testing.assert_close(normals[from_a & ~from_b], points[from_a & ~from_b])
    x = either.interior(500, seed=0)
    assert bool(((x.norm(dim=1) <= 1) | ((x - torch.tensor([d, 0.0], dtype=torch.float64)).norm(dim=1) <= 1)).all())


def test_an_l_from_two_rectangles_counts_a_shared_edge_once():
    ell = Box((0.0, 0.0), (2.0, 1.0)) | Box((0.0, 0.0), (1.0, 2.0))
    assert math.isclose(ell.measure, 3.0, rel_tol=1e-13) and math.isclose(ell.boundary_measure, 8.0, rel_tol=1e-13)
    points, normals = ell.boundary_sample(800, "grid")
    reference = Polygon([(0.0, 0.0), (2.0, 0.0), (2.0, 1.0), (1.0, 1.0), (1.0, 2.0), (0.0, 2.0)])
    assert reference.signed_distance(points).abs().max() < 1e-14
    torch.testing.assert_close(normals, reference.normal(points))
    # the left edge x = 0 (length 2 of 8) holds a quarter of the points, once
    assert int((points[:, 0] == 0).sum()) == 200
    assert len(torch.unique(points, dim=0)) == 800


def test_operators_are_the_named_classes_and_nest():
    a, b, c = Box((0.0, 0.0), (4.0, 4.0)), Disk((2.0, 2.0), 1.5), Disk((2.0, 2.0), 0.5)
    assert a - b == Difference(a, b) and a | b == Union(a, b) and a & b == Intersection(a, b)
    ring_removed = a - (b - c)  # a square with an annular hole: the inner disk stays
    assert math.isclose(ring_removed.measure, 16 - PI * (1.5**2 - 0.5**2), rel_tol=1e-13)
    assert math.isclose(ring_removed.boundary_measure, 16 + 2 * PI * (1.5 + 0.5), rel_tol=1e-13)
    points, normals = ring_removed.boundary_sample(400, seed=0)
    radius = (points - 2.0).norm(dim=1)
    inner = (radius - 0.5).abs() < 1e-12
    torch.testing.assert_close(normals[inner], (points[inner] - 2.0) / 0.5)  # the kept disk's own outward normal
    outer_ring = (radius - 1.5).abs() < 1e-12
    torch.testing.assert_close(normals[outer_ring], -(points[outer_ring] - 2.0) / 1.5)


def test_signed_distance_sign_and_normal_of_a_difference():
    domain = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.25)
    x = torch.tensor([[0.5, 0.5], [0.1, 0.5], [1.5, 0.5], [0.5, 0.8]], dtype=torch.float64)
    sd = domain.signed_distance(x)
    assert (sd > 0).tolist() == [True, False, True, False]
    torch.testing.assert_close(sd, torch.tensor([0.25, -0.1, 0.5, -0.05], dtype=torch.float64))
    torch.testing.assert_close(domain.normal(x[[1, 3]]), torch.tensor([[-1.0, 0.0], [0.0, -1.0]], dtype=torch.float64))


@pytest.mark.parametrize("method", RANDOM)
def test_a_box_minus_a_ball_in_3d(method):
    domain = Box((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)) - Ball((0.5, 0.5, 0.5), 0.3)
    points, normals = domain.boundary_sample(4096, method, seed=0)
    assert points.shape == (4096, 3) and domain.signed_distance(points).abs().max() < 1e-12
    on_sphere = ((points - 0.5).norm(dim=1) - 0.3).abs() < 1e-12
    torch.testing.assert_close(normals[on_sphere], -(points[on_sphere] - 0.5) / 0.3)
    share = 4 * PI * 0.09 / (6 + 4 * PI * 0.09)  # the sphere's share of the boundary area
    assert abs(float(on_sphere.double().mean()) - share) < 4 * math.sqrt(share * (1 - share) / 4096)
    x = domain.interior(500, method, seed=0)
    assert bool(((x - 0.5).norm(dim=1) > 0.3).all()) and domain.contains(x).all()
    with pytest.raises(ValueError, match="closed form in 2D only"):
        _ = domain.measure


def test_mixed_dimensions_and_non_geometries_are_refused():
    with pytest.raises(ValueError, match="2D and a 3D"):
        Disk((0.0, 0.0), 1.0) - Ball((0.0, 0.0, 0.0), 1.0)
    with pytest.raises(TypeError, match="combines geometries"):
        Union(Disk((0.0, 0.0), 1.0), np.zeros(2))
    with pytest.raises(ValueError, match="no grid"):
        plate().interior(16, "grid")


def test_a_polygon_piece_is_the_same_as_a_box_piece():
    hole = Disk((1.0, 0.5), 0.3)
    square = Polygon([(0.0, 0.0), (2.0, 0.0), (2.0, 1.0), (0.0, 1.0)])
    by_polygon, by_box = square - hole, Box((0.0, 0.0), (2.0, 1.0)) - hole
    assert math.isclose(by_polygon.measure, 2 - PI * 0.09, rel_tol=1e-13)
    assert math.isclose(by_polygon.boundary_measure, by_box.boundary_measure, rel_tol=1e-13)
    points, normals = by_polygon.boundary_sample(300, "grid")
    assert by_box.signed_distance(points).abs().max() < 1e-14
    torch.testing.assert_close(normals, by_box.normal(points))


def test_the_operators_need_no_registry():
    """geometry.py defines the combinations beside Geometry: a fresh interpreter that imports only the
    shapes gets a Difference from ``-``, and geometry keeps no table of classes."""
    import subprocess
    import sys

    code = ("from lit_constrained.physics.shapes import Box, Disk; import lit_constrained.physics.geometry as g;"
            "d = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.1); "
            "print(type(d).__module__, type(d).__name__, hasattr(g, 'COMBINATIONS'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["lit_constrained.physics.geometry", "Difference", "False"]
