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

and the solution satisfies :math:`r = 0`. :func:`solve_darcy` solves it with ``scipy.sparse``;
:func:`lit_constrained.tasks.darcy.darcy_residual` evaluates the same stencil in torch (for the
network's output grid).

All functions are pure and seeded: the same arguments give the same arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from lit_constrained.tasks.cache import DEFAULT_CACHE_DIR
from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode


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


# --------------------------------------------------------------------------------------------------
# Splits, sampling choices and the DataModule
# --------------------------------------------------------------------------------------------------


def grid_inputs(mask: np.ndarray) -> np.ndarray:
    """The FNO's 3 input channels ``(mask, x, y)`` of shape ``(S, 3, n, n)`` (``x`` along axis -2)."""
    s, n, _ = mask.shape
    coords = np.linspace(0.0, 1.0, n)
    gx, gy = np.meshgrid(coords, coords, indexing="ij")
    return np.stack([mask, np.broadcast_to(gx, mask.shape), np.broadcast_to(gy, mask.shape)], axis=1)


def darcy_dataset(
    n_train: int = 100,
    n_val: int = 10,
    n_test: int = 20,
    n_generate: int = 1000,
    n: int = 16,
    alpha: float = 2.0,
    tau: float = 3.0,
    nu_low: float = 3.0,
    nu_high: float = 12.0,
    data_fraction: float = 0.2,
    n_constraints: int = 50,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Everything the Darcy task needs, as numpy arrays (deterministic in the arguments).

    The ``n_train + n_val + n_test`` samples nearest the medoid mask (similar permeabilities, as the
    paper keeps 100 of 1000) are split at random into train / val / test, so the held-out ``nu`` come
    from the same distribution but are never trained on. Per sample, a fixed random ``data_fraction``
    of the nodes carries the data term (``<split>_data_mask``). The ``n_constraints`` constraints are
    distinct random (training sample, interior node) pairs: ``con_sample`` (index into the training
    set) and ``con_node`` (row-major index into the ``(n-2) x (n-2)`` interior).
    """
    for name, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if not isinstance(value, int) or value < (1 if name == "n_train" else 0):
            raise ValueError(f"{name} must be a non-negative integer (n_train >= 1), got {value!r}.")
    n_keep = n_train + n_val + n_test
    if n_keep > n_generate:
        raise ValueError(
            f"n_train + n_val + n_test = {n_keep} exceeds n_generate = {n_generate}: generate more samples."
        )
    if not 0.0 < data_fraction <= 1.0:
        raise ValueError(f"data_fraction must lie in (0, 1], got {data_fraction!r}.")
    n_interior = (n - 2) ** 2
    if not isinstance(n_constraints, int) or not 0 <= n_constraints <= n_train * n_interior:
        raise ValueError(
            f"n_constraints must be an integer in [0, n_train * (n-2)^2 = {n_train * n_interior}], got {n_constraints!r}."
        )
    data = generate_darcy(n_generate, n_keep, n, alpha, tau, nu_low, nu_high, seed)
    rng = np.random.default_rng([seed, 1])
    order = rng.permutation(n_keep)
    splits = {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}
    out: dict[str, np.ndarray] = {}
    n_data = max(1, int(round(data_fraction * n * n)))
    for split, idx in splits.items():
        out[f"{split}_nu"] = data["nu"][idx]
        out[f"{split}_u"] = data["u"][idx]
        out[f"{split}_x"] = grid_inputs(data["mask"][idx])
        masks = np.zeros((len(idx), n * n))
        for row in range(len(idx)):
            masks[row, rng.choice(n * n, size=n_data, replace=False)] = 1.0
        out[f"{split}_data_mask"] = masks.reshape(len(idx), n, n)
    pairs = rng.choice(n_train * n_interior, size=n_constraints, replace=False)
    out["con_sample"] = (pairs // n_interior).astype(np.int64)
    out["con_node"] = (pairs % n_interior).astype(np.int64)
    return out


#: version of :func:`darcy_dataset` (part of the cache key): raise it whenever its output changes
GENERATOR_VERSION = "1"


class DarcyData(RowDataModule):
    """Darcy permeabilities and solutions as batches of whole samples (float64; the task casts).

    A batch is a dict: ``x`` (B, 3, n, n) the FNO input (mask, x, y), ``nu`` and ``u`` (B, n, n) the
    permeability and the finite-difference solution, ``data_mask`` (B, n, n) the nodes of the data
    term; and, whole in every training batch (the same on every rank), the constraint set:
    ``con_x`` / ``con_nu`` (S, ...) the distinct training samples the constraints touch,
    ``con_sample`` (m,) the index into those and ``con_node`` (m,) the interior node (row-major).
    Full batch: one batch per epoch with all training samples; mini-batch: ``batch_fraction`` of the
    samples per step (the paper: 20 %). Validation / test batches hold the held-out samples.

    Args:
        batch_mode: ``"full"`` or ``"minibatch"``.
        batch_fraction: fraction of the training samples per mini-batch step.
        n_train: training samples (the paper: 100).
        n_val: validation samples (held out).
        n_test: test samples (held out).
        n_generate: permeabilities generated before keeping the ``n_train + n_val + n_test`` nearest
            the medoid mask (the paper: 1000).
        grid: nodes per side (boundary included; the paper: 16).
        alpha: GRF smoothness (the FNO paper: 2).
        tau: GRF inverse length scale (the FNO paper: 3).
        nu_low: permeability where the field is negative.
        nu_high: permeability where the field is >= 0.
        data_fraction: fraction of the nodes of each sample in the data term (the paper: 20 %).
        n_constraints: m, the number of hard residual constraints (the paper: 50).
        seed: seed of the generation and of every random choice above.
        cache_dir: where generated arrays are cached (``None``: always generate; ~0.2 s).
        num_workers: DataLoader worker processes (0: the data is tiny).
    """

    cache_name = "darcy"
    generator_version = GENERATOR_VERSION

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.2,
        n_train: int = 100,
        n_val: int = 10,
        n_test: int = 20,
        n_generate: int = 1000,
        grid: int = 16,
        alpha: float = 2.0,
        tau: float = 3.0,
        nu_low: float = 3.0,
        nu_high: float = 12.0,
        data_fraction: float = 0.2,
        n_constraints: int = 50,
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()  # fail early on bad sizes; cheap

    def generation_args(self) -> dict[str, Any]:
        """The arguments of :func:`darcy_dataset` (also the cache key)."""
        hp = self.hparams
        keys = ("n_train", "n_val", "n_test", "n_generate", "alpha", "tau", "nu_low", "nu_high",
                "data_fraction", "n_constraints", "seed")
        return {"n": hp.grid, **{k: hp[k] for k in keys}}

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return darcy_dataset(**args)

    @property
    def u_std(self) -> float:
        """The standard deviation of the training solutions (the task's fixed output scale)."""
        return float(self.tensors["train_u"].std())

    def constraint_set(self) -> dict[str, Tensor]:
        """The constraint points: distinct samples ``con_x``, ``con_nu`` and per-constraint indices."""
        t = self.tensors
        distinct, inverse = torch.unique(t["con_sample"], return_inverse=True)
        return {
            "con_x": t["train_x"][distinct],
            "con_nu": t["train_nu"][distinct],
            "con_sample": inverse,
            "con_node": t["con_node"],
        }

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {key: self.tensors[f"{split}_{key}"] for key in ("x", "nu", "u", "data_mask")}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        """The constraint set in every training batch (validation / test batches: the samples only)."""
        return self.constraint_set() if split == "train" else {}

    def example(self, split: Split = "test", index: int = 0) -> dict[str, Tensor]:
        """One sample of a split as a batch of size 1 (for figures)."""
        return {key: value[index:index + 1] for key, value in self.rows(split).items()}
