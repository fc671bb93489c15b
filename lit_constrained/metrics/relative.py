"""The constraint violation relative to a reference violation ||c|| / ||c_0||."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from ._base import ViolationMetric
from .functional import (
    _l2_compute,
    _max_update,
    _relative_compute,
    _sum_abs_update,
    _sum_squares_update,
    check_norm_order,
    reference_norm,
)


class RelativeViolation(ViolationMetric):
    r"""Norm of the residuals seen since the last reset, relative to a reference norm.

    .. math::
        r = \frac{\|c\|_p}{\rho}, \qquad
        \rho = \begin{cases} \|c_0\|_p & \text{if } \|c_0\|_p > 0 \\ 1 & \text{otherwise} \end{cases}

    :math:`c_0` is the one given as ``reference`` or, if none is given, the first value seen: the first
    finite norm this metric computes (by ``compute`` or ``forward``) becomes :math:`\|c_0\|_p`, so the first
    value is 1 and later ones say how much of the initial violation is left. The reference survives
    ``reset()`` (it is a persistent buffer, saved in ``state_dict`` and moved with ``.to``);
    ``reset_reference()`` forgets it. Under DDP the norm is computed from synced statistics, so the
    reference taken from it is the same on every rank.

    States, reduced across ranks so the synced norm is the norm of the union of all ranks' residuals:
    the sum of :math:`|c_i|` (``sum``) for :math:`p = 1`, the sum of squares (``sum``, square root at
    compute) for :math:`p = 2`, the maximum (``max``) for :math:`p = \infty`.

    Args:
        p: norm order, 1, 2 or ``float("inf")`` (or ``"inf"``).
        reference: the reference residual vector :math:`c_0` (a tensor with >= 1 dimension) or its norm
            (a float >= 0); None takes the first value seen.
        kwargs: passed to :class:`torchmetrics.Metric` (e.g. ``sync_on_compute=False``).

    Example:
        >>> import torch
        >>> metric = RelativeViolation()
        >>> metric.update(torch.tensor([3.0, -4.0]))
        >>> metric.compute()  # the first value seen is the reference
        tensor(1.)
        >>> metric.reset()
        >>> metric.update(torch.tensor([0.3, 0.4]))
        >>> metric.compute()
        tensor(0.1000)
    """

    statistic: Tensor
    reference_value: Tensor

    def __init__(self, p: float | Literal["inf"] = 2.0, reference: Tensor | float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.p = check_norm_order(p)
        reduce = "max" if self.p == float("inf") else "sum"
        self.add_state("statistic", default=torch.tensor(0.0), dist_reduce_fx=reduce)
        # NaN marks "no reference yet"; a buffer (not a state) so that reset() keeps it.
        self.register_buffer("reference_value", torch.tensor(float("nan")), persistent=True)
        if reference is not None:
            self.set_reference(reference)

    @property
    def reference(self) -> float | None:
        """The reference norm :math:`\\|c_0\\|_p`, or None while none is set."""
        value = float(self.reference_value)
        return None if value != value else value

    def set_reference(self, reference: Tensor | float) -> None:
        """Set :math:`c_0` (a residual vector) or its norm (a float >= 0)."""
        norm = reference_norm(reference, self.p)
        self.reference_value.copy_(norm.to(self.reference_value))

    def reset_reference(self) -> None:
        """Forget the reference: the next computed value becomes it."""
        self.reference_value.fill_(float("nan"))

    def update(self, constraints: Tensor) -> None:
        """Fold in a batch of residuals (any shape)."""
        c = self._detached(constraints)
        if self.p == 1.0:
            self.statistic += _sum_abs_update(c)[0].to(self.statistic)
        elif self.p == 2.0:
            self.statistic += _sum_squares_update(c).to(self.statistic)
        else:
            self.statistic = torch.maximum(self.statistic, _max_update(c).to(self.statistic))

    def compute(self) -> Tensor:
        """The relative violation; takes the reference from this value if none is set and it is finite."""
        norm = _l2_compute(self.statistic) if self.p == 2.0 else self.statistic.clone()
        ref = self.reference_value.to(norm)
        take = torch.isnan(ref) & torch.isfinite(norm)
        self.reference_value.copy_(torch.where(take, norm, ref).to(self.reference_value))
        return _relative_compute(norm, self.reference_value.to(norm))
