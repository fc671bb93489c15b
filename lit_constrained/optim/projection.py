r"""The projected step's kernel: what an optimizer hands over (:class:`Projection`), the step's
factorization with its refinement (:class:`Projector`), and the composition of the step.

For a tangential direction w in the variables of a projection Jacobian :math:`\tilde J` (J itself, or
:math:`J D`, D = diag(d), never formed: ``Projection.scaling``) with the map T back to x (identity, or
D), the step is

.. math::
    \Delta x = T\big(a \tilde P w - s \tilde J^+ c\big) = T\big(a w - \tilde J^T z\big),
    \qquad z = \tilde G^+ (s c + a \tilde J w)

(:func:`~lit_constrained.optim.linalg.merged_step.merged_step`), :math:`\tilde G = \tilde J \tilde J^T`,
:math:`\tilde P` the projector on its null space, s the (safeguarded) normal-step scale. Groups with
different lrs (:func:`mixed_lr_step`) project :math:`\mathrm{diag}(\alpha) T \tilde P w` again on the null
space of J, so it still leaves the linearized constraints unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .linalg.gram_factor import GramFactor
from .linalg.merged_step import merged_step
from .linalg.nullspace import NullSpace
from .linalg.products import Scaling
from .linalg.refinement import RefinementPlan, refine_


@dataclass(frozen=True)
class Projection:
    """What a step's factorization hands the kernel before any state changes (immutable: the host read
    returns a new one where it replaces the factor by the exact one).

    Attributes:
        jacobian: J in the working dtype.
        factor: the factorization of the projection Jacobian's Gram matrix (J J^T, or J D^2 J^T).
        finite: 0-dim bool, False when the inputs (J, g, ...) hold NaN/inf (checked on m x m data).
        constraints: c (float64).
        scaling: d when the projection Jacobian is J diag(d) (Adam(con): d = H^{-1/2}); None: J itself.
        tangent_scale: a scalar multiplying w (folded into the merged step: no pass over w; Adam(con)'s
            -1 / (1 - beta1^k)).
        gradient_product: J g (float64; the SQP methods' P g), or None.
        direction: w when it is formed before the factorization (Adam(con)), else None.
        direction_product: J~ w (float64) from the Gram's pass, or None.
    """

    jacobian: Tensor
    factor: GramFactor
    finite: Tensor
    constraints: Tensor
    scaling: Tensor | None = None
    tangent_scale: float = 1.0
    gradient_product: Tensor | None = None
    direction: Tensor | None = None
    direction_product: Tensor | None = None


@dataclass(frozen=True)
class NormalDirection:
    """||T J~^+ c|| (0-dim float64) and, where forming it took a pass over J (Adam(con)), the directions
    that pass produced: ``direction`` = -J~^+ c and ``tangent`` = -J~^T G~^+ (a J~ w) (projection
    variables; None when not formed)."""

    norm: Tensor
    direction: Tensor | None = None
    tangent: Tensor | None = None


@dataclass(frozen=True)
class Projector:
    """The step's factorization with its refinement plan and workspaces: the products the kernel and the
    post-step corrections apply (each :math:`J\\,out = -U_r U_r^T (sc)` refined per ``plan``)."""

    jacobian: Tensor
    factor: GramFactor
    plan: RefinementPlan
    scaling: Scaling | None = None
    workspace: tuple[Tensor, Tensor] | None = None
    """float64 scratch of the exact residuals (only with ``plan.exact_residual`` and refinements)."""
    scratch: Tensor | None = None
    """an n-vector for the exact refinement's corrections of the unscaled J (see ``refine_``)."""

    def merged(self, w: Tensor | None, a: float, sc: Tensor, out: Tensor, multipliers: Tensor | None = None
               ) -> Tensor:
        """out = a P~ w - J~^+ (sc), refined (``w=None``: the normal step alone); ``multipliers`` receives
        the rows' multipliers z (see ``merged_step``)."""
        return merged_step(self.jacobian, self.factor, w, a, sc, self.plan.steps, out, self.workspace,
                           self.scaling, self.plan.exact_residual, self.scratch, multipliers)

    def unrefined(self, w: Tensor, a: float, out: Tensor) -> Tensor:
        """out = a P~ w without refinement (the caller adds a normal part and refines the sum)."""
        zeros = torch.zeros(self.jacobian.shape[0], dtype=torch.float64, device=w.device)
        return merged_step(self.jacobian, self.factor, w, a, zeros, 0, out, scaling=self.scaling)

    def refine(self, out: Tensor, sc: Tensor) -> Tensor:
        """The plan's refinement of an ``out`` formed by other means toward J~ out = -U_r U_r^T (sc)."""
        return refine_(self.jacobian, self.factor, out, sc, self.plan.steps, self.workspace, self.scaling,
                       self.plan.exact_residual, self.scratch)

    def normal(self, sc: Tensor, out: Tensor) -> Tensor:
        """out = -J~^+ (sc)."""
        return self.merged(None, 0.0, sc, out)

    def project(self, w: Tensor, out: Tensor, a: float = 1.0) -> Tensor:
        """out = a P~ w."""
        zeros = torch.zeros(self.jacobian.shape[0], dtype=torch.float64, device=w.device)
        return self.merged(w, a, zeros, out)


def mixed_lr_step(projector: Projector, t: Tensor, lrs: list[tuple[float, slice]], rcond: float, out: Tensor
                  ) -> Tensor:
    """out = P(diag(lr) t) for a tangential direction t in x (already projected, T(P~ w)): the groups'
    lrs scale their blocks and the result is projected again on the null space of J itself."""
    for lr, block in lrs:
        t[block].mul_(lr)
    plain = NullSpace.from_jacobian(projector.jacobian, rcond)
    zeros = torch.zeros(projector.jacobian.shape[0], dtype=torch.float64, device=t.device)
    return merged_step(projector.jacobian, plain.factor, t, 1.0, zeros, plain.refine, out)
