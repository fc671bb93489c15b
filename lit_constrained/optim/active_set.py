r"""Inequality rows in the projected step: the dual of the linearized subproblem on the Gram matrix,
solved by an active-set method warm-started from the last step's active set.

The equality step is :math:`\Delta x = \arg\min \|\Delta x - a w\|^2` subject to
:math:`J \Delta x = -s c` (w the optimizer's tangential direction, a its scale, s the normal-step
scale; :mod:`~lit_constrained.optim.projection`). With p inequality rows :math:`g(x) \le 0` (G their
Jacobian) the step solves, exactly,

.. math::
    \min_{\Delta x} \tfrac12 \|\Delta x - a w\|^2 \quad\text{s.t.}\quad J \Delta x + s c = 0,\qquad
    G \Delta x + t g \le 0,

with :math:`t` the safeguard's fraction of the full normal step (1 unless the safeguard caps the step:
the inequality rows always take the full normal step, as ``rho="full"`` does for c). With
:math:`\hat J = [J; G]`, :math:`b = [s c; t g]` and :math:`\Delta x = a w - \hat J^T \lambda`, the dual is
the bound-constrained QP on the (m + p) x (m + p) Gram :math:`H = \hat J \hat J^T`,

.. math::
    \min_{\lambda} \tfrac12 \lambda^T H \lambda - \lambda^T q, \qquad q = b + a \hat J w, \qquad
    \lambda_I \ge 0,

whose KKT conditions are the primal ones: :math:`(H\lambda - q)_i = -(G_i \Delta x + t g_i) \ge 0` off
the active set, :math:`\lambda_i \ge 0` on it, complementarity. :func:`solve_dual` solves it by the
Lawson-Hanson active-set method (free equality multipliers, pseudo-inverse solves with the relative
cutoff of :class:`~lit_constrained.optim.linalg.gram_factor.GramFactor`).

The step itself (:func:`impose_inequalities`) is then the equality step on the rows E + A (A the active
inequality rows, sorted), with the same rank-revealing factor and refinements. It is tried first with
the last step's active set; only when that candidate violates a row or has a negative multiplier is the
dual solved (one Gram of all m + p rows) and the step recomputed on the new active set. So the final
step depends on the active set only, not on the warm start (resume stays bit-exact), and with no active
row it is the equality step, bit for bit.

One exception to the subproblem's multipliers: a warm row the objective pushes against (its first-order
multiplier estimate, the inequality part of :math:`-\hat G^+ \hat J \nabla f`, is positive) stays
active even when its multiplier in the subproblem is negative. That sign comes from w, whose component
off the row is the optimizer's scaling (Adam's diagonal applied to a direction in the row's null space),
not the objective's pull; releasing the row on it let the next step's moments take the bound's whole
normal gradient (-P_E g instead of -P_{E+W} g), and SQP-Adam stalled 7e-5 to 6e-3 from the
Hock-Schittkowski solutions (HS35/43/71/76); held, it reaches them to round-off (docs/inequalities.md).
A row held so is on its bound after the step (:math:`G_i \Delta x + t g_i = 0`), so the step stays feasible
for the linearized rows. Rows the linearization cannot satisfy together with the
equalities (an empty feasible set) enter the active set anyway: the step is the least-squares
(minimum-norm Gauss-Newton) compromise between the conflicting rows, finite, and a warning names them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .linalg.gram import gram
from .linalg.products import matvec
from .projection import Projector

MAX_ROUNDS = 4
"""Candidate steps per optimizer step: the warm start, the dual's active set, and two rounds that add a
row the float32 check still finds violated (the dual's Gram and the step's refined products differ by
round-off)."""
CHECK_ULPS = 64.0
"""A row counts as violated when :math:`G_i \\Delta x + t g_i` exceeds this many ulps of
:math:`\\|G_i\\| \\|\\Delta x\\|` (the product's rounding bound) plus 4 float64 ulps of |t g_i|."""
DUAL_TOL = 1e-10
"""The dual adds a row when its primal residual exceeds DUAL_TOL times the problem's scale
(max |q| + max |H| |lambda|): a row left exactly on its bound by the step stays out."""
MULTIPLIER_TOL = 1e-9
"""An active row leaves when its multiplier is below -MULTIPLIER_TOL * max |lambda| (round-off keeps a
weakly active row's multiplier near 0 of either sign)."""


@dataclass
class Inequalities:
    """The inequality rows of one step: g (float64, (p,)) and G (working dtype, (p, n)); ``g <= 0`` wanted."""

    values: Tensor
    jacobian: Tensor

    @property
    def p(self) -> int:
        return self.values.numel()

    def violation(self) -> Tensor:
        """max(max_i g_i, 0) (0-dim float64)."""
        if not self.p:
            return self.values.new_zeros(())
        return self.values.max().clamp_min(0.0)


@dataclass
class DualSolution:
    """The dual's solution: the multipliers (float64, (m + p,): the equality rows' free, the inequality
    rows' >= 0), the active inequality rows (sorted indices into 0..p-1) and the rows that conflict with
    the others (their linearization cannot hold together with the rest)."""

    multipliers: np.ndarray
    active: list[int]
    conflicting: list[int] = field(default_factory=list)
    iterations: int = 0


def _pseudo_solve(H: np.ndarray, b: np.ndarray, rows: list[int], rcond: float) -> np.ndarray:
    """H[rows, rows]^+ b[rows] with the relative eigenvalue cutoff rcond^2 (the Gram factor's)."""
    if not rows:
        return np.zeros(0)
    sub = H[np.ix_(rows, rows)]
    values, vectors = np.linalg.eigh(sub)
    largest = max(values[-1], 0.0)
    keep = values > (rcond**2) * largest
    inverse = np.where(keep, 1.0 / np.where(keep, values, 1.0), 0.0)
    return vectors @ (inverse * (vectors.T @ b[rows]))





def solve_dual(H: np.ndarray, q: np.ndarray, m: int, rcond: float, max_iterations: int | None = None
               ) -> DualSolution:
    r"""The bound-constrained dual :math:`\min \tfrac12 \lambda^T H \lambda - q^T \lambda`,
    :math:`\lambda_{m:} \ge 0` (rows 0..m-1 free), by a Lawson-Hanson active-set method from the
    equality rows alone, with the dual step of Goldfarb and Idnani for a dependent row.

    H is positive semidefinite (more rows than the rank of :math:`\hat J`: a vertex of n = 2 with three
    rows through it, a bound that repeats an equality), so the free set is kept linearly independent:
    each iteration takes the inequality row whose primal residual :math:`(q - H\lambda)_i` is largest
    (above a round-off tolerance).

    * Independent of the free rows: it joins them, the free set is re-solved and, while a multiplier
      would turn negative, the method moves back along the segment to the last feasible point and drops
      the rows that reach 0.
    * Dependent (:math:`\hat J_j = \sum_{i \in F} \alpha_i \hat J_i`): raising :math:`\lambda_j` by
      :math:`\tau` and lowering :math:`\lambda_F` by :math:`\tau\alpha` leaves the step unchanged; the
      largest feasible :math:`\tau` drives an inequality row with :math:`\alpha_i > 0` to 0, which leaves
      and row j takes its place. With no such row the rows cannot hold together (the linearization's
      feasible set is empty): row j is set aside as conflicting."""
    k = H.shape[0]
    iterations_left = max_iterations if max_iterations is not None else 3 * k + 10
    free = list(range(m))
    lam = np.zeros(k)
    lam[free] = _pseudo_solve(H, q, free, rcond)
    conflicting: set[int] = set()
    iterations = 0
    dependent_below = max(rcond**2, 1e-15) * 1e2
    while iterations < iterations_left:
        iterations += 1
        residual = q - H @ lam
        tol = DUAL_TOL * (np.abs(q).max(initial=0.0) + (np.abs(H) @ np.abs(lam)).max(initial=0.0)) + 1e-300
        in_free = set(free)
        candidates = [row for row in range(m, k) if row not in in_free and row not in conflicting
                      and residual[row] > tol]
        if not candidates:
            break
        j = max(candidates, key=lambda row: residual[row] / max(np.sqrt(H[row, row]), 1e-300))
        alpha = _pseudo_solve(H, H[:, j], free, rcond)
        left = H[j, j] - (H[j, free] @ alpha if free else 0.0)
        if left <= dependent_below * H[j, j]:  # dependent on the free rows: the dual step
            limits = [(lam[row] / a, row) for row, a in zip(free, alpha) if row >= m and a > 0.0]
            if not limits:
                conflicting.add(j)
                continue
            tau, leaving = min(limits)
            lam[free] -= tau * alpha
            lam[j] = tau
            lam[leaving] = 0.0
            free = [row for row in free if row != leaving]
        free = sorted(set(free) | {j})
        s = _pseudo_solve(H, q, free, rcond)
        while True:
            blocking = [(row, value) for row, value in zip(free, s) if row >= m and value <= 0.0]
            if not blocking:
                lam[:] = 0.0
                lam[free] = s
                break
            current = lam[free]
            step = min(current[free.index(row)] / (current[free.index(row)] - value) for row, value in blocking)
            lam[free] = current + step * (s - current)
            free = [row for row in free if row < m or lam[row] > 0.0]
            lam[[row for row in range(m, k) if row not in set(free)]] = 0.0
            s = _pseudo_solve(H, q, free, rcond)
    return DualSolution(lam, [row - m for row in free if row >= m], sorted(row - m for row in conflicting),
                        iterations)


@dataclass
class ActiveSetStep:
    """The outcome of :func:`impose_inequalities`: the projector of the rows E + A the step imposed (its
    ``jacobian`` is [J; G_A]), the target b = [s c; t g_A] it imposed them to, the active rows (sorted),
    the inequality rows' multipliers ((p,), float64, 0 off A) and the candidate steps taken."""

    projector: Projector
    target: Tensor
    active: list[int]
    multipliers: Tensor
    rounds: int
    conflicting: list[int]
    working: list[int]
    """The next step's working set: the active rows less those the objective pulls off their bound (a
    negative first-order multiplier estimate), which this step may still have to hold against w, whose
    moments saw the row in the null space; the next step's moments then see the pull."""


def impose_inequalities(
    *,
    equality_projector: Projector,
    stacked_projector: Callable[[list[int]], Projector],
    sc: Tensor,
    inequalities: Inequalities,
    t: Tensor,
    w: Tensor,
    a: float,
    warm: list[int],
    rcond: float,
    delta: Tensor,
    equality_delta_formed: bool,
    owner: str,
    gradient_multipliers: Tensor | None = None,
) -> ActiveSetStep:
    """The step with inequality rows, into ``delta`` (see the module docstring).

    ``equality_projector`` is the step's projector of J alone; ``stacked_projector(rows)`` factorizes
    [J; G_rows] the same way (its Gram, rank cutoff and refinement plan). ``delta`` holds the equality
    step already when ``equality_delta_formed`` (the warm start is empty). ``t`` is the inequality rows'
    normal-step fraction (0-dim float64). ``gradient_multipliers``: the first-order multiplier estimates
    :math:`-\\hat G^+ \\hat J \\nabla f` of the warm rows (the inequality part, float64): the optimizer's
    tangential moments are projected on the warm rows' null space, so the direction w alone can never
    ask a row to leave; a row whose estimate is negative (the objective pulls it off its bound) leaves, and
    a row whose estimate is positive (the objective pushes against it) is held on its bound."""
    g, G = inequalities.values, inequalities.jacobian
    m = sc.numel()
    tg = t * g
    active = sorted(set(i for i in warm if 0 <= i < inequalities.p))
    leaving_rows: list[int] = []
    multipliers = torch.zeros(inequalities.p, dtype=torch.float64, device=g.device)
    conflicting: list[int] = []
    for rounds in range(1, MAX_ROUNDS + 1):
        projector, target = _candidate(equality_projector, stacked_projector, sc, tg, active)
        z = torch.empty(target.numel(), dtype=torch.float64, device=g.device)
        if active or not equality_delta_formed or rounds > 1:
            projector.merged(w, a, target, delta, multipliers=z)
        else:  # the equality step is in delta already; its multipliers are not needed
            z.zero_()
        leaving = gradient_multipliers if rounds == 1 and active else None
        violated, dropped, pulled_off = _check(G, tg, delta, z[m:], active, leaving)
        if rounds == 1:
            leaving_rows = pulled_off
        deficient = bool(active) and not conflicting and (
            int(projector.factor.rank) < int(equality_projector.factor.rank) + len(active))
        if not violated and not dropped and not deficient:
            break
        if rounds == MAX_ROUNDS:
            break
        if rounds == 1 or dropped or deficient:  # (a dependent warm row: its step is a least-squares one)
            solution = _dual(equality_projector.jacobian, G, sc, tg, w, a, m, rcond)
            conflicting = solution.conflicting
            new = sorted(set(solution.active) | set(conflicting))
            if new == active:  # the dual agrees with the candidate up to round-off: add what the check saw
                new = sorted(set(active) | set(violated))
        else:
            new = sorted(set(active) | set(violated))
        if new == active:
            break
        active = new
    if active:
        multipliers[active] = z[m:].clamp_min(0.0)
    if conflicting:
        _warn_conflicting(owner, conflicting)
    working = sorted(set(active) - set(leaving_rows))
    return ActiveSetStep(projector, target, active, multipliers, rounds, conflicting, working)


def _candidate(equality_projector: Projector, stacked_projector: Callable[[list[int]], Projector],
               sc: Tensor, tg: Tensor, active: list[int]) -> tuple[Projector, Tensor]:
    if not active:
        return equality_projector, sc
    rows = torch.tensor(active, dtype=torch.long, device=tg.device)
    return stacked_projector(active), torch.cat([sc, tg[rows]])


def _check(G: Tensor, tg: Tensor, delta: Tensor, active_multipliers: Tensor, active: list[int],
           gradient_multipliers: Tensor | None = None) -> tuple[list[int], list[int], list[int]]:
    """The candidate's KKT check (one pass over G and one host read): the inactive rows that
    :math:`G_i \\Delta x + t g_i \\le 0` does not hold for (beyond round-off, ``CHECK_ULPS``), and the
    active rows whose multipliers are negative (beyond ``MULTIPLIER_TOL``), unless ``gradient_multipliers``
    (the warm rows' first-order estimates) say the objective pushes against the row: then it is held (see
    :func:`impose_inequalities`). It is also where a NaN/inf in
    G shows (no pass of its own: the step's one finiteness read covers g, J and the gradient); raised
    before the parameters change (the optimizer's moments of this step are updated by then)."""
    residual = matvec(G, delta) + tg
    if active:
        residual[active] = -1.0  # (not checked: their multipliers are)
        negative = active_multipliers < -MULTIPLIER_TOL * active_multipliers.abs().max().clamp_min(1e-300)
        pulled = torch.zeros_like(negative)
        if gradient_multipliers is not None:
            scale = MULTIPLIER_TOL * gradient_multipliers.abs().max().clamp_min(1e-300)
            pulled = gradient_multipliers < -scale
            negative = negative & (gradient_multipliers <= scale)  # a row the objective pushes against is held
        read = torch.cat([residual, (negative | pulled).to(torch.float64), pulled.to(torch.float64)]).tolist()
    else:
        read = residual.tolist()
    p = tg.numel()
    if not all(math.isfinite(value) for value in read[:p]):
        raise ValueError(
            "The inequality jacobian G (or the step) is not finite: G delta holds NaN/inf; the parameters were "
            "not changed (check the inequality rows' residuals and their derivatives at this point)."
        )
    positive = [i for i in range(p) if read[i] > 0.0]
    dropped = [active[j] for j, flag in enumerate(read[p:p + len(active)]) if flag]
    leaving = [active[j] for j, flag in enumerate(read[p + len(active):]) if flag]
    if not positive:
        return [], dropped, leaving
    rows = torch.tensor(positive, dtype=torch.long, device=G.device)
    eps = torch.finfo(G.dtype).eps
    bound = (CHECK_ULPS * eps * torch.linalg.vector_norm(G[rows], dim=1).to(torch.float64)
             * torch.linalg.vector_norm(delta).to(torch.float64)
             + 4 * torch.finfo(torch.float64).eps * tg[rows].abs())
    over = (torch.tensor([read[i] for i in positive], dtype=torch.float64, device=G.device) > bound).tolist()
    return [i for i, flag in zip(positive, over) if flag], dropped, leaving


def _dual(J: Tensor, G: Tensor, sc: Tensor, tg: Tensor, w: Tensor, a: float, m: int, rcond: float
          ) -> DualSolution:
    """The dual on the Gram of all m + p rows (float64, from the blocked products), solved on the host."""
    stacked = torch.cat([J, G]) if m else G
    H = gram(stacked)
    q = torch.cat([sc, tg]) + a * matvec(stacked, w)
    return solve_dual(H.cpu().numpy(), q.cpu().numpy(), m, rcond)


def _warn_conflicting(owner: str, rows: list[int]) -> None:
    shown = ", ".join(str(i) for i in rows[:10]) + (f", ... ({len(rows)} rows)" if len(rows) > 10 else "")
    warnings.warn(
        f"{owner}: the linearized inequality rows {shown} (indices into the inequalities) cannot hold "
        "together with the equalities and the other active rows (an empty feasible set of the "
        "linearization at this step): the step imposes their least-squares compromise (finite; they stay "
        "violated). Check that the bounds and the equalities are compatible (an obstacle above a boundary "
        "value, a bound that contradicts a conservation law).",
        RuntimeWarning, stacklevel=2,
    )
