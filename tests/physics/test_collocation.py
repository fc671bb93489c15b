"""The box (lit_constrained.physics.shapes.Box) and the collocation samplers: where the points lie, how they
are stratified, reproducibility, and one argument order across the samplers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.physics import Box

RANDOM = ("uniform", "lhs", "sobol")


def on_boundary(box: Box, x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    lower, upper = torch.tensor(box.lower, dtype=x.dtype), torch.tensor(box.upper, dtype=x.dtype)
    return ((x[:, axes] == lower[axes]) | (x[:, axes] == upper[axes])).any(1)


@pytest.mark.parametrize("method", RANDOM)
def test_interior_points_lie_in_the_box_and_are_seeded(method):
    box = Box((-1.0, 0.0, 2.0), (1.0, 0.5, 5.0))
    x = box.interior(32, method, seed=4)
    assert x.shape == (32, 3) and x.dtype == torch.float64
    assert bool((x >= torch.tensor(box.lower)).all() and (x <= torch.tensor(box.upper)).all())
    assert torch.equal(x, box.interior(32, method, seed=4))
    assert not torch.equal(x, box.interior(32, method, seed=5))
    assert box.interior(8, method, dtype=torch.float32).dtype == torch.float32


def test_latin_hypercube_has_one_point_in_each_slice_of_each_coordinate():
    box = Box((0.0, 10.0), (2.0, 11.0))
    n = 20
    x = box.interior(n, "lhs", seed=1).numpy()
    for axis in range(2):
        unit = (x[:, axis] - box.lower[axis]) / (box.upper[axis] - box.lower[axis])
        assert sorted(np.floor(unit * n).astype(int)) == list(range(n))


def test_sobol_power_of_two_is_balanced_in_each_coordinate():
    x = Box.unit(2).interior(16, "sobol", seed=0).numpy()
    for axis in range(2):
        assert sorted(np.floor(x[:, axis] * 16).astype(int)) == list(range(16))


@pytest.mark.filterwarnings("ignore:The balance properties of Sobol")  # n per face is not a power of 2
@pytest.mark.parametrize("method", RANDOM)
def test_boundary_is_shared_among_faces_by_their_length(method):
    box = Box((0.0, 0.0), (2.0, 1.0))  # faces x = 0, 2 have length 1; y = 0, 1 have length 2
    x = box.boundary(60, method, seed=2)
    assert x.shape == (60, 2) and bool(on_boundary(box, x, [0, 1]).all())
    counts = [int((x[:, 0] == 0).sum()), int((x[:, 0] == 2).sum()), int((x[:, 1] == 0).sum()), int((x[:, 1] == 1).sum())]
    assert counts == [10, 10, 20, 20]
    assert torch.equal(x, box.boundary(60, method, seed=2))
    assert not torch.equal(x, box.boundary(60, method, seed=3))


def test_boundary_counts_that_do_not_divide_go_to_the_largest_remainders():
    x = Box.unit(2).boundary(7, seed=0)
    faces = [int((x[:, 0] == 0).sum()), int((x[:, 0] == 1).sum()), int((x[:, 1] == 0).sum()), int((x[:, 1] == 1).sum())]
    assert sorted(faces) == [1, 2, 2, 2] and sum(faces) == 7


@pytest.mark.filterwarnings("ignore:The balance properties of Sobol")  # n per face is not a power of 2
def test_space_time_box_spatial_boundary_and_initial_slice():
    box = Box((0.0, 0.0), (1.0, 2.0), names=("x", "t"))
    walls = box.boundary(30, "lhs", seed=0, dims=("x",))
    assert bool(((walls[:, 0] == 0) | (walls[:, 0] == 1)).all())
    assert bool(((walls[:, 1] >= 0) & (walls[:, 1] <= 2)).all()) and int((walls[:, 0] == 0).sum()) == 15
    start = box.initial(12, "sobol", seed=0, time="t")
    assert bool((start[:, 1] == 0).all()) and bool(((start[:, 0] >= 0) & (start[:, 0] <= 1)).all())
    assert torch.equal(box.initial(12, method="sobol", seed=0), start)  # time defaults to the last coordinate
    top = box.face("t", "upper", 5, seed=1)
    assert bool((top[:, 1] == 2).all())


def test_grids_interior_face_boundary_and_test_grid():
    box = Box((0.0, 0.0), (1.0, 2.0))
    inner = box.interior(9, "grid")
    expected = torch.tensor([[a, b] for a in (0.25, 0.5, 0.75) for b in (0.5, 1.0, 1.5)], dtype=torch.float64)
    assert torch.equal(inner, expected)
    edge = box.boundary(12, "grid")  # k = 4 nodes per axis: 4 k - 4 boundary nodes, corners once
    assert edge.shape == (12, 2) and len({tuple(p) for p in edge.tolist()}) == 12
    assert bool(on_boundary(box, edge, [0, 1]).all())
    face = box.face("y", "upper", 3, "grid")
    assert torch.equal(face, torch.tensor([[0.0, 2.0], [0.5, 2.0], [1.0, 2.0]], dtype=torch.float64))
    test = box.grid(5)
    assert test.shape == (25, 2) and float(test[:, 1].max()) == 2.0 and float(test[:, 0].min()) == 0.0
    assert box.grid([2, 3]).shape == (6, 2)
    walls = Box((0.0, 0.0), (1.0, 1.0), ("x", "t")).boundary(8, "grid", dims=("x",))  # k = 4: 2 walls x 4 times
    assert walls.shape == (8, 2) and bool(((walls[:, 0] == 0) | (walls[:, 0] == 1)).all())


def test_one_dimensional_box():
    box = Box((0.0,), (3.0,))
    ends = box.boundary(4, seed=0)
    assert sorted(ends[:, 0].tolist()) == [0.0, 0.0, 3.0, 3.0]
    assert box.interior(5, "grid")[:, 0].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]


def test_errors_name_the_fix():
    box = Box.unit(2)
    with pytest.raises(ValueError, match="nearest grids have 8 or 12"):
        box.boundary(10, "grid")
    with pytest.raises(ValueError, match="nearest grids have 4 or 9"):
        box.interior(5, "grid")
    with pytest.raises(ValueError, match="one of"):
        box.interior(5, "halton")
    with pytest.raises(ValueError, match="positive integer"):
        box.interior(0)
    with pytest.raises(ValueError, match="upper > lower"):
        Box((0.0, 1.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="'lower' or 'upper'"):
        box.face("x", "left", 3)
    with pytest.raises(ValueError, match="Unknown coordinate 't'"):
        box.initial(3, time="t")
    with pytest.raises(ValueError, match="2 distinct names"):
        Box((0.0, 0.0), (1.0, 1.0), names=("x", "x"))


@pytest.mark.filterwarnings("ignore:The balance properties of Sobol")
@pytest.mark.parametrize("method", RANDOM)
def test_boundary_sample_gives_boundary_points_and_their_face_normals(method):
    box = Box((0.0, -1.0, 0.0), (2.0, 1.0, 3.0), names=("x", "y", "t"))
    for dims in (None, ("x", "y")):
        points, normals = box.boundary_sample(60, method, seed=1, dims=dims)
        assert torch.equal(points, box.boundary(60, method, seed=1, dims=dims))
        lower, upper = torch.tensor(box.lower, dtype=points.dtype), torch.tensor(box.upper, dtype=points.dtype)
        expected = (points == upper).double() - (points == lower).double()
        assert torch.equal(normals, expected) and bool((normals.abs().sum(1) == 1).all())
        if dims is not None:
            assert normals[:, 2].abs().max() == 0


def test_boundary_grid_normals_and_the_corner_nodes():
    box = Box.unit(2)
    points, normals = box.boundary_sample(8, "grid")  # the 3 x 3 grid's 8 boundary nodes
    assert torch.equal(points, box.boundary(8, "grid"))
    corner = (points == 0).all(1)
    torch.testing.assert_close(normals[corner], torch.tensor([[-1.0, -1.0]], dtype=torch.float64) / math.sqrt(2))
    side = (points[:, 0] == 1) & (points[:, 1] == 0.5)
    assert normals[side].tolist() == [[1.0, 0.0]]


def test_periodic_pairs_face_each_other_across_the_coordinate():
    box = Box((0.0, 0.0), (3.0, 1.0), names=("x", "t"))
    pairs = box.periodic_pairs("x", 16, "lhs", seed=0)
    assert pairs.shape == (16, 4)
    assert torch.equal(pairs[:, :2], box.face("x", "lower", 16, "lhs", seed=0))
    assert bool((pairs[:, 2] == 3).all()) and torch.equal(pairs[:, 1], pairs[:, 3])


def test_box_in_two_dimensions_as_a_piece_of_a_constructive_geometry():
    """Its arc-length map goes round the rectangle counter-clockwise from the lower-left corner."""
    box = Box((0.0, 0.0), (2.0, 1.0))
    points, normals = box._perimeter(np.array([0.0, 0.25, 3.5 / 6, 0.75, 0.9]))  # arc lengths 0, 1.5, 3.5, 4.5, 5.4
    np.testing.assert_allclose(points, [[0.0, 0.0], [1.5, 0.0], [1.5, 1.0], [0.5, 1.0], [0.0, 0.6]], rtol=0, atol=1e-15)
    assert normals.tolist() == [[0.0, -1.0], [0.0, -1.0], [0.0, 1.0], [0.0, 1.0], [-1.0, 0.0]]
    assert box.measure == 2.0 and box.boundary_measure == 6.0


def test_every_sampler_takes_n_method_seed_dtype_in_that_order():
    """Box.boundary / boundary_sample / initial take (n, method, seed, dtype) positionally, as every geometry's
    samplers do; the part of the box (dims, time) only by keyword."""
    import inspect

    from lit_constrained.physics import Disk, Geometry, SpaceTime

    box = Box((0.0, 0.0), (1.0, 2.0), names=("x", "t"))
    for sampler in (box.interior, box.boundary, box.boundary_sample, box.initial, Disk((0.0, 0.0), 1.0).boundary,
                    SpaceTime(Disk((0.0, 0.0), 1.0), (0.0, 1.0)).initial, Geometry.boundary_sample):
        positional = [p.name for p in inspect.signature(sampler).parameters.values()
                      if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"]
        assert positional == ["n", "method", "seed", "dtype"], (sampler, positional)
    walls = box.boundary(8, "lhs", 3, torch.float32, dims=("x",))
    assert walls.dtype == torch.float32 and bool(((walls[:, 0] == 0) | (walls[:, 0] == 1)).all())
    assert torch.equal(box.boundary_sample(8, "lhs", 3, torch.float32, dims=("x",)).points, walls)
    with pytest.raises(TypeError):
        box.boundary(8, "lhs", 3, torch.float32, ("x",))  # dims only by keyword
