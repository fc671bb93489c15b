r"""The constraint Jacobian J = dc/dx in the optimizers' flat layout.

Row i is the gradient of :math:`c_i` with respect to all parameters, each flattened in row-major
order, complex parameters as ``view_as_real`` (PyTorch's gradient of a real function of
:math:`z = a + i b` is :math:`\partial/\partial a + i\,\partial/\partial b`, so the real view is the
gradient with respect to (a, b)).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from .flat import real_view

JacobianMethod = Literal["auto", "batched", "loop"]


def _flatten_rows(grads: Sequence[Tensor | None], params: Sequence[Tensor], m: int, like: Tensor) -> Tensor:
    """Concatenate per-parameter gradient rows; None (unused parameter) gives zero columns."""
    blocks = []
    for gr, p in zip(grads, params, strict=True):
        size = real_view(p).numel()
        if gr is None:
            blocks.append(like.new_zeros(m, size))
        else:
            blocks.append(real_view(gr).reshape(m, size))
    return torch.cat(blocks, dim=1)


def _row_range(rows: slice | None, m: int) -> tuple[int, int]:
    """``(start, stop)`` of a contiguous row slice of the m rows (all rows for None)."""
    if rows is None:
        return 0, m
    if not isinstance(rows, slice) or rows.step not in (None, 1):
        raise ValueError(f"rows must be a contiguous slice (step 1) or None, got {rows!r}.")
    start, stop, _ = rows.indices(m)
    return start, max(start, stop)


def constraint_jacobian(
    constraints: Tensor,
    params: Sequence[Tensor],
    method: JacobianMethod = "auto",
    create_graph: bool = False,
    rows: slice | None = None,
) -> Tensor:
    """J of shape (m, n) for a 1-D ``constraints`` tensor attached to the graph of ``params``.

    Args:
        constraints: c, shape (m,), computed from ``params`` with autograd.
        params: the parameters, in the order of the flat layout (the optimizer's ``param_groups``).
        method: ``"batched"`` (one ``torch.autograd.grad`` with ``is_grads_batched=True``, a vmap over
            the rows), ``"loop"`` (one backward per row), or ``"auto"`` (batched, falling back to the
            loop for operations without a batching rule).
        create_graph: keep the graph of J (for higher derivatives).
        rows: only these rows of J (a slice with step 1; shape ``(len(rows), n)``): the backward
            passes of the other rows are not made (a rank's share under data parallelism, see
            :mod:`lit_constrained.distributed`).

    The graph of ``constraints`` is retained, so the objective's backward can follow. A parameter
    that a constraint does not depend on gets zero columns.
    """
    if constraints.dim() != 1:
        raise ValueError(f"constraints must be 1-D (m residuals), got shape {tuple(constraints.shape)}.")
    params = list(params)
    start, stop = _row_range(rows, constraints.numel())
    m = stop - start
    if m == 0:
        n = sum(real_view(p).numel() for p in params)
        return constraints.new_zeros(0, n)
    if not constraints.requires_grad:
        raise ValueError(
            "constraints do not require grad: they must be computed from the parameters with autograd "
            "enabled (not under torch.no_grad() or detached)."
        )
    kwargs = dict(retain_graph=True, create_graph=create_graph, allow_unused=True)
    if method in ("auto", "batched"):
        try:
            eye = torch.eye(constraints.numel(), dtype=constraints.dtype, device=constraints.device)[start:stop]
            grads = torch.autograd.grad(constraints, params, grad_outputs=eye, is_grads_batched=True, **kwargs)
            return _flatten_rows(grads, params, m, constraints)
        except RuntimeError as error:
            if "backward through the graph a second time" in str(error):
                raise RuntimeError(_SECOND_BACKWARD) from error
            if method == "batched":
                raise
            warnings.warn(
                f"Batched Jacobian failed ({str(error).splitlines()[0][:120]}); using the row loop.",
                RuntimeWarning,
                stacklevel=2,
            )
    elif method != "loop":
        raise ValueError(f"Unknown Jacobian method {method!r}: use 'auto', 'batched' or 'loop'.")
    try:
        rows = [
            _flatten_rows(torch.autograd.grad(constraints[i], params, **kwargs), params, 1, constraints)
            for i in range(start, stop)
        ]
    except RuntimeError as error:
        if "backward through the graph a second time" in str(error):
            raise RuntimeError(_SECOND_BACKWARD) from error
        raise
    return torch.cat(rows, dim=0)


_SECOND_BACKWARD = (
    "The constraint Jacobian needs the graph of the constraints, but part of it was already freed by a "
    "torch.autograd.grad call inside constraints() (e.g. an ODE residual's du/dt): compute the residual "
    "with create_graph=True: torch.autograd.grad(u.sum(), t, create_graph=True)."
)
