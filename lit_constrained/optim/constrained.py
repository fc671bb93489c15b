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

**A functional core under a thin class** (torch.optim's ``torch.optim.adam.adam`` under ``Adam``). The step
itself is a function over flat tensors (:mod:`~lit_constrained.optim.functional`: ``sqp_heavy_ball``,
``sqp_adam``, ``adam_con``; SQP-MoMo's in :mod:`~lit_constrained.optim.experimental.sqp_momo_step`), on the
shared pieces of :mod:`~lit_constrained.optim.kernel` (the one host read, stacked rows, the corrections).
This class only gathers g, c, J (and the inequality rows) into the flat layout
(:class:`~lit_constrained.optim.flat.FlatLayout`), checks them, calls the subclass's function
(``_step_function``) with the param groups, adds the step to the parameters, runs the post-step corrections
and keeps ``state["flat"]`` (the one state entry of every optimizer of the package) and its
:class:`~lit_constrained.optim.workspace.Workspace` (scratch, by composition).

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
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from lit_constrained.hints import no_constraints_given_hint

from .autocast import outside_autocast
from .checks import check_lr, check_positive, check_shared_keys, prepared_constraint_inputs
from .flat import FlatLayout, group_blocks, group_params
from .functional import ProjectedStep
from .hyperparameters import (
    DEFAULT_CONSTRAINT_TOL,
    DEFAULT_LR,
    DEFAULT_MAX_CORRECTIONS,
    DEFAULT_MAX_NORMAL_STEP,
    DEFAULT_RHO,
    PROJECTION_DEFAULTS,
    SHARED_KEYS,
    MaxNormalStep,
    Precision,
    Rho,
    check_max_corrections,
    check_max_normal_step,
    check_precision,
    check_rho,
)
from .kernel import Block, Rows, correct
from .linalg.blas_threads import host_blas_threads
from .linalg.gram_factor import EIGH_MAX_SIZE
from .projection import Projection
from .safeguard import ADAPTIVE_NORMAL_STEP
from .state import (
    STATE_KEY,
    ViewCache,
    gather_flat_state,
    restore_parameter_entries,
    saved_parameter_entries,
    scatter_flat_state,
    split_flat_state,
)
from .workspace import Workspace

__all__ = [
    "ADAPTIVE_NORMAL_STEP", "DEFAULT_CONSTRAINT_TOL", "DEFAULT_LR", "DEFAULT_MAX_CORRECTIONS",
    "DEFAULT_MAX_NORMAL_STEP", "DEFAULT_RHO", "ConstrainedOptimizer", "FlatInputs", "MaxNormalStep",
    "ParamsT", "Precision", "Projection", "Rho",
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


@dataclass(frozen=True)
class FlatInputs:
    """What :meth:`ConstrainedOptimizer.step` gathered (built once, never changed): the layout, the
    parameters' real views, g, c, J, the inequality rows (g, G; None for p = 0) and the working set, and
    the closure's value."""

    layout: FlatLayout
    reals: list[Tensor]
    g: Tensor
    c: Tensor
    jacobian: Tensor
    inequalities: Tensor | None
    inequality_jacobian: Tensor | None
    warm: tuple[int, ...]
    loss: Any


class ConstrainedOptimizer(Optimizer, ABC):
    """The class under a step function: hyperparameters, input checks, the flat layout, the state (the
    package's convention, :mod:`~lit_constrained.optim.state`: per parameter the views of the flat vectors
    ``vector_keys``, and ``state["global"]``), the post-step corrections and the diagnostics; a subclass
    gives its state at the first step (``_init_state``) and calls its function (``_step_function``)."""

    requires = frozenset({"constraints", "jacobian"})
    accepts_inequalities: bool = False
    """Whether ``step`` takes ``inequalities=`` / ``inequality_jacobian=`` (rows g <= 0)."""
    warns_without_constraints: bool = True
    """Whether ``step()`` warns (once) when it is given nothing to impose (a plain LightningModule's
    automatic optimization passes no constraints); ConstrainedModule turns it off after its own warning."""
    shared_keys: tuple[str, ...] = SHARED_KEYS
    """Hyperparameters of the one projection: equal in all param groups."""
    vector_keys: tuple[str, ...] = ()
    """The state's n-vectors (the moments): kept flat, each parameter's entry holds views of them."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        defaults = {**PROJECTION_DEFAULTS, **defaults}
        self._check_group(defaults)
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}
        self._workspace = Workspace()
        self._check_groups()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("diagnostics", {})
        self.__dict__.setdefault("_workspace", Workspace())

    @property
    def active_set(self) -> Tensor:
        """The last step's active inequality rows (a sorted LongTensor, ``state["global"]["active_rows"]``;
        empty without inequality rows). The next step's working set is ``state["global"]["active_set"]``."""
        rows = self.state.get(STATE_KEY, {}).get("active_rows")
        return torch.zeros(0, dtype=torch.long) if rows is None else rows

    @property
    def inequality_multipliers(self) -> Tensor | None:
        """The last step's inequality multipliers ((p,) float64, >= 0, 0 off the active set;
        ``state["global"]["inequality_multipliers"]``), None without inequality rows."""
        return self.state.get(STATE_KEY, {}).get("inequality_multipliers")

    def _vector_keys(self) -> tuple[str, ...]:
        """The state's n-vectors (:attr:`vector_keys`)."""
        return self.vector_keys

    def _view_cache(self) -> ViewCache:
        """The per-parameter views of the state's flat vectors (scratch: rebuilt from the state when empty)."""
        return self._workspace.cache.setdefault("state_views", {})  # type: ignore[return-value]

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
        """torch's ``load_state_dict``, with the per-parameter entries kept as saved (torch would cast them to
        each parameter's dtype; ``precision="float64"`` keeps float64 moments of float32 parameters) and a
        checkpoint of the earlier layout (one ``state["flat"]`` entry) split into today's
        (:func:`~lit_constrained.optim.state.split_flat_state`); groups saved before a hyperparameter existed
        get its default (a checkpoint from before ``constraint_tol`` / ``max_corrections`` resumes with the
        corrections of today's defaults)."""
        params = group_params(self.param_groups)
        state_dict = split_flat_state(state_dict, params, self._vector_keys(), type(self).__name__)
        entries = saved_parameter_entries(state_dict, params)
        super().load_state_dict(state_dict)
        restore_parameter_entries(self.state, entries)
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
    def _step_function(self, inputs: FlatInputs, state: dict[str, Any], diagnostics: bool) -> ProjectedStep:
        """Call the optimizer's step function (:mod:`~lit_constrained.optim.functional`) on the gathered
        inputs with ``self._group_blocks()`` and ``self._workspace``."""

    # ------------------------------------------------------------------ the param groups' blocks
    def _group_blocks(self) -> list[Block]:
        """Each param group with its slice of the flat vector (cached while the groups' params stay)."""
        key = tuple(id(p) for group in self.param_groups for p in group["params"])
        cache = self._workspace.cache
        cached = cache.get("group_blocks")
        if cached is not None and cached[0] == key and len(cached[1]) == len(self.param_groups) and all(
            a is b for a, (b, _) in zip(self.param_groups, cached[1])
        ):
            return cached[1]
        blocks = group_blocks(self.param_groups)
        cache["group_blocks"] = (key, blocks)
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
        inputs = self._gather(params, constraints, jacobian, inequalities, inequality_jacobian, loss)
        if self.warns_without_constraints and not inputs.c.numel() and inputs.inequalities is None:
            self.warns_without_constraints = False
            warnings.warn(no_constraints_given_hint(type(self).__name__), stacklevel=2)
        previous, gathered = self._state(params, inputs)
        result = self._step_function(inputs, previous, diagnostics)
        m, n = inputs.jacobian.shape
        if inputs.inequalities is not None:
            result.state["active_rows"] = torch.tensor(result.active, dtype=torch.long)
            result.state["inequality_multipliers"] = result.multipliers
        self._warn_if_dependent(result.state, result.rank, m, n, result.condition)
        scatter_flat_state(self.state, params, result.state, self._vector_keys(), self._view_cache(),
                           previous if gathered else None)
        inputs.layout.add_(inputs.reals, result.delta)
        record = result.diagnostics
        rows = m + (inputs.inequalities.numel() if inputs.inequalities is not None else 0)
        if rows and constraint_closure is not None and self.param_groups[0]["max_corrections"]:
            self._correct(constraint_closure, result, inputs)
        if record is not None:
            self.diagnostics = record
        return loss

    def _correct(self, evaluate: Callable[[], Any], result: ProjectedStep, inputs: FlatInputs) -> None:
        """The post-step corrections (:func:`~lit_constrained.optim.kernel.correct`) on the rows the step
        imposed, applied to the parameters; their diagnostics join the step's."""
        first = self.param_groups[0]
        correct(evaluate, projection=result.projection, projector=result.imposed, rows=self._rows(inputs),
                state=result.state, delta=result.delta, apply=lambda step: inputs.layout.add_(inputs.reals, step),
                workspace=self._workspace, constraint_tol=first["constraint_tol"],
                max_corrections=first["max_corrections"], record=result.diagnostics, active=result.active)

    def _rows(self, inputs: FlatInputs) -> Rows:
        """The step's rows for the corrections (their violation and measure)."""
        from .active_set import Inequalities

        if inputs.inequalities is None:
            return Rows(inputs.g, inputs.c, inputs.jacobian)
        return Rows(inputs.g, inputs.c, inputs.jacobian, Inequalities(inputs.inequalities, inputs.inequality_jacobian),
                    inputs.warm)

    def _call_closure(self, closure: Callable[[], Any] | None) -> Any:
        """The closure's value (called under grad mode), or None."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def _gather(self, params: list[Tensor], constraints: Tensor | None, jacobian: Tensor | None,
                inequalities: Tensor | None, inequality_jacobian: Tensor | None, loss: Any) -> FlatInputs:
        """g, c and J (and g, G of the inequality rows) in the flat layout and working dtype, checked."""
        workspace = self._workspace
        layout = FlatLayout.cached(workspace.cache, params)
        dtype = layout.working_dtype(self.param_groups[0]["precision"])
        device, n = params[0].device, layout.n
        owner = type(self).__name__
        g = layout.gather([p.grad for p in params], workspace.buffer("grad", (n,), dtype, device), "grad", owner)
        c, J = prepared_constraint_inputs(owner, constraints, jacobian, n, dtype, device,
                                          lambda m: workspace.buffer("jacobian", (m, n), dtype, device))
        q = Q = None
        warm: tuple[int, ...] = ()
        if inequalities is not None or inequality_jacobian is not None:
            if not self.accepts_inequalities:
                raise TypeError(
                    f"{owner} takes no inequality rows (inequalities=); SQPAdam and SQPHeavyBall impose them."
                )
            q, Q = prepared_constraint_inputs(
                f"{owner} (inequalities)", inequalities, inequality_jacobian, n, dtype, device,
                lambda p: workspace.buffer("inequality_jacobian", (p, n), dtype, device),
            )
            if not q.numel():
                q = Q = None
            elif len({float(group["lr"]) for group in self.param_groups}) > 1:
                raise ValueError(
                    f"{owner}: inequality rows need one lr in all param groups (the active-set step projects one "
                    "tangential direction); the groups' lrs differ: give them one lr."
                )
        state = self.state[STATE_KEY]
        if q is None:
            for key in ("active_set", "active_rows", "inequality_multipliers"):
                state.pop(key, None)
        else:
            working = state.get("active_set")
            warm = () if working is None else tuple(row for row in working.tolist() if row < q.numel())
        return FlatInputs(layout, layout.reals(params), g, c, J, q, Q, warm, loss)

    def _state(self, params: list[Tensor], inputs: FlatInputs) -> tuple[dict[str, Any], bool]:
        """The step's flat state (:func:`~lit_constrained.optim.state.gather_flat_state`: created at the first
        step; moments from a checkpoint of another precision cast once) and whether it was gathered from the
        parameters' entries (False at the first step: they have none yet)."""
        g, n = inputs.g, inputs.layout.n
        shared = self.state[STATE_KEY]
        if not shared:
            return self._init_state(n, g.device, g.dtype), False
        if shared.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {shared['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        state = gather_flat_state(self.state, params, self._vector_keys(), self._view_cache())
        for key in self._vector_keys():
            value = state[key]
            if value.dtype != g.dtype or value.device != g.device:
                state[key] = value.to(device=g.device, dtype=g.dtype)
        return state, True

    def _warn_if_dependent(self, state: dict[str, Any], rank: int, m: int, n: int, condition: float) -> None:
        """One warning per optimizer (``state["global"]["rank_warned"]``: a resumed run does not repeat it)
        when the imposed constraints are numerically dependent (rank < m): duplicate points, or more points
        than the network can satisfy (m > n among them)."""
        if rank >= m or state.get("rank_warned", False):
            return
        state["rank_warned"] = True
        why = (f"there are more constraints than parameters (m = {m} > n = {n}): at most n can hold"
               if m > n else "duplicate or redundant points, or more points than the network can satisfy")
        warnings.warn(
            f"{type(self).__name__}: the m = {m} imposed constraints have numerical rank {rank} (singular values "
            f"of J below rcond = {self.param_groups[0]['rcond']:g} x the largest are dropped; cond(J J^T) of the "
            f"kept part {condition:.2g}): {m - rank} are dependent on the others ({why}). The step imposes "
            "their least-squares solution (the minimum-norm Gauss-Newton step), so not every constraint can "
            "reach 0: impose fewer or independent points, or use a larger network. The rank is logged as "
            # stacklevel: the caller of optimizer.step (above torch's hook wrapper and the three decorators)
            "optim/rank.", RuntimeWarning, stacklevel=7,
        )
