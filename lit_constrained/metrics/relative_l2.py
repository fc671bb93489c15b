r"""The relative L2 error of a prediction against a reference solution.

.. math::
    \text{global:}\quad \frac{\|\hat u - u\|_2}{\|u\|_2}, \qquad
    \text{per sample:}\quad \frac{1}{S}\sum_{i=1}^{S} \frac{\|\hat u_i - u_i\|_2}{\|u_i\|_2}

(the per-sample mean is the FNO papers' convention for fields; the global ratio weighs every point the
same). :func:`relative_l2_error` is the value on one batch, in the inputs' dtype;
:class:`RelativeL2Error` accumulates the global ratio over batches and ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torchmetrics
from torch import Tensor


def _check_shapes(prediction: Tensor, target: Tensor) -> None:
    if prediction.shape != target.shape:
        raise ValueError(f"prediction and target shapes differ: {tuple(prediction.shape)} vs {tuple(target.shape)}.")


def relative_l2_error(prediction: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
    r"""The relative L2 error of one batch, a 0-d tensor in the inputs' dtype.

    ``per_sample=False``: :math:`\|\hat u - u\|_2 / \|u\|_2` over all entries. ``per_sample=True``: the
    mean over the first dimension (samples) of each sample's ratio, the norms over its other dimensions.

    Example:
        >>> import torch
        >>> prediction, target = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 1.0], [4.0, 4.0]])
        >>> round(relative_l2_error(prediction, target).item(), 6)  # sqrt((0 + 1 + 1 + 0) / 34)
        0.242536
        >>> round(relative_l2_error(prediction, target, per_sample=True).item(), 6)  # (1/sqrt(2) + 1/sqrt(32)) / 2
        0.441942
    """
    _check_shapes(prediction, target)
    if not per_sample:
        return (prediction - target).norm() / target.norm()
    if prediction.dim() < 1:
        raise ValueError("per_sample=True needs a first dimension of samples, got a 0-d tensor.")
    return ((prediction - target).flatten(1).norm(dim=1) / target.flatten(1).norm(dim=1)).mean()


class RelativeL2Error(torchmetrics.Metric):
    r""":math:`\|\hat u - u\|_2 / \|u\|_2` over everything seen since the last reset (correct under DDP:
    the two sums are reduced over ranks before the ratio; accumulated in float64).

    Example:
        >>> import torch
        >>> metric = RelativeL2Error()
        >>> metric.update(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]))
        >>> metric.update(torch.tensor([3.0]), torch.tensor([1.0]))
        >>> round(metric.compute().item(), 6)  # sqrt((0 + 1 + 4) / 3)
        1.290994
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    error_sq: Tensor
    reference_sq: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("error_sq", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("reference_sq", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, prediction: Tensor, target: Tensor) -> None:
        _check_shapes(prediction, target)
        self.error_sq += (prediction.double() - target.double()).square().sum()
        self.reference_sq += target.double().square().sum()

    def compute(self) -> Tensor:
        return (self.error_sq / self.reference_sq.clamp(min=torch.finfo(torch.float64).tiny)).sqrt()
