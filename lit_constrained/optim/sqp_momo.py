r"""SQP-MoMo and SQP-MoMo-Adam: hard constraints with MoMo's self-adapting (Polyak-type) step size.

MoMo (Schaipp et al., arXiv 2305.07583; :mod:`~lit_constrained.optim.momo`) takes the proximal step of a
truncated model of the loss built from momentum averages; the projected SQP methods
(:mod:`~lit_constrained.optim.sqp`) split the step into a normal part that restores the linearized
constraints and a tangential part in the null space of the Jacobian. SQP-MoMo solves MoMo's proximal
subproblem restricted to the linearized constraints; the result is again closed form.

**The derivation (Euclidean prox, SQP-MoMo).** At :math:`x_k`, with the momentum averages of MoMo
(:math:`\beta` = ``momentum``)

.. math::
    \bar f_k = (1-\beta) f_k + \beta \bar f_{k-1}, \quad
    d_k = (1-\beta) g_k + \beta d_{k-1}, \quad
    \gamma_k = (1-\beta) \langle g_k, x_k\rangle + \beta\gamma_{k-1}, \quad
    h_k = \bar f_k + \langle d_k, x_k\rangle - \gamma_k,

MoMo's model of the loss is :math:`m_k(y) = \max\{\rho_k^{-1}(h_k + \langle d_k, y - x_k\rangle), f^*_k\}`
(:math:`\rho_k = 1`, or :math:`1-\beta^k` with bias correction). SQP-MoMo takes

.. math::
    x_{k+1} = \arg\min_y\ m_k(y) + \tfrac{1}{2\alpha_k}\|y - x_k\|^2
    \quad\text{subject to}\quad J_k (y - x_k) = J_k n_k,

with :math:`n_k = -s_k J_k^+ c_k` the package's normal step (:math:`s_k = 1` for ``rho="full"``,
:math:`s_k = \alpha_k\rho` for a numeric rho). :math:`n_k` lies in the range of :math:`J_k^T`, so every
feasible y is :math:`y = x_k + n_k + z` with :math:`z \in \mathrm{null}(J_k)`, and then

.. math::
    \|y - x_k\|^2 = \|n_k\|^2 + \|z\|^2, \qquad
    \langle d_k, y - x_k\rangle = \langle d_k, n_k\rangle + \langle P_k d_k, z\rangle

(:math:`P_k` the orthogonal projector on :math:`\mathrm{null}(J_k)`; :math:`\langle d, z\rangle =
\langle P d, z\rangle` for :math:`z = P z`). Up to the constant :math:`\|n_k\|^2/(2\alpha_k)` the
subproblem in z is MoMo's unconstrained one (its Lemma B.1, over the subspace :math:`\mathrm{null}(J_k)`,
where :math:`P_k d_k` is the slope) with the constant :math:`h_k + \langle d_k, n_k\rangle` in place of
:math:`h_k`. Its solution :math:`z = -\tau_k P_k d_k` gives

.. math::
    x_{k+1} = x_k + n_k - \tau_k P_k d_k, \qquad
    \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
        \frac{(h_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}{\|P_k d_k\|^2}\Big\}

(:math:`\tau_k = 0` when :math:`P_k d_k = 0`). The user lr :math:`\alpha_k` caps the adaptive term
:math:`\zeta_k` (the fraction); with a small lr the cap is active and the step is the projected
heavy-ball step :math:`x_k + n_k - \alpha_k P_k d_k` with MoMo's dampened momentum.

**The Adam flavour (SQP-MoMo-Adam).** MoMo-Adam's prox is in the norm of Adam's preconditioner
:math:`D_k = \mathrm{diag}(\epsilon + \sqrt{v_k/(1-\beta_2^k)})` (:math:`v_k` the second moment of the raw
gradients, eps outside the root, as :class:`~lit_constrained.optim.momo.MoMoAdam`):
:math:`\min_y m_k(y) + \frac{1}{2\alpha_k}\|y - x_k\|^2_{D_k}` subject to the same linearized constraint.
For the cross term to vanish the normal step must be :math:`D_k`-orthogonal to :math:`\mathrm{null}(J_k)`:
the :math:`D`-minimum-norm normal step

.. math::
    n_k = -s_k D_k^{-1} J_k^T (J_k D_k^{-1} J_k^T)^+ c_k

(the normal part of Adam(con)'s KKT system with :math:`H = D_k`). Then :math:`\|n_k + z\|_D^2 =
\|n_k\|_D^2 + \|z\|_D^2` for every :math:`z \in \mathrm{null}(J_k)`, and in the variable
:math:`u = D_k^{1/2} z \in \mathrm{null}(\tilde J_k)`, :math:`\tilde J_k = J_k D_k^{-1/2}`, the
subproblem is once more Lemma B.1 with slope :math:`\tilde P_k D_k^{-1/2} d_k` (:math:`\tilde P_k` the
orthogonal projector on :math:`\mathrm{null}(\tilde J_k)`):

.. math::
    x_{k+1} = x_k + n_k - \tau_k P^D_k D_k^{-1} d_k, \qquad
    \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
        \frac{(h_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}{\|\tilde P_k D_k^{-1/2} d_k\|^2}\Big\},

with :math:`\rho_k = 1 - \beta_1^k` and :math:`P^D_k = D_k^{-1/2}\tilde P_k D_k^{1/2} = I - D_k^{-1}J_k^T
(J_k D_k^{-1} J_k^T)^+ J_k` the :math:`D_k`-orthogonal projector on :math:`\mathrm{null}(J_k)` (the one
Adam(con)'s KKT system applies); :math:`\|\tilde P_k D_k^{-1/2} d_k\|^2 = \|P^D_k D_k^{-1} d_k\|^2_{D_k}`.
This is the exact D-norm prox, no approximation: the step is computed in the scaled variable with a
rank-revealing factorization of :math:`\tilde J_k` and mapped back by :math:`D_k^{-1/2}`.

**SQP-Adam's geometry (SQP-MoMo-Adam with** ``geometry="euclidean"``). The D-norm prox above inherits
Adam(con)'s D-orthogonal projector, which in the lr sweeps (docs/sqp_momo.md) trains far slower than
SQP-Adam's Euclidean projection of Adam's direction. This option keeps SQP-Adam's geometry and still
solves a proximal subproblem exactly, in another metric. The normal step and projector are Euclidean,
:math:`n_k = -s_k J_k^+ c_k`, :math:`P_k = I - J_k^+ J_k`; :math:`\hat D_k = \mathrm{diag}(\epsilon +
\sqrt{\hat v_k/(1-\beta_2^k)})` with :math:`\hat v_k` the second moment of the projected gradients
:math:`P_k g_k` (as SQP-Adam's); the prox term is :math:`\frac{1}{2\alpha_k}\|y - x_k\|^2_{M_k}` with

.. math::
    M_k = (I - P_k) + (P_k \hat D_k^{-1} P_k)^+ .

:math:`n_k \in \mathrm{range}(I - P_k)` and :math:`(P\hat D^{-1}P)^+` vanishes there, so
:math:`\|n_k + z\|^2_{M_k} = \|n_k\|^2 + z^T (P_k\hat D_k^{-1}P_k)^+ z` without cross term. With Z an
orthonormal basis of :math:`\mathrm{null}(J_k)` and z = Z u the subproblem is Lemma B.1 in u with the metric
:math:`B = (Z^T\hat D^{-1}Z)^{-1}`, so :math:`u = -\tau B^{-1}Z^T d` and

.. math::
    x_{k+1} = x_k + n_k - \tau_k P_k \hat D_k^{-1} P_k d_k, \qquad
    \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
        \frac{(h_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}{\|\hat D_k^{-1/2} P_k d_k\|^2}\Big\}.

This is exact (no approximation) for the metric :math:`M_k`; it is not the D-norm prox. On
:math:`\mathrm{null}(J_k)` the D-norm prox uses :math:`Z^T D Z`, this one :math:`(Z^T\hat D^{-1}Z)^{-1}
\preceq Z^T\hat D Z` (Schur complement of :math:`[[Z^TDZ, I], [I, Z^TD^{-1}Z]] \succeq 0`), equal for the same
D only when :math:`\mathrm{null}(J_k)` is D-invariant (D = cI, or J's rows supported where D is constant);
and :math:`\hat D` is of the projected, not the raw, gradients. The direction :math:`P\hat D^{-1}Pd` is
SQP-Adam's :math:`P\hat D^{-1}r` with r (the momentum of the projected gradients) replaced by
:math:`P_k d_k` (MoMo's momentum of the raw gradients, projected on today's null space), the same for a
constant J; the model's constant :math:`h_k` needs the raw d. Cost: the projections of g and d and of
:math:`\hat D^{-1}Pd` (three, two passes over J each) and :math:`J^+c`. The state keys are the same
(``exp_avg_sq`` then holds :math:`\hat v`); ``geometry`` is shared by all groups.

With m = 0 (no constraints) both reduce to MoMo / MoMo-Adam without weight decay (:math:`n_k = 0`,
:math:`P_k = I`).

**The online lower bound** (``estimate_lower_bound=True``, MoMo's Algorithms 3, 4) carries over with the
projected quantities: the model's constant :math:`h_k` becomes :math:`h_k + \langle d_k, n_k\rangle` (the
value of the linear model on the linearized feasible set at :math:`z = 0`) and the slope norm
:math:`\|d_k\|^2_{D^{-1}}` becomes :math:`\|P_k d_k\|^2` (:math:`\|\tilde P_k D_k^{-1/2} d_k\|^2`; in the
Euclidean geometry :math:`\|\hat D_k^{-1/2} P_k d_k\|^2`):

.. math::
    \text{ResetStar: if } \rho_k f^*_k \ge h_k + \langle d_k, n_k\rangle:\
        f^*_k \leftarrow \max\Big\{\frac{h_k + \langle d_k, n_k\rangle}{2\rho_k}, f^*_1\Big\}, \qquad
    \text{EstimateStar: } f^*_{k+1} = \max\Big\{\frac{h_k + \langle d_k, n_k\rangle
        - \tfrac12\tau_k\|P_k d_k\|^2}{\rho_k}, f^*_1\Big\},

:math:`f^*_1` the user's ``lower_bound`` (also the floor). With m = 0 these are MoMo's rules.

**Param groups.** :math:`\bar f, \gamma, d` describe the one loss, so ``momentum``/``betas``,
``lower_bound``, ``estimate_lower_bound``, ``bias_correction`` and the projection's ``rho``, ``rcond``,
``max_normal_step``, ``precision`` are shared (a ``ValueError`` names a key that differs). Each group i
gets :math:`\tau_i = \min\{\alpha_i/\rho_k, \zeta_k\}` from its own lr (as MoMo); when the lrs differ the
tangential step :math:`-\mathrm{diag}(\tau_i) P_k d_k` is projected on :math:`\mathrm{null}(J_k)` again
(:math:`\tilde P_k` in the scaled variable), so :math:`J_k \Delta x = J_k n_k` still holds. ``eps``
(SQP-MoMo-Adam) is per group. A numeric ``rho`` scales the normal step by the lr of group 0.

**Why this is not a** :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer` **subclass.** That
base class composes :math:`\Delta x = T(\alpha \tilde P w - s \tilde J^+ c)` with the lr a Python float
from ``param_groups`` and asks its subclasses for w before it computes the (safeguarded) normal step;
MoMo's :math:`\tau_k` is a device scalar that depends on that normal step
(:math:`\langle d_k, n_k\rangle`), on :math:`\|P_k d_k\|^2` and on the loss. So the step is composed here,
from the same factorization (:class:`~lit_constrained.optim.nullspace.NullSpace`: rank-revealing,
float64 m x m algebra, iterative refinement) and the same flat layout and checks.

**Cost.** Per step: one factorization of :math:`J J^T` (:math:`\tilde J \tilde J^T`), :math:`P d` (two
passes over J) and :math:`J^+ c` (one pass): one pass more than SQP-HeavyBall's merged step, for the exact
:math:`\|P d\|^2` (from the explicit projection, not the cancellation-prone
:math:`\|d\|^2 - (Jd)^T G^+ (Jd)`).

**Normal-step safeguard.** ``max_normal_step``: ``None`` (the default: the full normal step) or a number
r that caps :math:`\|n_k\| \le r\,\|x_k\|` (the step is then still exact for the capped normal step).
The adaptive trust radius of the other constrained optimizers is not offered here.

torch.optim conventions: every hyperparameter in ``defaults`` and each group; ``step(closure, *,
constraints=None, jacobian=None, diagnostics=False)``, the closure returns the (already back-propagated)
loss, g is read from ``p.grad`` (a parameter without grad takes part with g = 0: the projection needs all
of x); c has shape (m,), J shape (m, n) in the flat layout (:mod:`~lit_constrained.optim.flat`).
``optimizer.diagnostics`` (0-dim tensors, only on steps called with ``diagnostics=True``): ``tau``
(``tau/group<i>`` with several groups), ``zeta``, ``lower_bound_used``, ``normal_inner_product``
(:math:`\langle d_k, n_k\rangle`), ``projected_direction_norm`` (:math:`\|P_k d_k\|`), ``rank``,
``step_norm``, ``normal_step_norm``, ``violation_max``, ``linearized_feasibility_error``
(:math:`\|J\Delta x - J n\| / \|J n\|`). ``optimizer.state["flat"]`` holds what resuming needs: ``step``,
the moments (n-vectors in the working dtype), ``loss_avg``, ``gamma`` and ``lower_bound`` (the current
:math:`f^*` estimate; 0-dim float64), which :class:`~lit_constrained.callbacks.step_size.StepSizeMonitor` logs with
``tau`` and ``zeta``. In data-parallel training the package's stepper passes the rank-mean loss and the
gathered c and J to every rank, so all replicas take the same step.

A non-finite loss, gradient, c or J raises ``ValueError`` before anything changes (one host sync, plus
one in the factorization's refinement decision).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal, Union

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import ParamsT

from .autocast import outside_autocast
from .checks import (
    check_beta, check_betas, check_constraint_inputs, check_finite, check_lr, check_positive, check_shared_keys,
    loss_from_closure,
)
from .flat import block_sizes, group_params, real_view
from .nullspace import DEFAULT_RCOND, NullSpace

Rho = Union[float, Literal["full"]]
Precision = Literal["native", "float64"]
Geometry = Literal["adam", "euclidean"]

STATE_KEY = "flat"
"""The ``optimizer.state`` key of the flat state (as the other constrained optimizers)."""


def _check_rho(rho: Rho) -> None:
    if rho == "full":
        return
    if isinstance(rho, (str, bool)) or not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"Invalid rho={rho!r}: a number > 0, or 'full' for the full normal step (rho_k = 1/lr_k).")


def _check_cap(value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, (str, bool)) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"Invalid max_normal_step={value!r}: a number > 0 (a cap on ||n|| relative to ||x||) or None (no cap)."
        )


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"Invalid {name}={value!r}: it must be True or False.")


def model_step(
    *,
    lr: float,
    rho: float,
    constant: Tensor,
    slope_norm_sq: Tensor,
    lower_bound: Tensor,
) -> tuple[Tensor, Tensor]:
    r"""``(tau, zeta)``: :math:`\zeta = (c - \rho f^*)_+ / \|s\|^2` (0 when the slope s is 0) and
    :math:`\tau = \min\{\alpha/\rho, \zeta\}`, with :math:`c = h_k + \langle d_k, n_k\rangle` the model's
    constant and :math:`\|s\|^2 = \|P_k d_k\|^2` (Lemma B.1 on :math:`\mathrm{null}(J_k)`). 0-dim tensors."""
    positive = slope_norm_sq > 0.0
    gap = (constant - rho * lower_bound).clamp_min(0.0)
    zeta = torch.where(positive, gap / torch.where(positive, slope_norm_sq, 1.0), 0.0)
    return zeta.clamp(max=lr / rho), zeta


class _SQPMoMoBase(Optimizer, ABC):
    """The step shared by :class:`SQPMoMo` and :class:`SQPMoMoAdam` (see the module docstring)."""

    requires = frozenset({"constraints", "jacobian"})
    shared_keys: tuple[str, ...] = (
        "lower_bound", "estimate_lower_bound", "rho", "rcond", "max_normal_step", "precision",
    )

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self._check_group(defaults)
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}
        self._check_groups()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("diagnostics", {})

    # ------------------------------------------------------------------ hyperparameters
    def _check_group(self, group: dict[str, Any]) -> None:
        check_lr(group["lr"])
        _check_rho(group["rho"])
        check_positive("rcond", group["rcond"])
        _check_cap(group["max_normal_step"])
        if group["precision"] not in ("native", "float64"):
            raise ValueError(
                f"Invalid precision={group['precision']!r}: 'native' (the parameters' dtype) or 'float64'."
            )
        lower = group["lower_bound"]
        if isinstance(lower, bool) or not (isinstance(lower, (int, float)) and math.isfinite(lower)):
            raise ValueError(
                f"Invalid lower_bound={lower!r}: a finite number (a lower bound of the loss; 0 for "
                "non-negative losses; a very negative number switches the adaptive step off)."
            )
        _check_flag("estimate_lower_bound", group["estimate_lower_bound"])

    def _check_groups(self) -> None:
        for group in self.param_groups:
            self._check_group(group)
        check_shared_keys(
            type(self).__name__, self.param_groups, self.shared_keys,
            "the one model of the loss / the one projection",
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "diagnostics"):
            self._check_groups()

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _beta(self) -> float:
        """beta (``momentum``) or beta1 (``betas[0]``), shared by all groups."""

    @abstractmethod
    def _rho(self, k: int) -> float:
        """The bias-correction factor rho_k."""

    def _weight(self, k: int) -> float:
        """The averaging weight of the new sample."""
        return 1.0 - self._beta()

    @abstractmethod
    def _moment_keys(self) -> tuple[str, ...]:
        """The state keys of the moments, the momentum average d first."""

    @abstractmethod
    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, k: int, weight: float) -> None:
        """Update the moments in place: the momentum with the new gradient g, a second moment with
        ``g_second`` (g, or :math:`P_k g` in the Euclidean geometry)."""

    def _scaling(self, state: dict[str, Any], k: int) -> Tensor | None:
        r""":math:`D_k^{-1/2}` as an n-vector (None for D = I)."""
        return None

    def _euclidean_metric(self) -> bool:
        """True for SQP-MoMo-Adam's ``geometry="euclidean"``: Euclidean normal step and projector, the
        metric :math:`(Z^T D^{-1} Z)^{-1}` on null(J) with D from the projected gradients."""
        return False

    # ------------------------------------------------------------------ the step
    def _working_dtype(self, params: list[Tensor]) -> torch.dtype:
        if self.param_groups[0]["precision"] == "float64":
            return torch.float64
        dtype = torch.float32
        for p in params:
            dtype = torch.promote_types(dtype, real_view(p).dtype)
        return dtype if dtype.is_floating_point else torch.float32

    @staticmethod
    def _flat(tensors: list[Tensor | None], params: list[Tensor], dtype: torch.dtype) -> Tensor:
        pieces = []
        for t, p in zip(tensors, params):
            if t is None:
                pieces.append(torch.zeros(real_view(p).numel(), dtype=dtype, device=p.device))
            else:
                if t.is_sparse:
                    raise ValueError("SQP-MoMo does not support sparse gradients.")
                pieces.append(real_view(t.detach()).reshape(-1).to(dtype))
        return torch.cat(pieces)

    def _checked_inputs(
        self, constraints: Tensor | None, jacobian: Tensor | None, n: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        check_constraint_inputs(type(self).__name__, constraints, jacobian, n)
        if constraints is None or jacobian is None:
            return torch.zeros(0, dtype=torch.float64, device=device), torch.zeros(0, n, dtype=dtype, device=device)
        return constraints.detach().to(device=device, dtype=torch.float64), jacobian.detach().to(device=device, dtype=dtype)

    @outside_autocast
    @torch.no_grad()
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        constraints: Tensor | None = None,
        jacobian: Tensor | None = None,
        diagnostics: bool = False,
    ) -> Any:
        """One step. ``closure`` returns the loss value (called once, under grad mode); g is read from
        ``p.grad``; ``constraints`` is c (shape (m,), ``None`` for m = 0) and ``jacobian`` J (shape (m, n),
        flat layout). Returns the closure's value."""
        self.diagnostics = {}
        value, loss = loss_from_closure(type(self).__name__, closure, "step(closure, constraints=c, jacobian=J)")
        self._check_groups()
        params = group_params(self.param_groups)
        if not params:
            return value
        device = params[0].device
        dtype = self._working_dtype(params)
        n = sum(block_sizes(params))
        x = self._flat([p for p in params], params, dtype)
        g = self._flat([p.grad for p in params], params, dtype)
        c, J = self._checked_inputs(constraints, jacobian, n, dtype, device)
        m = c.numel()
        f = loss.detach().reshape(()).to(device=device, dtype=torch.float64)
        gx = torch.dot(g, x).to(torch.float64)

        # the one host sync of the checks, before anything changes
        finite = torch.isfinite(f) & torch.isfinite(gx)
        if m:
            finite = finite & torch.isfinite(c).all() & torch.isfinite(J.sum(dtype=torch.float64))
        if not bool(finite):
            self._raise_nonfinite(f, g, c, J)

        state = self.state[STATE_KEY]
        if not state:
            state.update(self._init_state(n, device, dtype))
        elif state.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {state['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        for key in self._moment_keys():  # moments loaded from another precision: cast once
            if state[key].dtype != dtype:
                state[key] = state[key].to(dtype)

        first = self.param_groups[0]
        k = int(state["step"]) + 1
        rho_k = self._rho(k)
        weight = self._weight(k)
        floor = float(first["lower_bound"])
        estimate = bool(first["estimate_lower_bound"])
        scalar = lambda v: torch.as_tensor(v, dtype=torch.float64, device=device)  # noqa: E731
        f_star = state["lower_bound"] if estimate else scalar(floor)

        # 1. the loss model: averages and moments (the Euclidean geometry's second moment is of P_k g_k)
        loss_avg = state["loss_avg"] + weight * (f - state["loss_avg"])
        gamma = state["gamma"] + weight * (gx - state["gamma"])
        euclidean = self._euclidean_metric()
        space = NullSpace.from_jacobian(J, float(first["rcond"])) if euclidean else None
        g_second = space.project(g).to(dtype) if euclidean and m else g
        self._update_moments(state, g, g_second, k, weight)
        d = state[self._moment_keys()[0]]
        h = loss_avg + torch.dot(d, x).to(torch.float64) - gamma

        # 2. the projection. slope: the vector whose squared norm is the prox's slope norm; direction: the
        #    tangential direction in the working variable (u = D^{1/2} z for the exact D-norm prox, x else)
        scaling = self._scaling(state, k)  # D^{-1/2} or None
        if scaling is None:  # D = I (SQP-MoMo)
            space = NullSpace.from_jacobian(J, float(first["rcond"]))
            slope = space.project(d).to(dtype) if m else d.clone()
            direction = slope
        elif euclidean:  # metric (Z^T D^{-1} Z)^{-1} on null(J): direction P D^{-1} P d
            projected = space.project(d).to(dtype) if m else d.clone()
            slope = projected * scaling  # D^{-1/2} P d
            direction = space.project(slope * scaling).to(dtype) if m else slope * scaling
        else:  # the exact D-norm prox, in the scaled variable u = D^{1/2} z
            space = NullSpace.from_jacobian(J * scaling, float(first["rcond"]))
            w = d * scaling
            slope = space.project(w).to(dtype) if m else w
            direction = slope
        scaled_variable = scaling is not None and not euclidean
        slope_norm_sq = torch.dot(slope, slope).to(torch.float64)

        lrs = [float(group["lr"]) for group in self.param_groups]
        rho = first["rho"]
        s = 1.0 if rho == "full" else lrs[0] * float(rho)
        if m:
            normal = space.pseudo_solve(c).to(dtype).mul_(-s)  # -s J^+ c (J~^+ c in the scaled variable)
            normal_x = normal * scaling if scaled_variable else normal
            normal_norm = normal_x.norm().to(torch.float64)
            cap = first["max_normal_step"]
            if cap is not None:
                limit = float(cap) * x.norm().to(torch.float64)
                shrink = torch.where(normal_norm > limit, limit / normal_norm.clamp_min(1e-300), 1.0)
                normal.mul_(shrink.to(dtype))
                normal_x = normal * scaling if scaled_variable else normal
                normal_norm = normal_norm * shrink
            d_dot_n = torch.dot(d, normal_x).to(torch.float64)
        else:
            normal = None
            normal_x = None
            normal_norm = scalar(0.0)
            d_dot_n = scalar(0.0)
        constant = h + d_dot_n

        # 3. ResetStar, step sizes, the step
        if estimate:
            lowered = (constant / (2.0 * rho_k)).clamp_min(floor)
            f_star = torch.where(rho_k * f_star >= constant, lowered, f_star)
        taus, zeta = [], scalar(0.0)
        for lr in lrs:
            tau, zeta = model_step(lr=lr, rho=rho_k, constant=constant, slope_norm_sq=slope_norm_sq,
                                   lower_bound=f_star)
            taus.append(tau)
        delta = self._tangential(direction, taus, lrs, space, m, dtype)
        if normal is not None:
            delta.add_(normal)
        if scaled_variable:
            delta.mul_(scaling)
        self._add_to_params(params, delta)

        # 4. EstimateStar, state, diagnostics
        used = f_star
        if estimate:
            tau_norm = self._tau_slope_norm(slope, taus, lrs)
            f_star = ((constant - 0.5 * tau_norm) / rho_k).clamp_min(floor)
        state.update(step=k, n=n, loss_avg=loss_avg, gamma=gamma, lower_bound=f_star)
        if diagnostics:
            record = {"zeta": zeta, "lower_bound_used": used, "normal_inner_product": d_dot_n,
                      "projected_direction_norm": slope_norm_sq.sqrt(), "normal_step_norm": normal_norm,
                      "step_norm": delta.norm().to(torch.float64),
                      "violation_max": c.abs().max() if m else scalar(0.0)}
            several = len(self.param_groups) > 1
            for i, tau in enumerate(taus):
                record[f"tau/group{i}" if several else "tau"] = tau
            if m:
                record["rank"] = scalar(float(space.rank))
                target = J @ normal_x
                record["linearized_feasibility_error"] = (
                    (J @ delta - target).norm() / target.norm().clamp_min(1e-300)
                ).to(torch.float64)
            self.diagnostics = record
        return value

    def _tangential(
        self, p: Tensor, taus: list[Tensor], lrs: list[float], space: NullSpace, m: int, dtype: torch.dtype
    ) -> Tensor:
        r""":math:`-\tau P d` (one lr), or :math:`\tilde P(-\mathrm{diag}(\tau_i) P d)` for groups with
        different lrs (projected again so that it stays in the null space)."""
        if all(lr == lrs[0] for lr in lrs):
            return p * (-taus[0]).to(dtype)
        out = torch.empty_like(p)
        for (group, block), tau in zip(self._group_blocks(), taus):
            torch.mul(p[block], (-tau).to(dtype), out=out[block])
        return space.project(out).to(dtype) if m else out

    def _tau_slope_norm(self, p: Tensor, taus: list[Tensor], lrs: list[float]) -> Tensor:
        r""":math:`\tau_k \|P d\|^2`, or :math:`\sum_i \tau_i \|(P d)_i\|^2` over groups (as MoMo)."""
        if all(lr == lrs[0] for lr in lrs):
            return taus[0] * torch.dot(p, p).to(torch.float64)
        total = torch.zeros((), dtype=torch.float64, device=p.device)
        for (group, block), tau in zip(self._group_blocks(), taus):
            total = total + tau * torch.dot(p[block], p[block]).to(torch.float64)
        return total

    def _group_blocks(self) -> list[tuple[dict[str, Any], slice]]:
        blocks, offset = [], 0
        for group in self.param_groups:
            size = sum(block_sizes(group["params"]))
            blocks.append((group, slice(offset, offset + size)))
            offset += size
        return blocks

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zero = torch.zeros((), dtype=torch.float64, device=device)
        state: dict[str, Any] = {"step": 0, "n": n, "loss_avg": zero, "gamma": zero.clone(),
                                 "lower_bound": zero + float(self.param_groups[0]["lower_bound"])}
        for key in self._moment_keys():
            state[key] = torch.zeros(n, dtype=dtype, device=device)
        return state

    @staticmethod
    def _add_to_params(params: list[Tensor], delta: Tensor) -> None:
        offset = 0
        for p in params:
            view = real_view(p.detach())
            size = view.numel()
            view.add_(delta[offset:offset + size].view_as(view).to(view.dtype))
            offset += size

    def _raise_nonfinite(self, f: Tensor, g: Tensor, c: Tensor, J: Tensor) -> None:
        if not bool(torch.isfinite(f)):
            raise ValueError(
                f"{type(self).__name__}: the loss is not finite ({float(f)!r}); the step was not taken. "
                "Check the loss at this batch (a diverging run, a bad batch, log of 0, ...)."
            )
        check_finite("The constraints c", c)
        check_finite("The jacobian J", J)
        check_finite("The objective gradient g (or the parameters)", g)
        raise ValueError(f"{type(self).__name__}: <g, x> overflowed; the step was not taken.")


class SQPMoMo(_SQPMoMoBase):
    r"""SQP-MoMo: MoMo's model-based step restricted to the linearized constraints (Euclidean prox).

    .. math::
        x_{k+1} = x_k + n_k - \tau_k P_k d_k, \qquad
        \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
            \frac{(\bar f_k + \langle d_k, x_k\rangle - \gamma_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}
                 {\|P_k d_k\|^2}\Big\},

    :math:`n_k = -J_k^+ c_k` (``rho="full"``), :math:`P_k` the projector on :math:`\mathrm{null}(J_k)`,
    :math:`d_k, \bar f_k, \gamma_k` MoMo's averages (:math:`\rho_k = 1`, averages starting at the first
    sample; ``bias_correction=True``: starting at 0, :math:`\rho_k = 1 - \beta^k`). Derivation, the online
    lower bound and the conventions in the module docstring. m = 0 gives
    :class:`~lit_constrained.optim.momo.MoMo` (without weight decay).

    Args:
        params: parameters or parameter groups (per group: ``lr``).
        lr: :math:`\alpha`, the cap of the adaptive step (default 1.0, MoMo's: a cap, not the step;
            a small cap turns the method into projected heavy ball).
        momentum: :math:`\beta \in [0, 1)` (the group key schedulers cycle), shared.
        lower_bound: :math:`f^*` (0 for non-negative losses), or the start and floor of the estimate. Shared.
        estimate_lower_bound: estimate :math:`f^*` online (MoMo*). Shared.
        bias_correction: MoMo-Bias averaging. Shared.
        rho: ``"full"`` (default: the normal step restores the linearized constraints) or a number
            (normal step :math:`-\alpha\rho J^+ c`). Shared.
        rcond: relative singular-value cutoff of J's numerical rank. Shared.
        max_normal_step: ``None`` or a cap on :math:`\|n_k\|` relative to :math:`\|x_k\|`. Shared.
        precision: ``"native"`` or ``"float64"``. Shared.
    """

    shared_keys = _SQPMoMoBase.shared_keys + ("momentum", "bias_correction")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        momentum: float = 0.9,
        lower_bound: float = 0.0,
        estimate_lower_bound: bool = False,
        bias_correction: bool = False,
        rho: Rho = "full",
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
        precision: Precision = "native",
    ) -> None:
        super().__init__(
            params,
            dict(lr=lr, momentum=momentum, lower_bound=lower_bound, estimate_lower_bound=estimate_lower_bound,
                 bias_correction=bias_correction, rho=rho, rcond=rcond, max_normal_step=max_normal_step,
                 precision=precision),
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_beta("momentum", group["momentum"])
        _check_flag("bias_correction", group["bias_correction"])

    def _beta(self) -> float:
        return float(self.param_groups[0]["momentum"])

    def _rho(self, k: int) -> float:
        return 1.0 - self._beta() ** k if self.param_groups[0]["bias_correction"] else 1.0

    def _weight(self, k: int) -> float:
        if k == 1 and not self.param_groups[0]["bias_correction"]:
            return 1.0  # fbar_0 = f_1, d_0 = g_1, gamma_0 = <g_1, x_1>
        return 1.0 - self._beta()

    def _moment_keys(self) -> tuple[str, ...]:
        return ("grad_avg",)

    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, k: int, weight: float) -> None:
        state["grad_avg"].lerp_(g, weight)


class SQPMoMoAdam(_SQPMoMoBase):
    r"""SQP-MoMo-Adam: MoMo-Adam's step (prox in Adam's D-norm) restricted to the linearized constraints.

    .. math::
        x_{k+1} = x_k + n_k - \tau_k P^D_k D_k^{-1} d_k, \qquad
        \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
            \frac{(h_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}{\|\tilde P_k D_k^{-1/2} d_k\|^2}\Big\},

    :math:`D_k = \mathrm{diag}(\epsilon + \sqrt{v_k/(1-\beta_2^k)})`, :math:`\rho_k = 1-\beta_1^k`,
    :math:`n_k = -D_k^{-1}J_k^T(J_k D_k^{-1}J_k^T)^+ c_k` (``rho="full"``) and
    :math:`P^D_k = I - D_k^{-1}J_k^T(J_k D_k^{-1}J_k^T)^+ J_k` the D-orthogonal projector on
    :math:`\mathrm{null}(J_k)` (Adam(con)'s KKT system with :math:`H = D_k`); :math:`\tilde P_k` projects on
    :math:`\mathrm{null}(J_k D_k^{-1/2})`. m = 0 gives :class:`~lit_constrained.optim.momo.MoMoAdam`
    (without weight decay). See the module docstring.

    Args:
        params: parameters or parameter groups (per group: ``lr``, ``eps``).
        lr: :math:`\alpha`, the cap of the adaptive step (default 1e-2, MoMo-Adam's: a cap, not the step).
        betas: :math:`(\beta_1, \beta_2)`, shared.
        eps: added outside the square root of D, per group.
        lower_bound, estimate_lower_bound, rho, rcond, max_normal_step, precision: as :class:`SQPMoMo`.
        geometry: ``"adam"`` (default): the exact prox in Adam's D-norm above (Adam(con)'s D-orthogonal
            projector and D-minimum-norm normal step). ``"euclidean"``: SQP-Adam's geometry, the exact prox
            in the metric :math:`M_k = (I - P_k) + (P_k\hat D_k^{-1}P_k)^+` (:math:`\hat D` from the second
            moment of the projected gradients): :math:`x_{k+1} = x_k - J_k^+c_k - \tau_k P_k\hat D_k^{-1}P_k d_k`,
            :math:`\tau_k` with the slope norm :math:`\|\hat D_k^{-1/2}P_k d_k\|^2`. Shared. See the module
            docstring.
    """

    shared_keys = _SQPMoMoBase.shared_keys + ("betas", "geometry")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        lower_bound: float = 0.0,
        estimate_lower_bound: bool = False,
        rho: Rho = "full",
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
        precision: Precision = "native",
        geometry: Geometry = "adam",
    ) -> None:
        super().__init__(
            params,
            dict(lr=lr, betas=tuple(betas), eps=eps, lower_bound=lower_bound,
                 estimate_lower_bound=estimate_lower_bound, rho=rho, rcond=rcond,
                 max_normal_step=max_normal_step, precision=precision, geometry=geometry),
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # state dicts saved before the option existed: the exact prox
            group.setdefault("geometry", "adam")

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_betas(tuple(group["betas"]))
        check_positive("eps", group["eps"])
        if group.get("geometry", "adam") not in ("adam", "euclidean"):
            raise ValueError(
                f"Invalid geometry={group['geometry']!r}: 'adam' (the exact prox in Adam's D-norm, Adam(con)'s "
                "D-orthogonal projector) or 'euclidean' (SQP-Adam's Euclidean projector and normal step)."
            )

    def _beta(self) -> float:
        return float(self.param_groups[0]["betas"][0])

    def _rho(self, k: int) -> float:
        return 1.0 - self._beta() ** k

    def _moment_keys(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, k: int, weight: float) -> None:
        beta2 = float(self.param_groups[0]["betas"][1])
        state["exp_avg"].lerp_(g, weight)
        state["exp_avg_sq"].mul_(beta2).addcmul_(g_second, g_second, value=1.0 - beta2)

    def _euclidean_metric(self) -> bool:
        return self.param_groups[0]["geometry"] == "euclidean"

    def _scaling(self, state: dict[str, Any], k: int) -> Tensor:
        r""":math:`D_k^{-1/2}`, :math:`D_k = \epsilon + \sqrt{v_k/(1-\beta_2^k)}` (eps per group)."""
        beta2 = float(self.param_groups[0]["betas"][1])
        out = torch.div(state["exp_avg_sq"], 1.0 - beta2**k).sqrt_()
        for group, block in self._group_blocks():
            out[block].add_(float(group["eps"]))
        return out.rsqrt_()
