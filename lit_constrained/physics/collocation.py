r"""Collocation: seeded points of the unit cube and the unit interval by a sampling method, and counts
shared among pieces; every geometry maps these points onto its domain and its boundary.

The methods (every draw from numpy's ``default_rng(seed)`` or a stream spawned from it, reproducible bit
for bit):

* ``"uniform"``: i.i.d. uniform points;
* ``"lhs"``: a Latin hypercube (``scipy.stats.qmc.LatinHypercube``): every one of the n equal slices of
  each coordinate holds exactly one point;
* ``"sobol"``: a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``; its balance properties need n a
  power of 2, and scipy warns otherwise);
* ``"grid"``: a geometry's own nodes (a box's tensor grid, a 2D boundary's arc-length nodes
  :math:`(i + 1/2)/n`), where it has them.

:func:`allocate` shares n points among pieces (a box's faces, a constructive geometry's leaves) in
proportion to their measures by largest remainders, n exact.

Example:
    >>> import numpy as np
    >>> unit_cube_sample(4, 2, "lhs", np.random.default_rng(0)).shape, allocate(10, [1.0, 1.0, 2.0])
    ((4, 2), [2, 3, 5])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["SAMPLING_METHODS", "SamplingMethod", "allocate", "unit_cube_sample", "unit_interval_sample"]

SamplingMethod = Literal["uniform", "lhs", "sobol", "grid"]
SAMPLING_METHODS: tuple[str, ...] = ("uniform", "lhs", "sobol", "grid")
RANDOM_METHODS: tuple[str, ...] = ("uniform", "lhs", "sobol")


def _check_count(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what}: the number of points must be a positive integer, got {n!r}.")


def _check_method(method: str) -> None:
    if method not in SAMPLING_METHODS:
        raise ValueError(f"Unknown sampling method {method!r}: use one of {SAMPLING_METHODS}.")


def _no_grid(method: str, what: str) -> None:
    _check_method(method)
    if method == "grid":
        raise ValueError(f"{what}: no grid with an exact number of points here; use 'uniform', 'lhs' or 'sobol'.")


def unit_cube_sample(n: int, dim: int, method: str, rng: np.random.Generator) -> np.ndarray:
    """n random points of :math:`[0, 1)^{dim}` by ``"uniform"``, ``"lhs"`` or ``"sobol"`` (float64 (n, dim))."""
    _check_method(method)
    if method == "grid":
        raise ValueError("unit_cube_sample draws random points; grids come from Box.interior/face/boundary.")
    if dim == 0:
        return np.zeros((n, 0))
    if method == "uniform":
        return rng.random((n, dim))
    from scipy.stats import qmc  # scipy is a dependency; imported on use (it is slow to import)

    engine = qmc.LatinHypercube(dim, rng=rng) if method == "lhs" else qmc.Sobol(dim, scramble=True, rng=rng)
    return engine.random(n)


def unit_interval_sample(n: int, method: str, rng: np.random.Generator) -> np.ndarray:
    """n numbers of [0, 1) (shape (n,)): ``unit_cube_sample`` in 1D, or the grid :math:`(i + 1/2)/n`."""
    _check_method(method)
    if method == "grid":
        return (np.arange(n) + 0.5) / n
    if method == "sobol" and n & (n - 1) == 0:
        return unit_cube_sample(n, 1, method, rng)[:, 0]
    if method == "sobol":  # a power-of-2 draw, its first n (scipy warns on other n; the prefix stays balanced)
        return unit_cube_sample(1 << (n - 1).bit_length(), 1, method, rng)[:n, 0]
    return unit_cube_sample(n, 1, method, rng)[:, 0]


def allocate(n: int, weights: Sequence[float]) -> list[int]:
    """n shared in proportion to ``weights`` by largest remainders (ties to the first), summing to n exactly."""
    total = float(sum(weights))
    shares = [n * w / total for w in weights]
    counts = [int(math.floor(s)) for s in shares]
    for j in sorted(range(len(shares)), key=lambda j: (counts[j] - shares[j], j))[: n - sum(counts)]:
        counts[j] += 1
    return counts
