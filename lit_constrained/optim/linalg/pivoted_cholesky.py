r"""The pseudo-inverse of a large Gram matrix G = J J^T (m x m, float64) by a pivoted Cholesky factorization.

For m in the hundreds to thousands an eigendecomposition of G costs :math:`\sim 9 m^3` flops, a Cholesky
factorization :math:`m^3/3` (measured costs: docs/optim_measurements.md, large m). LAPACK's pivoted Cholesky (``dpstrf``, Higham's algorithm 10.3) costs the same as the plain one and is
rank-revealing: with a permutation :math:`\Pi`,

.. math::
    \Pi^T G \Pi = L L^T + S, \qquad L \in \mathbb{R}^{m \times r} \text{ lower trapezoidal},

stopping when every diagonal entry of the Schur complement S is at most :math:`\text{tol}`; the dropped
part then has :math:`\|S\|_2 \le \mathrm{tr}\,S \le (m - r)\,\text{tol}`. With
``tol = rcond^2 * max(diag G)`` (the relative cutoff on the singular values of J, as the eigenvalue
cutoff of :class:`~lit_constrained.optim.linalg.gram_factor.GramFactor` keeps :math:`\lambda_i > \mathrm{rcond}^2
\lambda_{\max}`), the kept factor is the numerical range of J, and

* full rank (r = m): :math:`G^{-1} b = \Pi L^{-T} L^{-1} \Pi^T b` (two triangular solves);
* rank r < m: with the eigendecomposition :math:`L^T L = V \Lambda V^T` (r x r), the k singular values of L
  above the cutoff kept (:math:`\lambda_i > \mathrm{rcond}^2 \lambda_1`) and the thin QR factorization
  :math:`L V_k = Q R` (Q: m x k orthonormal, R: k x k), :math:`(L V_k V_k^T L^T)^+ = Q (R R^T)^{-1} Q^T`, so

.. math::
    G^+ b = \Pi Q R^{-T} R^{-1} Q^T \Pi^T b, \qquad U_r U_r^T b = \Pi Q Q^T \Pi^T b, \qquad
    b^T G^+ b = \|R^{-1} Q^T \Pi^T b\|^2

(the minimum-norm least-squares solution of the normal equations, as the eigendecomposition gives; the
products and the QR cost :math:`O(m r^2)`, the eigendecomposition :math:`O(r^3)`; the condition of the
kept part is then exact, :math:`\lambda_1 / \lambda_k`).

At full rank the condition number :math:`\kappa(G) = \lambda_{\max} / \lambda_{\min}` is estimated
by power iterations on G and on :math:`G^{-1}` (``POWER_ITERATIONS`` each, O(m^2) per iteration): within a
small factor of the value that the refinement plan of :mod:`~lit_constrained.optim.linalg` thresholds
(its thresholds are orders of magnitude apart). LAPACK's 1-norm estimator ``dtrcon`` on the triangular
factor was tried first: squared, it overestimated cond(G) by ~m (1 900 against 5 at m = 300).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.linalg import lapack, qr, solve_triangular

POWER_ITERATIONS = 10
"""Power iterations for each of lambda_max(G) and 1 / lambda_min (of the kept part): the condition
estimate and the smallest singular value of J, sqrt(lambda_max / kappa)."""


@dataclass
class HostCholesky:
    """A pivoted Cholesky factorization of G with its numerical rank, on the host (NumPy float64).

    Attributes:
        order: the permutation :math:`\\Pi` as indices (0-based): ``G[order][:, order] = L L^T + S``.
        lower: L (m x r) when the rank is full (r = m), else None.
        q, r_factor: the thin QR factors of L V_k when r < m (see the module docstring; else None).
        rank: r.
        condition: the estimate of :math:`\\kappa(G_r)` (1.0 when r = 0).
        largest: the estimate of :math:`\\lambda_{\\max}(G)` (0.0 for G = 0).
    """

    order: np.ndarray
    lower: np.ndarray | None
    q: np.ndarray | None
    r_factor: np.ndarray | None
    rank: int
    condition: float
    largest: float

    @classmethod
    def factor(cls, G: np.ndarray, rcond: float) -> "HostCholesky":
        """Factor a symmetric positive semi-definite float64 G with the cutoff ``rcond`` on the singular
        values of J (the cutoff on G's pivots is ``rcond**2 * max(diag G)``)."""
        m = G.shape[0]
        diagonal_max = float(G.diagonal().max()) if m else 0.0
        if not m or not diagonal_max > 0.0:  # G = 0 (or not positive): nothing is kept
            return cls(np.arange(m), None, None, None, 0, 1.0, max(diagonal_max, 0.0))
        factor, pivots, rank, info = lapack.dpstrf(G, lower=1, tol=(rcond**2) * diagonal_max)
        if info < 0:
            raise ValueError(f"dpstrf: illegal argument {-info}")
        order = pivots - 1
        rank = int(rank)
        columns = np.tril(factor[:, :rank])
        chol = cls(order, columns, None, None, rank, 1.0, 0.0)
        if rank < m:  # rank-deficient: the kept part from L's right singular vectors (exact condition)
            chol._keep_above_cutoff(columns, rcond)
            return chol
        chol.largest = _power_iteration(lambda x: G @ x, _start(G.diagonal()))
        inverse_largest = _power_iteration(chol.solve, _start(np.ones(m)))
        chol.condition = chol.largest * inverse_largest if inverse_largest > 0.0 else math.inf
        if chol.condition * rcond**2 > 1.0:  # full rank by the pivots, yet singular values below the cutoff
            chol._keep_above_cutoff(columns, rcond)
        return chol

    def _keep_above_cutoff(self, columns: np.ndarray, rcond: float) -> None:
        r"""The rank-deficient factor with the cutoff enforced exactly: the pivots' tolerance bounds the
        Schur complement, not the kept part's conditioning (chemistry at m = 1 000: rank 439 kept with cond
        ~1e16). With the eigendecomposition :math:`L^T L = V \Lambda V^T` (r x r: O(m r^2 + r^3)), the
        singular values of L are :math:`\sqrt{\lambda_i}`: keep :math:`\lambda_i > \mathrm{rcond}^2
        \lambda_1` and store the thin QR factors of :math:`L V_k = Q R`, so that :math:`L V_k (L V_k)^T` is
        the kept part of :math:`L L^T` and the rank-deficient formulas hold, with the exact condition and
        largest eigenvalue. (:math:`L^T L` has the conditioning of G itself, which the eigh factor of a small
        Gram works with too; a thin SVD of L costs 2-3x as much at m = 1 000.)"""
        eigenvalues, vectors = np.linalg.eigh(columns.T @ columns)  # ascending
        largest = float(eigenvalues[-1]) if eigenvalues.size else 0.0
        keep = eigenvalues > (rcond**2) * largest
        self.rank = int(np.count_nonzero(keep))  # >= 1: L has a positive pivot, so lambda_1 > 0 is kept
        self.lower = None
        self.q, self.r_factor = qr(columns @ vectors[:, keep], mode="economic", check_finite=False)
        self.largest = largest
        self.condition = largest / float(eigenvalues[keep][0])

    # --------------------------------------------------------------- the three products the step needs
    def _inner(self, b: np.ndarray) -> np.ndarray:
        """:math:`T^{-1} \\Pi^T b` restricted to the kept part (T = L, or R with Q^T applied first)."""
        permuted = b[self.order]
        if self.lower is not None:
            return solve_triangular(self.lower, permuted, lower=True, check_finite=False)
        return solve_triangular(self.r_factor, self.q.T @ permuted, lower=False, check_finite=False)

    def _outer(self, y: np.ndarray) -> np.ndarray:
        """:math:`\\Pi T^{-T} y` (with Q for the rank-deficient factor), back in G's order."""
        if self.lower is not None:
            permuted = solve_triangular(self.lower, y, lower=True, trans="T", check_finite=False)
        else:
            permuted = self.q @ solve_triangular(self.r_factor, y, lower=False, trans="T", check_finite=False)
        out = np.empty_like(permuted)
        out[self.order] = permuted
        return out

    def solve(self, b: np.ndarray) -> np.ndarray:
        """G^+ b for b of shape (m,) or (m, k)."""
        if self.rank == 0:
            return np.zeros_like(b, dtype=np.float64)
        return self._outer(self._inner(b))

    def range_part(self, c: np.ndarray) -> np.ndarray:
        """U_r U_r^T c: the part of c in the numerical range of J (c itself at full rank)."""
        if self.rank == 0:
            return np.zeros_like(c, dtype=np.float64)
        if self.lower is not None:
            return np.array(c, dtype=np.float64)
        permuted = self.q @ (self.q.T @ c[self.order])
        out = np.empty_like(permuted)
        out[self.order] = permuted
        return out

    def pinv_norm_sq(self, c: np.ndarray) -> float:
        """c^T G^+ c = ||T^{-1} Pi^T c||^2."""
        if self.rank == 0:
            return 0.0
        y = self._inner(c)
        return float(y @ y)

    @property
    def kept_min(self) -> float:
        """The smallest kept eigenvalue, estimated as :math:`\\lambda_{\\max} / \\kappa` (the largest
        when nothing is kept)."""
        if self.rank == 0 or not math.isfinite(self.condition):
            return self.largest if self.rank == 0 else 0.0
        return self.largest / self.condition


def _start(weights: np.ndarray) -> np.ndarray:
    """A deterministic start vector for the power iterations: ones plus the axis of the largest weight
    (never orthogonal to a dominant diagonal direction), with a fixed pseudo-random tilt."""
    m = weights.shape[0]
    x = np.ones(m) + 0.5 * np.random.default_rng(0).standard_normal(m)
    x[int(np.argmax(weights))] += math.sqrt(m)
    return x / np.linalg.norm(x)


def _power_iteration(apply: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> float:
    """The largest eigenvalue of the symmetric positive semi-definite operator ``apply`` by
    ``POWER_ITERATIONS`` power iterations (the Rayleigh quotient: a lower bound that converges from
    below). Used for lambda_max(G) and, through G^+, for 1 / lambda_min of the kept part: their product
    estimates cond(G_r) from below, typically within a factor of 2."""
    estimate = 0.0
    for _ in range(POWER_ITERATIONS):
        y = apply(x)
        norm = float(np.linalg.norm(y))
        if not norm > 0.0 or not math.isfinite(norm):
            break
        estimate = float(x @ y)
        x = y / norm
    return max(estimate, 0.0)
