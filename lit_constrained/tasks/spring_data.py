"""Data of the 1D spring (damped harmonic oscillator; 2601.11795 section 5.1, Moseley 2018).

The ODE, with mass 1, friction ``mu`` and stiffness ``k``:

.. math::

    u''(t) + \\mu u'(t) + k u(t) = 0, \\quad t \\in [0, 1], \\qquad u(0) = 1,\\ u'(0) = 0.

Under-damped (``mu^2 < 4 k``), with :math:`\\delta = \\mu / 2`, :math:`\\omega = \\sqrt{k - \\delta^2}`,
:math:`\\phi = \\arctan(-\\delta / \\omega)` and :math:`A = 1 / (2 \\cos \\phi)`, the exact solution is

.. math::

    u(t) = e^{-\\delta t}\\, 2 A \\cos(\\phi + \\omega t).

Points (the paper's): residual (collocation) points ``t = i / 29``, ``i = 0..29``; data points
``t = 20 i / 499``, ``i = 0..9`` (the first 200 of 500 test points, every 20th, i.e. within
[0, 0.4]); constraints: the residual at collocation points 4, 12, 21 (``t = 4/29, 12/29, 21/29``);
test points: 500 evenly spaced points of [0, 1]. Everything is deterministic: nothing to cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode


def spring_constants(mu: float, k: float) -> tuple[float, float, float, float]:
    """(delta, omega, phi, A) of the under-damped spring with mass 1; ``ValueError`` otherwise."""
    if not (mu >= 0 and k > 0):
        raise ValueError(f"Spring needs friction mu >= 0 and stiffness k > 0, got mu={mu}, k={k}.")
    delta = mu / 2.0
    if delta**2 >= k:
        raise ValueError(
            f"The exact solution is for the under-damped spring (mu^2 < 4 k); got mu={mu}, k={k}. "
            "Lower mu or raise k."
        )
    omega = math.sqrt(k - delta**2)
    phi = math.atan(-delta / omega)
    amplitude = 1.0 / (2.0 * math.cos(phi))
    return delta, omega, phi, amplitude


def spring_exact(t: Tensor, mu: float = 4.0, k: float = 400.0) -> Tensor:
    """The exact solution u(t) with u(0) = 1, u'(0) = 0 (torch, differentiable, any shape)."""
    delta, omega, phi, amplitude = spring_constants(mu, k)
    return torch.exp(-delta * t) * (2.0 * amplitude) * torch.cos(phi + omega * t)


def spring_points(
    n_residual: int = 30,
    n_data: int = 10,
    data_stride: int = 20,
    constraint_indices: Sequence[int] = (4, 12, 21),
    n_test: int = 500,
    mu: float = 4.0,
    k: float = 400.0,
) -> dict[str, np.ndarray]:
    """All points of the spring problem as float64 numpy arrays.

    Keys: ``t_res`` (n_residual,), ``t_data``/``u_data`` (n_data,), ``t_con`` (m,), ``t_test``/
    ``u_test`` (n_test,). Data points are ``t_test[::data_stride][:n_data]`` as in the paper.
    """
    if n_residual < 2 or n_test < 2:
        raise ValueError(f"n_residual and n_test must be >= 2, got {n_residual}, {n_test}.")
    if n_data < 1 or data_stride < 1 or (n_data - 1) * data_stride >= n_test:
        raise ValueError(
            f"n_data={n_data} data points with data_stride={data_stride} must fit in the "
            f"n_test={n_test} test points: need n_data >= 1 and (n_data - 1) * data_stride < n_test."
        )
    bad = [i for i in constraint_indices if not 0 <= int(i) < n_residual]
    if bad:
        raise ValueError(f"constraint_indices {bad} are outside the {n_residual} residual points.")
    t_res = np.arange(n_residual, dtype=np.float64) / (n_residual - 1)
    t_test = np.linspace(0.0, 1.0, n_test, dtype=np.float64)
    t_data = t_test[: (n_data - 1) * data_stride + 1 : data_stride].copy()
    t_con = t_res[np.asarray(list(constraint_indices), dtype=np.int64)].copy()

    def exact(t: np.ndarray) -> np.ndarray:
        return spring_exact(torch.from_numpy(t), mu, k).numpy()

    return {
        "t_res": t_res,
        "t_data": t_data,
        "u_data": exact(t_data),
        "t_con": t_con,
        "t_test": t_test,
        "u_test": exact(t_test),
    }


class SpringData(RowDataModule):
    """The spring's points as batches (float64; the task casts them to its dtype).

    A training batch is a dict: ``t_res`` (the sampled collocation points, sharded by the
    distributed sampler under DDP) and, whole in every batch, ``t_data``, ``u_data`` (the 10
    observations) and ``t_con`` (the constraint points, the same on every rank). Full batch: one
    batch per epoch with all ``n_residual`` points; mini-batch: ``batch_fraction`` of them per step
    (the paper: half). The validation/test batch holds everything plus the 500 test points.

    Args:
        batch_mode: ``"full"`` (exact gradients) or ``"minibatch"``.
        batch_fraction: fraction of the collocation points per mini-batch step.
        n_residual: number of evenly spaced collocation points on [0, 1].
        n_data: number of observations (every ``data_stride``-th test point from t = 0).
        data_stride: stride of the observations among the test points.
        constraint_indices: collocation points whose residual is a hard constraint.
        n_test: number of evenly spaced test points on [0, 1].
        mu: friction coefficient (must match the task's).
        k: stiffness (must match the task's).
        num_workers: DataLoader worker processes (0: load in the main process; the data is tiny).
    """

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_residual: int = 30,
        n_data: int = 10,
        data_stride: int = 20,
        constraint_indices: list[int] = [4, 12, 21],  # noqa: B006 (a list keeps YAML/CLI simple)
        n_test: int = 500,
        mu: float = 4.0,
        k: float = 400.0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        # validate the sizes now, so a bad config fails before the trainer starts
        self.setup()

    def generation_args(self) -> dict[str, Any]:
        """The arguments of :func:`spring_points`."""
        hp = self.hparams
        keys = ("n_residual", "n_data", "data_stride", "constraint_indices", "n_test", "mu", "k")
        args = {key: hp[key] for key in keys}
        args["constraint_indices"] = tuple(hp.constraint_indices)
        return args

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return spring_points(**args)

    def as_tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        """Every array as a column (N, 1): the network's input and output shape."""
        return {key: torch.from_numpy(value)[:, None] for key, value in arrays.items()}

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {"t_res": self.tensors["t_res"]}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        keys = ("t_data", "u_data", "t_con") if split == "train" else ("t_data", "u_data", "t_con", "t_test", "u_test")
        return {key: self.tensors[key] for key in keys}
