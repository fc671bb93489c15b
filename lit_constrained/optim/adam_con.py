r"""Adam(con): the projection-less hard-constrained Adam baseline (Márquez-Neila et al., 2017)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checks import check_betas, check_positive
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


class AdamCon(ConstrainedOptimizer):
    r"""Adam(con): Adam moments of the RAW gradient, then a KKT system with the Adam scaling as Hessian.

    .. math::
        m_k &= \beta_1 m_{k-1} + (1-\beta_1) g_k, \qquad v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k \odot g_k \\
        \hat m &= m_k / (1-\beta_1^k), \quad \hat v = v_k / (1-\beta_2^k), \quad
              H = \mathrm{diag}\big(\sqrt{\hat v + \epsilon}\big) \\
        &\begin{bmatrix} H & J^T \\ J & 0 \end{bmatrix} \begin{bmatrix} d \\ y \end{bmatrix}
              = -\begin{bmatrix} \hat m \\ c \end{bmatrix}
              \iff y = (J H^{-1} J^T)^{-1}(c - J H^{-1} \hat m),\ d = -H^{-1}(\hat m + J^T y) \\
        x_{k+1} &= x_k + \alpha_k d_k

    Solved in the scaled variable :math:`z = H^{1/2} d` with :math:`\hat J = J H^{-1/2}`:
    :math:`z = -\hat P H^{-1/2}\hat m - \hat J^+ c`, which is the same KKT solution and reuses the
    rank-revealing float64 factorization (:class:`~lit_constrained.optim.nullspace.NullSpace` of
    :math:`\hat J`). The normal component :math:`-H^{-1/2}\hat J^+ c` satisfies :math:`J(\cdot) = -c`;
    ``rho`` scales it (the paper's method is ``rho=1``), and ``rho="full"`` takes it unscaled by the lr,
    so the linearized constraints are restored in one step.

    Args:
        params: parameters or parameter groups.
        lr: step size.
        betas: Adam's :math:`(\beta_1, \beta_2)`, per group.
        eps: added inside the square root of H, per group.
        rho: normal-component scale (1.0 is the published method) or ``"full"`` (the default). Shared.
        rcond: relative singular-value cutoff defining the numerical rank of :math:`\hat J`. Shared.
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
        rcond: float = DEFAULT_RCOND,
        max_normal_step: MaxNormalStep = DEFAULT_MAX_NORMAL_STEP,
        precision: Precision = "native",
    ) -> None:
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "rho": rho, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_betas(group["betas"])
        check_positive("eps", group["eps"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=dtype, device=device)
        return {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor, NullSpace]:
        k = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m_hat, inv_sqrt_h = torch.empty_like(m), torch.empty_like(v)
        for group, block in self._group_blocks():
            beta1, beta2 = (float(b) for b in group["betas"])
            m[block].mul_(beta1).add_(g[block], alpha=1.0 - beta1)
            v[block].mul_(beta2).addcmul_(g[block], g[block], value=1.0 - beta2)
            torch.div(m[block], 1.0 - beta1**k, out=m_hat[block])
            torch.div(v[block], 1.0 - beta2**k, out=inv_sqrt_h[block]).add_(float(group["eps"])).sqrt_().rsqrt_()  # H^{-1/2}
        plain = self._factorize(jacobian)  # J itself: diagnostics, re-projection with mixed group lrs
        scaled = NullSpace.from_jacobian(plain.jacobian * inv_sqrt_h, self.param_groups[0]["rcond"])
        pinv_c, projected, Jq = scaled.normal_and_projection(c, inv_sqrt_h * m_hat)
        if diagnostics is not None:
            diagnostics["multiplier_norm"] = scaled.solve_gram(c - Jq).norm()  # y of the KKT system
        normal = -inv_sqrt_h * pinv_c
        tangential = -inv_sqrt_h * projected
        return normal, tangential, plain
