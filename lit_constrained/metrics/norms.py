"""The l1 and l2 norms of the constraint residuals, accumulated over batches and ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import ViolationMetric
from .functional import _l2_compute, _sum_abs_update, _sum_squares_update


class L1Violation(ViolationMetric):
    r"""l1 norm of all residuals seen since the last reset.

    .. math:: \|c\|_1 = \sum_{i=1}^m |c_i|

    State: the sum of :math:`|c_i|`, reduced across ranks with ``sum``: the synced value is the l1 norm of
    the union of all ranks' residuals.

    Args:
        kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute=False``).

    Example:
        >>> import torch
        >>> metric = L1Violation()
        >>> metric.update(torch.tensor([0.5, -3.0]))
        >>> metric.update(torch.tensor([1.0]))
        >>> metric.compute()
        tensor(4.5000)
    """

    sum_abs: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sum_abs", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, constraints: Tensor) -> None:
        """Fold in a batch of residuals (any shape)."""
        self.sum_abs += _sum_abs_update(self._detached(constraints))[0].to(self.sum_abs)

    def compute(self) -> Tensor:
        """The l1 norm seen."""
        return self.sum_abs.clone()


class L2Violation(ViolationMetric):
    r"""Euclidean norm of all residuals seen since the last reset.

    .. math:: \|c\|_2 = \Big(\sum_{i=1}^m |c_i|^2\Big)^{1/2}

    State: the sum of squares, reduced across ranks with ``sum``; the square root is taken only in
    ``compute``, so the synced value is the norm of the union of all ranks' residuals (not a sum of norms).

    Args:
        kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute=False``).

    Example:
        >>> import torch
        >>> metric = L2Violation()
        >>> metric.update(torch.tensor([3.0]))
        >>> metric.update(torch.tensor([-4.0]))
        >>> metric.compute()
        tensor(5.)
    """

    sum_squares: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sum_squares", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, constraints: Tensor) -> None:
        """Fold in a batch of residuals (any shape)."""
        self.sum_squares += _sum_squares_update(self._detached(constraints)).to(self.sum_squares)

    def compute(self) -> Tensor:
        """The l2 norm seen."""
        return _l2_compute(self.sum_squares)
