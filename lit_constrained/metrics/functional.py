r"""Functional core of the constraint-violation metrics.

Every metric reduces a vector of equality-constraint residuals :math:`c \in \mathbb{R}^m` (any shape is
flattened; complex residuals use their modulus) to one non-negative number. Each metric is split, as in
torchmetrics, into an ``_update`` function that turns one batch of residuals into additive (or max-able)
sufficient statistics and a ``_compute`` function that turns the accumulated statistics into the value.
Because the statistics are sums, counts and maxima, accumulating them over batches or over ranks and then
computing gives exactly the value on the union of all residuals.

The public functions (``violation_max`` ... ``relative_violation``) are the one-shot versions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..optim.checks import check_residual_tensor

_check_constraints = check_residual_tensor  # the metrics' input check (one copy, in optim/checks.py)

__all__ = [
    "check_norm_order",
    "reference_norm",
    "relative_violation",
    "violation_l1",
    "violation_l2",
    "violation_max",
    "violation_mean",
    "violation_norm",
]


def _abs_flat(constraints: Tensor) -> Tensor:
    """Validate ``constraints`` and return ``|c|`` as a flat real floating-point vector."""
    c = check_residual_tensor(constraints).reshape(-1)
    if not (c.is_floating_point() or c.is_complex()):
        c = c.to(torch.get_default_dtype())
    return c.abs()


def check_norm_order(p: float | str) -> float:
    """Return ``p`` as a float if it is one of the supported norm orders 1, 2 or inf (or "inf"), else raise."""
    if p == "inf":
        return math.inf
    if isinstance(p, bool) or not isinstance(p, (int, float)) or float(p) not in (1.0, 2.0, math.inf):
        raise ValueError(f"Invalid norm order p={p!r}: use 1, 2 or float('inf') / \"inf\" (the max norm).")
    return float(p)


# --------------------------------------------------------------------------------------------- updates
def _max_update(constraints: Tensor) -> Tensor:
    """Largest ``|c_i|`` of the batch (0 for an empty batch: no residual, no violation)."""
    a = _abs_flat(constraints)
    if a.numel() == 0:
        return a.new_zeros(())
    return a.max()


def _sum_abs_update(constraints: Tensor) -> tuple[Tensor, int]:
    """Sum of ``|c_i|`` and the number of residuals of the batch."""
    a = _abs_flat(constraints)
    return a.sum(), a.numel()


def _sum_squares_update(constraints: Tensor) -> Tensor:
    """Sum of ``|c_i|^2`` of the batch."""
    return _abs_flat(constraints).square().sum()


# -------------------------------------------------------------------------------------------- computes
def _mean_compute(sum_abs: Tensor, count: Tensor | int) -> Tensor:
    """Mean of ``|c_i|``; NaN when no residual was seen (the mean of nothing is undefined)."""
    return sum_abs / count


def _l2_compute(sum_squares: Tensor) -> Tensor:
    return sum_squares.sqrt()


def _relative_compute(norm: Tensor, reference: Tensor | float) -> Tensor:
    """``norm / reference``, dividing by 1 instead when the reference norm is 0."""
    ref = torch.as_tensor(reference, dtype=norm.dtype, device=norm.device)
    return norm / torch.where(ref > 0, ref, torch.ones_like(ref))


# ------------------------------------------------------------------------------------------ functional
def violation_max(constraints: Tensor) -> Tensor:
    r"""Largest constraint violation.

    .. math:: \|c\|_\infty = \max_{i} |c_i| \qquad (0 \text{ when } m = 0)

    Args:
        constraints: residuals :math:`c` of any shape (flattened).

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> violation_max(torch.tensor([0.5, -3.0, 1.0]))
        tensor(3.)
    """
    return _max_update(constraints)


def violation_mean(constraints: Tensor) -> Tensor:
    r"""Mean absolute constraint violation.

    .. math:: \frac{1}{m} \sum_{i=1}^m |c_i| \qquad (\text{NaN when } m = 0)

    Args:
        constraints: residuals :math:`c` of any shape (flattened).

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> violation_mean(torch.tensor([0.5, -3.0, 1.0]))
        tensor(1.5000)
    """
    total, count = _sum_abs_update(constraints)
    return _mean_compute(total, count)


def violation_l1(constraints: Tensor) -> Tensor:
    r"""l1 norm of the constraint residuals.

    .. math:: \|c\|_1 = \sum_{i=1}^m |c_i|

    Args:
        constraints: residuals :math:`c` of any shape (flattened).

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> violation_l1(torch.tensor([0.5, -3.0, 1.0]))
        tensor(4.5000)
    """
    return _sum_abs_update(constraints)[0]


def violation_l2(constraints: Tensor) -> Tensor:
    r"""Euclidean norm of the constraint residuals.

    .. math:: \|c\|_2 = \Big(\sum_{i=1}^m |c_i|^2\Big)^{1/2}

    Args:
        constraints: residuals :math:`c` of any shape (flattened).

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> violation_l2(torch.tensor([3.0, -4.0]))
        tensor(5.)
    """
    return _l2_compute(_sum_squares_update(constraints))


def violation_norm(constraints: Tensor, p: float | str = 2.0) -> Tensor:
    r"""The :math:`p`-norm of the residuals, :math:`p \in \{1, 2, \infty\}`.

    .. math:: \|c\|_p = \Big(\sum_{i=1}^m |c_i|^p\Big)^{1/p}, \qquad \|c\|_\infty = \max_i |c_i|

    Args:
        constraints: residuals :math:`c` of any shape (flattened).
        p: norm order, 1, 2 or ``float("inf")`` (or ``"inf"``).

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> violation_norm(torch.tensor([3.0, -4.0]), p=1)
        tensor(7.)
    """
    p = check_norm_order(p)
    if p == 1.0:
        return violation_l1(constraints)
    if p == 2.0:
        return violation_l2(constraints)
    return violation_max(constraints)


def relative_violation(constraints: Tensor, reference: Tensor | float, p: float | str = 2.0) -> Tensor:
    r"""Constraint violation relative to a reference violation :math:`c_0` (e.g. at initialization).

    .. math::
        r(c) = \frac{\|c\|_p}{\rho}, \qquad
        \rho = \begin{cases} \|c_0\|_p & \text{if } \|c_0\|_p > 0 \\ 1 & \text{otherwise} \end{cases}

    Args:
        constraints: residuals :math:`c` of any shape (flattened).
        reference: either the reference residual vector :math:`c_0` (a tensor with at least one
            dimension; its :math:`p`-norm is taken) or the reference norm :math:`\|c_0\|_p` itself
            (a float or 0-d tensor, >= 0).
        p: norm order, 1, 2 or ``float("inf")``.

    Returns:
        A 0-d tensor.

    Example:
        >>> import torch
        >>> relative_violation(torch.tensor([0.3, -0.4]), reference=torch.tensor([3.0, 4.0]))
        tensor(0.1000)
        >>> relative_violation(torch.tensor([0.3, -0.4]), reference=0.0)  # zero reference: divide by 1
        tensor(0.5000)
    """
    return _relative_compute(violation_norm(constraints, p), reference_norm(reference, p))


def reference_norm(reference: Tensor | float, p: float | str = 2.0) -> Tensor:
    """The reference norm: ``||reference||_p`` for a residual vector, the value itself for a scalar.

    Raises:
        ValueError: for a negative, NaN or infinite scalar reference, or a non-numeric one.
    """
    if isinstance(reference, Tensor) and reference.dim() > 0:
        return violation_norm(reference.detach(), p)
    if isinstance(reference, bool) or not isinstance(reference, (int, float, Tensor)):
        raise ValueError(
            f"reference must be a residual vector c_0 (a tensor) or its norm (a float >= 0), got {reference!r}."
        )
    value = float(reference)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"reference norm must be a finite number >= 0, got {value!r}.")
    return torch.tensor(value)
