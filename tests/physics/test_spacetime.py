"""lit_constrained.physics.spacetime: the cylinder geometry x [t0, t1]: slices, lateral normals, measures."""

from __future__ import annotations

import math

import pytest
import torch

from lit_constrained.physics import Box, Disk, Polygon, SpaceTime

RANDOM = ("uniform", "lhs", "sobol")


def plate():
    return Box((0.0, 0.0), (2.0, 1.0)) - Disk((1.0, 0.5), 0.25)


@pytest.mark.parametrize("method", RANDOM)
def test_interior_points_are_in_the_geometry_at_times_in_the_interval(method):
    cylinder = SpaceTime(plate(), (1.0, 3.0))
    x = cylinder.interior(256, method, seed=0)
    assert x.shape == (256, 3) and cylinder.names == ("x", "y", "t")
    assert plate().contains(x[:, :2]).all() and bool(((x[:, 2] >= 1) & (x[:, 2] <= 3)).all())
    assert torch.equal(x, cylinder.interior(256, method, seed=0)) and not torch.equal(x, cylinder.interior(256, method, seed=1))
    if method == "lhs":  # the times are a Latin hypercube of [1, 3]: one in each of the 256 slices
        assert sorted(((x[:, 2] - 1) / 2 * 256).floor().long().tolist()) == list(range(256))


def test_initial_and_final_slices():
    cylinder = SpaceTime(Disk((0.0, 0.0), 1.0), (0.5, 2.0), time_name="s")
    first, last = cylinder.initial(10, "lhs", seed=2), cylinder.final(10, seed=2)
    assert cylinder.names == ("x", "y", "s")
    assert first[:, 2].eq(0.5).all() and last[:, 2].eq(2.0).all()
    assert torch.equal(first[:, :2], Disk((0.0, 0.0), 1.0).interior(10, "lhs", seed=2))


@pytest.mark.parametrize("method", RANDOM)
def test_lateral_boundary_has_spatial_normals_and_zero_time_component(method):
    geometry = plate()
    cylinder = SpaceTime(geometry, (0.0, 1.0))
    points, normals = cylinder.boundary_sample(512, method, seed=0)
    assert points.shape == normals.shape == (512, 3) and normals[:, 2].abs().max() == 0
    assert geometry.signed_distance(points[:, :2]).abs().max() < 1e-12
    torch.testing.assert_close(normals[:, :2], geometry.normal(points[:, :2]))
    assert bool(((points[:, 2] >= 0) & (points[:, 2] <= 1)).all())
    assert torch.equal(points, cylinder.boundary(512, method, seed=0))


def test_measures_are_the_products():
    triangle = Polygon([(0.0, 0.0), (3.0, 0.0), (0.0, 4.0)])
    cylinder = SpaceTime(triangle, (-1.0, 1.5))
    assert math.isclose(cylinder.measure, 6.0 * 2.5) and math.isclose(cylinder.lateral_measure, 12.0 * 2.5)
    assert cylinder.dim == 3 and cylinder.duration == 2.5


def test_an_interval_in_time_is_a_space_time_box_slab():
    """SpaceTime of a 1D box: its lateral boundary is the two ends x = a, b over time with normals -1, +1."""
    cylinder = SpaceTime(Box((-1.0,), (1.0,)), (0.0, 1.0))
    points, normals = cylinder.boundary_sample(6, seed=0)
    assert sorted(points[:, 0].tolist()) == [-1.0] * 3 + [1.0] * 3
    assert torch.equal(normals[:, 0], points[:, 0]) and cylinder.names == ("x", "t")


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="t1 > t0"):
        SpaceTime(Disk((0.0, 0.0), 1.0), (1.0, 1.0))
    with pytest.raises(TypeError, match="needs a Geometry"):
        SpaceTime((0.0, 1.0), (0.0, 1.0))
    with pytest.raises(ValueError, match="time_name"):
        SpaceTime(Box((0.0, 0.0), (1.0, 1.0), names=("x", "t")), (0.0, 1.0))
    with pytest.raises(ValueError, match="no grid"):
        SpaceTime(Disk((0.0, 0.0), 1.0), (0.0, 1.0)).interior(16, "grid")


def test_a_space_time_cylinder_is_a_geometry():
    """SpaceTime is a Geometry: bounds, the cylinder's signed distance (exact for a box: the 3D box's),
    contains, the nearest piece's normal, and the operators."""
    from lit_constrained.physics import Geometry

    cylinder = SpaceTime(Box((0.0, 0.0), (1.0, 2.0)), (0.0, 1.0))
    assert isinstance(cylinder, Geometry) and cylinder.boundary_measure == cylinder.lateral_measure == 6.0
    lower, upper = cylinder.bounds
    assert lower.tolist() == [0.0, 0.0, 0.0] and upper.tolist() == [1.0, 2.0, 1.0]
    solid = Box((0.0, 0.0, 0.0), (1.0, 2.0, 1.0))
    x = torch.tensor([[0.5, 1.0, 0.5], [0.5, 1.0, 0.95], [0.05, 1.0, 0.5], [2.0, 3.0, 2.0], [0.5, 1.0, -0.5]],
                     dtype=torch.float64)
    assert torch.allclose(cylinder.signed_distance(x), solid.signed_distance(x), atol=1e-15)
    assert cylinder.contains(x).tolist() == [True, True, True, False, False]
    assert cylinder.normal(x[1:3]).tolist() == [[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]]  # a slice nearer, a wall nearer
    points, normals = cylinder.boundary_sample(64, seed=0)
    assert torch.equal(cylinder.normal(points), normals)  # on the lateral boundary: (n_x, 0)
    assert cylinder.signed_distance(points).abs().max() < 1e-12
    hollow = cylinder - SpaceTime(Disk((0.5, 1.0), 0.25), (0.0, 1.0))
    assert hollow.contains(torch.tensor([[0.5, 1.0, 0.5], [0.1, 0.1, 0.5]], dtype=torch.float64)).tolist() == [False, True]
