r"""Data of the density task: samples of a density with a kink where it reaches 0, quadrature nodes, the
points where p >= 0 is imposed.

The density is Epanechnikov's on [-1, 1], zero outside, on the domain [-L, L] (L = 1.5):

.. math::

    p^*(x) = \tfrac34 (1 - x^2) \ (|x| \le 1), \qquad p^*(x) = 0 \ (1 < |x| \le L), \qquad
    \int_{-L}^{L} p^* = 1.

Its inverse CDF is closed-form: with :math:`F(x) = \tfrac12 + \tfrac34 x - \tfrac14 x^3` on [-1, 1], a
uniform v gives :math:`x = 2 \cos\big((\arccos(1 - 2v) + 4\pi)/3\big)` (the root of the cubic in [-1, 1]),
so the samples are exact draws (seeded).

Arrays (float64): ``x_samples`` (rows: the data), ``x_quad``/``w_quad`` (Gauss-Legendre on [-L, L]: the
objective's :math:`\int p^2` and the mass :math:`\int p`), ``x_nonnegative`` (``n_nonnegative``
equispaced points of [-L, L], ends included: p >= 0 imposed), ``x_test``/``p_test`` (a fine grid and p*).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from torch import Tensor

from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode

__all__ = ["HALF_WIDTH", "DensityData", "density_exact", "density_points", "density_samples"]

HALF_WIDTH = 1.5
"""L: the domain is [-L, L]."""


def density_exact(x: Any) -> Any:
    """:math:`p^*(x) = \\tfrac34 \\max(1 - x^2, 0)` (numpy array or tensor)."""
    if isinstance(x, Tensor):
        return 0.75 * (1 - x * x).clamp_min(0)
    x = np.asarray(x, dtype=np.float64)
    return 0.75 * np.clip(1 - x * x, 0, None)


def density_samples(n: int, seed: int = 0) -> np.ndarray:
    """n exact draws from p* by its inverse CDF (see the module docstring)."""
    v = np.random.default_rng(seed).uniform(size=n)
    return 2.0 * np.cos((np.arccos(1.0 - 2.0 * v) + 4.0 * math.pi) / 3.0)


def density_points(n_samples: int = 2000, n_quad: int = 256, n_nonnegative: int = 61, n_test: int = 1201,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """Every array of the task (see the module docstring)."""
    for name, value, low in (("n_samples", n_samples, 1), ("n_quad", n_quad, 2),
                             ("n_nonnegative", n_nonnegative, 2), ("n_test", n_test, 3)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    nodes, weights = np.polynomial.legendre.leggauss(n_quad)
    x_test = np.linspace(-HALF_WIDTH, HALF_WIDTH, n_test)
    arrays = {
        "x_samples": density_samples(n_samples, seed)[:, None],
        "x_quad": HALF_WIDTH * nodes[:, None],
        "w_quad": HALF_WIDTH * weights,
        "x_nonnegative": np.linspace(-HALF_WIDTH, HALF_WIDTH, n_nonnegative)[:, None],
        "x_test": x_test[:, None],
        "p_test": density_exact(x_test),
    }
    return {key: np.asarray(value, dtype=np.float64) for key, value in arrays.items()}


class DensityData(RowDataModule):
    """The samples as rows (all in full batch, ``batch_fraction`` of them per mini-batch step); the
    quadrature and the imposed points whole in every batch, the test grid in validation/test.

    Args:
        batch_mode, batch_fraction, num_workers: as :class:`~lit_constrained.tasks.datamodule.RowDataModule`.
        n_samples: draws from p*. n_quad: Gauss-Legendre nodes on [-L, L].
        n_nonnegative: equispaced points where p >= 0 is imposed. n_test: test grid nodes.
        seed: the sampling seed.
    """

    def __init__(self, batch_mode: BatchMode = "full", batch_fraction: float = 0.25, n_samples: int = 2000,
                 n_quad: int = 256, n_nonnegative: int = 61, n_test: int = 1201, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()

    def generation_args(self) -> dict[str, Any]:
        return {key: self.hparams[key] for key in ("n_samples", "n_quad", "n_nonnegative", "n_test", "seed")}

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return density_points(**args)

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {"x_samples": self.tensors["x_samples"]}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        keys = ["x_quad", "w_quad", "x_nonnegative"] + (["x_test", "p_test"] if split != "train" else [])
        return {key: self.tensors[key] for key in keys}
