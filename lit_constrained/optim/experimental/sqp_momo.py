r"""SQP-MoMo and SQP-MoMo-Adam: hard constraints with MoMo's self-adapting (Polyak-type) step size.

**Status: experimental** (:mod:`lit_constrained.optim.experimental`; issue 31). The goal was a good-lr range
>= 10x SQP-Adam's, a best test error within 1.5x of SQP-Adam's and max |c_end| <= 1e-4 max |c_0| on at
least 2 of 3 tasks. Measured after the rebuild on the kernel (the adaptive normal-step safeguard and the
post-step corrections at their defaults, for SQP-Adam as well): **missed on all three tasks in both
geometries**. 11 lrs 1e-5..1, seeds 0-2, constant lr, full batch, f* = 0, rho = "full"; best mean test error
/ good-lr range (within 2x of the best) / max |c_end| / max |c_0| at the best lr:

=================  =========================  ===========================  ==============================
task (steps)       SQP-Adam                   SQP-MoMo-Adam (D-norm)       SQP-MoMo-Adam (Euclidean)
=================  =========================  ===========================  ==============================
curve (300)        1.7e-4 / 31.6x / 3.9e-7    5.4e-4 / 1x / 2.8e-7         1.1e-3 / 3.2x / 1.1e-5
spring (500)       1.0e-3 / 3.2x / 8.0e-7     0.103 / 1e5x / 1.6e-6        0.129 / 1e5x / 8.8e-6
Burgers (40)       0.870 / 1e4x / 9.3e-3      0.900 / 1e5x / 1.5e-4        0.911 / 1e5x / 1.8e-2
=================  =========================  ===========================  ==============================

On curve the range is narrower and the best error 3.2x / 6.7x SQP-Adam's; on spring the 1e5x "range" is
the untrained plateau (0.129 at every lr; SQP-Adam reaches 1.0e-3); on Burgers at 40 steps nothing has
trained and the violation ratio misses. With ``max_normal_step=None`` (the full normal step) curve and
spring miss too
(D-norm curve 2.6e-4, 1.56x, range 3.2x). Command (AMD EPYC, 1 thread, about 16 minutes):
``python -m lit_constrained.compare.sweep --tasks TASK --steps curve=300 spring=500 burgers=40 --methods
sqp_adam sqp_momo_adam sqp_momo_adam_euclidean --json docs/figures/sqp_momo_sweep_TASK.json``; the records
and figure are ``docs/figures/sqp_momo_sweep_kernel.{json,png}``; docs/sqp_momo.md has the per-lr tables.
The classes are exact (dense-reference tests) and kept for study; the API may change.

MoMo (Schaipp et al., arXiv 2305.07583; :mod:`~lit_constrained.optim.momo`) takes the proximal step of a
truncated model of the loss built from momentum averages; the projected SQP methods
(:mod:`~lit_constrained.optim.sqp`) split the step into a normal part that restores the linearized
constraints and a tangential part in the null space of the Jacobian. SQP-MoMo solves MoMo's proximal
subproblem restricted to the linearized constraints; the result is again closed form.
The derivation (the Euclidean prox, the Adam flavour, SQP-Adam's geometry, the online lower bound) and the
step both classes share: :mod:`~lit_constrained.optim.experimental.sqp_momo_step`.

**Param groups.** :math:`\bar f, \gamma, d` describe the one loss, so ``momentum``/``betas``,
``lower_bound``, ``estimate_lower_bound``, ``bias_correction`` and the projection's ``rho``, ``rcond``,
``max_normal_step``, ``precision`` are shared (a ``ValueError`` names a key that differs). Each group i
gets :math:`\tau_i = \min\{\alpha_i/\rho_k, \zeta_k\}` from its own lr (as MoMo); when the lrs differ the
tangential step :math:`-\mathrm{diag}(\tau_i) P_k d_k` is projected on :math:`\mathrm{null}(J_k)` again
(:math:`\tilde P_k` in the scaled variable), so :math:`J_k \Delta x = J_k n_k` still holds. ``eps``
(SQP-MoMo-Adam) is per group. A numeric ``rho`` scales the normal step by the lr of group 0.

**Built on the projected-step kernel.** These are
:class:`~lit_constrained.optim.constrained.ConstrainedOptimizer` subclasses over the step function
:func:`~lit_constrained.optim.experimental.sqp_momo_step.sqp_momo`: the flat layout, the input
checks, the factorization (rank-revealing, float64 m x m algebra, iterative refinement), the one host read,
the normal-step safeguard, the post-step corrections and the diagnostics are the kernel's
(:mod:`~lit_constrained.optim.kernel`). Only the composition differs: MoMo's :math:`\tau_k` is a device scalar that depends on the
(safeguarded) normal step (:math:`\langle d_k, n_k\rangle`), on :math:`\|P_k d_k\|^2` and on the loss, so
the tangential part is formed explicitly, :math:`P_k d_k` by the step's projector.

**Cost.** Per step: one factorization of :math:`J J^T` (:math:`\tilde J \tilde J^T`), :math:`P d` (two
passes over J) and :math:`J^+ c` (one pass): one pass more than SQP-HeavyBall's merged step, for the exact
:math:`\|P d\|^2` (from the explicit projection, not the cancellation-prone
:math:`\|d\|^2 - (Jd)^T G^+ (Jd)`).

**Normal-step safeguard and corrections**: those of the kernel (``max_normal_step``: ``"adaptive"``, a
number or ``None``; ``constraint_tol`` / ``max_corrections``); the step is exact for the capped normal step.
The default here is ``None`` (:data:`SQP_MOMO_MAX_NORMAL_STEP`, the full normal step, as before the rebuild),
not the kernel's ``"adaptive"``: the trust radius judges the normal step by the decrease of ||c|| over the
whole step, and MoMo's large tangential steps (tau up to lr / (1 - beta1)) spoil that ratio, so the radius
shrinks while the violation grows (measured: the curve task, SQP-MoMo-Adam euclidean, lr 1e-2, max |c|
1.08 -> 5.68 in 3 steps with ``"adaptive"``, 7.2e-4 with ``None``; the lr sweep with ``None``:
docs/figures/sqp_momo_sweep_full_normal.json).

torch.optim conventions: every hyperparameter in ``defaults`` and each group; ``step(closure, *,
constraints=None, jacobian=None, diagnostics=False, constraint_closure=None)``, the closure returns the (already back-propagated)
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

from typing import Any, Literal

import torch
from torch import Tensor

from ..checks import check_beta, check_betas, check_positive
from ..constrained import ParamsT
from ..hyperparameters import (
    DEFAULT_CONSTRAINT_TOL,
    DEFAULT_MAX_CORRECTIONS,
    DEFAULT_RCOND,
    MaxNormalStep,
    Precision,
    Rho,
    check_flag,
    document_projection_args,
)
from .sqp_momo_step import _SQPMoMoBase

Geometry = Literal["adam", "euclidean"]
SQP_MOMO_MAX_NORMAL_STEP: MaxNormalStep = None
"""SQP-MoMo's default ``max_normal_step``: the full normal step (see the module docstring)."""


@document_projection_args
class SQPMoMo(_SQPMoMoBase):
    r"""SQP-MoMo: MoMo's model-based step restricted to the linearized constraints (Euclidean prox).

    .. math::
        x_{k+1} = x_k + n_k - \tau_k P_k d_k, \qquad
        \tau_k = \min\Big\{\frac{\alpha_k}{\rho_k},
            \frac{(\bar f_k + \langle d_k, x_k\rangle - \gamma_k + \langle d_k, n_k\rangle - \rho_k f^*_k)_+}
                 {\|P_k d_k\|^2}\Big\},

    :math:`n_k = -J_k^+ c_k` (``rho="full"``; the kernel's safeguard may shorten it), :math:`P_k` the
    projector on :math:`\mathrm{null}(J_k)`, :math:`d_k, \bar f_k, \gamma_k` MoMo's averages
    (:math:`\rho_k = 1`, averages starting at the first sample; ``bias_correction=True``: starting at 0,
    :math:`\rho_k = 1 - \beta^k`). Derivation, the online lower bound and the conventions in the module
    docstring. m = 0 gives :class:`~lit_constrained.optim.momo.MoMo` (without weight decay).

    Args:
        params: parameters or parameter groups (per group: ``lr``).
        lr: :math:`\alpha`, the cap of the adaptive step (default 1.0, MoMo's: a cap, not the step;
            a small cap turns the method into projected heavy ball).
        momentum: :math:`\beta \in [0, 1)` (the group key schedulers cycle), shared.
        lower_bound: :math:`f^*` (0 for non-negative losses), or the start and floor of the estimate. Shared.
        estimate_lower_bound: estimate :math:`f^*` online (MoMo*). Shared.
        bias_correction: MoMo-Bias averaging. Shared.
{projection_args}
    Here ``max_normal_step`` defaults to ``None`` (the full normal step), not ``"adaptive"``: see the module
    docstring.
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
        max_normal_step: MaxNormalStep = SQP_MOMO_MAX_NORMAL_STEP,
        precision: Precision = "native",
        constraint_tol: float = DEFAULT_CONSTRAINT_TOL,
        max_corrections: int = DEFAULT_MAX_CORRECTIONS,
    ) -> None:
        super().__init__(
            params,
            dict(lr=lr, momentum=momentum, lower_bound=lower_bound, estimate_lower_bound=estimate_lower_bound,
                 bias_correction=bias_correction, rho=rho, rcond=rcond, max_normal_step=max_normal_step,
                 precision=precision, constraint_tol=constraint_tol, max_corrections=max_corrections),
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_beta("momentum", group["momentum"])
        check_flag("bias_correction", group["bias_correction"])

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

    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, weight: float) -> None:
        state["grad_avg"].lerp_(g, weight)


@document_projection_args
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
        lower_bound, estimate_lower_bound: as :class:`SQPMoMo`.
        geometry: ``"adam"`` (default): the exact prox in Adam's D-norm above (Adam(con)'s D-orthogonal
            projector and D-minimum-norm normal step). ``"euclidean"``: SQP-Adam's geometry, the exact prox
            in the metric :math:`M_k = (I - P_k) + (P_k\hat D_k^{-1}P_k)^+` (:math:`\hat D` from the second
            moment of the projected gradients): :math:`x_{k+1} = x_k - J_k^+c_k - \tau_k P_k\hat D_k^{-1}P_k d_k`,
            :math:`\tau_k` with the slope norm :math:`\|\hat D_k^{-1/2}P_k d_k\|^2`. Shared. See the module
            docstring.
{projection_args}
    Here ``max_normal_step`` defaults to ``None`` (the full normal step), not ``"adaptive"``: see the module
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
        max_normal_step: MaxNormalStep = SQP_MOMO_MAX_NORMAL_STEP,
        precision: Precision = "native",
        geometry: Geometry = "adam",
        constraint_tol: float = DEFAULT_CONSTRAINT_TOL,
        max_corrections: int = DEFAULT_MAX_CORRECTIONS,
    ) -> None:
        super().__init__(
            params,
            dict(lr=lr, betas=tuple(betas), eps=eps, lower_bound=lower_bound,
                 estimate_lower_bound=estimate_lower_bound, rho=rho, rcond=rcond,
                 max_normal_step=max_normal_step, precision=precision, geometry=geometry,
                 constraint_tol=constraint_tol, max_corrections=max_corrections),
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

    def _update_moments(self, state: dict[str, Any], g: Tensor, g_second: Tensor, weight: float) -> None:
        state["exp_avg"].lerp_(g, weight)
        if not self._scaled_variable():  # (the D-norm prox's second moment was formed before the factorization)
            beta2 = float(self.param_groups[0]["betas"][1])
            state["exp_avg_sq"].mul_(beta2).addcmul_(g_second, g_second, value=1.0 - beta2)

    def _euclidean_metric(self) -> bool:
        return self.param_groups[0]["geometry"] == "euclidean"

    def _scaled_variable(self) -> bool:
        return not self._euclidean_metric()

    def _metric_scaling(self, state: dict[str, Any], k: int, second_moment: Tensor | None = None) -> Tensor:
        r""":math:`D_k^{-1/2}`, :math:`D_k = \epsilon + \sqrt{v_k/(1-\beta_2^k)}` (eps per group)."""
        beta2 = float(self.param_groups[0]["betas"][1])
        v = state["exp_avg_sq"] if second_moment is None else second_moment
        out = torch.div(v, 1.0 - beta2**k, out=self._workspace.vector("metric_scaling", v)).sqrt_()
        for group, block in self._group_blocks():
            out[block].add_(float(group["eps"]))
        return out.rsqrt_()
