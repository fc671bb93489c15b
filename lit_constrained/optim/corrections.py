r"""Feasibility held to a tolerance (``../shared/spec/algorithms.md`` section 8): bounded Gauss-Newton
corrections after a step, with the step's own factorization.

After the step :math:`x^+ = x_k + \Delta_k`, at most K = ``max_corrections`` times while
:math:`\max|c(x^+)| > \text{tol}`,

.. math::
    x^+ \leftarrow x^+ + T\big(-\tilde J_k^+ c(x^+)\big) = x^+ - T \tilde J_k^T \tilde G_k^+ c(x^+)

(J at :math:`x_k`: a second-order correction, no new Jacobian; T and :math:`\tilde J` as in the step, so
:math:`J_k \Delta x = -c(x^+)`), the same refinements, and only c re-evaluated. tol =
``constraint_tol`` * max(max :math:`|c_1|`, 1). The loop stops early when a correction leaves max |c|
above ``CORRECTION_STALL`` times the previous one (the residual's rounding floor); a correction that
increased max |c| is undone (every correction is evaluated after, the last one allowed too).

Step acceptance: when after the corrections max |c| is still above max(``BACKTRACK_ABOVE_TOL`` tol,
``BACKTRACK_GROWTH`` max :math:`|c_k|`) (the step's curvature outran the linearization), the step is
halved, :math:`x^+ = x_k + \tau \Delta_k` with :math:`\tau = 1/2, 1/4, ...` (at most ``MAX_BACKTRACKS``
times; the optimizer's state keeps the full step's update), and corrected again. Each evaluation is one
host read of max |c| (the decisions are the same on every rank: c is).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .projection import Projector

BACKTRACK_ABOVE_TOL = 10.0
BACKTRACK_GROWTH = 2.0
MAX_BACKTRACKS = 3
"""Step acceptance: a step whose corrected max |c| exceeds max(10 tol, 2 max |c_k|) is halved, at most 3
times (to 1/8 of the step)."""
CORRECTION_STALL = 0.5
"""The corrections stop when one leaves max |c| above this fraction of the previous max |c| (the
rounding floor of the residual is reached: more corrections would only cost forwards)."""


@dataclass
class Corrected:
    """The outcome: corrections ``taken``, the ``step_fraction`` tau kept, and the max |c| evaluated after the
    last change (``violation``; NaN where c was)."""

    taken: int = 0
    step_fraction: float = 1.0
    violation: float = math.nan


def evaluated_constraints(evaluate: Callable[[], Tensor], m: int) -> Tensor:
    """c from the constraint closure, checked for its shape."""
    c = evaluate()
    if not isinstance(c, Tensor) or c.shape != (m,):
        shape = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
        raise ValueError(
            f"constraint_closure returned {shape}, expected a tensor of shape ({m},): the constraints "
            "of this step at the updated parameters."
        )
    return c.detach()


def max_violation(evaluate: Callable[[], Tensor], m: int) -> float:
    return float(evaluated_constraints(evaluate, m).abs().max())


Measure = Callable[[], tuple[Tensor, float]]
"""Evaluates the constraints at the current parameters: (the values of the projector's rows, float64,
the correction's target; the violation, max |c| for equality rows and the positive part of inequality
rows, inactive ones included, so that a correction pushing an inactive row over its bound counts as
making the violation worse)."""


def equality_measure(evaluate: Callable[[], Tensor], m: int) -> Measure:
    """The :data:`Measure` of equality rows only: c and max |c|."""

    def measure() -> tuple[Tensor, float]:
        c = evaluated_constraints(evaluate, m)
        return c, float(c.abs().max())

    return measure


def hold_feasibility(
    evaluate: Callable[[], Tensor] | None,
    projector: Projector,
    to_x: Callable[[Tensor], Tensor],
    apply: Callable[[Tensor], None],
    delta: Tensor,
    tol: float,
    violation_before: float,
    max_corrections: int,
    buffers: Callable[[str], Tensor],
    measure: Measure | None = None,
) -> Corrected:
    """Correct the step ``delta`` (already applied by the caller) toward max |c| <= ``tol``.

    ``to_x`` maps a correction from the projection variables to x in place, ``apply`` adds an x-vector to
    the parameters, ``buffers(name)`` returns a persistent n-vector of J's dtype. ``measure`` (for rows
    other than equalities) replaces ``evaluate``: it returns the projector's rows and the violation."""
    if measure is None:
        measure = equality_measure(evaluate, projector.jacobian.shape[0])
    result = Corrected()
    accept_below = max(BACKTRACK_ABOVE_TOL * tol, BACKTRACK_GROWTH * violation_before)
    applied = buffers("corrections_applied").zero_()
    for backtrack in range(MAX_BACKTRACKS + 1):
        taken, result.violation = _corrections(measure, projector, to_x, apply, tol, max_corrections,
                                               applied, buffers("correction_step"))
        result.taken += taken
        if backtrack == MAX_BACKTRACKS or result.violation <= accept_below:
            break
        # back to x_k + (tau / 2) Delta_k: remove the corrections and half of what is left of the step
        apply(applied.add_(delta, alpha=result.step_fraction / 2).neg_())
        applied.zero_()
        result.step_fraction /= 2
    return result


def _corrections(
    measure: Measure, projector: Projector, to_x: Callable[[Tensor], Tensor],
    apply: Callable[[Tensor], None], tol: float, max_corrections: int, applied: Tensor, correction: Tensor,
) -> tuple[int, float]:
    """The correction loop (each correction also added to ``applied``): the number taken and the last
    evaluated max |c|. Every correction is evaluated after, the last one allowed too, so that one which made
    max |c| worse is undone wherever it falls."""
    taken, previous = 0, math.inf
    while True:
        c, violation = measure()
        if taken and not violation <= previous:  # the last correction made it worse (or NaN): undo it
            apply(correction.neg_())
            applied.add_(correction)
            return taken - 1, previous
        if taken == max_corrections or not violation > tol or violation > CORRECTION_STALL * previous:
            return taken, violation
        projector.normal(c.to(torch.float64), correction)
        apply(to_x(correction))
        applied.add_(correction)
        taken, previous = taken + 1, violation
