"""The inequality rows' part of the constrained step (:class:`InequalityRows`, a mixin of
:class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`): validating g and G, the working set
from the state, the stacked factorizations [J; G_rows], the active-set step
(:mod:`~lit_constrained.optim.active_set`), the corrections' measure and the diagnostics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .active_set import Inequalities, impose_inequalities
from .checks import prepared_constraint_inputs
from .corrections import evaluated_constraints
from .projection import Projection, Projector
from .step_inputs import StepInputs, state_violation


class InequalityRows:
    """Rows g <= 0 in the step of a :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`
    (whose workspaces, factorization and projector this mixin uses)."""

    accepts_inequalities: bool = False
    """Whether ``step`` takes ``inequalities=`` / ``inequality_jacobian=`` (rows g <= 0)."""

    def _inequality_inputs(self, inputs: StepInputs, inequalities: Tensor | None,
                           inequality_jacobian: Tensor | None) -> None:
        """Validate g and G and put them on ``inputs`` (their finiteness joins the step's host read)."""
        if inequalities is None and inequality_jacobian is None:
            self.active_set, self.inequality_multipliers = torch.zeros(0, dtype=torch.long), None
            inputs.state.pop("active_set", None)
            return
        owner = type(self).__name__
        if not self.accepts_inequalities:
            raise TypeError(
                f"{owner} takes no inequality rows (inequalities=); SQPAdam and SQPHeavyBall impose them."
            )
        n = inputs.layout.n
        g, G = prepared_constraint_inputs(
            f"{owner} (inequalities)", inequalities, inequality_jacobian, n, inputs.dtype, inputs.g.device,
            lambda p: self._buffer("inequality_jacobian", (p, n), inputs.dtype, inputs.g.device),
        )
        if not g.numel():
            self.active_set, self.inequality_multipliers = torch.zeros(0, dtype=torch.long), None
            inputs.state.pop("active_set", None)
            return
        if len({float(group["lr"]) for group in self.param_groups}) > 1:
            raise ValueError(
                f"{owner}: inequality rows need one lr in all param groups (the active-set step projects one "
                "tangential direction); the groups' lrs differ: give them one lr."
            )
        finite = torch.isfinite(g).all()  # (a NaN/inf in G shows in the active-set check's G delta)
        inputs.finite = finite if inputs.finite is None else inputs.finite & finite
        inputs.inequalities = Inequalities(g, G)
        working = inputs.state.get("active_set")
        inputs.warm = [] if working is None else [row for row in working.tolist() if row < g.numel()]

    def _violation(self, inputs: StepInputs) -> Tensor:
        """max(max |c|, max(g, 0)) (0-dim float64): the violation the tolerances are relative to."""
        violation = inputs.c.abs().max() if inputs.m else inputs.c.new_zeros(())
        if inputs.inequalities is not None:
            violation = torch.maximum(violation, inputs.inequalities.violation())
        return violation

    def _stacked(self, inputs: StepInputs, rows: list[int], with_gradient: bool = False
                 ) -> tuple[Projection, Projector]:
        """The projection and projector of [J; G_rows] (the step's factorization and refinement plan for
        those rows, made once a step; the exact-Gram memory of stacked rows kept apart from that of J).
        ``with_gradient``: the projection carries [J; G_rows] g from the Gram's pass (for P g)."""
        key = tuple(rows)
        if key in inputs.stacked:
            return inputs.stacked[key]
        J, G = inputs.jacobian, inputs.inequalities.jacobian
        m, n = J.shape
        slot = "stacked_jacobian_working" if rows == inputs.warm else "stacked_jacobian"
        stacked = self._buffer(slot, (m + len(rows), n), J.dtype, J.device)
        stacked[:m].copy_(J)
        torch.index_select(G, 0, torch.tensor(rows, dtype=torch.long, device=G.device), out=stacked[m:])
        equality_memory, self._exact_gram_for = self._exact_gram_for, self._stacked_exact_gram_for
        try:
            factor, finite, Jg = self._scaled_factorize(stacked, None, inputs.g if with_gradient else None)
            if Jg is not None:
                finite = finite & torch.isfinite(Jg).all()
            target = torch.zeros(m + len(rows), dtype=torch.float64, device=J.device)
            projection = Projection(stacked, factor, finite, target, gradient_product=Jg)
            stacked_inputs = StepInputs(inputs.layout, inputs.reals, inputs.dtype, inputs.g, target, stacked,
                                        inputs.state)
            projector = self._projector(projection, stacked_inputs, warn_dependent=False)
            self._stacked_exact_gram_for = self._exact_gram_for
        finally:
            self._exact_gram_for = equality_memory
        inputs.stacked[key] = projection, projector
        return projection, projector

    def _with_inequalities(self, projector: Projector, inputs: StepInputs, w: Tensor, a: float, sc: Tensor,
                           fraction: Tensor, delta: Tensor) -> tuple[Projector, list[int]]:
        """The step with the inequality rows into ``delta`` (:func:`~lit_constrained.optim.active_set.impose_inequalities`),
        warm-started from the last step's active set; returns the imposed rows' projector and the active rows."""
        warm = inputs.warm
        if not warm:
            projector.merged(w, a, sc, delta)
        result = impose_inequalities(
            equality_projector=projector, stacked_projector=lambda rows: self._stacked(inputs, rows)[1],
            sc=sc, inequalities=inputs.inequalities, t=fraction, w=w, a=a, warm=warm,
            rcond=float(self.param_groups[0]["rcond"]), delta=delta, equality_delta_formed=not warm,
            owner=type(self).__name__, gradient_multipliers=self._gradient_multipliers(inputs),
        )
        self.active_set = torch.tensor(result.active, dtype=torch.long)
        self.inequality_multipliers = result.multipliers
        inputs.state["active_set"] = torch.tensor(result.working, dtype=torch.long)
        return result.projector, result.active

    @staticmethod
    def _gradient_multipliers(inputs: StepInputs) -> Tensor | None:
        """The working rows' first-order multiplier estimates, the inequality part of
        :math:`-\\hat G^+ \\hat J \\nabla f` (no pass over J: [J; G_warm] g came with the Gram)."""
        projection = inputs.tangent_projection
        if projection is None or projection.gradient_product is None:
            return None
        return -projection.factor.solve(projection.gradient_product)[inputs.m:]

    def _record_inequalities(self, record: dict[str, Tensor], inputs: StepInputs) -> None:
        """``active`` (rows), ``dual_max`` (the largest inequality multiplier) and the violation of both
        kinds of rows (``violation_max``: max(max |c|, max(g, 0)) at the step's start)."""
        device = inputs.g.device
        record["active"] = torch.tensor(float(self.active_set.numel()), dtype=torch.float64, device=device)
        multipliers = self.inequality_multipliers
        record["dual_max"] = (multipliers.max() if multipliers is not None and multipliers.numel()
                              else torch.zeros((), dtype=torch.float64, device=device))
        record["inequality_violation"] = inputs.inequalities.violation()
        record["violation_max"] = self._violation(inputs)
        record["violation_ratio"] = record["violation_max"] / state_violation(inputs.state)

    @staticmethod
    def _inequality_measure(evaluate: Callable[[], Any], inputs: StepInputs, active: list[int]
                            ) -> Callable[[], tuple[Tensor, float]]:
        """The corrections' measure with inequality rows: the closure returns (c, g); the target is
        [c; g_A] (the imposed rows), the violation max(max |c|, max(g, 0)) over every row."""
        m, p = inputs.m, inputs.inequalities.p
        rows = torch.tensor(active, dtype=torch.long, device=inputs.c.device)

        def measure() -> tuple[Tensor, float]:
            values = evaluate()
            if not isinstance(values, (tuple, list)) or len(values) != 2:
                raise ValueError(
                    "constraint_closure must return the pair (c, g) when the step is given inequalities: c "
                    f"of shape ({m},), g of shape ({p},), at the updated parameters."
                )
            c = evaluated_constraints(lambda: values[0], m).to(torch.float64)
            g = evaluated_constraints(lambda: values[1], p).to(torch.float64)
            violation = max(float(c.abs().max()) if m else 0.0, float(g.max().clamp_min(0.0)))
            return torch.cat([c, g[rows]]), violation

        return measure
