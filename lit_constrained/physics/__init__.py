"""Physics-informed building blocks: differential operators of a pointwise field with respect to its
input coordinates (:mod:`~lit_constrained.physics.operators`, built on :mod:`torch.func`, so they work
both on ordinary batches and inside ``vmap`` / ``jacrev`` over points) and seeded collocation points in
a box (:mod:`~lit_constrained.physics.collocation`).

Example (the residual of -Δu = f at collocation points of the unit square)::

    from lit_constrained.physics import Box, laplacian

    x = Box.unit(2).interior(64, "lhs", seed=0)
    residual = -laplacian(lambda x: net(x)[:, 0], x) - f(x)
"""

from lit_constrained.physics.collocation import SAMPLING_METHODS, Box, SamplingMethod, unit_cube_sample
from lit_constrained.physics.operators import (
    Coordinate, FieldDerivatives, coordinate_index, default_names, derivatives, divergence, gradient, hessian,
    laplacian, partial, time_derivative,
)

__all__ = [
    "Box", "Coordinate", "FieldDerivatives", "SAMPLING_METHODS", "SamplingMethod", "coordinate_index",
    "default_names", "derivatives", "divergence", "gradient", "hessian", "laplacian", "partial",
    "time_derivative", "unit_cube_sample",
]
