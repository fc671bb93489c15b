"""Shared class attributes of the constraint-violation metrics."""

from __future__ import annotations

from torch import Tensor
from torchmetrics import Metric

from .functional import _check_constraints


class ViolationMetric(Metric):
    """Base of the violation metrics: lower is better, bounded below by 0, used for monitoring only.

    Updates detach their input, so logging a violation never keeps an autograd graph alive.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False
    plot_lower_bound = 0.0

    @staticmethod
    def _detached(constraints: Tensor) -> Tensor:
        return _check_constraints(constraints).detach()
