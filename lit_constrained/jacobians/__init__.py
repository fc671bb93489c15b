"""The constraint Jacobian J = dc/dx of a task's constraints, in the optimizers' flat layout (pure PyTorch,
no Lightning; it imports nothing of the package but the hints' text).

:mod:`~lit_constrained.jacobians.columns` (the columns of J: the parameters as real numbers),
:mod:`~lit_constrained.jacobians.batched` (batched, looped and per-sample Jacobians of c) and
:mod:`~lit_constrained.jacobians.pointwise` (per-point residuals, point by point: linear in m).
"""

from .batched import GroupingMode, JacobianMethod, constraint_jacobian, constraint_units, per_sample_jacobian
from .columns import block_sizes, numel_real, real_view
from .pointwise import PointwiseJacobian, PointwisePath, chunk_points, pointwise_jacobian

__all__ = [
    "GroupingMode", "JacobianMethod", "PointwiseJacobian", "PointwisePath", "block_sizes", "chunk_points",
    "constraint_jacobian", "constraint_units", "numel_real", "per_sample_jacobian", "pointwise_jacobian", "real_view",
]
