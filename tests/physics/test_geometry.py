"""lit_constrained.physics.geometry: the shared pieces (packing of boundary samples, the proportional
shares, the 1D sampler) and the 2D boundary as arc-length intervals of its pieces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.physics import Box, Disk, Geometry
from lit_constrained.physics.collocation import allocate, unit_interval_sample
from lit_constrained.physics.geometry import BoundaryCurve


def test_a_boundary_sample_is_points_and_normals():
    sample = Disk((0.0, 0.0), 1.0).boundary_sample(5, seed=0)
    assert sample.points.shape == sample.normals.shape == (5, 2)
    x, n = sample  # a tuple
    assert torch.equal(x, sample.points) and torch.equal(n, sample.normals)
    torch.testing.assert_close(n, x)  # the unit circle's outward normal is the point itself


def test_allocate_is_proportional_by_largest_remainders_and_exact():
    assert allocate(10, [1.0, 1.0, 2.0]) == [3, 2, 5]  # shares 2.5, 2.5, 5: the tie goes to the first
    assert allocate(7, [1.0] * 4) == [2, 2, 2, 1]
    counts = allocate(100_003, [math.pi, 1.0, 0.001])
    assert sum(counts) == 100_003 and counts[2] == round(100_003 * 0.001 / (math.pi + 1.001))


@pytest.mark.parametrize("method", ["uniform", "lhs", "sobol", "grid"])
def test_unit_interval_sample_is_n_numbers_in_the_unit_interval(method):
    v = unit_interval_sample(100, method, np.random.default_rng(0))
    assert v.shape == (100,) and v.min() >= 0 and v.max() < 1
    if method in ("lhs", "grid"):  # one in each of the 100 slices
        assert sorted(np.floor(v * 100).astype(int)) == list(range(100))


def test_the_kept_intervals_of_a_disk_cut_by_a_box_edge_are_the_closed_form_angles():
    """A disk centered on the square's top edge, subtracted: its kept arc is the lower half (angles pi..2pi)."""
    domain = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 1.0), 0.25)
    curve = BoundaryCurve.of(domain)
    arcs = [(sign, a, b) for leaf, sign, a, b in curve.pieces if isinstance(leaf, Disk)]
    assert len(arcs) == 1 and arcs[0][0] == -1.0
    np.testing.assert_allclose(arcs[0][1:], (0.5, 1.0), rtol=0, atol=1e-12)
    assert math.isclose(curve.length, 4 - 0.5 + math.pi * 0.25, rel_tol=1e-13)
    assert math.isclose(curve.area(), 1 - math.pi * 0.25**2 / 2, rel_tol=1e-13)


def test_box_is_a_geometry_with_the_closed_form_measures_distance_and_normals():
    box = Box((0.0, -1.0, 2.0), (2.0, 1.0, 3.0))
    assert isinstance(box, Geometry) and box.measure == 4.0 and box.boundary_measure == 2 * (2 * 2 + 2 * 1 + 2 * 1)
    x = torch.tensor([[1.0, 0.0, 2.5], [1.9, 0.0, 2.5], [3.0, 2.0, 2.5]], dtype=torch.float64)
    torch.testing.assert_close(box.signed_distance(x), torch.tensor([-0.5, -0.1, math.sqrt(2)], dtype=torch.float64))
    assert box.normal(x[1:2]).tolist() == [[1.0, 0.0, 0.0]]
    assert box.contains(x).tolist() == [True, True, False]


class MappedDisk(Disk):
    """A disk whose circle the boundary curve does not know: sampled through its own arc-length map."""

    _perimeter_circle = None


@pytest.mark.parametrize("method", ["uniform", "sobol", "grid"])
def test_a_piece_known_only_by_its_map_samples_as_the_circle_does(method):
    box = Box((0.0, 0.0), (1.0, 1.0))
    known, mapped = box - Disk((0.5, 0.5), 0.2), box - MappedDisk((0.5, 0.5), 0.2)
    a, b = known.boundary_sample(512, method, seed=0), mapped.boundary_sample(512, method, seed=0)
    torch.testing.assert_close(a.points, b.points, rtol=0, atol=1e-15)
    torch.testing.assert_close(a.normals, b.normals, rtol=0, atol=1e-15)
    on_hole = ((b.points - 0.5).norm(dim=1) - 0.2).abs() < 1e-12
    assert 0 < int(on_hole.sum()) < 512
    torch.testing.assert_close(b.normals[on_hole], -(b.points[on_hole] - 0.5) / 0.2)
