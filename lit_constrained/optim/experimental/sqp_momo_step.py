r"""The SQP-MoMo step shared by :class:`~lit_constrained.optim.experimental.sqp_momo.SQPMoMo` and
:class:`~lit_constrained.optim.experimental.sqp_momo.SQPMoMoAdam` (:class:`_SQPMoMoBase` over :func:`sqp_momo`),
and its derivation. The step is the function :func:`sqp_momo` over flat tensors (on the kernel's host read,
safeguard and corrections); the classes gather, scatter and keep the state.

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
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from ..checks import loss_from_closure, loss_tensor
from ..constrained import ConstrainedOptimizer, FlatInputs
from ..functional import ProjectedStep
from ..hyperparameters import SHARED_KEYS, check_flag
from ..kernel import Block, Composed, Rows, host_read, to_x, violation
from ..momo_rules import adaptive_step, estimate_lower_bound, reset_lower_bound
from ..projection import Projection, Projector
from ..safeguard import normal_step_scale
from ..step_diagnostics import record_step
from ..workspace import Workspace


class LossModel(Protocol):
    """The flavour of an SQP-MoMo step (SQP-MoMo, SQP-MoMo-Adam), read from its param groups."""

    def _beta(self) -> float: ...
    def _rho(self, k: int) -> float: ...
    def _weight(self, k: int) -> float: ...
    def _moment_keys(self) -> tuple[str, ...]: ...
    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, weight: float) -> None: ...
    def _metric_scaling(self, state: dict[str, Any], k: int, second_moment: Tensor | None = None) -> Tensor | None: ...
    def _euclidean_metric(self) -> bool: ...
    def _scaled_variable(self) -> bool: ...


def sqp_momo(x: Sequence[Tensor], grad: Tensor, c: Tensor, J: Tensor, state: dict[str, Any], *, loss: Tensor,
             flat_x: Tensor, groups: Sequence[Block], model: LossModel, workspace: Workspace | None = None,
             diagnostics: bool = False, owner: str = "SQPMoMo") -> ProjectedStep:
    """One SQP-MoMo step (the module docstring): x_{k+1} - x_k = n_k - tau_k P d_k, with the kernel's
    safeguarded normal step n_k and MoMo's scalar rules (no weight decay). ``loss``: f (0-dim float64);
    ``flat_x``: the parameters as one flat vector (working dtype); ``model``: the flavour's rules."""
    workspace = workspace if workspace is not None else Workspace()
    first = groups[0][0]
    rcond = float(first["rcond"])
    gx = torch.dot(grad, flat_x).to(torch.float64)
    rows = Rows(grad, c, J, finite=torch.isfinite(loss) & torch.isfinite(gx),
                named=((f"{owner}: the loss", loss), ("The objective gradient g", grad), ("The parameters x", flat_x)))
    if not model._scaled_variable():
        factor, finite, _ = workspace.factorize(J, rcond)
        projection = Projection(J, factor, finite, c)
    else:  # the D-norm prox: J~ = J D_k^{-1/2} with the second moment of this step (committed below)
        k = int(state["step"]) + 1
        v_next = workspace.vector("exp_avg_sq_next", grad)
        beta2 = float(first["betas"][1])
        torch.mul(state["exp_avg_sq"], beta2, out=v_next).addcmul_(grad, grad, value=1.0 - beta2)
        scaling = model._metric_scaling(state, k, v_next)
        factor, finite, _ = workspace.factorize(J, rcond, scaling)
        projection = Projection(J, factor, finite, c, scaling=scaling)
    read = host_read(projection, rows, workspace, rcond)
    projection, projector = read.projection, read.projector
    state = {**state, "n": grad.numel(), "step": state["step"] + 1}
    record: dict[str, Tensor] | None = {} if diagnostics else None
    composed = _compose(projection, projector, rows, state, loss, gx, flat_x, groups, model, workspace, record)
    if "initial_violation" not in state:
        state["initial_violation"] = violation(rows)
    state.pop("active_set", None)
    if record is not None:
        factor = projection.factor if projection.scaling is None else workspace.factorize(J, rcond)[0]
        record_step(record, state=state, factor=factor, projector=projector, to_x=lambda step: to_x(projection, step),
                    c=c, delta=composed.delta, scale=composed.scale, normal_norm=composed.normal_norm,
                    lr=float(first["lr"]), rho=first["rho"])
    return ProjectedStep(composed.delta, state, record, projection, projector, projector, rank=read.rank,
                         condition=read.condition)


def _compose(projection: Projection, projector: Projector, rows: Rows, state: dict[str, Any], f: Tensor, gx: Tensor,
             x: Tensor, groups: Sequence[Block], model: LossModel, workspace: Workspace,
             record: dict[str, Tensor] | None) -> Composed:
    """x_{k+1} - x_k = n_k - tau_k P d_k (see the module docstring)."""
    first = groups[0][0]
    g, c, m = rows.g, rows.c, rows.m
    k = int(state["step"])
    rho_k, weight = model._rho(k), model._weight(k)
    floor = float(first["lower_bound"])
    estimate = bool(first["estimate_lower_bound"])
    device = g.device
    f_star = state["lower_bound"] if estimate else torch.full((), floor, dtype=torch.float64, device=device)

    # 1. the loss model: averages and moments (the Euclidean geometry's second moment is of P_k g_k)
    loss_avg = state["loss_avg"] + weight * (f - state["loss_avg"])
    gamma = state["gamma"] + weight * (gx - state["gamma"])
    euclidean = model._euclidean_metric()
    g_second = projector.project(g, torch.empty_like(g)) if euclidean and m else g
    if model._scaled_variable():  # commit the second moment the factorization's scaling was formed from
        state["exp_avg_sq"] = workspace.swap("exp_avg_sq_next", state["exp_avg_sq"])
    model._update_moments(state, g, g_second, weight)
    d = state[model._moment_keys()[0]]
    d_dot_x = torch.dot(d, x).to(torch.float64)

    # 2. slope (its squared norm is the prox's slope norm) and the tangential direction in the working
    #    variable (u = D^{1/2} z for the exact D-norm prox, x else)
    project = (lambda v: projector.project(v, torch.empty_like(v))) if m else (lambda v: v.clone())
    if projection.scaling is not None:  # the exact D-norm prox, in the scaled variable
        slope = project(d * projection.scaling)
        direction = slope
    elif euclidean:  # metric (Z^T D^{-1} Z)^{-1} on null(J): direction P D^{-1} P d
        scaling = model._metric_scaling(state, k)
        slope = project(d) * scaling  # D^{-1/2} P d
        direction = project(slope * scaling)
    else:  # D = I
        slope = project(d)
        direction = slope
    slope_norm_sq = torch.dot(slope, slope).to(torch.float64)

    # 3. the normal step (the kernel's safeguard) and <d, n>
    lrs = [float(group["lr"]) for group, _ in groups]
    rho = first["rho"]
    s = 1.0 if rho == "full" else lrs[0] * float(rho)
    delta = workspace.vector("delta", g)
    if m:
        normal = projector.normal(c, torch.empty_like(g))  # -J~^+ c
        normal_x = to_x(projection, normal.clone())
        scale, normal_norm = normal_step_scale(
            first["max_normal_step"], rho, s, normal_x.norm().to(torch.float64), c, projection.factor,
            lambda: x.norm().to(torch.float64), state)
        normal.mul_(scale.to(normal.dtype))
        normal_x.mul_(scale.to(normal_x.dtype))
        d_dot_n = torch.dot(d, normal_x).to(torch.float64)
    else:
        scale, normal = None, None
        normal_norm = d_dot_n = torch.zeros((), dtype=torch.float64, device=device)

    # 4. ResetStar, the step sizes, the step (MoMo's rules with h_k + <d_k, n_k> as the model's constant)
    rules = dict(loss_avg=loss_avg, gamma=gamma, d_dot_x=d_dot_x + d_dot_n)
    if estimate:
        f_star = reset_lower_bound(f_star, floor, lr=lrs[0], weight_decay=0.0, rho=rho_k, **rules)
    steps = [adaptive_step(lr=lr, weight_decay=0.0, rho=rho_k, d_norm_sq=slope_norm_sq, lower_bound=f_star,
                           **rules) for lr in lrs]
    taus = [tau for tau, _ in steps]
    _tangential(direction, taus, projector, m, delta, groups)
    if normal is not None:
        delta.add_(normal)
    to_x(projection, delta)

    # 5. EstimateStar, state, diagnostics
    used = f_star
    if estimate:
        f_star = estimate_lower_bound(floor, rho=rho_k, tau_d_norm_sq=_tau_slope_norm(slope, taus, groups), **rules)
    state.update(loss_avg=loss_avg, gamma=gamma, lower_bound=f_star)
    if record is not None:
        record.update(zeta=steps[-1][1], lower_bound_used=used, normal_inner_product=d_dot_n,
                      projected_direction_norm=slope_norm_sq.sqrt())
        several = len(groups) > 1
        for i, tau in enumerate(taus):
            record[f"tau/group{i}" if several else "tau"] = tau
    return Composed(delta, scale, normal_norm)


def _tangential(p: Tensor, taus: list[Tensor], projector: Projector, m: int, out: Tensor,
                groups: Sequence[Block]) -> Tensor:
    r""":math:`-\tau P d` (one lr), or :math:`\tilde P(-\mathrm{diag}(\tau_i) P d)` for groups with
    different lrs (projected again so that it stays in the null space)."""
    first = float(groups[0][0]["lr"])
    if len(taus) == 1 or all(float(group["lr"]) == first for group, _ in groups):
        return torch.mul(p, (-taus[0]).to(p.dtype), out=out)
    scaled = torch.empty_like(p)
    for (_, block), tau in zip(groups, taus):
        torch.mul(p[block], (-tau).to(p.dtype), out=scaled[block])
    return projector.project(scaled, out) if m else out.copy_(scaled)


def _tau_slope_norm(p: Tensor, taus: list[Tensor], groups: Sequence[Block]) -> Tensor:
    r""":math:`\tau_k \|P d\|^2`, or :math:`\sum_i \tau_i \|(P d)_i\|^2` over groups (as MoMo)."""
    if len(taus) == 1:
        return taus[0] * torch.dot(p, p).to(torch.float64)
    total = torch.zeros((), dtype=torch.float64, device=p.device)
    for (_, block), tau in zip(groups, taus):
        total = total + tau * torch.dot(p[block], p[block]).to(torch.float64)
    return total


class _SQPMoMoBase(ConstrainedOptimizer):
    """The class shared by :class:`SQPMoMo` and :class:`SQPMoMoAdam` over :func:`sqp_momo`."""

    shared_keys: tuple[str, ...] = SHARED_KEYS + ("lower_bound", "estimate_lower_bound")

    # ------------------------------------------------------------------ hyperparameters
    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        lower = group["lower_bound"]
        if isinstance(lower, bool) or not (isinstance(lower, (int, float)) and torch.isfinite(torch.tensor(lower))):
            raise ValueError(
                f"Invalid lower_bound={lower!r}: a finite number (a lower bound of the loss; 0 for "
                "non-negative losses; a very negative number switches the adaptive step off)."
            )
        check_flag("estimate_lower_bound", group["estimate_lower_bound"])

    # ------------------------------------------------------------------ the flavour (LossModel)
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

    def _vector_keys(self) -> tuple[str, ...]:
        """The state's n-vectors: the moments (each parameter's entry holds views of them)."""
        return self._moment_keys()

    @abstractmethod
    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, weight: float) -> None:
        """Update the moments in place: the momentum with the new gradient g, a second moment with
        ``g_second`` (:math:`P_k g` in the Euclidean geometry; unused by the D-norm prox, whose second
        moment the step formed before the factorization)."""

    def _metric_scaling(self, state: dict[str, Any], k: int, second_moment: Tensor | None = None) -> Tensor | None:
        r""":math:`D_k^{-1/2}` as an n-vector (None for D = I), from ``second_moment`` (the state's when None)."""
        return None

    def _euclidean_metric(self) -> bool:
        """True for SQP-MoMo-Adam's ``geometry="euclidean"``: Euclidean normal step and projector, the
        metric :math:`(Z^T D^{-1} Z)^{-1}` on null(J) with D from the projected gradients."""
        return False

    def _scaled_variable(self) -> bool:
        """The exact D-norm prox: the projection Jacobian is :math:`J D^{-1/2}` (SQP-MoMo-Adam, ``"adam"``)."""
        return False

    # ------------------------------------------------------------------ the class's hooks
    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zero = torch.zeros((), dtype=torch.float64, device=device)
        state: dict[str, Any] = {"step": 0, "n": n, "loss_avg": zero, "gamma": zero.clone(),
                                 "lower_bound": zero + float(self.param_groups[0]["lower_bound"])}
        for key in self._moment_keys():
            state[key] = torch.zeros(n, dtype=dtype, device=device)
        return state

    def _call_closure(self, closure: Any) -> Any:
        return loss_from_closure(type(self).__name__, closure, "step(closure, constraints=c, jacobian=J)")[0]

    def _step_function(self, inputs: FlatInputs, state: dict[str, Any], diagnostics: bool) -> ProjectedStep:
        x = inputs.layout.gather(inputs.reals, self._workspace.vector("parameters", inputs.g), "parameters")
        f = loss_tensor(inputs.loss).detach().reshape(()).to(device=x.device, dtype=torch.float64)
        return sqp_momo(inputs.reals, inputs.g, inputs.c, inputs.jacobian, state, loss=f, flat_x=x,
                        groups=self._group_blocks(), model=self, workspace=self._workspace, diagnostics=diagnostics,
                        owner=type(self).__name__)
