"""The largest constraint violation max_i |c_i|, accumulated over batches and ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ._base import ViolationMetric
from .functional import _max_update


class MaxViolation(ViolationMetric):
    r"""Largest absolute constraint residual over everything seen since the last reset.

    .. math:: \|c\|_\infty = \max_{i} |c_i|

    State: the running maximum, reduced across ranks with ``max``, so the synced value is the maximum
    over the union of all ranks' residuals. Nothing seen gives 0.

    Args:
        kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute=False``).

    Example:
        >>> import torch
        >>> metric = MaxViolation()
        >>> metric.update(torch.tensor([0.5, -3.0]))
        >>> metric.update(torch.tensor([1.0]))
        >>> metric.compute()
        tensor(3.)
    """

    max_abs: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("max_abs", default=torch.tensor(0.0), dist_reduce_fx="max")

    def update(self, constraints: Tensor) -> None:
        """Fold in a batch of residuals (any shape)."""
        batch_max = _max_update(self._detached(constraints)).to(self.max_abs)
        self.max_abs = torch.maximum(self.max_abs, batch_max)

    def compute(self) -> Tensor:
        """The maximum seen."""
        return self.max_abs.clone()
