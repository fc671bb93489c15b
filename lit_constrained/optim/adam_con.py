r"""Adam(con): the projection-less hard-constrained Adam baseline (Márquez-Neila et al., 2017)."""

from __future__ import annotations

from typing import Any

import torch

from .checks import check_betas, check_positive
from .constrained import ConstrainedOptimizer, FlatInputs, ParamsT
from .functional import ProjectedStep, adam_con
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
    rank-revealing factorization (:mod:`~lit_constrained.optim.linalg`) of :math:`\hat J`. It is
    never formed: its Gram :math:`J H^{-1} J^T` scales a cache-sized chunk of J's columns at a time, and
    its products are :math:`J (H^{-1/2} v)` and :math:`H^{-1/2} (J^T z)` (one read of J each). The
    normal component :math:`-H^{-1/2}\hat J^+ c` satisfies :math:`J(\cdot) = -c`;
    ``rho`` scales it (the paper's method is ``rho=1``), and ``rho="full"`` takes it unscaled by the lr,
    so the linearized constraints are restored in one step.

    Args:
        params: parameters or parameter groups.
        lr: step size.
        betas: Adam's :math:`(\beta_1, \beta_2)`, per group.
        eps: added inside the square root of H, per group.
{projection_args}
    (``rho=1.0`` is the published method; ``rcond`` cuts the singular values of :math:`\hat J`.)
    """

    vector_keys = ("exp_avg", "exp_avg_sq")

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
        constraint_tol: float = DEFAULT_CONSTRAINT_TOL,
        max_corrections: int = DEFAULT_MAX_CORRECTIONS,
    ) -> None:
        super().__init__(
            params,
            {"lr": lr, "betas": tuple(betas), "eps": eps, "rho": rho, "rcond": rcond,
             "max_normal_step": max_normal_step, "precision": precision,
             "constraint_tol": constraint_tol, "max_corrections": max_corrections},
        )

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        check_betas(group["betas"])
        check_positive("eps", group["eps"])

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        zeros = torch.zeros(n, dtype=dtype, device=device)
        return {"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}

    def _step_function(self, inputs: FlatInputs, state: dict[str, Any], diagnostics: bool) -> ProjectedStep:
        return adam_con(inputs.reals, inputs.g, inputs.c, inputs.jacobian, state, groups=self._group_blocks(),
                        workspace=self._workspace, diagnostics=diagnostics, owner=type(self).__name__)
