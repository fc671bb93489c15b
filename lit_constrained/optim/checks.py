"""Input validation shared by the optimizers: clear ``ValueError``s that say what to fix."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor


def check_lr(lr: float | None, allow_none: bool = False) -> None:
    if lr is None and allow_none:
        return
    if lr is None or not isinstance(lr, (int, float, Tensor)) or not math.isfinite(float(lr)) or lr < 0:
        raise ValueError(f"Invalid learning rate {lr!r}: it must be a finite number >= 0.")


def check_beta(name: str, beta: float) -> None:
    if not 0.0 <= float(beta) < 1.0:
        raise ValueError(f"Invalid {name}={beta!r}: it must lie in [0, 1).")


def check_betas(betas: tuple[float, float]) -> None:
    if len(betas) != 2:
        raise ValueError(f"Invalid betas={betas!r}: expected a pair (beta1, beta2).")
    check_beta("betas[0]", betas[0])
    check_beta("betas[1]", betas[1])


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"Invalid {name}={value!r}: it must be a finite number > 0.")


def all_finite(t: Tensor) -> bool:
    """Whether ``t`` holds no NaN/inf: one reduction (a NaN or inf makes the sum non-finite; an
    overflowing sum of finite values falls back to the elementwise check)."""
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(name: str, t: Tensor) -> None:
    """Raise if ``t`` holds NaN or inf, naming the quantity."""
    if not all_finite(t):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN or inf); the step was not taken. "
            "Check the loss/constraints at this point (a diverging run or a bad batch)."
        )


def check_shared_keys(owner: str, param_groups: Sequence[Mapping[str, Any]], keys: Sequence[str], why: str) -> None:
    """Raise unless every group has group 0's value for each of ``keys`` (hyperparameters that one
    quantity shared by all groups depends on; ``why`` names that quantity)."""
    first = param_groups[0]
    for i, group in enumerate(param_groups):
        for key in keys:
            if group[key] != first[key]:
                raise ValueError(
                    f"{owner}: param group {i} has {key}={group[key]!r} but group 0 has {first[key]!r}. "
                    f"It defines {why} shared by all groups: set it once, in the optimizer's arguments, "
                    "not per group."
                )


def check_constraint_inputs(owner: str, constraints: Tensor | None, jacobian: Tensor | None, n: int) -> int:
    """Validate the ``constraints=`` (c, shape (m,)) and ``jacobian=`` (J, shape (m, n)) step arguments
    of a hard-constrained optimizer; returns m (0 when both are absent)."""
    if constraints is None:
        if jacobian is not None and jacobian.numel():
            raise ValueError("A jacobian was given without constraints; pass both (or neither for m = 0).")
        return 0
    if not isinstance(constraints, Tensor) or constraints.dim() != 1:
        shape = tuple(constraints.shape) if isinstance(constraints, Tensor) else type(constraints).__name__
        raise ValueError(f"constraints must be a 1-D tensor of m residuals, got shape {shape}.")
    m = constraints.numel()
    if jacobian is None:
        raise ValueError(f"{owner} requires jacobian= (shape ({m}, {n})) with the constraints.")
    if jacobian.dim() != 2 or tuple(jacobian.shape) != (m, n):
        raise ValueError(
            f"jacobian has shape {tuple(jacobian.shape)}, expected (m, n) = ({m}, {n}): one row per "
            "constraint, one column per real parameter entry in param_groups order "
            "(complex parameters as view_as_real)."
        )
    return m


def loss_from_closure(owner: str, closure: Callable[[], Any] | None, call: str) -> tuple[Any, Tensor]:
    """Call the closure of a loss-based step (MoMo family) under grad mode; returns (its value, the loss
    as a tensor of one element). ``call`` shows how to call the step, for the error without a closure."""
    if closure is None:
        raise ValueError(
            f"{owner} needs the loss value: call {call} with a closure that returns the (already "
            "back-propagated) loss, e.g. loss.backward(); opt.step(lambda: loss, ...)."
        )
    with torch.enable_grad():
        value = closure()
    loss = value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=torch.float64)
    if loss.numel() != 1:
        raise ValueError(f"The closure must return a scalar loss; got a tensor of shape {tuple(loss.shape)}.")
    return value, loss
