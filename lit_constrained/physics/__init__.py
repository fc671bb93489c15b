"""Physics-informed building blocks: differential operators of a pointwise field with respect to its
input coordinates (:mod:`~lit_constrained.physics.operators`, built on :mod:`torch.func`, so they work
both on ordinary batches and inside ``vmap`` / ``jacrev`` over points), seeded points of the unit cube by a
sampling method (:mod:`~lit_constrained.physics.collocation`), boxes, disks, balls and polygons
(:mod:`~lit_constrained.physics.shapes`), their differences, unions and intersections
with outward unit normals (:mod:`~lit_constrained.physics.geometry`)
and space-time cylinders (:mod:`~lit_constrained.physics.spacetime`).

Example (the residual of -Δu = f at collocation points of the unit square)::

    from lit_constrained.physics import Box, laplacian

    x = Box.unit(2).interior(64, "lhs", seed=0)
    residual = -laplacian(lambda x: net(x)[:, 0], x) - f(x)
"""

from lit_constrained.physics.collocation import SAMPLING_METHODS, SamplingMethod, unit_cube_sample
from lit_constrained.physics.geometry import BoundarySample, Difference, Geometry, Intersection, Union
from lit_constrained.physics.shapes import Ball, Box, Disk, Polygon
from lit_constrained.physics.spacetime import SpaceTime
from lit_constrained.physics.operators import (
    Coordinate, FieldDerivatives, coordinate_index, default_names, derivatives, divergence, gradient, hessian,
    laplacian, normal_derivative, partial, periodic_difference, time_derivative,
)

__all__ = [
    "Ball", "BoundarySample", "Box", "Coordinate", "Difference", "Disk", "Geometry", "Intersection", "Polygon",
    "SpaceTime", "Union", "FieldDerivatives", "SAMPLING_METHODS", "SamplingMethod", "coordinate_index",
    "default_names", "derivatives", "divergence", "gradient", "hessian", "laplacian", "normal_derivative", "partial",
    "periodic_difference", "time_derivative", "unit_cube_sample",
]
