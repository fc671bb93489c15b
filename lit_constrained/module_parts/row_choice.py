r"""Which points of an imposed part's pool are imposed: ``Imposed(residual, pool, count=k | "auto")``.

**The rule** (``imposed_choice``). A part with a count holds a pool of :math:`N` candidate points; k of
them are imposed, re-chosen every ``rechoose_every`` steps (and at the first step), the rows kept between.

* ``"spread"`` (the default, :func:`farthest_points`): k points spread over the pool, whatever the
  residuals: the point nearest the centre of the pool's bounding box (scaled to the unit cube), then each
  time the pool point farthest from those taken (farthest-point sampling: no pool point is farther from
  the k taken than twice the best covering radius of any k points). The same pool and k give the same
  points, so a re-choice moves the rows only when the count or the pool changes.
* ``"largest"`` (:func:`spread_largest`): the residual is evaluated at the whole pool (values only, no
  Jacobian) and each point scored by how far its rows are from holding (:math:`\max_j |r_{ij}|` for an
  equality, :math:`\max_j r_{ij}` for ``"<="``, :math:`\max_j (-r_{ij})` for ``">="``); the points are
  taken greedily, highest score first, skipping any point closer than :math:`\rho = \tfrac12 k^{-1/d}`
  (in the unit-scaled box) to one taken, filled up by score when the spacing leaves fewer than k.

Measured on PINNacle's four tasks (the defaults of package c7aa053, Intel Xeon, 2 000 steps on
1 024/256/256 points, rel. L2 against plain Adam's on the same machine at the same CPU time;
docs/pinnacle.md, "Against the targets", has the current defaults' figures): spread, seed 0,
Poisson2d-C 9.7e-3 (Adam 0.53), Wave1d-C 0.33 (0.55), Burgers1d-C 0.17 (0.46), Heat2d-MS 1.07 (0.91); the largest residuals lost Burgers1d-C (0.78 against 0.45) and Heat2d-MS (1.30 against 0.91).
With the counts pinned equal (``runs_rule_*_pinned.jsonl``) the largest residuals do better where the
solution is smooth (Poisson2d-C 9.1e-3 against 1.35e-2 for a residual-blind spread, Wave1d-C 0.36
against 0.46) and worse where they sit on a feature the network cannot yet represent: Burgers1d-C's
shock (0.78 against 0.36) and Heat2d-MS's ten x-periods (1.41 against 1.06). So spread is the default.

**How many** (``count="auto"``). The module keeps an imposed step within ``imposed_cost_ratio`` (3)
times the unconstrained step of the same objective, by a cost model it measures at the first
choice of a fit (:class:`CostModel`): :math:`t(m) = t_f + \sum_p m_p t_p + g\,m^2`, with :math:`t_f`
the objective and its gradient, :math:`t_p` one row of part p's per-point Jacobian (probed on a few of
its points, in the dtype c and J are evaluated in) and :math:`g\,m^2` the Gram product :math:`J J^\top`
of the step (timed on a probe of the network's size), all by :func:`cost_clock` (the process's CPU time
on a CPU). The model is then checked against the steps it
predicts: at each of the first :data:`SETTLING_CORRECTIONS` (3) re-choices the median step time since
the one before corrects the constraint terms (:meth:`CostModel.corrected`, with :math:`t_f` measured again
then, warm), so what the probe misses (the optimizer's own products, its post-step corrections) is counted,
and the first interval's dearer steps (the new rows brought to feasibility) are not the last word. The budget is split over the auto parts in equal numbers of points
(:func:`equal_shares`, a part's cap its pool); which points, by the rule above. The total never
exceeds the largest rank the step's factorization reported at a choice (``optimizer.diagnostics["rank"]``)
below the rows it factored: rows beyond it are dependent and add cost, not constraint (the largest, not the last: the rank of fewer
rows is at most their number, so the last would only ratchet the count down).

**The count follows what holds.** At each re-choice, and once :data:`FIRST_CHECK` (20) steps after a
fit's first choice, the module asks whether the rows imposed since the
last one held (:meth:`RowChoice.held`: max |c| at the interval's last step at most :data:`HOLD_RATIO` x
max(max |c| at its first step, 1)); if not, each auto part's count is capped at half of what it was,
and after each interval that held the cap doubles (the budget still bounds the count). Measured on
Burgers1d-C from the initial weights: 25 points a part never held and lost the network within 50 steps
(rel. L2 1.02 at the end), so the first check comes early; starting every fit small instead (8 a part,
doubling) blew up Wave1d-C's objective (1.2e4 at step 50, rel. L2 0.88 at the end against 0.33-0.40). Measured on
Burgers1d-C: with 23 points a part the newly chosen worst points at the shock did not hold for the last
300 steps, and the test error went from 0.55 to 2.5.

The model, settled after its third correction, is kept (checkpoint), with the caps and the interval's
violations, so a run resumed after that chooses the same counts and rows as the uninterrupted one, bit
for bit.

**The chosen points are kept**, with their per-point data, not only their indices: between re-choices
the step imposes the same points even when the pool is a mini-batch that changes every step.

**Under DDP** the choice is made on every rank and rank 0's points (and data) are broadcast (a few small
collectives per re-choice), so every rank imposes the same rows even when each rank's pool is its own
shard of the points, for a task whose constraints are shared (``constraints_shared``); a task with
per-rank constraints keeps each rank's own.

What was chosen is visible: ``imposed/<part>/rows`` (points imposed) in the logger, the fit summary's
``imposed`` line, and the checkpoint's ``lit_constrained_row_choice`` entry (resume is bit-exact).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from ..imposed import AUTO, Imposed, Part
from .constraint_precision import promote_parts

CHECKPOINT_KEY = "lit_constrained_row_choice"
"""The checkpoint entry holding the chosen rows, the auto counts' cost model and the choice step."""

HOLD_RATIO = 1e-2
"""The rows imposed since a choice held when max |c| at the interval's last step is at most this fraction
of max(max |c| at its first step, 1): the step brought the newly chosen rows' residuals down 100x (or
below 1e-2 where they started below 1)."""

ImposedChoice = Literal["spread", "largest"]
"""Which points of a counted part are imposed: spread over its pool, or its largest residuals spread."""

PROBE_POINTS = 8
"""Points of a part whose per-point Jacobian is timed for the cost model."""

FIRST_CHECK = 20
"""Steps after a fit's first choice at which the auto rows are checked (:meth:`RowChoice.held`) before the
first full interval: the rows imposed from the initial weights are where a count too large shows
(Burgers1d-C, seed 0, 25 points a part: max |c| 1.06 for 40 steps, J's rank 56 of 75 rows, then 40 and
the network lost for good, rel. L2 1.02 at step 2 000; 8 a part held by step 20). The check halves the
counts if the rows did not hold; it corrects no cost (its steps are the run's dearest)."""

SETTLING_CORRECTIONS = 3
"""Re-choices at which the cost model is corrected by the steps measured since the one before (then kept).
More than one: the first interval's steps are not the run's (measured on Poisson2d-C, AMD EPYC: 172 ms a
step over steps 1-99 at 37 points a part, 80 ms over steps 100-500 at 20), so a model corrected by them
alone set counts at which the later steps cost 3.1-3.4x Adam's (``benchmarks/bench_imposed_step.py``)."""

GRAM_PROBE_ROWS = 64
"""Rows of the random J whose Gram product is timed for the cost model."""



# ------------------------------------------------------------------------------------------- the rule
def row_scores(values: Tensor, sense: str) -> Tensor:
    """How far each point's rows are from holding, (N,): ``values`` (N, k) of an ``"="``, ``"<="`` or
    ``">="`` part; a non-finite value scores highest."""
    v = values.detach().reshape(values.shape[0], -1).to(torch.float64)
    score = v.abs() if sense == "=" else (v if sense == "<=" else -v)
    return torch.nan_to_num(score, nan=math.inf).amax(dim=1)


def _unit_box(points: Tensor) -> np.ndarray:
    """``points`` (N, d) as float64 NumPy coordinates scaled to their unit bounding box."""
    x = points.detach().to(torch.float64).cpu().numpy()
    low, high = x.min(axis=0), x.max(axis=0)
    return (x - low) / np.where(high > low, high - low, 1.0)


def _all_or_none(points: Tensor, k: int) -> Tensor | None:
    """Every index of ``points`` when k >= N, none when k <= 0; None otherwise (a choice to make)."""
    n = points.shape[0]
    if k >= n:
        return torch.arange(n, device=points.device)
    if k <= 0:
        return torch.zeros(0, dtype=torch.long, device=points.device)
    return None


def farthest_points(points: Tensor, k: int) -> Tensor:
    """The sorted indices of ``k`` of ``points`` (N, d) spread over them (coordinates scaled to the unit
    bounding box): the point nearest the box's centre, then each time the point farthest from those taken.
    All N when k >= N."""
    if (trivial := _all_or_none(points, k)) is not None:
        return trivial
    x = _unit_box(points)
    taken = [int(np.argmin(((x - 0.5) ** 2).sum(axis=1)))]
    nearest = ((x - x[taken[0]]) ** 2).sum(axis=1)  # squared distance to the nearest point taken
    while len(taken) < k:
        taken.append(int(np.argmax(nearest)))
        nearest = np.minimum(nearest, ((x - x[taken[-1]]) ** 2).sum(axis=1))
    return torch.as_tensor(sorted(taken), dtype=torch.long, device=points.device)


def spread_largest(points: Tensor, scores: Tensor, k: int) -> Tensor:
    r"""The sorted indices of ``k`` of ``points`` (N, d): the highest ``scores`` first, none closer than
    :math:`\tfrac12 k^{-1/d}` to one taken (coordinates scaled to the pool's unit bounding box), filled
    up by score if the spacing leaves fewer than k. All N when k >= N."""
    if (trivial := _all_or_none(points, k)) is not None:
        return trivial
    n, x = points.shape[0], _unit_box(points)
    radius2 = (0.5 * k ** (-1.0 / x.shape[1])) ** 2
    order = np.argsort(-scores.cpu().numpy(), kind="stable")
    blocked = np.zeros(n, dtype=bool)
    taken: list[int] = []
    for i in order:
        if blocked[i]:
            continue
        taken.append(int(i))
        if len(taken) == k:
            break
        blocked |= ((x - x[i]) ** 2).sum(axis=1) < radius2
    if len(taken) < k:
        chosen = set(taken)
        taken += [int(i) for i in order if int(i) not in chosen][: k - len(taken)]
    return torch.as_tensor(sorted(taken), dtype=torch.long, device=points.device)


# ------------------------------------------------------------------------------------- the cost model
@dataclass(frozen=True)
class CostModel:
    r"""The measured cost of an imposed step, :math:`t(m) = t_f + \sum_p m_p t_p + g\,m^2` (seconds)."""

    free_s: float
    """:math:`t_f`: the objective and its gradient (the unconstrained step's work)."""
    row_s: Mapping[str, float]
    """:math:`t_p`: one point of part p in the per-point Jacobian (all its rows)."""
    gram_s: float
    """:math:`g`: the Gram product per squared row."""
    corrections: int = 0
    """How many times measured steps corrected it (:meth:`corrected`)."""

    @property
    def settled(self) -> bool:
        """Corrected :data:`SETTLING_CORRECTIONS` times and kept from then on, so the counts depend on nothing
        measured afterwards: a run resumed after that chooses exactly as the uninterrupted one."""
        return self.corrections >= SETTLING_CORRECTIONS

    def step_s(self, counts: Mapping[str, int], widths: Mapping[str, int]) -> float:
        m = sum(counts[name] * widths[name] for name in counts)
        return self.free_s + sum(counts[name] * self.row_s[name] for name in counts) + self.gram_s * m * m

    def corrected(self, measured_s: float, counts: Mapping[str, int], widths: Mapping[str, int]) -> CostModel:
        """The model with its constraint terms scaled so that it predicts ``measured_s`` (the mean step
        measured with ``counts``); itself when nothing was imposed or the measurement is not above
        :math:`t_f`."""
        predicted = self.step_s(counts, widths) - self.free_s
        if predicted <= 0 or not measured_s > self.free_s:
            return dataclasses.replace(self, corrections=self.corrections + 1)
        scale = (measured_s - self.free_s) / predicted
        return CostModel(self.free_s, {name: t * scale for name, t in self.row_s.items()}, self.gram_s * scale,
                         self.corrections + 1)


def cost_clock(device: torch.device | None) -> Callable[[], float]:
    """The clock of the cost model and of the steps it is checked against: the process's CPU time on a CPU
    device (what a step costs this process whatever else shares the cores, so a probe at one moment and
    steps at another compare under a changing load; the benchmarks' "equal CPU time" is the same
    currency), wall time on an accelerator (its kernels run outside the process's CPU time; the step's
    one host read waits for them)."""
    return time.process_time if device is None or device.type == "cpu" else time.perf_counter


def _median_time(fn: Callable[[], Any], clock: Callable[[], float], repeats: int = 3) -> float:
    fn()  # warm-up: the per-point engine chooses its path, caches fill
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def measure_free(task: Any, batch: Any, repeats: int = 3) -> float:
    """:math:`t_f`: the seconds of ``task``'s objective on ``batch`` and its gradient (by :func:`cost_clock`,
    the median of ``repeats`` after a warm-up)."""
    params = [p for p in task.parameters() if p.requires_grad]

    def objective_and_gradient() -> None:
        with torch.enable_grad():
            torch.autograd.grad(task.objective(batch), params, allow_unused=True)

    return _median_time(objective_and_gradient, cost_clock(params[0].device if params else None), repeats)


def measure_cost(task: Any, batch: Any, parts: Mapping[str, Part], widths: Mapping[str, int]) -> CostModel:
    """:class:`CostModel` of ``task`` on ``batch`` for the auto ``parts`` (their pools; c and J in the
    task's ``constraint_dtype``)."""
    params = [p for p in task.parameters() if p.requires_grad]
    clock = cost_clock(params[0].device if params else None)
    free = measure_free(task, batch)
    promoted = promote_parts(task, parts, getattr(task, "constraint_dtype", "native")) or {}
    row_s = {}
    for name, part in promoted.items():
        probe = part.at(slice(0, PROBE_POINTS))
        spec = [(probe.residual, probe.points, widths[name], probe.data)]
        dtype = probe.at(slice(0, 1)).values().dtype  # c's dtype: float64 when promoted
        t = _median_time(lambda: task.pointwise_jacobian(task, params, spec, rows=None, dtype=dtype), clock, 2)
        row_s[name] = t / probe.points.shape[0]
    n = sum(p.numel() for p in params)
    dtype = params[0].dtype if params else torch.float32
    probe_j = torch.randn(GRAM_PROBE_ROWS, n, dtype=dtype, device=params[0].device if params else None)
    gram = _median_time(lambda: (probe_j @ probe_j.T).to(torch.float64), clock, 2)
    return CostModel(free, row_s, gram / GRAM_PROBE_ROWS**2)


def auto_counts(cost: CostModel, budget: float, shares: Mapping[str, float], pools: Mapping[str, int],
                widths: Mapping[str, int], max_rows: int | None) -> dict[str, int]:
    """The most points per auto part, in proportion to ``shares``, whose step costs at most ``budget``
    times :math:`t_f` and whose rows stay within ``max_rows`` (None: no cap); at least one point."""

    def counts(scale: float) -> dict[str, int]:
        return {name: min(pools[name], int(scale * shares[name])) for name in shares}

    def fits(c: Mapping[str, int]) -> bool:
        rows = sum(c[name] * widths[name] for name in c)
        return cost.step_s(c, widths) <= budget * cost.free_s and (max_rows is None or rows <= max_rows)

    low, high = 0.0, float(sum(pools.values())) / min(shares.values())  # counts(high): every pool whole
    if fits(counts(high)):
        low = high  # the bisection below then keeps it
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(counts(middle)) else (low, middle)
    chosen = counts(low)
    if sum(chosen.values()) == 0:
        chosen[max(shares, key=lambda name: shares[name])] = 1
    return chosen


def equal_shares(names: Iterable[str]) -> dict[str, float]:
    """The auto budget's split: the same number of points for every auto part (a part whose pool is
    smaller passes the rest on: :func:`auto_counts` caps each at its pool). Measured against a split by
    each part's mean squared residual: on Wave1d-C that gives the initial condition 35 of 37 points at
    the first choice (its residual dominates a fresh network's) and the objective grew from 0.57 to
    4.8e4 in 30 steps; the equal split is the project's swept family (``sqp<N>``: N / 2 PDE points)."""
    names = list(names)
    return {name: 1.0 / len(names) for name in names}


# -------------------------------------------------------------------------------------- the choice
class RowChoice:
    """The rows of each counted part that are imposed now, re-chosen every ``every`` steps.

    Args:
        every: steps between re-choices (``rechoose_every``).
        budget: the auto counts' cost bound, in unconstrained steps (``imposed_cost_ratio``).
        rule: which points (``imposed_choice``): ``"spread"`` or ``"largest"`` (the module docstring).
    """

    def __init__(self, every: int = 100, budget: float = 3.0, rule: ImposedChoice = "spread") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"rechoose_every must be an integer >= 1 (steps between re-choices), got {every!r}.")
        if not isinstance(budget, (int, float)) or not budget > 1:
            raise ValueError(
                f"imposed_cost_ratio must be a number > 1 (an imposed step's cost in unconstrained steps), got {budget!r}."
            )
        if rule not in get_args(ImposedChoice):
            raise ValueError(f"imposed_choice must be one of {', '.join(map(repr, get_args(ImposedChoice)))} (which "
                             f"points of a counted part are imposed), got {rule!r}.")
        self.every = every
        self.budget = float(budget)
        self.rule = rule
        self.chosen: dict[str, Tensor] = {}
        """Each counted part's imposed points: sorted indices into its pool."""
        self.kept: dict[str, tuple[Tensor, Any]] = {}
        """Each counted part's imposed points and their data (rank 0's under DDP)."""
        self.pools: dict[str, int] = {}
        """Each counted part's pool size when its points were chosen."""
        self.cost: CostModel | None = None
        self.chosen_at: int | None = None
        """The step of the last choice (None: none yet)."""
        self.max_rank: int | None = None
        """The largest rank of J the optimizer reported at a choice with fewer than its rows (some dependent):
        the cap on the rows. Not the last one: the rank of fewer rows is at most their number, so the last
        rank as the cap would only ratchet down (measured on Wave1d-C: 112 rows of rank 75, then 44 rows of
        rank 41, 40 of 37, ...)."""
        self.first_check = False
        """Whether the check :data:`FIRST_CHECK` steps after the first choice of auto rows is still to come."""
        self.last_rows: int | None = None
        """The rows of the last step observed (the size of its c): what the rank reported with it is of."""
        self._step_times: list[float] = []  # the steps' seconds since the last choice (the model's check)
        self.auto_caps: dict[str, int] = {}
        """Each auto part's most points after an interval whose rows did not hold (:meth:`held`): half its
        count then, doubled after each interval that held (the cost budget still bounds it)."""
        self.violations: tuple[Tensor | None, Tensor | None] = (None, None)
        """max |c| of the imposed rows at the first and at the last step since the last choice (0-dim
        tensors, read once, at the next choice)."""

    def observed(self, seconds: float, constraints: Tensor | None) -> None:
        """Record one training step: its duration (the module times its step by :func:`cost_clock`) and,
        while auto parts are imposed (there is a cost model), the max |c| of its imposed rows ``constraints``
        (a 0-dim tensor, not read here: no host sync a step; None or empty: no rows)."""
        self._step_times.append(seconds)
        if constraints is not None:
            self.last_rows = int(constraints.numel())
        if self.cost is not None and constraints is not None and constraints.numel():
            violation = constraints.detach().abs().max()
            self.violations = (violation if self.violations[0] is None else self.violations[0], violation)

    def held(self) -> bool | None:
        """Whether the rows imposed since the last choice held: max |c| at the interval's last step at most
        :data:`HOLD_RATIO` x max(max |c| at its first step, 1) (None: no step observed)."""
        first, last = self.violations
        if first is None or last is None:
            return None
        return float(last) <= HOLD_RATIO * max(float(first), 1.0)

    @staticmethod
    def counted(parts: Mapping[str, Part] | None) -> dict[str, Imposed]:
        """The per-point parts with a ``count`` (a :class:`~lit_constrained.imposed.Coupled` part has none)."""
        return {name: part for name, part in (parts or {}).items()
                if isinstance(part, Imposed) and part.count is not None}

    def due(self, step: int) -> bool:
        if self.chosen_at is None:
            return True
        return step - self.chosen_at >= (min(FIRST_CHECK, self.every) if self.first_check else self.every)

    def apply(self, task: Any, batch: Any, parts: Mapping[str, Part] | None) -> dict[str, Part] | None:
        """``parts`` with each counted part's points (and their data) cut to its chosen ones (chosen now if
        it has none yet or its pool changed size)."""
        if parts is None:
            return None
        counted = self.counted(parts)
        if any(name not in self.chosen or self.pools[name] != part.points.shape[0] for name, part in counted.items()):
            self.choose(task, batch, parts, self.chosen_at if self.chosen_at is not None else 0)
        kept = {name: (self._kept_part(name, part) if name in counted else part) for name, part in parts.items()}
        return {name: part for name, part in kept.items()
                if not isinstance(part, Imposed) or part.points.shape[0]} or None  # a part with 0 points: none

    def update(self, task: Any, batch: Any, step: int) -> bool:
        """Re-choose the counted parts' points of ``task.imposed(batch)`` if ``step`` is due; whether it did."""
        if self.due(step):
            parts = task.imposed(batch)
            if self.counted(parts):
                self.choose(task, batch, parts, step)
                return True
        return False

    def choose(self, task: Any, batch: Any, parts: Mapping[str, Part], step: int) -> None:
        """Choose every counted part's points at the current weights (by :attr:`rule`)."""
        counted = self.counted(parts)
        early = self.first_check  # the check FIRST_CHECK steps after the first choice
        with torch.enable_grad():
            # the whole pool only where its residuals are scored ("largest"); one point tells the widths
            values = {name: _as_rows((part if self.rule == "largest" else part.at(slice(0, 1))).values()).detach()
                      for name, part in counted.items()}
        widths = {name: v.shape[1] for name, v in values.items()}
        counts = {name: min(int(part.count), part.points.shape[0])
                  for name, part in counted.items() if part.count != AUTO}
        auto = {name: part for name, part in counted.items() if part.count == AUTO}
        if auto:
            if self.cost is None or set(self.cost.row_s) != set(auto):
                self.cost = measure_cost(task, batch, auto, widths)
                self.first_check = True
            elif early:
                self.first_check = False
            elif not self.cost.settled and len(self._step_times) >= 3 and set(self.chosen) == set(counted):
                last = {name: int(self.chosen[name].numel()) for name in auto}
                # t_f again, warm: measured at a fit's first step it read up to 1.4x the steady one (Burgers1d-C:
                # 41 ms against 30 ms after 110 steps), and the budget is a multiple of it
                warm = dataclasses.replace(self.cost, free_s=measure_free(task, batch, repeats=5))
                self.cost = warm.corrected(statistics.median(self._step_times[1:]), last, widths)
            fixed_rows = sum(counts[name] * widths[name] for name in counts)
            max_rows = self.rows_cap(_last_rank(task), self.last_rows, fixed_rows)
            self._update_auto_caps(auto)
            pools = {n: min(p.points.shape[0], self.auto_caps.get(n, p.points.shape[0])) for n, p in auto.items()}
            counts.update(auto_counts(self.cost, self.budget, equal_shares(auto), pools, widths, max_rows))
        if self.rule == "spread":
            chosen = {name: farthest_points(counted[name].points, k) for name, k in counts.items()}
        else:
            chosen = {name: spread_largest(counted[name].points, row_scores(values[name], counted[name].sense), k)
                      for name, k in counts.items()}
        shared = getattr(task, "constraints_shared", True)
        self.chosen = _same_on_every_rank(chosen, shared)
        self.kept = {}
        for name, index in self.chosen.items():
            pool = counted[name].points.shape[0]  # another rank's indices may pass this rank's pool: shapes only
            part = counted[name].at(index.clamp(max=pool - 1)) if pool else counted[name]
            self.kept[name] = _rank_zeros(part.points, part.data, shared)
        self.pools = {name: part.points.shape[0] for name, part in counted.items()}
        self.chosen_at = step
        self._step_times = []
        self.violations = (None, None)

    def _update_auto_caps(self, auto: Mapping[str, Imposed]) -> None:
        """After an interval of these auto parts: their caps halved from their counts if the rows did not
        hold (:meth:`held`), doubled if they held (a cap at or above the pool is dropped)."""
        held = self.held() if set(self.chosen) >= set(auto) else None
        if held is False:
            self.auto_caps = {name: max(1, int(self.chosen[name].numel()) // 2) for name in auto}
        elif held:
            self.auto_caps = {name: 2 * cap for name, cap in self.auto_caps.items()
                              if name in auto and 2 * cap < auto[name].points.shape[0]}

    def _kept_part(self, name: str, part: Imposed) -> Imposed:
        """``part`` at its kept points and data (a checkpoint without them: its chosen indices)."""
        if name not in self.kept:
            cut = part.at(self.chosen[name])
            self.kept[name] = (cut.points, cut.data)
        points, data = self.kept[name]
        if isinstance(data, Tensor) and isinstance(part.data, Tensor):
            data = _like(data, part.data)
        elif isinstance(data, Mapping) and isinstance(part.data, Mapping):
            data = {key: _like(value, part.data[key]) if key in part.data else value for key, value in data.items()}
        else:
            data = _moved(data, part.points.device)
        return dataclasses.replace(part, points=_like(points, part.points), data=data, count=None)

    def rows(self) -> dict[str, tuple[int, int]]:
        """Each counted part's (points imposed, pool size)."""
        return {name: (int(index.numel()), self.pools[name]) for name, index in self.chosen.items()}

    def rows_cap(self, rank: int | None, rows: int | None, fixed_rows: int) -> int | None:
        """The most rows the auto parts may take beside ``fixed_rows`` (None: no cap yet), given the
        ``rank`` of J reported now by a step of ``rows`` rows: :attr:`max_rank`, raised to ``rank`` when
        that is larger and below ``rows`` (a J of full rank says nothing about how many rows more it
        could carry: its rank as the cap would hold a count that started small where it was)."""
        if rank is not None and rows is not None and rank < rows and (self.max_rank is None or rank > self.max_rank):
            self.max_rank = rank
        return None if self.max_rank is None else max(self.max_rank - fixed_rows, 1)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        cost = None if self.cost is None else dataclasses.asdict(self.cost)
        return {"chosen": {name: index.cpu() for name, index in self.chosen.items()}, "pools": dict(self.pools),
                "kept": {name: (points.cpu(), _moved(data, torch.device("cpu"))) for name, (points, data) in self.kept.items()},
                "cost": cost, "chosen_at": self.chosen_at, "max_rank": self.max_rank, "last_rows": self.last_rows, "first_check": self.first_check, "auto_caps": dict(self.auto_caps),
                "violations": [None if v is None else float(v) for v in self.violations]}

    def load_state_dict(self, state: Mapping[str, Any], device: torch.device | None = None) -> None:
        self.chosen = {name: torch.as_tensor(index, dtype=torch.long, device=device)
                       for name, index in state["chosen"].items()}
        self.pools = {name: int(size) for name, size in state["pools"].items()}
        self.kept = {name: (torch.as_tensor(points, device=device), _moved(data, device))
                     for name, (points, data) in state.get("kept", {}).items()}
        cost = state.get("cost")
        self.cost = None if cost is None else CostModel(float(cost["free_s"]), dict(cost["row_s"]), float(cost["gram_s"]),
                                                        int(cost.get("corrections", SETTLING_CORRECTIONS if cost.get("settled") else 0)))
        self.chosen_at = state.get("chosen_at")
        self.max_rank = state.get("max_rank")
        self.last_rows = state.get("last_rows")
        self.first_check = bool(state.get("first_check", False))
        self.auto_caps = {name: int(cap) for name, cap in state.get("auto_caps", {}).items()}
        self.violations = tuple(None if v is None else torch.tensor(float(v), dtype=torch.float64, device=device)
                                for v in state.get("violations", (None, None)))


def _like(kept: Tensor, current: Tensor) -> Tensor:
    """A kept tensor on ``current``'s device and, both being floating, in its dtype: the pool's points as this
    evaluation holds them (e.g. cast to float64 for the end-of-fit floors), the kept values unchanged otherwise."""
    floating = kept.is_floating_point() and current.is_floating_point()
    return kept.to(device=current.device, dtype=current.dtype if floating else kept.dtype)


def _moved(data: Any, device: torch.device | None) -> Any:
    """A part's per-point data (None, a tensor or a dict of tensors) on ``device``."""
    if data is None or device is None:
        return data
    if isinstance(data, Tensor):
        return data.to(device)
    return {key: value.to(device) for key, value in data.items()}


def _rank_zeros(points: Tensor, data: Any, shared: bool) -> tuple[Tensor, Any]:
    """Rank 0's ``points`` and ``data`` on every rank (broadcast in place into copies of this rank's,
    which have the same shapes: the counts are rank 0's) when a process group runs and the constraints
    are shared; this rank's otherwise."""
    import torch.distributed as dist

    if not shared or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return points, data
    tensors = [points.clone()]
    if isinstance(data, Tensor):
        tensors.append(data.clone())
    elif data is not None:
        tensors.extend(data[key].clone() for key in sorted(data))
    for tensor in tensors:
        if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
            moved = tensor.to(torch.device("cuda", torch.cuda.current_device()))
            dist.broadcast(moved, src=0)
            tensor.copy_(moved)
        else:
            dist.broadcast(tensor, src=0)
    if data is None:
        return tensors[0], None
    if isinstance(data, Tensor):
        return tensors[0], tensors[1]
    return tensors[0], dict(zip(sorted(data), tensors[1:]))


def _as_rows(values: Tensor) -> Tensor:
    return values[:, None] if values.dim() == 1 else values.reshape(values.shape[0], -1)


def _last_rank(task: Any) -> int | None:
    """The rank of J the task's optimizer reported last (None: none yet, or not an SQP optimizer)."""
    try:
        optimizer = task.optimizers()
    except (RuntimeError, AttributeError):  # not attached to a Trainer, or no optimizer yet
        return None
    optimizer = getattr(optimizer, "optimizer", optimizer)
    rank = getattr(optimizer, "diagnostics", {}).get("rank") if isinstance(getattr(optimizer, "diagnostics", None), Mapping) else None
    return None if rank is None else int(rank)


def _same_on_every_rank(chosen: dict[str, Tensor], shared: bool) -> dict[str, Tensor]:
    """Rank 0's choice on every rank (a broadcast of the counts, then of the indices) when a process
    group runs and the constraints are shared; ``chosen`` as it is otherwise."""
    import torch.distributed as dist

    if not shared or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return chosen
    names = list(chosen)
    device = next(iter(chosen.values())).device if chosen else torch.device("cpu")
    if dist.get_backend() == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    sizes = torch.tensor([chosen[name].numel() for name in names], dtype=torch.long, device=device)
    dist.broadcast(sizes, src=0)
    flat = torch.zeros(int(sizes.sum()), dtype=torch.long, device=device)
    if dist.get_rank() == 0:
        flat = torch.cat([chosen[name].to(device) for name in names]) if names else flat
    dist.broadcast(flat, src=0)
    pieces = torch.split(flat, sizes.tolist())
    return {name: piece.to(chosen[name].device) for name, piece in zip(names, pieces)}
