"""The factorization object of the public API (:class:`NullSpace`): the null-space projector P and the
pseudo-inverse J^+ of a constraint Jacobian J, with the optimizers' refinement."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..hyperparameters import DEFAULT_RCOND
from .gram import exact_gram, gram
from .gram_factor import GramFactor
from .merged_step import merged_step
from .refinement import RefinementPlan, exact_refinements, refinement_counts

@dataclass
class NullSpace:
    """A factorization of J that applies the null-space projector and the pseudo-inverse.

    Attributes:
        jacobian: J (any float dtype), shape (m, n).
        factor: the :class:`GramFactor` of J J^T.
        refine: the number of refinement steps the projections apply (from :class:`RefinementPlan`).
        exact_residual: whether their residuals need float64 products (:func:`exact_residual_needed`).
    """

    jacobian: Tensor
    factor: GramFactor
    refine: int = 0
    exact_residual: bool = True

    @classmethod
    def from_jacobian(cls, jacobian: Tensor, rcond: float = DEFAULT_RCOND) -> "NullSpace":
        """Factorize J (host-side refinement decision: one sync; the optimizers decide in their step). J is
        detached: the factorization (a rank cutoff) carries no autograd graph."""
        jacobian = jacobian.detach()
        m, n = jacobian.shape
        if m == 0:
            return cls(jacobian, GramFactor.empty(jacobian.device), 0)
        factor = GramFactor.from_gram(gram(jacobian), rcond)
        plan = RefinementPlan.decode(tuple(refinement_counts(factor, n, jacobian.dtype).tolist()), m)
        if plan.exact_gram:
            factor = GramFactor.from_gram(exact_gram(jacobian), rcond)
            return cls(jacobian, factor, exact_refinements(factor, jacobian.dtype), True)
        return cls(jacobian, factor, plan.steps, plan.exact_residual)

    @property
    def rank(self) -> int:
        return int(self.factor.rank)

    @property
    def smallest_singular_value(self) -> float:
        return float(self.factor.smallest_singular_value)

    def solve_gram(self, b: Tensor) -> Tensor:
        """G^+ b for b of shape (m,) or (m, k)."""
        return self.factor.solve(b)

    def project(self, w: Tensor) -> Tensor:
        """P w (a new tensor in J's dtype)."""
        if self.jacobian.shape[0] == 0:
            return w.clone()
        sc = torch.zeros(self.jacobian.shape[0], dtype=torch.float64, device=w.device)
        out = torch.empty_like(w, dtype=self.jacobian.dtype)
        return merged_step(self.jacobian, self.factor, w.to(self.jacobian.dtype), 1.0, sc, self.refine, out,
                           exact=self.exact_residual)

    def pseudo_solve(self, c: Tensor) -> Tensor:
        """J^+ c: the minimum-norm least-squares x of J x = c."""
        J = self.jacobian
        out = torch.empty(J.shape[1], dtype=J.dtype, device=J.device)
        if J.shape[0] == 0:
            return out.zero_()
        return merged_step(J, self.factor, None, 0.0, -c.to(torch.float64), self.refine, out,
                           exact=self.exact_residual)
