r"""Data for 2D Darcy flow: random piecewise-constant permeabilities and finite-difference solutions.

The problem (2601.11795, section 5.4; the FNO paper's Darcy benchmark):

.. math::
    -\nabla\cdot(\nu(x)\nabla u(x)) = 1 \ \text{on } (0, 1)^2, \qquad u = 0 \ \text{on the boundary},

on the ``N x N`` node grid ``x_i = i / (N - 1)`` (boundary included; ``N = 16``).

Permeability (as in the FNO paper): a Gaussian random field
:math:`\psi \sim \mathcal N(0, (-\Delta + \tau^2 I)^{-\alpha})` with zero Neumann boundary conditions,
i.e. the cosine expansion

.. math::
    \psi(x, y) = \sum_{(k_1, k_2) \ne 0} \xi_{k}\, \tau^{\alpha - 1} (\pi^2 |k|^2 + \tau^2)^{-\alpha/2}
                 \cos(\pi k_1 x) \cos(\pi k_2 y), \qquad \xi_k \sim \mathcal N(0, 1),

then :math:`\nu = \nu_+` where :math:`\psi \ge 0`, else :math:`\nu_-` (12 and 3).

Solver: the 5-point stencil with harmonic-mean face coefficients
:math:`a_{i+1/2,j} = 2\nu_{ij}\nu_{i+1,j} / (\nu_{ij} + \nu_{i+1,j})`, so at an interior node

.. math::
    r_{ij}(u) = -\frac{1}{h^2}\Big[a_{i+1/2,j}(u_{i+1,j} - u_{ij}) - a_{i-1/2,j}(u_{ij} - u_{i-1,j})
                + a_{i,j+1/2}(u_{i,j+1} - u_{ij}) - a_{i,j-1/2}(u_{ij} - u_{i,j-1})\Big] - f,

and the solution satisfies :math:`r = 0`. :func:`darcy_residual` evaluates the same stencil in
torch (for the network's output grid); :func:`solve_darcy` solves it with ``scipy.sparse``.

All functions are pure and seeded: the same arguments give the same arrays.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor


def _check_grid(n: int) -> None:
    if not isinstance(n, int) or n < 3:
        raise ValueError(f"The grid needs at least 3 nodes per side (one interior node), got n={n!r}.")


def gaussian_random_field(
    n_samples: int, n: int = 16, alpha: float = 2.0, tau: float = 3.0, seed: int = 0
) -> np.ndarray:
    r"""Samples of the zero-mean Neumann GRF :math:`\mathcal N(0, (-\Delta + \tau^2)^{-\alpha})` on the node grid.

    Uses the cosine modes :math:`k_1, k_2 = 0..n-1` (finer modes alias on an ``n``-node grid);
    the constant mode is dropped (zero mean). Returns ``(n_samples, n, n)`` float64, indexed
    ``[sample, i, j]`` with ``x = i / (n - 1)``, ``y = j / (n - 1)``.
    """
    _check_grid(n)
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}.")
    if alpha <= 0 or tau <= 0:
        raise ValueError(f"alpha and tau must be > 0, got alpha={alpha!r}, tau={tau!r}.")
    rng = np.random.default_rng(seed)
    k = np.arange(n)
    x = np.linspace(0.0, 1.0, n)
    basis = np.cos(np.pi * np.outer(x, k))  # (n nodes, n modes)
    k1, k2 = np.meshgrid(k, k, indexing="ij")
    sqrt_eig = tau ** (alpha - 1.0) * (np.pi**2 * (k1**2 + k2**2) + tau**2) ** (-alpha / 2.0)
    sqrt_eig[0, 0] = 0.0
    xi = rng.standard_normal((n_samples, n, n))
    return np.einsum("ik,skl,jl->sij", basis, xi * sqrt_eig, basis, optimize=True)


def threshold_field(psi: np.ndarray, nu_low: float = 3.0, nu_high: float = 12.0) -> np.ndarray:
    """Piecewise-constant permeability: ``nu_high`` where ``psi >= 0``, else ``nu_low``."""
    if not (nu_low > 0 and nu_high > 0):
        raise ValueError(f"Permeabilities must be > 0, got nu_low={nu_low!r}, nu_high={nu_high!r}.")
    return np.where(psi >= 0.0, nu_high, nu_low).astype(np.float64)


def _harmonic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 2.0 * a * b / (a + b)


def darcy_matrix(nu: np.ndarray) -> sp.csr_matrix:
    """The 5-point operator on the interior nodes for a batch of permeabilities.

    ``nu`` is ``(S, n, n)`` (node values, boundary included). Returns the block-diagonal
    ``(S (n-2)^2) x (S (n-2)^2)`` matrix ``A`` with ``(A u)_{ij} = -div(nu grad u)_{ij}`` for ``u``
    vanishing on the boundary (row-major interior numbering per sample, samples one after the other).
    """
    nu = np.asarray(nu, dtype=np.float64)
    if nu.ndim != 3 or nu.shape[1] != nu.shape[2]:
        raise ValueError(f"nu must have shape (samples, n, n), got {nu.shape}.")
    s, n, _ = nu.shape
    _check_grid(n)
    m = n - 2
    h2 = (1.0 / (n - 1)) ** 2
    c = nu[:, 1:-1, 1:-1]
    a_e = _harmonic(c, nu[:, 2:, 1:-1]) / h2   # face (i+1/2, j)
    a_w = _harmonic(c, nu[:, :-2, 1:-1]) / h2  # face (i-1/2, j)
    a_n = _harmonic(c, nu[:, 1:-1, 2:]) / h2   # face (i, j+1/2)
    a_s = _harmonic(c, nu[:, 1:-1, :-2]) / h2  # face (i, j-1/2)
    idx = np.arange(s * m * m).reshape(s, m, m)
    rows = [idx.ravel()]
    cols = [idx.ravel()]
    vals = [(a_e + a_w + a_n + a_s).ravel()]
    def span(d: int) -> slice:  # nodes i with a neighbour i + d inside the interior
        return slice(max(0, -d), m - max(0, d))

    def shifted(d: int) -> slice:  # those neighbours i + d
        return slice(max(0, d), m + min(0, d))

    for coef, (di, dj) in ((a_e, (1, 0)), (a_w, (-1, 0)), (a_n, (0, 1)), (a_s, (0, -1))):
        rows.append(idx[:, span(di), span(dj)].ravel())
        cols.append(idx[:, shifted(di), shifted(dj)].ravel())
        vals.append(-coef[:, span(di), span(dj)].ravel())
    size = s * m * m
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size)
    )


def solve_darcy(nu: np.ndarray, forcing: float = 1.0) -> np.ndarray:
    """Solve ``-div(nu grad u) = forcing``, ``u = 0`` on the boundary, for each permeability.

    ``nu`` is ``(S, n, n)``; returns ``u`` of the same shape (float64, zero boundary).
    One sparse LU of the block-diagonal system (all samples at once).
    """
    nu = np.asarray(nu, dtype=np.float64)
    a = darcy_matrix(nu)
    s, n, _ = nu.shape
    rhs = np.full(a.shape[0], float(forcing))
    interior = spla.spsolve(a.tocsc(), rhs).reshape(s, n - 2, n - 2)
    u = np.zeros_like(nu)
    u[:, 1:-1, 1:-1] = interior
    return u


def darcy_residual(u: Tensor, nu: Tensor, forcing: float = 1.0) -> Tensor:
    """The finite-difference PDE residual at the interior nodes, in torch (same stencil as the solver).

    ``u`` and ``nu`` are ``(..., n, n)`` node values (boundary included); returns ``(..., n-2, n-2)``
    with ``r = -div(nu grad u) - forcing``. Differentiable, ``vmap``-safe (no in-place writes).
    """
    if u.shape[-2:] != nu.shape[-2:] or u.shape[-1] != u.shape[-2]:
        raise ValueError(f"u and nu must be (..., n, n) grids of the same size, got {tuple(u.shape)} and {tuple(nu.shape)}.")
    n = u.shape[-1]
    h2 = (1.0 / (n - 1)) ** 2
    c_nu = nu[..., 1:-1, 1:-1]
    c_u = u[..., 1:-1, 1:-1]

    def flux(nb_nu: Tensor, nb_u: Tensor) -> Tensor:
        return 2.0 * c_nu * nb_nu / (c_nu + nb_nu) * (nb_u - c_u)

    div = (
        flux(nu[..., 2:, 1:-1], u[..., 2:, 1:-1])
        + flux(nu[..., :-2, 1:-1], u[..., :-2, 1:-1])
        + flux(nu[..., 1:-1, 2:], u[..., 1:-1, 2:])
        + flux(nu[..., 1:-1, :-2], u[..., 1:-1, :-2])
    )
    return -div / h2 - forcing


def boundary_mask(n: int) -> np.ndarray:
    """Boolean ``(n, n)`` mask of the boundary nodes."""
    _check_grid(n)
    mask = np.zeros((n, n), dtype=bool)
    mask[0, :] = mask[-1, :] = mask[:, 0] = mask[:, -1] = True
    return mask


def medoid_order(masks: np.ndarray) -> np.ndarray:
    """Indices of the samples sorted by Hamming distance of their binary mask to the medoid mask.

    The medoid is the sample whose mask has the least total Hamming distance to all others; it comes
    first. Ties are broken by index (stable sort), so the order is deterministic.
    """
    flat = np.asarray(masks, dtype=np.float64).reshape(len(masks), -1)
    # Hamming distance of binary vectors: |a| + |b| - 2 a.b
    ones = flat.sum(axis=1)
    dist = ones[:, None] + ones[None, :] - 2.0 * flat @ flat.T
    medoid = int(np.argmin(dist.sum(axis=1)))
    return np.argsort(dist[medoid], kind="stable")


def generate_darcy(
    n_generate: int = 1000,
    n_keep: int = 130,
    n: int = 16,
    alpha: float = 2.0,
    tau: float = 3.0,
    nu_low: float = 3.0,
    nu_high: float = 12.0,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Generate ``n_generate`` permeabilities, keep the ``n_keep`` nearest the medoid mask, solve them.

    Returns float64 arrays ``nu`` and ``u`` of shape ``(n_keep, n, n)``, ordered by distance to the
    medoid (the medoid first), and ``mask`` (``nu == nu_high``, as float64). Solving only the kept
    samples gives the same solutions as solving all and selecting (each sample is independent).
    """
    if not isinstance(n_keep, int) or not 1 <= n_keep <= n_generate:
        raise ValueError(f"n_keep must be an integer in [1, n_generate={n_generate}], got {n_keep!r}.")
    psi = gaussian_random_field(n_generate, n=n, alpha=alpha, tau=tau, seed=seed)
    nu_all = threshold_field(psi, nu_low, nu_high)
    keep = medoid_order(nu_all == nu_high)[:n_keep]
    nu = nu_all[keep]
    u = solve_darcy(nu)
    return {"nu": nu, "u": u, "mask": (nu == nu_high).astype(np.float64), "index": keep.astype(np.int64)}
