r"""The base class of the hard-constrained optimizers: one step from (g, c, J) to x_{k+1}.

A subclass turns the flat gradient g (and its state) into a tangential direction w, expressed in the
variables of a "projection Jacobian" :math:`\tilde J` (J itself for the SQP methods; the scaled
:math:`J H^{-1/2}` for Adam(con), never formed: ``Projection.scaling``) with a map T back to x
(identity, or :math:`H^{-1/2}`), and this class
composes the step

.. math::
    \Delta x = T\big(\alpha\, \tilde P w - s\, \tilde J^+ c\big)
             = T\big(\alpha w - \tilde J^T z\big), \qquad z = \tilde G^+ (s c + \alpha \tilde J w),

with :math:`\tilde G = \tilde J \tilde J^T`, :math:`\tilde P` the projector on its null space and
:math:`s = \alpha\rho` the normal-step scale (the paper's normal step is :math:`v = -\rho \tilde J^+ c`,
:math:`d = v + \tilde P w`, :math:`x_{k+1} = x_k + \alpha d`). The normal and tangential parts share
their passes over J by linearity: J is read for the Gram matrix, for :math:`\tilde J w` and for
:math:`\tilde J^T z` (plus two reads per refinement step; :mod:`~lit_constrained.optim.linalg`).

``rho="full"`` (the default) takes :math:`s = 1` (:math:`\rho_k = 1/\alpha_k` at every step, so it
follows LR schedulers): the linearized constraint :math:`c + J \Delta x` is restored in one step
instead of shrinking by :math:`(1 - \alpha \rho)` per step. A numeric ``rho`` is the papers' method.
So ``lr = 0`` is not "no step": it removes the tangential (objective) step, but with ``rho="full"`` each
step still takes the full normal step, and with any rho the post-step corrections (``max_corrections``)
still pull max |c| down to ``constraint_tol``: the weights move onto the constraints (a feasibility
projection). Only a numeric rho with ``max_corrections=0`` leaves them unchanged at lr = 0 (the fit
warns: :class:`~lit_constrained.callbacks.health.RunHealth`).

**The normal-step safeguard** (``max_normal_step``, :mod:`~lit_constrained.optim.safeguard`). Far from
feasibility the linearization can be poor and a full normal step huge (a Darcy FNO's first full normal
step has norm ~730): ``"adaptive"`` (the default) is a trust radius on the full normal step, a number a
fixed cap relative to ||x||, ``None`` no cap.

**The kernel.** A subclass supplies its hyperparameters, its state and its tangential direction
(``_prepare``: factorize and flag non-finite inputs; ``_tangent``: update the state, return w; ``_to_x``
and ``_normal_direction`` for a scaled projection Jacobian); this class owns the flat layout
(:class:`~lit_constrained.optim.flat.FlatLayout`), the checks, the one host read (finiteness and the
refinement plan), the composition (:mod:`~lit_constrained.optim.projection`), the post-step corrections
(:mod:`~lit_constrained.optim.corrections`), the diagnostics (:mod:`~lit_constrained.optim.step_diagnostics`) and the
workspaces and Gram factor (:mod:`~lit_constrained.optim.step_factorization`).
The merged step is :class:`MergedStepOptimizer`'s ``_compose`` (SQP-HeavyBall, SQP-Adam, Adam(con)); an
optimizer whose step is not of that form subclasses :class:`ConstrainedOptimizer` with its own ``_compose``
(SQP-MoMo) and keeps the rest.

Hyperparameters follow torch.optim's conventions: every one is in ``defaults`` and hence in each param
group (``repr``, ``state_dict``/``load_state_dict`` and schedulers see them). ``rho``, ``rcond``,
``max_normal_step`` and ``precision`` define the one projection shared by all groups and must be equal in
all groups; the others (``lr``, momenta, ``eps``, ``h``) are honoured per group. When the groups' lrs
differ, the tangential part :math:`\mathrm{diag}(\alpha) t` is projected again on the null space of J,
so it still leaves the linearized constraints unchanged; the normal part is scaled per block as well
(``rho`` numeric) or not at all (``rho="full"``), so :math:`J \Delta x = -\alpha\rho c` holds exactly
only when all groups share one lr or with ``rho="full"``.

**Precision.** ``precision="native"`` (the default) keeps J, the momenta and every n-vector in the
parameters' dtype and uses float64 for the m x m algebra and the accumulations
(:mod:`~lit_constrained.optim.linalg`); ``precision="float64"`` (or float64 parameters) runs all of
it in float64, the reference. Buffers are allocated at the first step and reused.

Step diagnostics (rank, norms, violation, ...) are computed only when asked,
``step(..., diagnostics=True)``, into the plain attribute ``optimizer.diagnostics`` (0-dim tensors: no
host sync to produce them); ``optimizer.state`` holds only what resuming needs. A step with
``diagnostics=False`` reads one value on the host (the finiteness flag and the refinement plan together).
"""

from __future__ import annotations

import functools
import math
import warnings
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from lit_constrained.hints import no_constraints_given_hint

from .autocast import outside_autocast
from .linalg.blas_threads import host_blas_threads
from .checks import check_finite, check_lr, check_positive, check_shared_keys, prepared_constraint_inputs
from .corrections import hold_feasibility, max_violation
from .inequality_rows import InequalityRows
from .flat import FlatLayout, group_blocks, group_params
from .linalg.gram_factor import EIGH_MAX_SIZE, GramFactor
from .hyperparameters import (
    DEFAULT_CONSTRAINT_TOL,
    DEFAULT_LR,
    DEFAULT_MAX_CORRECTIONS,
    DEFAULT_MAX_NORMAL_STEP,
    DEFAULT_RHO,
    PROJECTION_DEFAULTS,
    SHARED_KEYS,
    STATE_KEY,
    MaxNormalStep,
    Precision,
    Rho,
    check_max_corrections,
    check_max_normal_step,
    check_precision,
    check_rho,
)
from .linalg.refinement import RefinementPlan, exact_refinements, refinement_counts
from .projection import Projection, Projector
from .safeguard import ADAPTIVE_NORMAL_STEP
from .step_diagnostics import record_step
from .step_factorization import StepFactorization
from .step_inputs import Composed, StepInputs

__all__ = [
    "ADAPTIVE_NORMAL_STEP", "DEFAULT_CONSTRAINT_TOL", "DEFAULT_LR", "DEFAULT_MAX_CORRECTIONS",
    "DEFAULT_MAX_NORMAL_STEP", "DEFAULT_RHO", "Composed", "ConstrainedOptimizer", "MaxNormalStep",
    "ParamsT", "Precision", "Projection", "Rho", "StepInputs",
]


def _with_host_blas_threads(step: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``step`` with NumPy/SciPy's BLAS held to torch's thread count where its m x m algebra is
    BLAS-sized: CPU constraints with m > ``EIGH_MAX_SIZE`` (the pivoted Cholesky factor;
    :mod:`~lit_constrained.optim.linalg.blas_threads`). Smaller m and device tensors skip the ~15 us limit."""

    @functools.wraps(step)
    def limited(*args: Any, **kwargs: Any) -> Any:
        c = kwargs.get("constraints")
        if c is None or c.device.type != "cpu" or c.numel() <= EIGH_MAX_SIZE:
            return step(*args, **kwargs)
        with host_blas_threads():
            return step(*args, **kwargs)

    return limited


class ConstrainedOptimizer(InequalityRows, StepFactorization, Optimizer, ABC):
    """Shared machinery: hyperparameters, input checks, the flat layout, rho / "full", the safeguard,
    the merged step, the corrections, diagnostics, state and workspaces."""

    requires = frozenset({"constraints", "jacobian"})
    warns_without_constraints: bool = True
    """Whether ``step()`` warns (once) when it is given nothing to impose (a plain LightningModule's
    automatic optimization passes no constraints); ConstrainedModule turns it off after its own warning."""
    shared_keys: tuple[str, ...] = SHARED_KEYS
    """Hyperparameters of the one projection: equal in all param groups."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        defaults = {**PROJECTION_DEFAULTS, **defaults}
        self._check_group(defaults)
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}
        self._rank_warned = False
        self._buffers: dict[str, Tensor] = {}
        self._view_cache: dict[str, Any] = {}
        self._exact_gram_for: tuple[tuple[int, ...], torch.dtype] | None = None
        """(shape, dtype) of the J whose last step needed the exact Gram (see ``_exact_gram_expected``)."""
        self._stacked_exact_gram_for: tuple[tuple[int, ...], torch.dtype] | None = None
        """The same for the stacked rows [J; G_A] of a step with active inequality rows."""
        self.active_set: Tensor = torch.zeros(0, dtype=torch.long)
        """The last step's active inequality rows (a sorted LongTensor; a diagnostic: the next step's working set is
        ``state["active_set"]``, which resumes with the state)."""
        self.inequality_multipliers: Tensor | None = None
        """The last step's inequality multipliers ((p,) float64, >= 0, 0 off the active set)."""
        self._check_groups()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("diagnostics", {})
        self.__dict__.setdefault("_rank_warned", False)
        self.__dict__.setdefault("_buffers", {})
        self.__dict__.setdefault("_view_cache", {})
        self.__dict__.setdefault("_exact_gram_for", None)
        self.__dict__.setdefault("_stacked_exact_gram_for", None)
        self.__dict__.setdefault("active_set", torch.zeros(0, dtype=torch.long))
        self.__dict__.setdefault("inequality_multipliers", None)

    # ------------------------------------------------------------------ hyperparameters
    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate one group's hyperparameters (subclasses extend it with their own)."""
        check_lr(group["lr"])
        check_rho(group["rho"])
        check_positive("rcond", group["rcond"])
        check_max_normal_step(group["max_normal_step"])
        check_precision(group["precision"])
        check_positive("constraint_tol", group["constraint_tol"])
        check_max_corrections(group["max_corrections"])

    def _check_groups(self) -> None:
        for group in self.param_groups:
            self._check_group(group)
        check_shared_keys(
            type(self).__name__, self.param_groups, self.shared_keys,
            "the one projection (the constraints couple the groups)",
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``; groups saved before a hyperparameter existed get its default (a
        checkpoint from before ``constraint_tol`` / ``max_corrections`` resumes with the corrections of
        today's defaults)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key in ("constraint_tol", "max_corrections"):
                group.setdefault(key, self.defaults[key])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "diagnostics"):  # after __init__: validate the new group at once
            self._check_groups()

    @property
    def rho(self) -> Rho:
        """The normal-step scale shared by all groups (``param_groups[i]["rho"]``)."""
        return self.param_groups[0]["rho"]

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        """The state at the first step (moments in ``dtype``)."""

    @abstractmethod
    def _prepare(self, g: Tensor, jacobian: Tensor, c: Tensor, state: dict[str, Any]) -> Projection:
        """Factorize the projection Jacobian (``_factorize``); flag non-finite inputs. No state change
        (``state["step"]`` is still k - 1)."""

    def _to_x(self, projection: Projection, step: Tensor) -> Tensor:
        """Map a step from the projection variables to x, in place (identity by default)."""
        return step

    def _diagnostic_factor(self, projection: Projection, jacobian: Tensor) -> GramFactor:
        """The factor of J J^T whose rank / smallest singular value the diagnostics report."""
        return projection.factor

    # ------------------------------------------------------------------ the param groups' blocks
    def _group_blocks(self) -> list[tuple[dict[str, Any], slice]]:
        """Each param group with its slice of the flat vector (cached while the groups' params stay)."""
        key = tuple(id(p) for group in self.param_groups for p in group["params"])
        cached = self._view_cache.get("group_blocks")
        if cached is not None and cached[0] == key and len(cached[1]) == len(self.param_groups) and all(
            a is b for a, (b, _) in zip(self.param_groups, cached[1])
        ):
            return cached[1]
        blocks = group_blocks(self.param_groups)
        self._view_cache["group_blocks"] = (key, blocks)
        return blocks

    # ------------------------------------------------------------------ the step
    @outside_autocast
    @torch.no_grad()
    @_with_host_blas_threads
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        constraints: Tensor | None = None,
        jacobian: Tensor | None = None,
        diagnostics: bool = False,
        constraint_closure: Callable[[], Any] | None = None,
        inequalities: Tensor | None = None,
        inequality_jacobian: Tensor | None = None,
    ) -> Any:
        """One step; g is read from ``p.grad``, c and J are given (J in the flat layout).

        Args:
            closure: optional, re-evaluates the model and returns the loss (called under grad mode).
            constraints: c, shape (m,); ``None`` for m = 0.
            jacobian: J, shape (m, n), columns in ``param_groups`` order (complex parameters as
                ``view_as_real``).
            diagnostics: fill ``self.diagnostics`` with this step's diagnostics (0-dim tensors); when
                False it is left empty (a stale value is never read as current).
            constraint_closure: optional, returns c (shape (m,)) at the current parameters, or the
                pair (c, g) when ``inequalities`` are given; given, the step is followed by at most
                ``max_corrections`` Gauss-Newton corrections toward max |c| <= tol
                (:mod:`~lit_constrained.optim.corrections`; with inequality rows on the rows E + A, and
                a correction that pushes an inactive row over its bound counts as a worse one, undone).
                It must return the same values on every data-parallel rank.
            inequalities: g, shape (p,), rows that must stay <= 0 (bounds are rows of g), on optimizers
                with ``accepts_inequalities`` (:mod:`~lit_constrained.optim.active_set`); ``None``: p = 0.
            inequality_jacobian: G, shape (p, n), the Jacobian of g (flat layout, like J).

        A NaN/inf in g, c or J raises ``ValueError`` before anything changes.
        """
        loss = self._call_closure(closure)
        self._check_groups()
        self.diagnostics = {}
        params = group_params(self.param_groups)
        if not params:
            return loss
        inputs = self._inputs(params, constraints, jacobian, loss)
        self._inequality_inputs(inputs, inequalities, inequality_jacobian)
        if self.warns_without_constraints and not inputs.m and inputs.inequalities is None:
            self.warns_without_constraints = False
            warnings.warn(no_constraints_given_hint(type(self).__name__), stacklevel=2)
        projection = self._prepare(inputs.g, inputs.jacobian, inputs.c, inputs.state)
        projector = self._projector(projection, inputs)  # raises on non-finite inputs: nothing changed yet
        if inputs.warm:  # the tangential moments on the null space of the rows E + the working set
            inputs.tangent_projection = self._stacked(inputs, inputs.warm, with_gradient=True)[0]
        state = inputs.state
        state["n"] = inputs.layout.n
        state["step"] = state["step"] + 1
        record: dict[str, Tensor] | None = {} if diagnostics else None
        composed = self._compose(projection, projector, inputs, record)
        inputs.layout.add_(inputs.reals, composed.delta)
        if "initial_violation" not in state:
            state["initial_violation"] = self._violation(inputs)
        rows = inputs.m + (inputs.inequalities.p if inputs.inequalities is not None else 0)
        if rows and constraint_closure is not None and self.param_groups[0]["max_corrections"]:
            self._correct(constraint_closure, projection, composed.imposed or projector, inputs, composed.delta,
                          record, composed.active)
        if record is not None:
            lr = float(self.param_groups[0]["lr"])
            record_step(record, state=state, factor=self._diagnostic_factor(projection, inputs.jacobian),
                        projector=projector, to_x=functools.partial(self._to_x, projection), c=inputs.c,
                        delta=composed.delta, scale=composed.scale, normal_norm=composed.normal_norm, lr=lr,
                        rho=self.rho)
            if inputs.inequalities is not None:
                self._record_inequalities(record, inputs)
            self.diagnostics = record
        return loss

    def _call_closure(self, closure: Callable[[], Any] | None) -> Any:
        """The closure's value (called under grad mode), or None."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _inputs(self, params: list[Tensor], constraints: Tensor | None, jacobian: Tensor | None,
                loss: Any) -> StepInputs:
        """g, c and J in the flat layout and working dtype, checked; the state (created at the first step)."""
        layout = FlatLayout.cached(self._view_cache, params)
        dtype = layout.working_dtype(self.param_groups[0]["precision"])
        device, n = params[0].device, layout.n
        g = layout.gather([p.grad for p in params], self._buffer("grad", (n,), dtype, device), "grad",
                          type(self).__name__)
        c, J = prepared_constraint_inputs(
            type(self).__name__, constraints, jacobian, n, dtype, device,
            lambda m: self._buffer("jacobian", (m, n), dtype, device),
        )
        state = self.state[STATE_KEY]
        if not state:
            state.update(self._init_state(n, device, dtype))
        elif state.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {state['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        else:
            for key, value in state.items():  # moments from a checkpoint of another precision: cast once
                if isinstance(value, Tensor) and value.dim() == 1 and value.dtype != dtype and value.is_floating_point():
                    state[key] = value.to(dtype)
        return StepInputs(layout, layout.reals(params), dtype, g, c, J, state, loss)

    def _projector(self, projection: Projection, inputs: StepInputs, warn_dependent: bool = True) -> Projector:
        """The one host read of the step: the inputs' finiteness, the refinement plan and the rank (a
        warning when the constraints are numerically dependent); raises before any change when a NaN/inf
        is found. The exact Gram replaces the blocked one where the plan asks for it."""
        g, c, J = inputs.g, inputs.c, inputs.jacobian
        m, n = J.shape
        finite = projection.finite & torch.isfinite(c).all()
        if inputs.finite is not None:
            finite = finite & inputs.finite
        if m == 0:
            finite = finite & torch.isfinite(torch.dot(g, g))
            if not bool(finite):
                self._raise_nonfinite(inputs)
            return Projector(J, projection.factor, RefinementPlan(0, False))
        factor = projection.factor
        read = torch.cat([  # (all on the factor's device: one transfer)
            finite.reshape(1).to(torch.float64),
            refinement_counts(factor, n, inputs.dtype),
            factor.rank.reshape(1).to(torch.float64),
            factor.condition.reshape(1).to(torch.float64),
        ]).tolist()
        if not read[0]:
            self._raise_nonfinite(inputs)
        if warn_dependent:
            self._warn_if_dependent(int(read[3]), m, n, read[4])
        plan = RefinementPlan.decode((read[1], read[2]), m)  # (of the blocked Gram, at this conditioning)
        if projection.scaling is None:  # remember for the next step whether the blocked Gram suffices
            self._exact_gram_for = (tuple(J.shape), J.dtype) if plan.exact_gram else None
        if plan.exact_gram or factor.exact:
            if not factor.exact:
                projection.factor = self._exact_factor(J, projection.scaling)
            plan = RefinementPlan(exact_refinements(projection.factor, inputs.dtype), True)
        scaling = self._scaling(projection)
        exact = bool(plan.steps) and plan.exact_residual
        return Projector(J, projection.factor, plan, scaling,
                         self._exact_workspace(J) if exact else None,
                         self._vector("correction", g) if exact and scaling is None else None)

    @abstractmethod
    def _compose(self, projection: Projection, projector: Projector, inputs: StepInputs,
                 record: dict[str, Tensor] | None) -> Composed:
        """Update the state and form Delta x (in x) from the step's projector; :class:`MergedStepOptimizer`
        composes the merged step from a tangential direction, SQP-MoMo its own."""

    def _correct(self, evaluate: Callable[[], Any], projection: Projection, projector: Projector,
                 inputs: StepInputs, delta: Tensor, record: dict[str, Tensor] | None,
                 active: list[int] | None = None) -> None:
        """The post-step corrections (:func:`~lit_constrained.optim.corrections.hold_feasibility`) on the
        rows the step imposed (``projector``: J, or [J; G_A] with ``active`` inequality rows). None
        follows a step whose normal step the safeguard capped (far from feasibility the linearization is
        not trusted, and an uncapped Gauss-Newton correction would take the step the cap refused).
        Diagnostics: ``corrections`` (taken), ``step_fraction`` (tau) and ``corrected_violation`` (the
        violation after them; an evaluation of its own on diagnostic steps where none was made last)."""
        state, group = inputs.state, self.param_groups[0]
        capped = state.get("normal_step_capped")
        taken, fraction, violation = 0, 1.0, math.nan
        measure = None if inputs.inequalities is None else self._inequality_measure(evaluate, inputs, active or [])
        if capped is None or not bool(capped):
            tol = float(group["constraint_tol"]) * max(float(state["initial_violation"]), 1.0)
            result = hold_feasibility(
                evaluate, projector, functools.partial(self._to_x, projection),
                lambda step: inputs.layout.add_(inputs.reals, step), delta, tol, float(self._violation(inputs)),
                int(group["max_corrections"]), lambda name: self._vector(name, delta), measure,
            )
            taken, fraction, violation = result.taken, result.step_fraction, result.violation
        if record is not None:
            if math.isnan(violation):
                violation = max_violation(evaluate, inputs.m) if measure is None else measure()[1]
            as_tensor = functools.partial(torch.tensor, dtype=torch.float64, device=delta.device)
            record["corrections"] = as_tensor(float(taken))
            record["step_fraction"] = as_tensor(fraction)
            record["corrected_violation"] = as_tensor(violation)

    def _warn_if_dependent(self, rank: int, m: int, n: int, condition: float) -> None:
        """One warning per optimizer when the imposed constraints are numerically dependent (rank < m):
        duplicate points, or more points than the network can satisfy (m > n among them)."""
        if rank >= m or self._rank_warned:
            return
        self._rank_warned = True
        why = (f"there are more constraints than parameters (m = {m} > n = {n}): at most n can hold"
               if m > n else "duplicate or redundant points, or more points than the network can satisfy")
        warnings.warn(
            f"{type(self).__name__}: the m = {m} imposed constraints have numerical rank {rank} (singular values "
            f"of J below rcond = {self.param_groups[0]['rcond']:g} x the largest are dropped; cond(J J^T) of the "
            f"kept part {condition:.2g}): {m - rank} are dependent on the others ({why}). The step imposes "
            "their least-squares solution (the minimum-norm Gauss-Newton step), so not every constraint can "
            "reach 0: impose fewer or independent points, or use a larger network. The rank is logged as "
            # stacklevel: the caller of optimizer.step (above torch's hook wrapper and the three decorators)
            "optim/rank.", RuntimeWarning, stacklevel=8,
        )

    def _raise_nonfinite(self, inputs: StepInputs) -> None:
        """The failure path (syncs are fine here): name what is not finite."""
        check_finite("The constraints c", inputs.c)
        check_finite("The jacobian J", inputs.jacobian)
        check_finite("The objective gradient g", inputs.g)
        raise ValueError(
            "The step is not finite (an overflow in the projection); the step was not taken. "
            "Check the loss/constraints at this point (a diverging run or a bad batch)."
        )
