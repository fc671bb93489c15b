r"""Adam(con): the projection-less hard-constrained Adam baseline (Márquez-Neila et al., 2017)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checks import check_betas, check_positive
from .constrained import ParamsT, Projection
from .merged import MergedStepOptimizer
from .linalg.gram_factor import GramFactor
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
from .linalg.merged_step import merged_step
from .projection import NormalDirection


@document_projection_args
class AdamCon(MergedStepOptimizer):
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

    def _prepare(self, g: Tensor, jacobian: Tensor, c: Tensor, state: dict[str, Any]) -> Projection:
        # the new moments go to spare buffers (swapped into the state in _tangent, after the checks)
        k = state["step"] + 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        shape, dtype, device = tuple(m.shape), m.dtype, m.device
        m_new = self._buffer("exp_avg_next", shape, dtype, device)
        v_new = self._buffer("exp_avg_sq_next", shape, dtype, device)
        inv_sqrt_h = self._buffer("inverse_sqrt_scaling", shape, dtype, device)
        w = self._buffer("direction", shape, dtype, device)
        blocks = self._group_blocks()
        scales = []
        for group, block in blocks:
            beta1, beta2 = (float(b) for b in group["betas"])
            torch.lerp(m[block], g[block], 1.0 - beta1, out=m_new[block])
            torch.mul(v[block], beta2, out=v_new[block]).addcmul_(g[block], g[block], value=1.0 - beta2)
            # H^{-1/2} = (v_hat + eps)^{-1/4}
            torch.div(v_new[block], 1.0 - beta2**k, out=inv_sqrt_h[block]).add_(float(group["eps"]))
            inv_sqrt_h[block].sqrt_().rsqrt_()
            # w = -H^{-1/2} m_hat: the tangential direction in the scaled variable z = H^{1/2} d; the scalar
            # -1 / (1 - beta1^k) is folded into the merged step when the groups share it
            torch.mul(m_new[block], inv_sqrt_h[block], out=w[block])
            scales.append(-1.0 / (1.0 - beta1**k))
        tangent_scale = 1.0
        if all(scale == scales[0] for scale in scales):
            tangent_scale = scales[0]
        else:
            for scale, (_, block) in zip(scales, blocks):
                w[block].mul_(scale)
        # the Gram of J~ = J H^{-1/2} (never formed; NaN/inf in g or J shows in it) and J~ w from its pass
        factor, finite, Jw = self._scaled_factorize(jacobian, inv_sqrt_h, w)
        return Projection(jacobian, factor, finite, c, scaling=inv_sqrt_h, tangent_scale=tangent_scale,
                          direction=w, direction_product=Jw)

    def _tangent(self, projection: Projection, g: Tensor, state: dict[str, Any],
                 diagnostics: dict[str, Tensor] | None) -> Tensor:
        for key in ("exp_avg", "exp_avg_sq"):  # commit the new moments (swap with the spare buffers)
            state[key], self._buffers[key + "_next"] = self._buffers[key + "_next"], state[key]
        if diagnostics is not None and projection.jacobian.shape[0]:  # y of the KKT system
            Jw = projection.tangent_scale * projection.direction_product
            diagnostics["multiplier_norm"] = projection.factor.solve(projection.constraints + Jw).norm()
        return projection.direction

    def _to_x(self, projection: Projection, step: Tensor) -> Tensor:
        return step.mul_(projection.scaling)  # d = H^{-1/2} z

    def _normal_direction(self, projection: Projection, c: Tensor, step_scale: float | None) -> NormalDirection:
        r"""||H^{-1/2} J~^+ c||: a pass over J (the scaling breaks the free identity of the SQP methods).
        The direction -J~^+ c is kept for the step itself, and when the groups share one lr (``step_scale``
        = a) the same pass forms the tangential part :math:`-\tilde J^T \tilde G^+ (a \tilde J w)`: one
        product :math:`H^{-1/2} (Y^T J)^T` with two columns in Y costs one read of J, like one of them."""
        J, factor = projection.jacobian, projection.factor
        n, dtype = J.shape[1], J.dtype
        d, scratch = self._scaling(projection)
        tangent = None
        if step_scale is None:
            direction = self._buffer("normal_direction", (n,), dtype, J.device)
            merged_step(J, factor, None, 0.0, c, 0, direction, scaling=(d, scratch))
        else:
            rhs = torch.stack([c, step_scale * projection.direction_product], dim=1)
            coefficients = factor.solve(rhs).T.neg().to(dtype)
            directions = self._buffer("directions", (2, n), dtype, J.device)
            torch.mm(coefficients, J, out=directions).mul_(d)  # -J~^T G~^+ [c, a J~ w] = -d (J^T ...)
            direction, tangent = directions[0], directions[1]
        norm = torch.mul(direction, d, out=scratch).norm().to(torch.float64)
        return NormalDirection(norm, direction, tangent)

    def _diagnostic_factor(self, projection: Projection, jacobian: Tensor) -> GramFactor:
        return self._factorize(jacobian)[0]  # the rank of J itself (diagnostic steps only)
