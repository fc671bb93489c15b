"""The mean constraint violation (1/m) sum_i |c_i|, accumulated over batches and ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import ViolationMetric
from .functional import _mean_compute, _sum_abs_update


class MeanViolation(ViolationMetric):
    r"""Mean absolute constraint residual over everything seen since the last reset.

    .. math:: \frac{1}{m} \sum_{i=1}^m |c_i|

    States: the sum of :math:`|c_i|` and the count :math:`m`, both reduced across ranks with ``sum``, so the
    synced value is the mean over the union of all ranks' residuals (shards of different sizes are weighted
    by their sizes, not averaged per rank). Nothing seen gives NaN.

    Args:
        kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute=False``).

    Example:
        >>> import torch
        >>> metric = MeanViolation()
        >>> metric.update(torch.tensor([0.5, -3.0]))
        >>> metric.update(torch.tensor([1.0]))
        >>> metric.compute()
        tensor(1.5000)
    """

    sum_abs: Tensor
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sum_abs", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, constraints: Tensor) -> None:
        """Fold in a batch of residuals (any shape)."""
        total, count = _sum_abs_update(self._detached(constraints))
        self.sum_abs += total.to(self.sum_abs)
        self.count += count

    def compute(self) -> Tensor:
        """The mean seen."""
        return _mean_compute(self.sum_abs, self.count)
