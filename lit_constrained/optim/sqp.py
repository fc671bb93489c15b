r"""Projected stochastic momentum SQP methods (Zhu & Curtis, arXiv 2601.11795, Algorithms 2 and 3)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .checks import check_beta, check_betas, check_positive
from .constrained import (
    DEFAULT_LR,
    DEFAULT_MAX_NORMAL_STEP,
    DEFAULT_RHO,
    ConstrainedOptimizer,
    MaxNormalStep,
    ParamsT,
    Precision,
    Rho,
)
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
    least-squares normal step; the rank is reported in ``optimizer.diagnostics["rank"]``.

    Args:
        params: parameters or parameter groups (complex parameters enter as ``view_as_real``).
        lr: the step size :math:`\alpha` (read from ``param_groups`` each step: schedulers work).
        momentum: :math:`\beta \in [0, 1)`, per group (the key torch's schedulers cycle, e.g.
            ``OneCycleLR``); ``beta=`` is accepted as its other name (the paper's).
        rho: normal-step scale :math:`\rho > 0`, or ``"full"`` (the default) for :math:`\rho_k = 1/\alpha_k`:
            the linearized constraints are then restored in one step (see
            :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`). Shared by all groups.
        h: tangential scale h > 0, per group.
        rcond: relative singular-value cutoff defining the numerical rank of J. Shared.
        max_normal_step: the safeguard on the normal step: a fixed cap relative to ||x||, or ``None``
            (see :class:`~lit_constrained.optim.constrained.ConstrainedOptimizer`). Shared.
        precision: ``"native"`` (n-vectors in the parameters' dtype) or ``"float64"`` (the reference). Shared.

    ``step(closure=None, *, constraints, jacobian, diagnostics=False)``: g is read from ``p.grad``;
    ``constraints`` is c (shape (m,)), ``jacobian`` is J (shape (m, n), flat layout); m = 0 gives heavy-ball
    SGD (torch's ``SGD(momentum=beta)`` with ``h = 1``).
    """

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
        *,
        beta: float | None = None,
    ) -> None:
        if beta is not None:
            momentum = beta
        super().__init__(
            params,
            {"lr": lr, "momentum": momentum, "rho": rho, "h": h, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_beta("momentum", group["momentum"])
        check_positive("h", group["h"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        return {"step": 0, "momentum": torch.zeros(n, dtype=dtype, device=device)}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor, NullSpace]:
        nullspace = self._factorize(jacobian)
        pinv_c, projected_g, Jg = nullspace.normal_and_projection(c, g)
        if diagnostics is not None:
            diagnostics["multiplier_norm"] = nullspace.solve_gram(c - Jg).norm()  # KKT multiplier of beta = 0
        r = state["momentum"]
        any_momentum = False
        for group, block in self._group_blocks():
            beta = float(group["momentum"])
            any_momentum |= beta > 0
            r[block].mul_(beta).add_(projected_g[block], alpha=-1.0 / float(group["h"]))
        tangential = nullspace.project(r) if any_momentum else r.clone()
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
        betas: :math:`(\beta_1, \beta_2)` in [0, 1), per group.
        eps: :math:`\epsilon`, added inside the square root, per group.
        rho: normal-step scale, or ``"full"`` (the default) for :math:`\rho_k = 1/\alpha_k`. Shared.
        h: tangential scale, per group.
        rcond: relative singular-value cutoff defining the numerical rank of J. Shared.
        max_normal_step: the normal-step safeguard (a cap relative to ||x||, or ``None``). Shared.
        precision: ``"native"`` or ``"float64"`` (the reference). Shared.
    """

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
    ) -> None:
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "rho": rho, "h": h, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_betas(group["betas"])
        check_positive("eps", group["eps"])
        check_positive("h", group["h"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=dtype, device=device)
        return {"step": 0, "momentum": zeros, "second_moment": zeros.clone()}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor, NullSpace]:
        k = state["step"]
        nullspace = self._factorize(jacobian)
        pinv_c, projected_g, Jg = nullspace.normal_and_projection(c, g)
        if diagnostics is not None:
            diagnostics["multiplier_norm"] = nullspace.solve_gram(c - Jg).norm()  # KKT multiplier of beta = 0
        r, s = state["momentum"], state["second_moment"]
        scaled = torch.empty_like(r)
        for group, block in self._group_blocks():
            beta1, beta2 = (float(b) for b in group["betas"])
            u = projected_g[block].mul_(-1.0 / float(group["h"]))
            r[block].mul_(beta1).add_(u)
            s[block].mul_(beta2).addcmul_(u, u)
            eta = (1.0 - beta1) * math.sqrt(1.0 - beta2**k) / math.sqrt(1.0 - beta2)
            torch.div(r[block], (s[block] + float(group["eps"])).sqrt_(), out=scaled[block]).mul_(eta)
        return -pinv_c, nullspace.project(scaled), nullspace
