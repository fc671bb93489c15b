r"""Projected stochastic momentum SQP methods (Zhu & Curtis, arXiv 2601.11795, Algorithms 2 and 3)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .checks import check_beta, check_betas, check_positive
from .constrained import ConstrainedOptimizer, ParamsT, Rho
from .nullspace import DEFAULT_RCOND, NullSpace


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
    :math:`[[I, J^T], [J, 0]] [d; y] = -[g; c]`. The linear algebra is done in float64 with a
    rank-revealing factorization (:class:`~lit_constrained.optim.nullspace.NullSpace`): for a
    rank-deficient J, P projects on the numerical null space and v is the minimum-norm
    least-squares normal step; the rank is recorded in ``state["diagnostics"]["rank"]``.

    Args:
        params: parameters or parameter groups (complex parameters enter as ``view_as_real``).
        lr: the step size :math:`\alpha` (read from ``param_groups`` each step: schedulers work).
        beta: momentum parameter in [0, 1).
        rho: normal-step scale :math:`\rho > 0`, or ``"full"`` for :math:`\rho_k = 1/\alpha_k`: the
            linearized constraints are then restored in one step (see
            :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer` for the trade-off).
        h: tangential scale h > 0.
        rcond: relative singular-value cutoff defining the numerical rank of J.
        max_normal_step: optional cap on the normal step, relative to ||x|| (off by default).

    ``step(closure=None, *, constraints, jacobian)``: g is read from ``p.grad``; ``constraints`` is c
    (shape (m,)), ``jacobian`` is J (shape (m, n), flat layout); m = 0 gives heavy-ball SGD.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        beta: float = 0.9,
        rho: Rho = 1.0,
        h: float = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
    ) -> None:
        check_beta("beta", beta)
        check_positive("h", h)
        self.beta = float(beta)
        self.h = float(h)
        super().__init__(params, {"lr": lr}, rho=rho, rcond=rcond, max_normal_step=max_normal_step)

    def _init_state(self, n: int, device: torch.device) -> dict[str, Any]:
        return {"step": 0, "momentum": torch.zeros(n, dtype=torch.float64, device=device)}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Any]
    ) -> tuple[Tensor, Tensor, NullSpace]:
        nullspace = self._factorize(jacobian)
        pinv_c, projected_g, Jg = nullspace.normal_and_projection(c, g)
        diagnostics["multiplier"] = nullspace.solve_gram(c - Jg)  # KKT multiplier of beta = 0
        r = state["momentum"]
        r.mul_(self.beta).add_(projected_g, alpha=-1.0 / self.h)
        tangential = nullspace.project(r) if self.beta > 0 else r.clone()
        return -pinv_c, tangential, nullspace


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
    :math:`\alpha (1-\beta_1^k)\,\mathrm{sign}(u)`: a built-in warm-up. Linear algebra in float64 with a
    rank-revealing factorization, as :class:`SQPHeavyBall`.

    Args:
        params: parameters or parameter groups.
        lr: the step size :math:`\alpha`.
        betas: :math:`(\beta_1, \beta_2)` in [0, 1).
        eps: :math:`\epsilon`, added inside the square root.
        rho: normal-step scale, or ``"full"`` for :math:`\rho_k = 1/\alpha_k`.
        h: tangential scale.
        rcond: relative singular-value cutoff defining the numerical rank of J.
        max_normal_step: optional cap on the normal step, relative to ||x|| (off by default).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-7,
        rho: Rho = 1.0,
        h: float = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
    ) -> None:
        check_betas(betas)
        check_positive("eps", eps)
        check_positive("h", h)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.h = float(h)
        super().__init__(params, {"lr": lr}, rho=rho, rcond=rcond, max_normal_step=max_normal_step)

    def _init_state(self, n: int, device: torch.device) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=torch.float64, device=device)
        return {"step": 0, "momentum": zeros, "second_moment": zeros.clone()}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Any]
    ) -> tuple[Tensor, Tensor, NullSpace]:
        beta1, beta2 = self.betas
        k = state["step"]
        nullspace = self._factorize(jacobian)
        pinv_c, projected_g, Jg = nullspace.normal_and_projection(c, g)
        diagnostics["multiplier"] = nullspace.solve_gram(c - Jg)  # KKT multiplier of beta = 0
        u = projected_g.mul_(-1.0 / self.h)
        r, s = state["momentum"], state["second_moment"]
        r.mul_(beta1).add_(u)
        s.mul_(beta2).addcmul_(u, u)
        eta = (1.0 - beta1) * math.sqrt(1.0 - beta2**k) / math.sqrt(1.0 - beta2)
        scaled = r / (s + self.eps).sqrt_()
        diagnostics["eta"] = eta
        return -pinv_c, nullspace.project(scaled).mul_(eta), nullspace
