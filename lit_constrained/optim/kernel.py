r"""The projected step's shared pieces, as functions over flat tensors (:mod:`~lit_constrained.optim.functional`
composes them; SQP-MoMo too): the step's rows (:class:`Rows`, immutable), the one host read
(:func:`host_read`), the factorization of stacked rows [J; G_A] (:func:`stacked`), the inequality rows'
step, measure and diagnostics, and the post-step corrections (:func:`correct`).

Nothing here keeps state between calls except through its arguments: the optimizer's ``state`` dict
(what resuming needs) and its :class:`~lit_constrained.optim.workspace.Workspace` (scratch and the
exact-Gram memory, which change no number)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .active_set import ActiveSetStep, Inequalities, impose_inequalities
from .checks import check_finite
from .corrections import evaluated_constraints, hold_feasibility, max_violation
from .linalg.refinement import RefinementPlan, exact_refinements, refinement_counts
from .projection import Projection, Projector
from .workspace import Memory, Workspace

Block = tuple[dict[str, Any], slice]
"""A param group (its hyperparameters) with its slice of the flat vector."""


@dataclass(frozen=True)
class Rows:
    """One step's inputs in the flat layout: g (working dtype), c (float64), J (working dtype) and the
    inequality rows; ``warm``: the inequality rows active at the last step (this step's working set);
    ``finite``: 0-dim bool, further inputs are finite (joins the host read); ``named``: further inputs
    the failure path names first (SQP-MoMo's loss and x)."""

    g: Tensor
    c: Tensor
    jacobian: Tensor
    inequalities: Inequalities | None = None
    warm: tuple[int, ...] = ()
    finite: Tensor | None = None
    named: tuple[tuple[str, Tensor], ...] = ()

    @property
    def m(self) -> int:
        return self.c.numel()

    @property
    def dtype(self) -> torch.dtype:
        return self.g.dtype


@dataclass(frozen=True)
class Composed:
    """A composed step: delta (in x), the normal-step scale s tau (None where it is per block) and the
    normal step's norm; with inequality rows also the projector of the rows E + A the step imposed (the
    corrections' rows), the active rows and the active-set step's outcome."""

    delta: Tensor
    scale: Tensor | None
    normal_norm: Tensor
    imposed: Projector | None = None
    active: list[int] | None = None
    active_step: ActiveSetStep | None = None


def to_x(projection: Projection, step: Tensor) -> Tensor:
    """Map a step from the projection variables to x, in place: identity, or d * step for the scaled
    projection Jacobian J diag(d)."""
    return step if projection.scaling is None else step.mul_(projection.scaling)


def violation(rows: Rows) -> Tensor:
    """max(max |c|, max(g, 0)) (0-dim float64): the violation the tolerances are relative to."""
    value = rows.c.abs().max() if rows.m else rows.c.new_zeros(())
    if rows.inequalities is not None:
        value = torch.maximum(value, rows.inequalities.violation())
    return value


def raise_nonfinite(rows: Rows) -> None:
    """The failure path (syncs are fine here): name what is not finite."""
    for name, value in rows.named:
        check_finite(name, value)
    check_finite("The constraints c", rows.c)
    check_finite("The jacobian J", rows.jacobian)
    check_finite("The objective gradient g", rows.g)
    raise ValueError(
        "The step is not finite (an overflow in the projection); the step was not taken. "
        "Check the loss/constraints at this point (a diverging run or a bad batch)."
    )


@dataclass(frozen=True)
class HostRead:
    """The host read's outcome: the projection (its factor exact where the plan asked), the step's
    projector, and the numerical rank and condition of the kept part of the Gram (for a warning)."""

    projection: Projection
    projector: Projector
    rank: int
    condition: float


def host_read(projection: Projection, rows: Rows, workspace: Workspace, rcond: float,
              memory: Memory = "equality", extra_finite: bool = True) -> HostRead:
    """The one host read of the step: the inputs' finiteness, the refinement plan and the rank; raises
    before any change when a NaN/inf is found. The exact Gram replaces the blocked one where the plan asks
    for it. ``extra_finite``: ``rows.finite`` joins the read (not for stacked rows)."""
    g, c, J = rows.g, rows.c, rows.jacobian
    m, n = J.shape
    finite = projection.finite & torch.isfinite(c).all()
    if extra_finite and rows.finite is not None:
        finite = finite & rows.finite
    if m == 0:
        finite = finite & torch.isfinite(torch.dot(g, g))
        if not bool(finite):
            raise_nonfinite(rows)
        return HostRead(projection, Projector(J, projection.factor, RefinementPlan(0, False)), 0, 1.0)
    factor = projection.factor
    read = torch.cat([  # (all on the factor's device: one transfer)
        finite.reshape(1).to(torch.float64),
        refinement_counts(factor, n, rows.dtype),
        factor.rank.reshape(1).to(torch.float64),
        factor.condition.reshape(1).to(torch.float64),
    ]).tolist()
    if not read[0]:
        raise_nonfinite(rows)
    plan = RefinementPlan.decode((read[1], read[2]), m)  # (of the blocked Gram, at this conditioning)
    if projection.scaling is None:  # remember for the next step whether the blocked Gram suffices
        workspace.remember_exact_gram(J, plan.exact_gram, memory)
    if plan.exact_gram or factor.exact:
        if not factor.exact:
            projection = _with_factor(projection, workspace.exact_factor(J, rcond, projection.scaling))
        plan = RefinementPlan(exact_refinements(projection.factor, rows.dtype), True)
    scaling = workspace.scaling(projection.scaling)
    exact = bool(plan.steps) and plan.exact_residual
    projector = Projector(J, projection.factor, plan, scaling,
                          workspace.exact_workspace(J) if exact else None,
                          workspace.vector("correction", g) if exact and scaling is None else None)
    return HostRead(projection, projector, int(read[3]), read[4])


def _with_factor(projection: Projection, factor: Any) -> Projection:
    from dataclasses import replace

    return replace(projection, factor=factor)


StackedCache = dict[tuple[int, ...], tuple[Projection, Projector]]
"""The factorizations of stacked rows [J; G_rows] made in one step."""


def stacked(rows: Rows, active: Sequence[int], workspace: Workspace, rcond: float, cache: StackedCache,
            with_gradient: bool = False) -> tuple[Projection, Projector]:
    """The projection and projector of [J; G_rows] (the step's factorization and refinement plan for
    those rows, made once a step; the exact-Gram memory of stacked rows kept apart from that of J).
    ``with_gradient``: the projection carries [J; G_rows] g from the Gram's pass (for P g)."""
    key = tuple(active)
    if key in cache:
        return cache[key]
    J, G = rows.jacobian, rows.inequalities.jacobian
    m, n = J.shape
    slot = "stacked_jacobian_working" if key == rows.warm else "stacked_jacobian"
    matrix = workspace.buffer(slot, (m + len(key), n), J.dtype, J.device)
    matrix[:m].copy_(J)
    torch.index_select(G, 0, torch.tensor(list(key), dtype=torch.long, device=G.device), out=matrix[m:])
    factor, finite, Jg = workspace.factorize(matrix, rcond, None, rows.g if with_gradient else None, "stacked")
    if Jg is not None:
        finite = finite & torch.isfinite(Jg).all()
    target = torch.zeros(m + len(key), dtype=torch.float64, device=J.device)
    projection = Projection(matrix, factor, finite, target, gradient_product=Jg)
    read = host_read(projection, Rows(rows.g, target, matrix), workspace, rcond, "stacked", extra_finite=False)
    cache[key] = read.projection, read.projector
    return cache[key]


def gradient_multipliers(m: int, tangent_projection: Projection | None) -> Tensor | None:
    """The working rows' first-order multiplier estimates, the inequality part of
    :math:`-\\hat G^+ \\hat J \\nabla f` (no pass over J: [J; G_warm] g came with the Gram)."""
    if tangent_projection is None or tangent_projection.gradient_product is None:
        return None
    return -tangent_projection.factor.solve(tangent_projection.gradient_product)[m:]


def with_inequalities(projector: Projector, rows: Rows, w: Tensor, a: float, sc: Tensor, fraction: Tensor,
                      delta: Tensor, *, workspace: Workspace, rcond: float, cache: StackedCache,
                      tangent_projection: Projection | None, owner: str) -> ActiveSetStep:
    """The step with the inequality rows into ``delta``
    (:func:`~lit_constrained.optim.active_set.impose_inequalities`), warm-started from the last step's
    active set."""
    warm = list(rows.warm)
    if not warm:
        projector.merged(w, a, sc, delta)
    return impose_inequalities(
        equality_projector=projector,
        stacked_projector=lambda active: stacked(rows, active, workspace, rcond, cache)[1],
        sc=sc, inequalities=rows.inequalities, t=fraction, w=w, a=a, warm=warm, rcond=rcond, delta=delta,
        equality_delta_formed=not warm, owner=owner,
        gradient_multipliers=gradient_multipliers(rows.m, tangent_projection),
    )


def record_inequalities(record: dict[str, Tensor], rows: Rows, state: dict[str, Any], active_set: Tensor,
                        multipliers: Tensor | None) -> None:
    """``active`` (rows), ``dual_max`` (the largest inequality multiplier) and the violation of both
    kinds of rows (``violation_max``: max(max |c|, max(g, 0)) at the step's start)."""
    device = rows.g.device
    record["active"] = torch.tensor(float(active_set.numel()), dtype=torch.float64, device=device)
    record["dual_max"] = (multipliers.max() if multipliers is not None and multipliers.numel()
                          else torch.zeros((), dtype=torch.float64, device=device))
    record["inequality_violation"] = rows.inequalities.violation()
    record["violation_max"] = violation(rows)
    record["violation_ratio"] = record["violation_max"] / state_violation(state)


def state_violation(state: dict[str, Any]) -> Tensor:
    """The first step's violation, the scale of the violation ratio (0-dim float64, at least TINY)."""
    return state["initial_violation"].clamp_min(1e-30)


def inequality_measure(evaluate: Callable[[], Any], rows: Rows, active: Sequence[int]
                       ) -> Callable[[], tuple[Tensor, float]]:
    """The corrections' measure with inequality rows: the closure returns (c, g); the target is
    [c; g_A] (the imposed rows), the violation max(max |c|, max(g, 0)) over every row."""
    m, p = rows.m, rows.inequalities.p
    index = torch.tensor(list(active), dtype=torch.long, device=rows.c.device)

    def measure() -> tuple[Tensor, float]:
        values = evaluate()
        if not isinstance(values, (tuple, list)) or len(values) != 2:
            raise ValueError(
                "constraint_closure must return the pair (c, g) when the step is given inequalities: c "
                f"of shape ({m},), g of shape ({p},), at the updated parameters."
            )
        c = evaluated_constraints(lambda: values[0], m).to(torch.float64)
        g = evaluated_constraints(lambda: values[1], p).to(torch.float64)
        worst = max(float(c.abs().max()) if m else 0.0, float(g.max().clamp_min(0.0)))
        return torch.cat([c, g[index]]), worst

    return measure


def correct(evaluate: Callable[[], Any], *, projection: Projection, projector: Projector, rows: Rows,
            state: dict[str, Any], delta: Tensor, apply: Callable[[Tensor], None], workspace: Workspace,
            constraint_tol: float, max_corrections: int, record: dict[str, Tensor] | None,
            active: Sequence[int] | None = None) -> None:
    """The post-step corrections (:func:`~lit_constrained.optim.corrections.hold_feasibility`) on the
    rows the step imposed (``projector``: J, or [J; G_A] with ``active`` inequality rows); ``apply`` adds
    an x-vector to the parameters. None follows a step whose normal step the safeguard capped (far from
    feasibility the linearization is not trusted, and an uncapped Gauss-Newton correction would take the
    step the cap refused). Diagnostics: ``corrections`` (taken), ``step_fraction`` (tau) and
    ``corrected_violation`` (the violation after them; an evaluation of its own on diagnostic steps where
    none was made last)."""
    capped = state.get("normal_step_capped")
    taken, fraction, after = 0, 1.0, math.nan
    measure = None if rows.inequalities is None else inequality_measure(evaluate, rows, active or [])
    if capped is None or not bool(capped):
        tol = float(constraint_tol) * max(float(state["initial_violation"]), 1.0)
        result = hold_feasibility(
            evaluate, projector, functools.partial(to_x, projection), apply, delta, tol, float(violation(rows)),
            int(max_corrections), lambda name: workspace.vector(name, delta), measure,
        )
        taken, fraction, after = result.taken, result.step_fraction, result.violation
    if record is not None:
        if math.isnan(after):
            after = max_violation(evaluate, rows.m) if measure is None else measure()[1]
        as_tensor = functools.partial(torch.tensor, dtype=torch.float64, device=delta.device)
        record["corrections"] = as_tensor(float(taken))
        record["step_fraction"] = as_tensor(fraction)
        record["corrected_violation"] = as_tensor(after)
