r"""Projected stochastic momentum SQP methods (Zhu & Curtis, arXiv 2601.11795, Algorithms 2 and 3)."""

from __future__ import annotations

from typing import Any

import torch

from .checks import check_beta, check_betas, check_positive
from .constrained import ConstrainedOptimizer, FlatInputs, ParamsT
from .functional import ProjectedStep, sqp_adam, sqp_heavy_ball
from .hyperparameters import (
    DEFAULT_CONSTRAINT_TOL,
    DEFAULT_LR,
    DEFAULT_MAX_CORRECTIONS,
    DEFAULT_MAX_NORMAL_STEP,
    DEFAULT_RCOND,
    DEFAULT_RHO,
    MaxNormalStep,
    Precision,
    Rho,
    document_projection_args,
)


@document_projection_args
class SQPHeavyBall(ConstrainedOptimizer):
    r"""SQP-HeavyBall(con): the projected stochastic heavy-ball SQP method (Algorithm 2).

    At the current point, with c the constraints, J their Jacobian, g the stochastic objective
    gradient and :math:`P = I - J^T (J J^T)^{-1} J` the null-space projector:

    .. math::
        v_k &= -\rho\, J_k^T (J_k J_k^T)^{-1} c_k \\
        u_k &= -\tfrac{1}{h} P_k g_k \\
        r_k &= \beta r_{k-1} + u_k \qquad (r_0 = 0,\ \text{no } (1-\beta) \text{ factor, never reset}) \\
        d_k &= v_k + P_k r_k \qquad (\text{the momentum is projected again at the current point}) \\
        x_{k+1} &= x_k + \alpha_k d_k

    so :math:`J_k d_k = -\rho c_k`. With :math:`\beta = 0, \rho = h = 1`, d solves the KKT system
    :math:`[[I, J^T], [J, 0]] [d; y] = -[g; c]`. The m x m algebra is done in float64 with a
    rank-revealing factorization of :math:`J J^T` (an eigendecomposition for m <= 64, LAPACK's pivoted
    Cholesky above on the CPU: :mod:`~lit_constrained.optim.linalg`), J and
    the momentum stay in the parameters' dtype: for a rank-deficient J, P projects on the numerical null
    space and v is the minimum-norm least-squares normal step; the rank is reported in
    ``optimizer.diagnostics["rank"]``. Per step J is read for the Gram matrix, for J g, for
    :math:`J^T G^+ J g`, for :math:`J r` and for :math:`J^T z` (v and :math:`P r` merged; see
    :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`).

    Args:
        params: parameters or parameter groups (complex parameters enter as ``view_as_real``).
        lr: the step size :math:`\alpha` (read from ``param_groups`` each step: schedulers work).
        momentum: :math:`\beta \in [0, 1)`, per group (the key torch's schedulers cycle, e.g.
            ``OneCycleLR``); ``beta=`` is accepted as its other name (the paper's).
        h: tangential scale h > 0, per group.
{projection_args}

    ``step(closure=None, *, constraints, jacobian, diagnostics=False)``: g is read from ``p.grad``;
    ``constraints`` is c (shape (m,)), ``jacobian`` is J (shape (m, n), flat layout); m = 0 gives heavy-ball
    SGD (torch's ``SGD(momentum=beta)`` with ``h = 1``).

    **Inequality rows** (``step(..., inequalities=q, inequality_jacobian=Q)``, rows :math:`q(x) \le 0`,
    bounds among them; :mod:`~lit_constrained.optim.active_set`): with A the active rows, the projector
    :math:`P` and the normal step are those of the rows :math:`[J; Q_A]`, and the step solves

    .. math::
        \alpha d_k = \arg\min_{\Delta} \|\Delta - \alpha P_{W} r_k\|^2 \quad\text{s.t.}\quad
        J_k \Delta = -\alpha\rho c_k,\ \ Q_k \Delta + \tau q_k \le 0

    (:math:`\tau` the safeguard's fraction, 1 unless it caps the step) in the dual on the Gram of
    :math:`[J; Q]`; the momentum is of :math:`u_k = -P_W g_k / h`, projected on the null space of the
    working set W (the last step's active rows that the objective does not pull off their bounds).
    With no active row the step is the equality step, bit for bit.
    """

    accepts_inequalities = True
    vector_keys = ("momentum",)

    def __init__(
        self,
        params: ParamsT,
        lr: float = DEFAULT_LR,
        momentum: float = 0.9,
        rho: Rho = DEFAULT_RHO,
        h: float = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: MaxNormalStep = DEFAULT_MAX_NORMAL_STEP,
        precision: Precision = "native",
        constraint_tol: float = DEFAULT_CONSTRAINT_TOL,
        max_corrections: int = DEFAULT_MAX_CORRECTIONS,
        *,
        beta: float | None = None,
    ) -> None:
        if beta is not None:
            momentum = beta
        super().__init__(
            params,
            {"lr": lr, "momentum": momentum, "rho": rho, "h": h, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision,
             "constraint_tol": constraint_tol, "max_corrections": max_corrections},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_beta("momentum", group["momentum"])
        check_positive("h", group["h"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        return {"step": 0, "momentum": torch.zeros(n, dtype=dtype, device=device)}

    def _step_function(self, inputs: FlatInputs, state: dict[str, Any], diagnostics: bool) -> ProjectedStep:
        return sqp_heavy_ball(inputs.reals, inputs.g, inputs.c, inputs.jacobian, state, groups=self._group_blocks(),
                              workspace=self._workspace, inequalities=inputs.inequalities,
                              inequality_jacobian=inputs.inequality_jacobian, warm=inputs.warm,
                              diagnostics=diagnostics, owner=type(self).__name__)


@document_projection_args
class SQPAdam(ConstrainedOptimizer):
    r"""SQP-Adam(con): the projected stochastic Adam SQP method (Algorithm 3).

    The moments are of the PROJECTED gradients, with the bias correction of Défossez et al.:

    .. math::
        v_k &= -\rho\, J_k^T (J_k J_k^T)^{-1} c_k \\
        u_k &= -\tfrac{1}{h} P_k g_k \\
        r_k &= \beta_1 r_{k-1} + u_k, \qquad s_k = \beta_2 s_{k-1} + u_k \odot u_k
              \qquad (\text{no } (1-\beta) \text{ factors}) \\
        \eta_k &= (1-\beta_1) \sqrt{1-\beta_2^k} / \sqrt{1-\beta_2} \\
        d_k &= v_k + \eta_k P_k \big( r_k / \sqrt{s_k + \epsilon} \big)
              \qquad (\epsilon \text{ inside the square root; scale, then project}) \\
        x_{k+1} &= x_k + \alpha_k d_k \qquad (\eta_k \text{ does not multiply } v_k)

    Hence :math:`J_k d_k = -\rho c_k`, and for a constant u (in the null space) the tangential step is
    :math:`\alpha (1-\beta_1^k)\,\mathrm{sign}(u)`: a built-in warm-up. The linear algebra and its
    precision are those of :class:`SQPHeavyBall`, and so are the inequality rows (the moments of
    :math:`u_k = -P_W g_k / h` on the working set's null space); :math:`\eta_k` is folded into the merged
    step's scalar.

    Args:
        params: parameters or parameter groups.
        lr: the step size :math:`\alpha`.
        betas: :math:`(\beta_1, \beta_2)` in [0, 1), per group.
        eps: :math:`\epsilon`, added inside the square root, per group.
        h: tangential scale, per group.
{projection_args}
    """

    accepts_inequalities = True
    vector_keys = ("momentum", "second_moment")

    def __init__(
        self,
        params: ParamsT,
        lr: float = DEFAULT_LR,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-7,
        rho: Rho = DEFAULT_RHO,
        h: float = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: MaxNormalStep = DEFAULT_MAX_NORMAL_STEP,
        precision: Precision = "native",
        constraint_tol: float = DEFAULT_CONSTRAINT_TOL,
        max_corrections: int = DEFAULT_MAX_CORRECTIONS,
    ) -> None:
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "rho": rho, "h": h, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision,
             "constraint_tol": constraint_tol, "max_corrections": max_corrections},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_betas(group["betas"])
        check_positive("eps", group["eps"])
        check_positive("h", group["h"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=dtype, device=device)
        return {"step": 0, "momentum": zeros, "second_moment": zeros.clone()}

    def _step_function(self, inputs: FlatInputs, state: dict[str, Any], diagnostics: bool) -> ProjectedStep:
        return sqp_adam(inputs.reals, inputs.g, inputs.c, inputs.jacobian, state, groups=self._group_blocks(),
                        workspace=self._workspace, inequalities=inputs.inequalities,
                        inequality_jacobian=inputs.inequality_jacobian, warm=inputs.warm, diagnostics=diagnostics,
                        owner=type(self).__name__)
