"""Data of the chemical reaction network (1-butene isomerization; 2601.11795 section 5.2).

Linear kinetics :math:`du/dt = K u`, :math:`u \\in \\mathbb{R}^4`, with rate constants
:math:`c = (c_1, \\dots, c_5)` and

.. math::

    K = \\begin{bmatrix} -(c_1 + c_2 + c_4) & 0 & c_3 & c_5 \\\\ 2 c_1 & 0 & 0 & 0 \\\\
        c_2 & 0 & -c_3 & 0 \\\\ c_4 & 0 & 0 & -c_5 \\end{bmatrix}.

Mass balance: :math:`w = (1, 1/2, 1, 1)` has :math:`w^T K = 0`, so :math:`w^T u(t)` is conserved.

Exact solution: :math:`u(t) = e^{K t} u_0 = V \\operatorname{diag}(e^{\\lambda t}) V^{-1} u_0` from the
eigendecomposition :math:`K = V \\Lambda V^{-1}` (vectorized over initial conditions and times). The
paper's route, ``scipy.integrate.odeint``, is kept as :func:`chemistry_odeint` (tests check they agree).

Dataset: initial conditions :math:`u_0 + \\xi`, :math:`\\xi \\sim U[-1, 1]^4`; times
:math:`t_j = t_{max} j / n_t`, :math:`j = 0..n_t-1`; one row per (initial condition, time):
input :math:`x = (u_0, t) \\in \\mathbb{R}^5`, label :math:`u \\in \\mathbb{R}^4`. A fixed random
fraction of the rows is labeled (the data term); a fixed random set of rows carries the constraints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from lit_constrained.tasks.cache import DEFAULT_CACHE_DIR
from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode

#: rate constants c1..c5 (Gupta et al. 2016, as used in the paper)
RATES: tuple[float, ...] = (4.283, 1.191, 5.743, 10.219, 1.535)
#: nominal initial condition
U0_NOMINAL: tuple[float, ...] = (14.5467204, 16.3351668, 25.9473091, 23.5250934)
#: mass-balance weights: w^T K = 0
MASS_WEIGHTS: tuple[float, ...] = (1.0, 0.5, 1.0, 1.0)


def reaction_matrix(rates: Sequence[float] = RATES) -> np.ndarray:
    """The 4 x 4 rate matrix K (float64) from the five rate constants."""
    if len(rates) != 5:
        raise ValueError(f"The reaction network has 5 rate constants, got {len(rates)}: {list(rates)}.")
    c1, c2, c3, c4, c5 = (float(c) for c in rates)
    return np.array(
        [
            [-(c1 + c2 + c4), 0.0, c3, c5],
            [2.0 * c1, 0.0, 0.0, 0.0],
            [c2, 0.0, -c3, 0.0],
            [c4, 0.0, 0.0, -c5],
        ]
    )


class ModalSolution:
    """:math:`u(u_0, t) = V \\operatorname{diag}(e^{\\lambda t}) V^{-1} u_0` for a fixed K (torch).

    Works on broadcastable ``u0`` (..., 4) and ``t`` (...), any float dtype, differentiable
    (complex arithmetic internally when K has complex eigenvalues; the result is real).
    """

    def __init__(self, rates: Sequence[float] = RATES) -> None:
        eigvals, eigvecs = np.linalg.eig(reaction_matrix(rates))
        self.eigvals = torch.as_tensor(eigvals.astype(np.complex128))
        self.eigvecs = torch.as_tensor(eigvecs.astype(np.complex128))
        self.eigvecs_inv = torch.linalg.inv(self.eigvecs)

    def __call__(self, u0: Tensor, t: Tensor) -> Tensor:
        modes = u0.to(torch.complex128) @ self.eigvecs_inv.T.to(u0.device)  # (..., 4): V^{-1} u0
        growth = torch.exp(t.to(torch.complex128)[..., None] * self.eigvals.to(u0.device))
        return ((modes * growth) @ self.eigvecs.T.to(u0.device)).real.to(u0.dtype)


def chemistry_exact(u0: np.ndarray, times: np.ndarray, rates: Sequence[float] = RATES) -> np.ndarray:
    """Exact trajectories, shape (n_ic, n_t, 4), of initial conditions ``u0`` (n_ic, 4) at ``times``."""
    u0_t = torch.as_tensor(np.asarray(u0, dtype=np.float64))[:, None, :]
    t_t = torch.as_tensor(np.asarray(times, dtype=np.float64))[None, :]
    return ModalSolution(rates)(u0_t, t_t).numpy()


def chemistry_odeint(
    u0: np.ndarray, times: np.ndarray, rates: Sequence[float] = RATES, rtol: float = 1e-10, atol: float = 1e-10
) -> np.ndarray:
    """The paper's route: ``scipy.integrate.odeint`` per initial condition, shape (n_ic, n_t, 4)."""
    from scipy.integrate import odeint

    K = reaction_matrix(rates)

    def rhs(u: np.ndarray, t: float) -> np.ndarray:
        return K @ u

    return np.stack(
        [odeint(rhs, ic, np.asarray(times, dtype=np.float64), Dfun=lambda u, t: K, rtol=rtol, atol=atol) for ic in u0]
    )


def sample_initial_conditions(n: int, rng: np.random.Generator, spread: float = 1.0) -> np.ndarray:
    """``n`` initial conditions ``U0_NOMINAL + U[-spread, spread]^4`` (float64, (n, 4))."""
    return np.asarray(U0_NOMINAL)[None, :] + rng.uniform(-spread, spread, size=(n, 4))


def chemistry_rows(u0: np.ndarray, times: np.ndarray, solution: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flatten trajectories to rows: x = (u0, t) (n_ic * n_t, 5) and u (n_ic * n_t, 4), IC-major."""
    n_ic, n_t = solution.shape[:2]
    x = np.concatenate(
        [np.repeat(u0, n_t, axis=0), np.tile(np.asarray(times, dtype=np.float64), n_ic)[:, None]], axis=1
    )
    return x, solution.reshape(n_ic * n_t, 4)


def generate_chemistry(
    n_ic: int = 100,
    n_val_ic: int = 20,
    n_test_ic: int = 20,
    n_times: int = 64,
    t_max: float = 10.0,
    ic_spread: float = 1.0,
    data_fraction: float = 0.2,
    n_constraints: int = 10,
    rates: Sequence[float] = RATES,
    solver: Literal["expm", "odeint"] = "expm",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """All arrays of the chemistry problem (float64, deterministic in ``seed``).

    Keys: ``x``, ``u``, ``labeled`` (training rows; bool mask of the ``data_fraction`` rows of the
    data term), ``con_rows`` (indices of the ``n_constraints`` constraint rows), ``x_val``, ``u_val``,
    ``labeled_val``, ``x_test``, ``u_test``, ``labeled_test``, ``times``.
    """
    if min(n_ic, n_val_ic, n_test_ic, n_times) < 1:
        raise ValueError("n_ic, n_val_ic, n_test_ic and n_times must all be >= 1.")
    if not 0.0 < data_fraction <= 1.0:
        raise ValueError(f"data_fraction must lie in (0, 1], got {data_fraction}.")
    if not 0 <= n_constraints <= n_ic * n_times:
        raise ValueError(f"n_constraints={n_constraints} must lie in [0, n_ic * n_times = {n_ic * n_times}].")
    if solver not in ("expm", "odeint"):
        raise ValueError(f"solver must be 'expm' or 'odeint', got {solver!r}.")
    times = t_max * np.arange(n_times, dtype=np.float64) / n_times
    solve = chemistry_exact if solver == "expm" else chemistry_odeint
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]
    out: dict[str, np.ndarray] = {"times": times}
    for suffix, n, stream in (("", n_ic, 0), ("_val", n_val_ic, 2), ("_test", n_test_ic, 3)):
        u0 = sample_initial_conditions(n, streams[stream], ic_spread)
        x, u = chemistry_rows(u0, times, solve(u0, times, rates))
        n_rows = len(x)
        n_labeled = max(1, int(round(data_fraction * n_rows)))
        labeled = np.zeros(n_rows, dtype=bool)
        mask_rng = streams[1] if suffix == "" else streams[stream]
        labeled[mask_rng.choice(n_rows, size=n_labeled, replace=False)] = True
        out.update({f"x{suffix}": x, f"u{suffix}": u, f"labeled{suffix}": labeled})
    out["con_rows"] = np.sort(streams[4].choice(n_ic * n_times, size=n_constraints, replace=False))
    return out


class ChemistryData(RowDataModule):
    """The reaction-network rows as batches (float64; the task casts them to its dtype).

    A training batch is a dict: ``x`` (B, 5) = (u0, t), ``u`` (B, 4) labels, ``labeled`` (B,) bool
    (which rows enter the data term), and, whole in every batch, ``x_con`` (m, 5), the constraint
    rows (the same on every rank). Full batch: all rows in one batch per epoch; mini-batch:
    ``batch_fraction`` of the rows per step (the paper: 20 %). Validation/test batches hold the
    held-out initial conditions' rows (with their own 20 % label mask) and the same ``x_con``.

    Sizes: the class defaults are the small embedded problem (100 initial conditions,
    6 400 rows); the paper's is ``n_ic: 1000`` (64 000 rows).

    Args:
        batch_mode: ``"full"`` or ``"minibatch"``.
        batch_fraction: fraction of the rows per mini-batch step.
        n_ic: training initial conditions.
        n_val_ic: held-out initial conditions for validation.
        n_test_ic: held-out initial conditions for testing.
        n_times: times per initial condition, ``t_j = t_max j / n_times``.
        t_max: time horizon.
        ic_spread: initial conditions are the nominal one plus ``U[-ic_spread, ic_spread]^4``.
        data_fraction: fraction of the rows with a data (label) term.
        n_constraints: number of constraint rows (mass-balance residuals), drawn from the training rows.
        solver: ``"expm"`` (exact, eigendecomposition) or ``"odeint"`` (the paper's route).
        seed: seed of the initial conditions, the label mask and the constraint rows.
        cache_dir: where generated arrays are cached (``.npz`` keyed by a hash of the arguments);
            ``None`` to always regenerate.
        num_workers: DataLoader worker processes.
    """

    cache_name = "chemistry"

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.2,
        n_ic: int = 100,
        n_val_ic: int = 20,
        n_test_ic: int = 20,
        n_times: int = 64,
        t_max: float = 10.0,
        ic_spread: float = 1.0,
        data_fraction: float = 0.2,
        n_constraints: int = 10,
        solver: Literal["expm", "odeint"] = "expm",
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)

    def generation_args(self) -> dict[str, Any]:
        hp = self.hparams
        keys = ("n_ic", "n_val_ic", "n_test_ic", "n_times", "t_max", "ic_spread", "data_fraction",
                "n_constraints", "solver", "seed")
        return {key: hp[key] for key in keys}

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return generate_chemistry(**args)

    def as_tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        tensors = super().as_tensors(arrays)
        tensors["x_con"] = tensors["x"][tensors["con_rows"]]
        return tensors

    def rows(self, split: Split) -> dict[str, Tensor]:
        suffix = _SUFFIX[split]
        return {key: self.tensors[f"{key}{suffix}"] for key in ("x", "u", "labeled")}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        return {"x_con": self.tensors["x_con"]}


#: the arrays' key suffix of each split (``x``, ``x_val``, ``x_test``, ...)
_SUFFIX: dict[str, str] = {"train": "", "val": "_val", "test": "_test"}
