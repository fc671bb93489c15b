r"""Constructive geometry: :math:`A \setminus B` (``A - B``), :math:`A \cup B` (``A | B``), :math:`A \cap B`
(``A & B``) of any two geometries of one dimension, nested freely.

* **Inside**: the signed distances combine as :math:`\max(d_A, -d_B)`, :math:`\min(d_A, d_B)`,
  :math:`\max(d_A, d_B)`: their sign (in, out) and their zero set (the boundary) are exact, their
  magnitude a bound on the distance. ``normal(x)`` is the normal of the piece whose distance is the
  combination's (negated for a subtracted piece).
* **Interior points**: drawn in the bounding box (uniform, LHS or Sobol, continued in rounds) and kept
  where strictly inside, the first n. Uniform draws stay uniform; an LHS or Sobol draw keeps its
  stratification only up to the rejection.
* **Boundary points** (2D): the boundary is made of arcs of the pieces' boundaries; each piece's point
  :math:`p` with normal :math:`n` (the piece's, negated for a subtracted piece) is kept where the result
  holds :math:`p - \varepsilon n` and not :math:`p + \varepsilon n`
  (:class:`~lit_constrained.physics.geometry.BoundaryCurve`: the kept arcs found once, to machine
  precision), and n points of :math:`[0, 1)` are mapped onto the kept arcs by arc length: in proportion
  to length, n exact. In other dimensions: each piece's boundary sampled in proportion to its area, the
  points kept by the same test, in rounds until n.
* **Measures** (2D): the boundary length is the kept arcs' length; the area
  :math:`\frac12\oint (x - x_0)\cdot n\,ds` by the divergence theorem on the kept arcs (exact on straight
  edges, Gauss-Legendre on arcs). In other dimensions no closed form: an error says so.

Example:
    >>> from lit_constrained.physics import Box, Disk
    >>> plate = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.25)
    >>> round(plate.measure, 12) == round(1 - 3.141592653589793 / 16, 12)
    True
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics.geometry import (
    COMBINATIONS, Geometry, SamplingMethod, _check_count, _no_grid, allocate, to_tensor, unit_cube_sample,
)

__all__ = ["Difference", "Intersection", "Union"]

MAX_ROUNDS = 64
"""The most rounds of rejection before a sampler gives up (the domain is then (nearly) empty)."""


@dataclass(frozen=True, eq=True)
class _Combination(Geometry):
    """Two geometries of one dimension, combined (the shared part of the three operations)."""

    first: Geometry
    second: Geometry

    def __post_init__(self) -> None:
        for part in (self.first, self.second):
            if not isinstance(part, Geometry):
                raise TypeError(f"{type(self).__name__} combines geometries, got {type(part).__name__}.")
        if self.first.dim != self.second.dim:
            raise ValueError(f"{type(self).__name__}: a {self.first.dim}D and a {self.second.dim}D geometry.")

    @property
    def dim(self) -> int:
        return self.first.dim

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.first.names)

    def _leaves(self) -> list[tuple[Geometry, float]]:
        return self.first._leaves() + [(leaf, self._second_sign * sign) for leaf, sign in self.second._leaves()]

    _second_sign = 1.0

    # ------------------------------------------------------------------ measures
    def _need_2d(self, what: str) -> None:
        if self.dim != 2:
            raise ValueError(f"{type(self).__name__}.{what} has a closed form in 2D only (here {self.dim}D); "
                             "estimate it from contains() on a Monte Carlo sample of the bounding box.")

    @property
    def measure(self) -> float:
        self._need_2d("measure")
        return self._curve.area()

    @property
    def boundary_measure(self) -> float:
        self._need_2d("boundary_measure")
        return self._curve.length

    # ------------------------------------------------------------------ samplers
    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points strictly inside, by rejection from the bounding box (no grid)."""
        what = f"{type(self).__name__}.interior"
        _check_count(n, what)
        _no_grid(method, what)
        lower, upper = self.bounds
        if np.any(upper <= lower):
            raise ValueError(f"{what}: the domain is empty (its bounding box is {lower} .. {upper}).")
        rng = np.random.default_rng(seed)
        engine = None
        if method == "sobol":
            from scipy.stats import qmc

            engine = qmc.Sobol(self.dim, scramble=True, rng=rng)
        kept: list[np.ndarray] = []
        have, batch = 0, max(64, int(1.25 * n))  # later rounds sized by the acceptance seen
        for _ in range(MAX_ROUNDS):
            if engine is not None:  # whole powers of 2 keep each round of Sobol points balanced
                batch = 1 << (batch - 1).bit_length()
            unit = engine.random(batch) if engine is not None else unit_cube_sample(batch, self.dim, method, rng)
            points = lower + (upper - lower) * unit
            inside = points[self._signed_distance(points) < 0]
            kept.append(inside)
            have += len(inside)
            if have >= n:
                return to_tensor(np.concatenate(kept)[:n], dtype)
            rate = max(have, 1) / (batch * len(kept))
            batch = int(min(1 << 24, max(64, 1.2 * (n - have) / rate)))
        raise ValueError(f"{what}: {have} of {n} points after {MAX_ROUNDS} rounds; is the domain (nearly) empty?")

    def _boundary_numpy(self, n: int, method: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if self.dim == 2:
            return super()._boundary_numpy(n, method, rng)
        _no_grid(method, f"{type(self).__name__}.boundary_sample in {self.dim}D")
        leaves = self._leaves()
        eps = self.TOLERANCE * self.scale
        weights = [leaf.boundary_measure for leaf, _ in leaves]
        points_kept: list[np.ndarray] = []
        normals_kept: list[np.ndarray] = []
        have, batch = 0, max(64, 2 * n)
        for _ in range(MAX_ROUNDS):
            drawn_p, drawn_n = [], []
            for (leaf, sign), count in zip(leaves, allocate(batch, weights)):
                if count == 0:
                    continue
                with warnings.catch_warnings():  # a piece's count is no power of 2; the rejection unbalances anyway
                    warnings.filterwarnings("ignore", "The balance properties of Sobol")
                    p, nrm = leaf._boundary_numpy(count, method, np.random.default_rng(rng.integers(2**63)))
                nrm = sign * nrm
                keep = (self._signed_distance(p - eps * nrm) < 0) & (self._signed_distance(p + eps * nrm) > 0)
                drawn_p.append(p[keep])
                drawn_n.append(nrm[keep])
            p, nrm = np.concatenate(drawn_p), np.concatenate(drawn_n)
            order = rng.permutation(len(p))
            points_kept.append(p[order])
            normals_kept.append(nrm[order])
            have += len(p)
            if have >= n:
                return np.concatenate(points_kept)[:n], np.concatenate(normals_kept)[:n]
            rate = max(have, 1) / (batch * len(points_kept))
            batch = int(min(1 << 24, max(64, 1.2 * (n - have) / rate)))
        raise ValueError(f"{type(self).__name__}.boundary_sample: {have} of {n} points after {MAX_ROUNDS} rounds.")


@dataclass(frozen=True, eq=True)
class Difference(_Combination):
    r""":math:`A \setminus B` (``A - B``): the points of A outside B; B's boundary inside A is a boundary
    with the normals of B reversed."""

    _second_sign = -1.0

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.first.bounds

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.first._signed_distance(x), -self.second._signed_distance(x))

    def _normal(self, x: np.ndarray) -> np.ndarray:
        a, b = self.first._signed_distance(x), -self.second._signed_distance(x)
        return np.where((a >= b)[:, None], self.first._normal(x), -self.second._normal(x))


@dataclass(frozen=True, eq=True)
class Union(_Combination):
    r""":math:`A \cup B` (``A | B``)."""

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        (la, ua), (lb, ub) = self.first.bounds, self.second.bounds
        return np.minimum(la, lb), np.maximum(ua, ub)

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        return np.minimum(self.first._signed_distance(x), self.second._signed_distance(x))

    def _normal(self, x: np.ndarray) -> np.ndarray:
        a, b = self.first._signed_distance(x), self.second._signed_distance(x)
        return np.where((a <= b)[:, None], self.first._normal(x), self.second._normal(x))


@dataclass(frozen=True, eq=True)
class Intersection(_Combination):
    r""":math:`A \cap B` (``A & B``)."""

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        (la, ua), (lb, ub) = self.first.bounds, self.second.bounds
        return np.maximum(la, lb), np.minimum(ua, ub)

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.first._signed_distance(x), self.second._signed_distance(x))

    def _normal(self, x: np.ndarray) -> np.ndarray:
        a, b = self.first._signed_distance(x), self.second._signed_distance(x)
        return np.where((a >= b)[:, None], self.first._normal(x), self.second._normal(x))


COMBINATIONS.update(Difference=Difference, Union=Union, Intersection=Intersection)
