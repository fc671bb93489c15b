r"""Adam(con): the projection-less hard-constrained Adam baseline (Márquez-Neila et al., 2017)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checks import check_betas, check_positive
from .constrained import ConstrainedOptimizer, ParamsT, Rho
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
        betas: Adam's :math:`(\beta_1, \beta_2)`.
        eps: added inside the square root of H.
        rho: normal-component scale (1.0 is the published method) or ``"full"``.
        rcond: relative singular-value cutoff defining the numerical rank of :math:`\hat J`.
        max_normal_step: optional cap on the normal step, relative to ||x|| (off by default).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-7,
        rho: Rho = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
    ) -> None:
        check_betas(betas)
        check_positive("eps", eps)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        super().__init__(params, {"lr": lr}, rho=rho, rcond=rcond, max_normal_step=max_normal_step)

    def _init_state(self, n: int, device: torch.device) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=torch.float64, device=device)
        return {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}

    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Any]
    ) -> tuple[Tensor, Tensor, NullSpace]:
        beta1, beta2 = self.betas
        k = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        m_hat = m / (1.0 - beta1**k)
        inv_sqrt_h = (v / (1.0 - beta2**k) + self.eps).sqrt_().rsqrt_()  # H^{-1/2}
        plain = self._factorize(jacobian)  # J itself: diagnostics, re-projection with mixed group lrs
        scaled = NullSpace.from_jacobian(plain.jacobian * inv_sqrt_h, self.rcond)
        pinv_c, projected, Jq = scaled.normal_and_projection(c, inv_sqrt_h * m_hat)
        diagnostics["multiplier"] = scaled.solve_gram(c - Jq)  # y of the KKT system
        normal = -inv_sqrt_h * pinv_c
        tangential = -inv_sqrt_h * projected
        return normal, tangential, plain
