r"""Data for the 1D viscous Burgers problem (paper 2601.11795, section 5.3).

.. math::

    u_t + u\,u_x = \nu\,u_{xx},\quad x\in[0,1)\ \text{periodic},\ t\in[0,1],\qquad
    u(x,0) = \sin(2\pi x + \xi\pi),\ \xi\sim U[0, 0.2],\ \nu = 0.01.

Two routes to the solution on the grid ``x_j = j / n_x``, ``t_i = i / (n_t - 1)``:

* :func:`cole_hopf` / :func:`cole_hopf_grid` (default, exact). With
  :math:`u = -2\nu\,\varphi_x/\varphi` the problem becomes the heat equation
  :math:`\varphi_t = \nu\varphi_{xx}` with :math:`\varphi(x,0) = \exp(z\cos\theta)`,
  :math:`z = 1/(4\pi\nu)`, :math:`\theta = 2\pi x + \xi\pi`. Expanding
  :math:`e^{z\cos\theta} = I_0(z) + 2\sum_{k\ge1} I_k(z)\cos k\theta` and letting each mode decay,

  .. math::

      \varphi = I_0(z) + 2\sum_{k=1}^{K} I_k(z)\,e^{-\nu(2\pi k)^2 t}\cos k\theta,\qquad
      u = \frac{8\pi\nu\sum_k k\,I_k(z)\,e^{-\nu(2\pi k)^2 t}\sin k\theta}{\varphi}.

  The Bessel values are exponentially scaled (``scipy.special.ive``): the common factor
  :math:`e^{z}` cancels in the ratio.
* :func:`method_of_lines` (the paper's route): a pseudo-spectral right-hand side on a finer periodic
  grid (2/3-rule dealiasing of the nonlinear term), integrated with ``scipy.integrate.odeint`` and
  subsampled to the ``n_x`` grid.

:func:`generate_burgers` draws the initial conditions of the train / validation / test splits from a
seed and lays out one row per grid point (``inputs = [x, t, u0(x_0), ..., u0(x_{n_x-1})]``);
:class:`BurgersData` caches and serves them.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from scipy.integrate import odeint
from scipy.special import ive
from torch import Tensor

from lit_constrained.tasks.cache import DEFAULT_CACHE_DIR
from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode

#: viscosity of the paper's problem
NU = 0.01
#: range of the phase shift xi of the initial condition sin(2 pi x + xi pi)
XI_RANGE = (0.0, 0.2)

SolverName = Literal["cole_hopf", "odeint"]


def grid(n_x: int, n_t: int) -> tuple[np.ndarray, np.ndarray]:
    """The periodic space grid ``x_j = j / n_x`` (x = 1 excluded) and ``t_i = i / (n_t - 1)``."""
    if n_x < 2 or n_t < 2:
        raise ValueError(f"grid: need n_x >= 2 and n_t >= 2, got n_x={n_x}, n_t={n_t}.")
    return np.arange(n_x) / n_x, np.linspace(0.0, 1.0, n_t)


def initial_condition(x: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """u0(x) = sin(2 pi x + xi pi) for each xi: shape (len(xi), len(x))."""
    return np.sin(2.0 * np.pi * np.asarray(x)[None, :] + np.pi * np.asarray(xi)[:, None])


def _check_nu(nu: float) -> None:
    if not nu > 0:
        raise ValueError(f"the viscosity nu must be positive, got {nu!r}.")


def _check_terms(n_terms: int) -> None:
    if n_terms < 1:
        raise ValueError(f"cole_hopf: n_terms must be >= 1, got {n_terms}.")


def cole_hopf(x: Tensor, t: Tensor, xi: Tensor, nu: float = NU, n_terms: int = 80) -> Tensor:
    r"""The exact solution u(x, t; xi) by the Cole-Hopf series (broadcasting torch tensors).

    ``x``, ``t`` and ``xi`` broadcast against each other; the result is differentiable in all three
    (autograd), which the tests use to check the PDE residual code. ``n_terms`` is K, the number of
    Fourier modes of :math:`\varphi` (80 is far past convergence for nu = 0.01).
    """
    _check_nu(nu)
    _check_terms(n_terms)
    bessel = ive(np.arange(n_terms + 1), 1.0 / (4.0 * math.pi * nu))  # I_k(z) e^{-z}
    theta = 2.0 * math.pi * x + math.pi * xi
    phi = float(bessel[0]) + torch.zeros_like(theta + t)
    num = torch.zeros_like(phi)
    for k in range(1, n_terms + 1):
        coeff = float(bessel[k]) * torch.exp(-nu * (2.0 * math.pi * k) ** 2 * t)
        phi = phi + 2.0 * coeff * torch.cos(k * theta)
        num = num + k * coeff * torch.sin(k * theta)
    return 8.0 * math.pi * nu * num / phi


def cole_hopf_grid(xi: np.ndarray, n_x: int, n_t: int, nu: float = NU, n_terms: int = 80) -> np.ndarray:
    """Exact solution on the grid: array (len(xi), n_t, n_x), float64.

    The series of :func:`cole_hopf`, evaluated as two matrix products (time factors times Fourier
    modes): about 30x faster than the broadcasting loop on the full grid.
    """
    _check_nu(nu)
    _check_terms(n_terms)
    x, t = grid(n_x, n_t)
    z = 1.0 / (4.0 * np.pi * nu)
    k = np.arange(1, n_terms + 1)
    coeff = ive(k, z)[None, :] * np.exp(-nu * (2.0 * np.pi * k[None, :]) ** 2 * t[:, None])  # (n_t, K)
    theta = 2.0 * np.pi * x[None, :] + np.pi * np.asarray(xi, dtype=np.float64)[:, None]  # (n_ic, n_x)
    k_theta = k[:, None, None] * theta[None]  # (K, n_ic, n_x)
    phi = ive(0, z) + 2.0 * np.einsum("tk,kix->itx", coeff, np.cos(k_theta))
    num = np.einsum("tk,kix->itx", coeff * k[None, :], np.sin(k_theta))
    return 8.0 * np.pi * nu * num / phi


def spectral_rhs(u: np.ndarray, nu: float) -> np.ndarray:
    r"""du/dt = -u u_x + nu u_xx on a periodic grid of [0, 1), pseudo-spectrally.

    Derivatives by FFT (wavenumbers :math:`2\pi k`); the product :math:`u u_x` is formed in physical
    space and its modes with :math:`|k| > n/3` are removed (2/3-rule dealiasing).
    """
    n = u.shape[-1]
    k = np.fft.rfftfreq(n, d=1.0 / n)
    wave = 2.0 * np.pi * k
    u_hat = np.fft.rfft(u)
    u_x = np.fft.irfft(1j * wave * u_hat, n)
    nonlinear_hat = np.fft.rfft(u * u_x)
    nonlinear_hat[k > n / 3.0] = 0.0
    return np.fft.irfft(-nonlinear_hat - nu * wave**2 * u_hat, n)


def method_of_lines(
    xi: np.ndarray,
    n_x: int,
    n_t: int,
    nu: float = NU,
    n_fine: int = 128,
    rtol: float = 1e-8,
    atol: float = 1e-10,
) -> np.ndarray:
    """The paper's route: odeint on the spectral semi-discretization, subsampled: (len(xi), n_t, n_x)."""
    _check_nu(nu)
    if n_fine % n_x != 0:
        raise ValueError(f"method_of_lines: n_fine ({n_fine}) must be a multiple of n_x ({n_x}).")
    x_fine = np.arange(n_fine) / n_fine
    _, t = grid(n_x, n_t)
    stride = n_fine // n_x
    solution = np.empty((len(xi), n_t, n_x))
    for i, u0 in enumerate(initial_condition(x_fine, np.asarray(xi))):
        trajectory = odeint(lambda u, _t: spectral_rhs(u, nu), u0, t, rtol=rtol, atol=atol)
        solution[i] = trajectory[:, ::stride]
    return solution


def solve(xi: np.ndarray, n_x: int, n_t: int, nu: float = NU, method: SolverName = "cole_hopf") -> np.ndarray:
    """Solution on the grid by ``method``: (len(xi), n_t, n_x)."""
    if method == "cole_hopf":
        return cole_hopf_grid(xi, n_x, n_t, nu)
    if method == "odeint":
        return method_of_lines(xi, n_x, n_t, nu)
    raise ValueError(f"method must be 'cole_hopf' or 'odeint', got {method!r}.")


def rows_from_grid(xi: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray]:
    """One row per (initial condition, t_i, x_j), ordered IC-major, then t, then x.

    Returns ``inputs`` (R, 2 + n_x) = [x, t, u0 on the grid], ``u`` (R,) the solution, ``ic`` (R,)
    the initial-condition index, ``ix`` / ``it`` the grid indices (ix == 0: the periodic boundary
    x = 0; it == 0: the initial time).
    """
    n_ic, n_t, n_x = u.shape
    x, t = grid(n_x, n_t)
    u0 = initial_condition(x, xi)  # (n_ic, n_x)
    ic, it, ix = (a.reshape(-1) for a in np.meshgrid(np.arange(n_ic), np.arange(n_t), np.arange(n_x), indexing="ij"))
    inputs = np.concatenate([x[ix][:, None], t[it][:, None], u0[ic]], axis=1)
    return {"inputs": inputs, "u": u.reshape(-1), "ic": ic, "ix": ix, "it": it}


def generate_burgers(
    n_train: int,
    n_val: int,
    n_test: int,
    n_x: int = 32,
    n_t: int = 32,
    data_rows_per_ic: int = 200,
    n_constraints: int = 10,
    nu: float = NU,
    method: SolverName = "cole_hopf",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """All arrays of the Burgers problem, deterministic in ``seed``.

    Keys ``<split>_<field>`` for split in train / val / test and the fields of
    :func:`rows_from_grid`, plus ``<split>_xi`` and ``<split>_labeled``, which marks
    ``data_rows_per_ic`` random rows per initial condition (the rows of the data-fitting term).
    ``constraint_rows`` holds ``n_constraints`` distinct training-row indices drawn uniformly over
    all initial conditions and grid points (the points of the hard constraints).
    """
    if n_train < 1 or n_val < 0 or n_test < 0:
        raise ValueError(f"need n_train >= 1 and n_val, n_test >= 0, got {n_train}, {n_val}, {n_test}.")
    per_ic = n_x * n_t
    if not 0 <= data_rows_per_ic <= per_ic:
        raise ValueError(f"data_rows_per_ic must lie in [0, n_x * n_t = {per_ic}], got {data_rows_per_ic}.")
    if not 0 <= n_constraints <= n_train * per_ic:
        raise ValueError(f"n_constraints must lie in [0, n_train * n_x * n_t = {n_train * per_ic}], got {n_constraints}.")
    rng = np.random.default_rng(seed)
    xi_all = rng.uniform(*XI_RANGE, size=n_train + n_val + n_test)
    u_all = solve(xi_all, n_x, n_t, nu, method)
    arrays: dict[str, np.ndarray] = {}
    bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(xi_all))}
    for split, (lo, hi) in bounds.items():
        arrays[f"{split}_xi"] = xi_all[lo:hi]
        for key, value in rows_from_grid(xi_all[lo:hi], u_all[lo:hi]).items():
            arrays[f"{split}_{key}"] = value
        labeled = np.zeros((hi - lo, per_ic), dtype=bool)
        for i in range(hi - lo):
            labeled[i, rng.choice(per_ic, size=data_rows_per_ic, replace=False)] = True
        arrays[f"{split}_labeled"] = labeled.reshape(-1)
    arrays["constraint_rows"] = np.sort(rng.choice(n_train * per_ic, size=n_constraints, replace=False))
    return arrays


class BurgersData(RowDataModule):
    """The Burgers rows as batches (float64; the task casts them to its dtype).

    A batch is a dict: ``inputs`` (B, 2 + n_x) = [x, t, u0 on the grid], ``u`` (B,) the solution,
    ``labeled`` (B,) bool (rows of the data term), ``ix`` / ``it`` (B,) grid indices (boundary and
    initial rows), ``ic`` (B,) initial-condition index, and, whole in every batch,
    ``x_con`` (m, 2 + n_x): the constraint rows (fixed, the same on every rank). Full batch: all
    rows in one batch per epoch; mini-batch: ``batch_fraction`` of the rows per step (the paper:
    20 %). Validation / test batches hold all rows of the held-out initial conditions.

    Sizes: the class defaults are the small embedded problem (10 training initial conditions,
    10 240 rows); the paper's is ``n_train: 100`` (102 400 rows).

    Args:
        batch_mode: ``"full"`` or ``"minibatch"``.
        batch_fraction: fraction of the rows per mini-batch step.
        n_train: training initial conditions.
        n_val: held-out initial conditions for validation.
        n_test: held-out initial conditions for testing.
        n_x: grid points in x (also the length of the u0 input).
        n_t: grid points in t.
        data_rows_per_ic: rows per initial condition with a data (label) term (the paper: 200).
        n_constraints: number of constraint rows (PDE residuals), drawn from the training rows.
        nu: viscosity.
        solver: ``"cole_hopf"`` (exact series) or ``"odeint"`` (the paper's method of lines).
        seed: seed of the initial conditions, the label rows and the constraint rows.
        cache_dir: where generated arrays are cached (``.npz`` keyed by a hash of the arguments);
            ``None`` to always regenerate.
        num_workers: DataLoader worker processes.
    """

    cache_name = "burgers"

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.2,
        n_train: int = 10,
        n_val: int = 4,
        n_test: int = 4,
        n_x: int = 32,
        n_t: int = 32,
        data_rows_per_ic: int = 200,
        n_constraints: int = 10,
        nu: float = NU,
        solver: SolverName = "cole_hopf",
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        if solver not in ("cole_hopf", "odeint"):
            raise ValueError(f"solver must be 'cole_hopf' or 'odeint', got {solver!r}.")

    def generation_args(self) -> dict[str, Any]:
        """The arguments of :func:`generate_burgers` (also the cache key)."""
        hp = self.hparams
        keys = ("n_train", "n_val", "n_test", "n_x", "n_t", "data_rows_per_ic", "n_constraints", "nu", "seed")
        args = {key: hp[key] for key in keys}
        args["method"] = hp["solver"]
        return args

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return generate_burgers(**args)

    def as_tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        tensors = super().as_tensors(arrays)
        tensors["x_con"] = tensors["train_inputs"][tensors["constraint_rows"]]
        return tensors

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {key: self.tensors[f"{split}_{key}"] for key in ("inputs", "u", "labeled", "ix", "it", "ic")}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        return {"x_con": self.tensors["x_con"]}
