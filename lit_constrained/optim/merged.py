r"""The merged composition of the projected step, :math:`\Delta x = T(a \tilde P w - s \tilde J^+ c)`
(:class:`MergedStepOptimizer`; the math: :mod:`~lit_constrained.optim.constrained`), from a subclass's
tangential direction w."""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor

from .constrained import ConstrainedOptimizer
from .projection import NormalDirection, Projection, Projector, mixed_lr_step
from .safeguard import normal_step_scale
from .step_inputs import Composed, StepInputs


class MergedStepOptimizer(ConstrainedOptimizer):
    r"""A :class:`ConstrainedOptimizer` whose step is the merged one,
    :math:`\Delta x = T(a \tilde P w - s \tilde J^+ c)`: a subclass supplies its tangential direction w
    (``_tangent``), and for a scaled projection Jacobian ``_to_x`` and ``_normal_direction``."""

    @abstractmethod
    def _tangent(self, projection: Projection, g: Tensor, state: dict[str, Any],
                 diagnostics: dict[str, Tensor] | None) -> Tensor:
        """Update the state; return w (projection variables, working dtype; may be a workspace)."""

    def _normal_direction(self, projection: Projection, c: Tensor, step_scale: float | None) -> NormalDirection:
        """||T(J~^+ c)||: free for T = identity (c^T G~^+ c). ``step_scale`` = a (all groups share one lr)
        or None: a hook that makes a pass over J~ may form the tangential part with it
        (:class:`~lit_constrained.optim.projection.NormalDirection`)."""
        return NormalDirection(projection.factor.pinv_norm_sq(c).sqrt())

    def _compose(self, projection: Projection, projector: Projector, inputs: StepInputs,
                 record: dict[str, Tensor] | None) -> Composed:
        """Delta x = T(a P~ w - s J~^+ c) (:mod:`~lit_constrained.optim.projection`) with the safeguarded
        s, w from ``_tangent``; groups with different lrs scale their blocks of the tangential part."""
        tangent = inputs.tangent_projection or projection
        w = self._tangent(tangent, inputs.g, inputs.state, record)
        projection.tangent_scale = tangent.tangent_scale
        c, m = inputs.c, inputs.m
        rho = self.rho
        lrs = [float(group["lr"]) for group in self.param_groups]
        lr = lrs[0]
        uniform = all(rate == lr for rate in lrs)
        a = lr * projection.tangent_scale
        delta = self._vector("delta", inputs.g)
        if inputs.inequalities is not None:
            return self._compose_with_inequalities(projection, projector, inputs, w, a, delta)
        if m == 0:  # no constraints: the unprojected direction, scaled by each group's lr
            if uniform:
                torch.mul(w, a, out=delta)
            else:
                for group, block in self._group_blocks():
                    torch.mul(w[block], float(group["lr"]) * projection.tangent_scale, out=delta[block])
            return Composed(delta, None, torch.zeros((), dtype=torch.float64, device=delta.device))
        if not uniform and rho != "full":  # each block's normal part scaled by its own lr * rho
            normal = self._mixed_lr_parts(projection, projector, w, c, delta)
            lr_rho = torch.cat([torch.full((block.stop - block.start,), float(group["lr"]) * float(rho),
                                           dtype=delta.dtype, device=delta.device)
                                for group, block in self._group_blocks()])
            delta.addcmul_(lr_rho, normal)
            return Composed(delta, None, torch.full((), math.nan, dtype=torch.float64, device=delta.device))
        s = 1.0 if rho == "full" else lr * float(rho)
        direction = self._normal_direction(projection, c, a if uniform else None)
        first = self.param_groups[0]
        scale, normal_norm = normal_step_scale(first["max_normal_step"], rho, s, direction.norm, c,
                                               projection.factor, lambda: _norm(inputs.reals), inputs.state)
        sc = scale * c
        if not uniform:  # rho = "full": the normal part unscaled, the tangential part per block
            delta.add_(self._mixed_lr_parts(projection, projector, w, c, delta) * scale.to(delta.dtype))
            return Composed(delta, scale, normal_norm)
        if direction.direction is None:
            projector.merged(w, a, sc, delta)
        else:  # -J~^+ c was formed for the safeguard's norm: reuse it, a P~ w + s (-J~^+ c), then refine
            if direction.tangent is None:
                projector.unrefined(w, a, delta)
            else:  # -J~^T G~^+ (a J~ w) came from the same pass: a P~ w = a w + tangent
                torch.add(direction.tangent, w, alpha=a, out=delta)
            delta.addcmul_(direction.direction, scale.to(delta.dtype))
            projector.refine(delta, sc)
        self._to_x(projection, delta)
        return Composed(delta, scale, normal_norm)

    def _compose_with_inequalities(self, projection: Projection, projector: Projector, inputs: StepInputs,
                                   w: Tensor, a: float, delta: Tensor) -> Composed:
        """The merged step with inequality rows (one lr in all groups: checked in ``_inequality_inputs``): the equality rows' safeguarded scale s tau as in the equality step, the
        inequality rows at the fraction tau of their full normal step."""
        c, rho = inputs.c, self.rho
        lr = float(self.param_groups[0]["lr"])
        if inputs.m:
            s = 1.0 if rho == "full" else lr * float(rho)
            direction = self._normal_direction(projection, c, a)
            scale, normal_norm = normal_step_scale(self.param_groups[0]["max_normal_step"], rho, s, direction.norm,
                                                   c, projection.factor, lambda: _norm(inputs.reals), inputs.state)
            fraction = scale / s if s > 0 else torch.ones((), dtype=torch.float64, device=c.device)
        else:
            scale = fraction = torch.ones((), dtype=torch.float64, device=c.device)
            normal_norm = torch.zeros((), dtype=torch.float64, device=c.device)
        imposed, active = self._with_inequalities(projector, inputs, w, a, scale * c, fraction, delta)
        self._to_x(projection, delta)
        return Composed(delta, scale, normal_norm, imposed, active)

    def _mixed_lr_parts(self, projection: Projection, projector: Projector, w: Tensor, c: Tensor, delta: Tensor
                        ) -> Tensor:
        """Groups with different lrs: delta = P(diag(lr) T(a P~ w)) (a = tangent_scale); returns the
        normal direction T(-J~^+ c) for the caller to scale (per block or by s)."""
        tangent = self._to_x(projection, projector.project(w, torch.empty_like(w), projection.tangent_scale))
        block_lrs = [(float(group["lr"]), block) for group, block in self._group_blocks()]
        mixed_lr_step(projector, tangent, block_lrs, self.param_groups[0]["rcond"], delta)
        return self._to_x(projection, projector.normal(c, torch.empty_like(w)))


def _norm(tensors: list[Tensor]) -> Tensor:
    """||x|| over the tensors (0-dim float64; step() runs under no_grad)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)).to(torch.float64))
