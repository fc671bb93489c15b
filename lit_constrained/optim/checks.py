"""Input validation: clear ``ValueError``s that say what to fix.

The one home of the package's checks (pure PyTorch: the Lightning layer imports them from here):

* the optimizers' hyper-parameters (:func:`check_lr`, :func:`check_betas`, :func:`check_shared_keys`, ...);
* the constraint values a task returns, as the step owner and the evaluation see them
  (:func:`check_objective`, :func:`check_constraints`: a 1-D real residual vector c, with grad when the
  Jacobian is needed, of a size m that does not change from step to step);
* the ``constraints=`` / ``jacobian=`` arguments of a hard-constrained optimizer's step
  (:func:`check_constraint_inputs`, :func:`prepared_constraint_inputs`);
* the residuals a violation metric is updated with (:func:`check_residual_tensor`);
* finiteness (:func:`all_finite`, :func:`check_finite`, :func:`count_nonfinite`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_constrained.hints import DERIVATIVE_FIX  # (the fix's one wording; pure Python)


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


def count_nonfinite(t: Tensor) -> int:
    """How many entries of ``t`` are NaN or inf (a host sync: for error messages only)."""
    return int((~torch.isfinite(t)).sum())


def check_finite(name: str, t: Tensor) -> None:
    """Raise if ``t`` holds NaN or inf, naming the quantity."""
    if not all_finite(t):
        bad = count_nonfinite(t)
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


def shape_of(value: Any) -> tuple[int, ...] | str:
    """``value``'s shape if it is a tensor, else its type's name (for error messages)."""
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _reject_complex(c: Tensor, subject: str) -> None:
    """Raise if the residuals are complex: a complex c = 0 is two real constraints."""
    if c.is_complex():
        raise ValueError(
            f"{subject} complex residuals (dtype {c.dtype}): a complex constraint c = 0 is two real "
            "ones, and the constrained optimizers work with real residuals. Return both parts, "
            "torch.cat([c.real, c.imag]) (2m real rows; both vanish exactly when |c| = 0)."
        )


def check_objective(f: Any, where: str) -> Tensor:
    """The objective a task returned (``where`` names the hook) as a 0-dim tensor; raises unless it
    is a tensor of one element."""
    if not isinstance(f, Tensor) or f.numel() != 1:
        raise ValueError(f"{where} must return a scalar tensor, got {shape_of(f)}.")
    return f.reshape(())


def check_constraints(c: Any, where: str, expected_m: int | None = None, need_grad: bool = False) -> Tensor | None:
    """The residuals c a task returned (``where`` names the hook, e.g. ``"Task.constraints()"``).

    Accepted: None (no constraints) or a 1-D real tensor of m residuals. ``expected_m``: the m of the
    previous step (the constraint set must stay fixed; None: no previous step); ``need_grad``: c must
    carry an autograd graph (the optimizer differentiates it). Returns c unchanged.
    """
    if c is None:
        if expected_m not in (None, 0):
            raise ValueError(f"{where} returned None after returning {expected_m} constraints at earlier steps.")
        return None
    if not isinstance(c, Tensor) or c.dim() != 1:
        raise ValueError(
            f"{where} must return a 1-D tensor of m residuals (or None), got shape {shape_of(c)}; "
            "flatten it (e.g. residual.reshape(-1)) if it is a grid."
        )
    _reject_complex(c, f"{where} returned")
    if expected_m is not None and c.numel() != expected_m:
        raise ValueError(
            f"{where} returned {c.numel()} constraints, but {expected_m} at the previous step: the "
            "constraint set must stay fixed. If constraints() comes from the batch (a residual at its "
            "points), the last batch of an epoch is smaller when the number of rows is not a multiple of "
            "batch_size: pass drop_last=True to the training DataLoader, or train full-batch (one item "
            "holding every row: DataLoader([batch], batch_size=None), or RowDataModule's "
            "batch_mode='full'). Otherwise choose the constraint points once (a buffer set in __init__ or "
            "setup(), or tensors a RowDataModule attaches whole to every batch: its fixed())."
        )
    if need_grad and not c.requires_grad:
        raise ValueError(
            f"{where} returned a tensor without grad (shape {tuple(c.shape)}): compute it from the "
            "network's output without detaching or torch.no_grad(). " + DERIVATIVE_FIX
        )
    return c


def check_residual_tensor(constraints: Any) -> Tensor:
    """The residuals a violation metric is given (any shape): ``constraints`` unchanged if it is a
    tensor, else a ``ValueError`` that says what to pass."""
    if not isinstance(constraints, Tensor):
        raise ValueError(
            f"constraints must be a torch.Tensor of residuals, got {type(constraints).__name__}. "
            "Pass the tensor returned by the task's `constraints(batch)` (skip the update when it is None)."
        )
    return constraints


def check_constraint_inputs(owner: str, constraints: Tensor | None, jacobian: Tensor | None, n: int) -> int:
    """Validate the ``constraints=`` (c, shape (m,), real) and ``jacobian=`` (J, shape (m, n)) step
    arguments of a hard-constrained optimizer; returns m (0 when both are absent)."""
    if constraints is None:
        if jacobian is not None and jacobian.numel():
            raise ValueError("A jacobian was given without constraints; pass both (or neither for m = 0).")
        return 0
    if not isinstance(constraints, Tensor) or constraints.dim() != 1:
        raise ValueError(f"constraints must be a 1-D tensor of m residuals, got shape {shape_of(constraints)}.")
    _reject_complex(constraints, f"{owner} was given")
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


def prepared_constraint_inputs(
    owner: str,
    constraints: Tensor | None,
    jacobian: Tensor | None,
    n: int,
    dtype: torch.dtype,
    device: torch.device,
    jacobian_buffer: Callable[[int], Tensor],
) -> tuple[Tensor, Tensor]:
    """The validated step arguments (:func:`check_constraint_inputs`) in the form the optimizers compute
    with: c detached in float64, shape (m,); J detached, shape (m, n), contiguous, in ``dtype`` on
    ``device`` (copied into ``jacobian_buffer(m)``, an (m, n) tensor the caller may reuse, only when
    it is not so already). m = 0 (no constraints): empty tensors of those dtypes."""
    m = check_constraint_inputs(owner, constraints, jacobian, n)
    if constraints is None or jacobian is None:
        return torch.zeros(0, dtype=torch.float64, device=device), torch.zeros(0, n, dtype=dtype, device=device)
    c = constraints.detach().to(torch.float64)
    J = jacobian.detach()
    if J.dtype != dtype or not J.is_contiguous() or J.device != device:
        J = jacobian_buffer(m).copy_(J)
    return c, J


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
    return value, loss_tensor(value)


def loss_tensor(value: Any) -> Tensor:
    """A closure's loss value as a tensor of one element (a Python number as float64); else a ValueError."""
    loss = value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=torch.float64)
    if loss.numel() != 1:
        raise ValueError(f"The closure must return a scalar loss; got a tensor of shape {tuple(loss.shape)}.")
    return loss
