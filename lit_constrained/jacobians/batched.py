r"""The constraint Jacobian J = dc/dx in the optimizers' flat layout.

Row i is the gradient of :math:`c_i` with respect to all parameters, each flattened in row-major
order, complex parameters as ``view_as_real`` (PyTorch's gradient of a real function of
:math:`z = a + i b` is :math:`\partial/\partial a + i\,\partial/\partial b`, so the real view is the
gradient with respect to (a, b)).

Two strategies:

* :func:`constraint_jacobian`: any 1-D ``constraints`` tensor attached to the graph (one batched
  ``torch.autograd.grad``, or one backward per row);
* :func:`per_sample_jacobian`: constraints that each depend on ONE sample of a batch (a residual at a
  node of one sample), differentiated per sample: a ``vmap``-ed forward pass with one copy of the
  parameters per unit of samples (grouped by :func:`constraint_units`; :func:`_unit_residuals`),
  then one reverse pass (:func:`_copies_jacobian`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import vmap

from lit_constrained.hints import DERIVATIVE_FIX

from .columns import numel_real, real_view

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
        n = numel_real(params)
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
    "with create_graph=True. " + DERIVATIVE_FIX
)


# ---------------------------------------------------------------------------------------------
# Per-sample constraints: one torch.func Jacobian per sample
# ---------------------------------------------------------------------------------------------

GroupingMode = Literal["auto", "rows", "samples"]


def constraint_units(sample: Tensor, node: Tensor, mode: GroupingMode = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """How the per-sample Jacobian batches the constraints: ``(owner, table, unit, slot)``.

    A *unit* is one functional evaluation on one sample followed by the backward passes of its rows:
    ``owner[u]`` is the sample of unit u, ``table[u]`` the (padded) residual nodes it differentiates,
    and constraint i is row ``slot[i]`` of unit ``unit[i]``.

    * ``"rows"``: one unit per constraint (m forward and m backward passes);
    * ``"samples"``: one unit per distinct sample, padded to the largest number of constraints on one
      sample G (S forward and S G backward passes);
    * ``"auto"``: the cheaper of the two, counting a backward pass as two forward passes
      (:func:`per_sample_jacobian` takes ``"rows"`` on an accelerator: the cost model needs the
      group sizes on the host, a sync per step).

    One ``vmap`` call covers all units: on small networks each call has a fixed cost of the order of
    a whole batched pass, so one padded call beats one call per group size.
    """
    if sample.dim() != 1 or sample.shape != node.shape:
        raise ValueError(
            f"sample and node must be 1-D index tensors of the same length, got {tuple(sample.shape)} and {tuple(node.shape)}."
        )
    if mode not in ("auto", "rows", "samples"):
        raise ValueError(f"grouping mode must be 'auto', 'rows' or 'samples', got {mode!r}.")
    m = sample.numel()
    if mode == "rows":  # no data-dependent shape: no host sync on an accelerator
        index = torch.arange(m, device=sample.device)
        return sample, node[:, None], index, torch.zeros_like(index)
    distinct, inverse, counts = torch.unique(sample, return_inverse=True, return_counts=True)
    width = int(counts.max()) if m else 0
    if mode == "auto":
        mode = "rows" if 3 * m <= distinct.numel() * (1 + 2 * width) else "samples"
    if mode == "rows":
        index = torch.arange(m, device=sample.device)
        return sample, node[:, None], index, torch.zeros_like(index)
    order = torch.argsort(inverse, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(m, device=sample.device) - starts[inverse[order]]
    table = torch.zeros(distinct.numel(), width, dtype=node.dtype, device=node.device)  # padding: node 0
    table[inverse, slot] = node
    return distinct, table, inverse, slot


_PER_SAMPLE_HINT = "the per-sample Jacobian needs the module's own parameters (or set vmap_jacobian=False)."


def _parameter_names(module: nn.Module, params: Sequence[Tensor], hint: str = _PER_SAMPLE_HINT) -> list[str]:
    """The names of ``params`` in ``module``; a parameter that is not the module's is an error naming
    its index, followed by ``hint`` (what the caller's Jacobian needs)."""
    names = {id(p): name for name, p in module.named_parameters()}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"params {missing} are not parameters of {type(module).__name__}; {hint}")
    return [names[id(p)] for p in params]


def _unit_residuals(
    module: nn.Module,
    params: Sequence[Tensor],
    sample_residuals: Callable[..., Tensor],
    sample_inputs: Sequence[Tensor],
    owner: Tensor,
    table: Tensor,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    r"""The residuals of every unit, each unit evaluated with its OWN copy of ``params``.

    Unit u evaluates ``sample_residuals(theta_u, *inputs[owner[u]])`` at the nodes ``table[u]``
    (:func:`constraint_units`), all units in one ``vmap``-ed pass; ``theta_u`` are broadcast views
    ``real_view(p).expand(units, ...)`` of the parameters (no memory; complex parameters as their real
    view). Returns ``(values, copies)``: ``values[u, s]`` (shape ``(units, width)``) is attached to the
    parameters through the copies (a later backward reaches them), and since unit u's values depend on
    copy u only, :func:`_copies_jacobian` gets every unit's Jacobian rows in one reverse pass.
    Parameters of ``module`` not in ``params`` are used at their current values.
    """
    params = list(params)
    keys = _parameter_names(module, params)
    is_complex = [p.is_complex() for p in params]
    units = table.shape[0]
    copies = tuple(real_view(p).expand(units, *real_view(p).shape) for p in params)

    def residuals_at(real_params: tuple[Tensor, ...], nodes: Tensor, *inputs: Tensor) -> Tensor:
        values = {
            key: torch.view_as_complex(r) if cplx else r
            for key, r, cplx in zip(keys, real_params, is_complex)
        }
        return sample_residuals(values, *inputs)[nodes]

    with torch.enable_grad():
        values = vmap(residuals_at)(copies, table, *[t[owner] for t in sample_inputs])
    return values, copies


def _copies_jacobian(constraints: Tensor, copies: Sequence[Tensor], unit: Tensor | None = None,
                    slot: Tensor | None = None, width: int = 1) -> Tensor:
    r"""J (m, n) of constraints that each depend on ONE copy of the parameters (:func:`_unit_residuals`).

    :math:`c_i` is slot ``slot[i]`` of unit ``unit[i]`` and depends on the copies
    :math:`\theta_{\mathrm{unit}[i]}` only, so with :math:`S_s = \{i : \mathrm{slot}[i] = s\}`

    .. math::
        \frac{\partial}{\partial \theta_u} \sum_{i \in S_s} c_i = \frac{\partial c_{i(u, s)}}{\partial \theta}

    (the row of the constraint in slot s of unit u): one reverse pass per slot gives all units' rows,
    the ``width`` passes batched with ``is_grads_batched``. ``unit`` / ``slot`` ``None``: one unit per
    constraint, in order (``unit = arange(m)``, ``slot = 0``, ``width = 1``). Columns in the order
    of ``copies`` (each flattened; a copy the constraints do not use gives zero columns).
    """
    if not constraints.requires_grad:
        raise ValueError("constraints do not require grad: evaluate them with autograd enabled (_unit_residuals).")
    units = copies[0].shape[0] if copies else 0
    kwargs = dict(allow_unused=True)
    if width == 1:
        grads = torch.autograd.grad(constraints.sum(), copies, **kwargs)
    else:  # slot s of every unit at once: a batch of one-hot cotangents, (width, m)
        slots = (slot == torch.arange(width, device=slot.device)[:, None]).to(constraints.dtype)
        grads = torch.autograd.grad(constraints, copies, grad_outputs=slots, is_grads_batched=True, **kwargs)
    flat = torch.cat([
        constraints.new_zeros(width, units, c[0].numel()) if g is None else g.reshape(width, units, -1)
        for g, c in zip(grads, copies)
    ], dim=2)
    return flat[0] if unit is None else flat[slot, unit]


def per_sample_jacobian(
    module: nn.Module,
    params: Sequence[Tensor],
    sample_residuals: Callable[..., Tensor],
    sample_inputs: Sequence[Tensor],
    sample: Tensor,
    node: Tensor,
    mode: GroupingMode = "auto",
) -> Tensor:
    r"""The Jacobian of ``c_i = sample_residuals(theta, *inputs[sample_i])[node_i]`` w.r.t. ``params``.

    ``sample_residuals(param_dict, *per_sample_inputs)`` evaluates ``module`` functionally on ONE
    sample (``functional_call``) and returns a 1-D tensor of that sample's residuals. Constraint i
    depends only on its own sample, so J is assembled per sample, the samples grouped into units as
    :func:`constraint_units` says: the residuals of all units in ONE ``vmap``-ed forward pass, every
    unit with its own copy of the parameters (:func:`_unit_residuals`), then one reverse pass per slot
    of a unit (:func:`_copies_jacobian`). That is the cost of one batched forward and backward pass
    over the units' samples, instead of m backward passes through the graph of the whole constraint
    batch (the general autograd Jacobian).

    Returns ``(m, n)`` in the flat layout of ``params`` (in the given order; complex parameters as
    ``view_as_real``: the derivative w.r.t. the real part, then the imaginary part, per entry). The
    differentiation variable IS the real view, so no conjugation convention enters.
    Parameters of ``module`` not in ``params`` are held at their current values.
    """
    params = list(params)
    m = sample.numel()
    if m == 0:
        _parameter_names(module, params)
        n = numel_real(params)
        dtype = real_view(params[0]).dtype if params else torch.get_default_dtype()
        return torch.zeros(0, n, dtype=dtype, device=sample.device)
    if mode == "auto" and sample.device.type != "cpu":
        mode = "rows"  # the cost model reads counts on the host: on an accelerator, no host sync instead
    owner, table, unit, slot = constraint_units(sample, node, mode)
    values, copies = _unit_residuals(module, params, sample_residuals, sample_inputs, owner, table)
    if mode == "rows" or (table.shape == (m, 1) and torch.equal(unit, torch.arange(m, device=unit.device))):
        return _copies_jacobian(values[:, 0], copies)  # one unit per constraint, in order
    return _copies_jacobian(values[unit, slot], copies, unit, slot, table.shape[1])
