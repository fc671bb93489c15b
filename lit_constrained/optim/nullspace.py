r"""Rank-revealing null-space linear algebra for a constraint Jacobian J (m x n, m small).

Everything here works in float64 (``J J^T`` squares the condition number).

With the Gram matrix :math:`G = J J^T = U \Lambda U^T` (an eigendecomposition: the left singular
vectors and squared singular values of J), the numerical rank r keeps the eigenvalues with
:math:`\lambda_i > \mathrm{rcond}^2 \lambda_{\max}` (a relative cutoff on the singular values, never an
absolute shift), and :math:`G^+ = U_r \Lambda_r^{-1} U_r^T`. Then

.. math::
    P w = w - J^T G^+ J w, \qquad J^+ c = J^T G^+ c,

P the orthogonal projector on the numerical null space of J and :math:`J^+ c` the minimum-norm
least-squares solution of :math:`J x = c`. One step of iterative refinement (re-applying the correction
to the residual ``J P w`` or ``U_r U_r^T c - J x``) removes the error of the normal equations, so the
result is as accurate as a QR of :math:`J^T` for the condition numbers met in training (the Gram
approach costs one GEMM plus a few matrix-vector products with J, several times less than a
Householder QR of an n x m matrix on a CPU). The unrefined error is about
:math:`\epsilon_{64}\,\kappa(G)`; refinement is skipped when :math:`\kappa(G) = \lambda_{\max}/\lambda_{\min}`
of the kept eigenvalues is at most ``REFINE_ABOVE_CONDITION`` (error below ~1e-13 without it), which
halves the passes over J for well-conditioned constraints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

DEFAULT_RCOND = 1e-7
"""Relative cutoff on the singular values of J: a float32 Jacobian carries ~1e-7 relative noise.
(The float64 Gram matrix resolves singular-value ratios down to ~1e-8: a smaller rcond is not meaningful.)"""

REFINE_ABOVE_CONDITION = 1e3
"""Iterative refinement is applied when the condition number of the kept part of J J^T exceeds this."""


@dataclass
class NullSpace:
    """A factorization of J that applies the null-space projector and the pseudo-inverse.

    Attributes:
        jacobian: J in float64, shape (m, n).
        basis: U_r, the kept eigenvectors of J J^T, shape (m, r).
        inverse_eigenvalues: 1 / lambda_i for the kept eigenvalues, shape (r,).
        rank: r, the numerical rank of J.
        smallest_singular_value: the smallest kept singular value of J (0.0 when r = 0).
        refine: whether the projections apply one step of iterative refinement.
    """

    jacobian: Tensor
    basis: Tensor
    inverse_eigenvalues: Tensor
    rank: int
    smallest_singular_value: float
    refine: bool = True

    @classmethod
    def from_jacobian(cls, jacobian: Tensor, rcond: float = DEFAULT_RCOND, workspace: Tensor | None = None) -> "NullSpace":
        """Factorize J (any float dtype; it is used in float64).

        ``workspace``: an optional float64 buffer of J's shape to convert into (a large fresh
        allocation per step costs page faults on a CPU: reuse one).
        """
        if jacobian.dtype == torch.float64:
            J = jacobian
        elif workspace is not None and workspace.shape == jacobian.shape and workspace.device == jacobian.device:
            J = workspace.copy_(jacobian)
        else:
            J = jacobian.to(torch.float64)
        m = J.shape[0]
        if m == 0:
            empty = J.new_zeros(0, 0)
            return cls(J, empty, J.new_zeros(0), 0, 0.0, False)
        gram = J @ J.T
        gram = 0.5 * (gram + gram.T)
        eigenvalues, eigenvectors = torch.linalg.eigh(gram)
        largest = eigenvalues[-1].clamp_min(0.0)
        keep = eigenvalues > (rcond**2) * largest
        if largest <= 0:
            keep = torch.zeros_like(keep)
        basis = eigenvectors[:, keep]
        kept = eigenvalues[keep]
        rank = int(kept.numel())
        smallest = float(kept[0].sqrt()) if rank else 0.0
        refine = rank > 0 and float(kept[-1] / kept[0]) > REFINE_ABOVE_CONDITION
        return cls(J, basis, 1.0 / kept, rank, smallest, refine)

    def solve_gram(self, b: Tensor) -> Tensor:
        """G^+ b for b of shape (m,) or (m, k)."""
        U = self.basis
        if b.dim() == 1:
            return U @ (self.inverse_eigenvalues * (U.T @ b))
        return U @ (self.inverse_eigenvalues[:, None] * (U.T @ b))

    def range_part(self, c: Tensor) -> Tensor:
        """U_r U_r^T c: the part of c that J can reach (c itself when J has full row rank)."""
        return self.basis @ (self.basis.T @ c)

    def project(self, w: Tensor) -> Tensor:
        """P w for w of shape (n,) or (n, k), with one refinement step."""
        if self.rank == 0:
            return w.clone()
        J = self.jacobian
        p = w - J.T @ self.solve_gram(J @ w)
        if not self.refine:
            return p
        return p - J.T @ self.solve_gram(J @ p)

    def pseudo_solve(self, c: Tensor) -> Tensor:
        """J^+ c: the minimum-norm least-squares x of J x = c, with one refinement step."""
        J = self.jacobian
        if self.rank == 0:
            return J.new_zeros(J.shape[1])
        x = J.T @ self.solve_gram(c)
        if not self.refine:
            return x
        return x + J.T @ self.solve_gram(self.range_part(c) - J @ x)

    def normal_and_projection(self, c: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(J^+ c, P w, J w) together, sharing the passes over J (J w is a by-product)."""
        J = self.jacobian
        Jw = J @ w
        if self.rank == 0:
            return J.new_zeros(J.shape[1]), w.clone(), Jw
        correction = J.T @ self.solve_gram(torch.stack([c, Jw], dim=1))
        x = correction[:, 0]
        p = w - correction[:, 1]
        if not self.refine:
            return x, p, Jw
        residual = torch.stack([self.range_part(c), torch.zeros_like(c)], dim=1) - J @ torch.stack([x, p], dim=1)
        refine = J.T @ self.solve_gram(residual)
        return x + refine[:, 0], p + refine[:, 1], Jw
