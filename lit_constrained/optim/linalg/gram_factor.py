r"""The pseudo-inverse of the Gram matrix G = J J^T (m x m, float64) with a relative rank cutoff.

With :math:`G = U \Lambda U^T` (an eigendecomposition: the left singular vectors and squared singular
values of J), the numerical rank keeps the eigenvalues with :math:`\lambda_i > \mathrm{rcond}^2
\lambda_{\max}` (a relative cutoff on the singular values, never an absolute shift) and
:math:`G^+ = U \mathrm{diag}(\mathrm{keep}/\lambda) U^T` (:class:`GramFactor`; the cutoff is a mask, so
no host sync and no data-dependent shapes). Two backends of the same factor:

* ``torch.linalg.eigh`` on the Gram's device (GPU, or a CPU Gram of order at most ``EIGH_MAX_SIZE``);
* a CPU Gram larger than that: LAPACK's rank-revealing pivoted Cholesky factorization
  (:class:`PivotedGramFactor`, :mod:`~lit_constrained.optim.linalg.pivoted_cholesky`), the same cutoff on the
  singular values of J at :math:`m^3/3` flops instead of eigh's :math:`\sim 9 m^3` (docs/optim_measurements.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..hyperparameters import DEFAULT_RCOND
from .pivoted_cholesky import HostCholesky

EIGH_MAX_SIZE = 64
"""The largest m whose CPU Gram matrix is factored by ``eigh``; a larger one is factored by the pivoted
Cholesky factorization (below it the m x m algebra costs microseconds either way; the measured costs:
docs/optim_measurements.md, large m, and "At scale")."""


@dataclass
class GramFactor:
    """The pseudo-inverse of G = J J^T by an eigendecomposition, with a relative cutoff as a mask.

    Attributes (all tensors, float64 unless said):
        basis: U, all eigenvectors of G, shape (m, m).
        inverse: keep_i / lambda_i, 0 for the dropped eigenvalues, shape (m,).
        keep: the kept eigenvalues (bool), shape (m,).
        kept_min: the smallest kept eigenvalue (0-dim; lambda_max when nothing is kept).
        condition: lambda_max / lambda_min of the kept eigenvalues (0-dim; 1 when r = 0).
        exact: G was formed from float64 products (``gram.exact_gram``): the refinement plan of the
            blocked Gram does not apply to it.
    ``rank`` and ``smallest_singular_value`` (diagnostics) are computed when read.
    """

    basis: Tensor
    inverse: Tensor
    keep: Tensor
    kept_min: Tensor
    condition: Tensor
    exact: bool = False

    @classmethod
    def from_gram(cls, G: Tensor, rcond: float = DEFAULT_RCOND, exact: bool = False) -> "GramFactor":
        """Factor G (float64, symmetric): ``eigh``, or the pivoted Cholesky factorization for a CPU G
        larger than ``EIGH_MAX_SIZE``. ``exact``: G is from float64 products."""
        if G.device.type == "cpu" and G.shape[0] > EIGH_MAX_SIZE:
            return PivotedGramFactor.from_gram(G, rcond, exact)
        return cls.from_eigh(G, rcond, exact)

    @classmethod
    def from_eigh(cls, G: Tensor, rcond: float = DEFAULT_RCOND, exact: bool = False) -> "GramFactor":
        """Factor G by ``torch.linalg.eigh`` whatever its size and device."""
        eigenvalues, basis = torch.linalg.eigh(G)
        largest = eigenvalues[-1]
        # (when largest <= 0 nothing is kept: every eigenvalue is <= largest <= 0 = the cutoff)
        keep = eigenvalues > (rcond**2) * largest.clamp_min(0.0)
        inverse = torch.where(keep, eigenvalues.reciprocal(), 0.0)
        kept_min = torch.where(keep, eigenvalues, largest).min()
        # nothing kept: kept_min = largest, so the ratio is 1, or 0/0 for G = 0
        condition = (largest / kept_min).nan_to_num(nan=1.0)
        return cls(basis, inverse, keep, kept_min, condition, exact)

    @classmethod
    def empty(cls, device: torch.device | None = None) -> "GramFactor":
        z = torch.zeros(0, dtype=torch.float64, device=device)
        scalar = torch.zeros((), dtype=torch.float64, device=device)
        return cls(z.reshape(0, 0), z, z.bool(), scalar, scalar + 1.0)

    @property
    def size(self) -> int:
        """m, the order of G."""
        return self.basis.shape[0]

    @property
    def rank(self) -> Tensor:
        """The numerical rank r of J (0-dim, int64)."""
        return self.keep.sum()

    @property
    def smallest_singular_value(self) -> Tensor:
        """The smallest kept singular value of J (0-dim; 0 when r = 0)."""
        return self.kept_min.clamp_min(0.0).sqrt()

    def solve(self, b: Tensor) -> Tensor:
        """G^+ b for b of shape (m,) or (m, k)."""
        U = self.basis
        weights = self.inverse if b.dim() == 1 else self.inverse[:, None]
        return U @ (weights * (U.T @ b))

    def range_part(self, c: Tensor) -> Tensor:
        """U_r U_r^T c: the part of c that J can reach (c itself when J has full row rank)."""
        U = self.basis
        weights = self.keep.to(c.dtype) if c.dim() == 1 else self.keep.to(c.dtype)[:, None]
        return U @ (weights * (U.T @ c))

    def pinv_norm_sq(self, c: Tensor) -> Tensor:
        """||J^+ c||^2 = c^T G^+ c (no pass over J)."""
        return (self.inverse * (self.basis.T @ c) ** 2).sum()


@dataclass
class PivotedGramFactor(GramFactor):
    """A :class:`GramFactor` of a CPU Gram by LAPACK's pivoted Cholesky factorization
    (:class:`~lit_constrained.optim.linalg.pivoted_cholesky.HostCholesky`, NumPy float64): no eigenvector basis
    (``basis``, ``inverse`` and ``keep`` are None); its methods take and return CPU tensors."""

    cholesky: HostCholesky | None = None

    @classmethod
    def from_gram(cls, G: Tensor, rcond: float = DEFAULT_RCOND, exact: bool = False) -> "PivotedGramFactor":
        chol = HostCholesky.factor(G.numpy(), rcond)
        return cls(None, None, None, _scalar(chol.kept_min), _scalar(chol.condition), exact, chol)

    @property
    def size(self) -> int:
        return self.cholesky.order.shape[0]

    @property
    def rank(self) -> Tensor:
        return torch.tensor(self.cholesky.rank)

    def solve(self, b: Tensor) -> Tensor:
        return torch.from_numpy(self.cholesky.solve(b.numpy()))

    def range_part(self, c: Tensor) -> Tensor:
        return torch.from_numpy(self.cholesky.range_part(c.numpy()))

    def pinv_norm_sq(self, c: Tensor) -> Tensor:
        return _scalar(self.cholesky.pinv_norm_sq(c.numpy()))


def _scalar(value: float) -> Tensor:
    """A 0-dim float64 CPU tensor (from a NumPy scalar: cheaper than ``torch.tensor``)."""
    return torch.from_numpy(np.asarray(value, dtype=np.float64))
