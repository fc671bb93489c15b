r"""Geometry: domains to sample collocation points in and on, with outward unit normals.

API summary (every sampler is seeded, reproducible bit for bit, returns float64 tensors unless ``dtype``
says otherwise; ``method`` is ``"uniform"``, ``"lhs"``, ``"sobol"`` or ``"grid"`` where it makes sense)::

    from lit_constrained.physics import Ball, Box, Disk, Polygon, SpaceTime

    domain = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.3, 0.3), 0.1) - Disk((0.7, 0.7), 0.1)  # Difference
    x = domain.interior(1000, "sobol", seed=0)            # (1000, 2), every point inside
    b = domain.boundary_sample(400, "uniform", seed=1)    # BoundarySample(points (400, 2), normals (400, 2))
    b.points, b.normals                                   # normals: outward unit normals of the domain
    domain.boundary(400, seed=1)                          # the same points, without normals
    domain.measure, domain.boundary_measure               # area 1 - 2 pi 0.01, length 4 + 0.4 pi
    domain.contains(x), domain.signed_distance(x), domain.normal(b.points)
    hole = Disk((0.3, 0.3), 0.1).signed_distance(b.points).abs() < 1e-9  # which piece a point lies on

    Disk(center, radius)          # 2D; Ball(center, radius) in any dimension
    Polygon(vertices)             # 2D simple polygon, either orientation
    a - b, a | b, a & b           # Difference(a, b), Union(a, b), Intersection(a, b)
    st = SpaceTime(domain, (0.0, 1.0))                    # points (x, y, t)
    st.interior(n), st.initial(n), st.boundary_sample(n)  # lateral boundary: normals (n_x, n_y, 0)

    domain.dirichlet(u, 64, value=g)                      # conditions as imposed parts (physics.conditions):
    domain.neumann(u, 64, value=h)                        # the normals travel as the part's per-point data
    Box.unit(2).periodic(u, "x", 16)                      # u(0, y) = u(1, y)

Every :class:`Geometry` has

* ``dim``, ``names`` (coordinate names, default ``x``, ``y``, ``z``), ``bounds`` (a bounding box);
* ``measure`` (area, volume: :math:`|\Omega|`) and ``boundary_measure`` (:math:`|\partial\Omega|`);
* ``signed_distance(x)`` (negative inside; exact for the primitives, for a constructive geometry the
  min/max combination of its pieces': its sign and its zero set exact, its magnitude a bound),
  ``contains(x)`` (the closed set, :math:`\mathrm{sd}(x) \le` a tolerance) and ``normal(x)`` (the outward
  unit normal of the boundary nearest to x);
* ``interior(n, method, seed, dtype)``, ``boundary(n, method, seed, dtype)`` (points) and
  ``boundary_sample(n, method, seed, dtype)`` (a :class:`BoundarySample`: the same points and their
  outward unit normals);
* the operators ``-``, ``|``, ``&`` (the constructive geometry below);
* the conditions ``dirichlet``, ``neumann``, ``periodic`` (:mod:`~lit_constrained.physics.conditions`):
  imposed parts on its boundary.

Boundary sampling in 2D parametrizes each piece's boundary curve by arc length :math:`s \in [0, L)` (a
measure-preserving map of :math:`[0, 1)`), so the boundary of the whole domain is a union of parameter
intervals and n points of :math:`[0, 1)` (uniform, LHS, Sobol or the grid :math:`(i + 1/2)/n`) map onto it
in proportion to length, n exact, with the stratification of the method kept. This module holds the base
class, the 2D boundary curve and the constructive geometry (in one module: the combinations subclass
Geometry and its operators build them); the unit-cube samplers shared by every geometry live in
:mod:`~lit_constrained.physics.collocation`, the shapes (the box among them) in
:mod:`~lit_constrained.physics.shapes`.

Constructive geometry (:class:`Difference`, :class:`Union`, :class:`Intersection`): :math:`A \setminus B` (``A - B``), :math:`A \cup B` (``A | B``), :math:`A \cap B`
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
  (:class:`BoundaryCurve`: the kept arcs found once, to machine
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

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics.collocation import (
    SamplingMethod, _check_count, _check_method, _no_grid, allocate, unit_cube_sample, unit_interval_sample,
)

from lit_constrained.physics.conditions import Conditions

__all__ = ["BoundarySample", "Difference", "Geometry", "Intersection", "Union"]

def as_numpy(x: Tensor | np.ndarray, dim: int) -> np.ndarray:
    """Points as a float64 numpy array (N, dim), with a clear error on another shape."""
    array = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"Points must have shape (N, {dim}), got {tuple(array.shape)}; a single point is x[None].")
    return array


def to_tensor(points: np.ndarray, dtype: torch.dtype) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(points, dtype=np.float64)).to(dtype)


class BoundarySample(NamedTuple):
    """Boundary points and the outward unit normals there, both (N, d) (a tuple: ``x, n = sample``)."""

    points: Tensor
    normals: Tensor


class Geometry(Conditions, ABC):
    r"""A closed domain :math:`\Omega \subset \mathbb{R}^d`: the shared API (see the module docstring).

    A subclass implements ``dim``, ``names``, ``bounds``, ``measure``, ``boundary_measure``,
    ``_signed_distance(x)`` and ``_normal(x)`` on numpy arrays, ``interior`` and either the 2D arc-length
    map ``_perimeter(u) -> (points, normals)`` with ``_perimeter_breaks`` (the corners' u) or its own
    ``_boundary_numpy(n, method, rng)``.
    """

    #: the relative tolerance (of the bounding box's diameter) of ``contains`` and of the boundary test of a
    #: constructive geometry outside 2D (in 2D: :attr:`BoundaryCurve.EPSILON`)
    TOLERANCE = 1e-9

    # ------------------------------------------------------------------ what a subclass gives
    @property
    @abstractmethod
    def dim(self) -> int:
        """The number of coordinates d."""

    @property
    @abstractmethod
    def names(self) -> tuple[str, ...]:
        """The coordinates' names (``()`` where there are no defaults: d > 3 without names)."""

    @property
    @abstractmethod
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """A bounding box ``(lower, upper)`` (numpy (d,) each)."""

    @property
    @abstractmethod
    def measure(self) -> float:
        r""":math:`|\Omega|`: the area (2D), volume (3D), length (1D)."""

    @property
    @abstractmethod
    def boundary_measure(self) -> float:
        r""":math:`|\partial\Omega|`: the boundary's length (2D), area (3D), number of points (1D)."""

    @abstractmethod
    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        """The signed distance (N,) at numpy points (N, d), negative inside."""

    @abstractmethod
    def _normal(self, x: np.ndarray) -> np.ndarray:
        """The outward unit normal (N, d) of the boundary nearest to numpy points (N, d)."""

    @abstractmethod
    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points of the domain, (n, d)."""

    def _leaves(self) -> list[tuple[Geometry, float]]:
        """The primitive pieces whose boundaries make this one's, with the sign of their normals here."""
        return [(self, 1.0)]

    # ------------------------------------------------------------------ shared
    @cached_property
    def scale(self) -> float:
        """The bounding box's diameter (the tolerances are relative to it)."""
        lower, upper = self.bounds
        return float(np.linalg.norm(upper - lower))

    def signed_distance(self, x: Tensor | np.ndarray) -> Tensor:
        """The signed distance to the boundary at the points x (N, d): negative inside; float64 (N,)."""
        return torch.from_numpy(self._signed_distance(as_numpy(x, self.dim)))

    def contains(self, x: Tensor | np.ndarray, tolerance: float | None = None) -> Tensor:
        """Whether each point x (N, d) lies in the closed domain (within ``tolerance``, default
        ``TOLERANCE`` x the bounding box's diameter): bool (N,)."""
        tol = self.TOLERANCE * self.scale if tolerance is None else tolerance
        return torch.from_numpy(self._signed_distance(as_numpy(x, self.dim)) <= tol)

    def normal(self, x: Tensor | np.ndarray, dtype: torch.dtype = torch.float64) -> Tensor:
        """The outward unit normal of the boundary nearest to each point x (N, d): (N, d)."""
        return to_tensor(self._normal(as_numpy(x, self.dim)), dtype)

    def boundary(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points on the boundary (the points of :meth:`boundary_sample`)."""
        return self.boundary_sample(n, method, seed, dtype).points

    def boundary_sample(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                        dtype: torch.dtype = torch.float64) -> BoundarySample:
        """n boundary points and their outward unit normals, spread in proportion to length (area).

        In 2D: along the arc length of the boundary, n exact, stratified as ``method`` ("grid": the
        arc-length nodes (i + 1/2) L / n); in other dimensions by each shape's own sampler."""
        _check_count(n, f"{type(self).__name__}.boundary_sample")
        _check_method(method)
        points, normals = self._boundary_numpy(n, method, np.random.default_rng(seed))
        return BoundarySample(to_tensor(points, dtype), to_tensor(normals, dtype))

    def _boundary_numpy(self, n: int, method: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if self.dim != 2:
            raise TypeError(f"{type(self).__name__} has no boundary sampler in {self.dim}D: a Geometry subclass "
                            "overrides _boundary_numpy(n, method, rng) outside 2D.")
        return self._curve.sample(unit_interval_sample(n, method, rng))

    @cached_property
    def _curve(self) -> BoundaryCurve:
        """The 2D boundary as arc-length intervals of its pieces' boundaries."""
        return BoundaryCurve.of(self)

    def _perimeter(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """2D: the boundary point at the arc-length fraction u in [0, 1] (and its outward normal)."""
        raise TypeError(f"{type(self).__name__} has no 2D arc-length map: a 2D Geometry subclass gives "
                        "_perimeter(u) -> (points, normals) and _perimeter_breaks.")

    @property
    def _perimeter_breaks(self) -> np.ndarray:
        """2D: the u of the corners of :meth:`_perimeter` (where it is not smooth), in [0, 1]."""
        return np.array([0.0, 1.0])

    #: 2D: whether :meth:`_perimeter` is straight between its breaks (a polygon's edges)
    _perimeter_straight = False
    #: 2D: (cx, cy, r) where :meth:`_perimeter` is the circle c + r (cos 2 pi u, sin 2 pi u)
    _perimeter_circle: tuple[float, float, float] | None = None

    # ------------------------------------------------------------------ constructive geometry
    # the combinations are defined below in this module (they subclass Geometry): no registry, no import circle
    def __sub__(self, other: Geometry) -> Difference:
        return Difference(self, other)

    def __or__(self, other: Geometry) -> Union:
        return Union(self, other)

    def __and__(self, other: Geometry) -> Intersection:
        return Intersection(self, other)


class BoundaryCurve:
    r"""A 2D domain's boundary as intervals :math:`[a, b] \subset [0, 1]` of its pieces' arc-length maps.

    For every piece (leaf) P with sign :math:`\sigma` (-1 for a subtracted piece), the point
    :math:`p = P(u)` with normal :math:`\sigma n_P(u)` is on the domain's boundary when the domain holds
    :math:`p - \varepsilon n` and not :math:`p + \varepsilon n` (:math:`\varepsilon` = ``EPSILON`` x the
    diameter), and no earlier piece has p on its boundary with the same normal (a shared edge counts
    once). The test runs on ``RESOLUTION`` + 1 equispaced u of each piece (and its corners); each change
    is located to machine precision (``STEPS`` cuts of its bracket into ``SECTIONS``). A kept or removed
    arc shorter than 1/``RESOLUTION`` of its piece's boundary that falls between two nodes is missed.
    """

    RESOLUTION = 4096
    SECTIONS = 16  # each refinement step cuts a bracket into 16: 4 bits a step
    STEPS = 11  # from 1/RESOLUTION = 2^-12 of a piece's boundary to 2^-56
    #: the perturbation of the test, relative to the diameter (an end point's error is about this)
    EPSILON = 1e-12

    def __init__(self, domain: Geometry, pieces: list[tuple[Geometry, float, float, float]]) -> None:
        self.domain = domain
        self.pieces = pieces  # (leaf, sign, a, b)
        self.lengths = np.array([leaf.boundary_measure * (b - a) for leaf, _, a, b in pieces])
        self._segments()

    def _segments(self) -> None:
        """The pieces split at their leaves' corners, as columns for :meth:`sample`: a straight segment
        (a leaf with ``_perimeter_straight``) by its start, unit direction and normal; an arc of a circle
        (a leaf with ``_perimeter_circle`` = (cx, cy, r)) by its center, radius and sign; any other curve
        by its leaf's map. ``kind``: 0 straight, 1 circle, 2 + k the k-th other leaf."""
        rows = []
        others: list[tuple[Geometry, float]] = []
        for leaf, sign, a, b in self.pieces:
            straight = getattr(leaf, "_perimeter_straight", False)
            circle = getattr(leaf, "_perimeter_circle", None)
            breaks = leaf._perimeter_breaks
            cuts = np.concatenate([[a], breaks[(breaks > a) & (breaks < b)], [b]]) if straight else np.array([a, b])
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                length = leaf.boundary_measure * (hi - lo)
                if length <= 0:
                    continue
                row = np.zeros(9)  # kind, x0, y0, dx, dy, nx, ny (straight) | cx, cy, r, sign (circle)
                if straight:
                    ends, _ = leaf._perimeter(np.array([lo, hi]))
                    _, middle = leaf._perimeter(np.array([0.5 * (lo + hi)]))
                    row[:7] = [0, *ends[0], *((ends[1] - ends[0]) / length), *(sign * middle[0])]
                elif circle is not None:
                    row[:5] = [1, *circle, sign]
                else:
                    if (leaf, sign) not in [(o, sg) for o, sg in others]:
                        others.append((leaf, sign))
                    row[0] = 2 + [(o, sg) for o, sg in others].index((leaf, sign))
                rows.append((row, length, lo, hi))
        table = np.array([row for row, *_ in rows])
        lengths = np.array([length for _, length, _, _ in rows])
        self._seg_kind = table[:, 0].astype(np.intp)
        self._seg_columns = table[:, 1:].T.copy()  # (8, segments): contiguous per column
        self._seg_cumulative = np.concatenate([[0.0], np.cumsum(lengths)])
        self._seg_slope = np.array([(hi - lo) / length for _, length, lo, hi in rows])
        self._seg_offset = np.array([lo for *_, lo, _ in rows]) - self._seg_cumulative[:-1] * self._seg_slope
        self._seg_others = others

    @property
    def length(self) -> float:
        """The boundary's length: the sum of the kept pieces' lengths."""
        return float(self.lengths.sum())

    @staticmethod
    def _kept(domain: Geometry, leaves: list[tuple[Geometry, float]], us: list[np.ndarray]) -> list[np.ndarray]:
        """Whether each leaf's points at the parameters ``us[i]`` lie on the domain's boundary (one test
        of all the leaves' points together)."""
        drawn = [leaf._perimeter(u) for (leaf, _), u in zip(leaves, us)]
        points = np.concatenate([p for p, _ in drawn])
        normals = np.concatenate([sign * n for (_, sign), (_, n) in zip(leaves, drawn)])
        owner = np.repeat(np.arange(len(leaves)), [len(u) for u in us])
        eps = BoundaryCurve.EPSILON * domain.scale
        keep = (domain._signed_distance(points - eps * normals) < 0) & (domain._signed_distance(points + eps * normals) > 0)
        for j, (other, other_sign) in enumerate(leaves[:-1]):
            on = (owner > j) & (np.abs(other._signed_distance(points)) <= eps)  # on an earlier leaf's boundary
            if on.any():
                rows = np.flatnonzero(on)
                same = np.einsum("ij,ij->i", other_sign * other._normal(points[rows]), normals[rows]) > 0.5
                keep[rows[same]] = False  # ... with the same normal: that leaf's point
        return np.split(keep, np.cumsum([len(u) for u in us])[:-1])

    @classmethod
    def of(cls, domain: Geometry) -> BoundaryCurve:
        leaves = domain._leaves()
        if len(leaves) == 1 and leaves[0][0] is domain:
            return cls(domain, [(domain, 1.0, 0.0, 1.0)])
        us = [np.union1d(np.linspace(0.0, 1.0, cls.RESOLUTION + 1), leaf._perimeter_breaks) for leaf, _ in leaves]
        keeps = cls._kept(domain, leaves, us)
        changes = [np.flatnonzero(keep[1:] != keep[:-1]) for keep in keeps]
        lo = [u[c] for u, c in zip(us, changes)]
        hi = [u[c + 1] for u, c in zip(us, changes)]
        lo_keep = [keep[c] for keep, c in zip(keeps, changes)]
        fractions = np.arange(1, cls.SECTIONS) / cls.SECTIONS
        for _ in range(cls.STEPS):  # every change of every leaf at once, each bracket cut in SECTIONS
            nodes = [np.concatenate([a[:, None], a[:, None] + (b - a)[:, None] * fractions, b[:, None]], axis=1)
                     for a, b in zip(lo, hi)]
            tests = cls._kept(domain, leaves, [t[:, 1:-1].reshape(-1) for t in nodes])
            for j, (t, at, k) in enumerate(zip(nodes, tests, lo_keep)):
                differs = at.reshape(len(t), cls.SECTIONS - 1) != k[:, None]
                first = np.where(differs.any(axis=1), differs.argmax(axis=1), cls.SECTIONS - 1)
                rows = np.arange(len(t))
                lo[j], hi[j] = t[rows, first], t[rows, first + 1]
        pieces = []
        for (leaf, sign), keep, a, b, k in zip(leaves, keeps, lo, hi, lo_keep):
            cut = 0.5 * (a + b)
            edges = np.concatenate([[0.0], cut, [1.0]])
            states = np.concatenate([[keep[0]], ~k])
            for start, end, state in zip(edges[:-1], edges[1:], states):
                if state and end > start:
                    pieces.append((leaf, sign, float(start), float(end)))
        if not pieces:
            raise ValueError(f"{type(domain).__name__}: the domain has an empty boundary (is it empty?).")
        return cls(domain, pieces)

    def sample(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The boundary points (and normals) at the arc-length fractions v in [0, 1) of the whole boundary
        (in v's order): on a straight segment its start + arc length x its direction, on an arc of a
        circle :math:`c + r(\\cos\\theta, \\sin\\theta)`, on another curve its leaf's map."""
        s = v * self._seg_cumulative[-1]
        which = np.searchsorted(self._seg_cumulative[1:-1], s, side="right")  # the segment of each point
        along = s - self._seg_cumulative[which]
        x0, y0, dx, dy, nx, ny, _, _ = self._seg_columns
        points = np.empty((len(v), 2))
        normals = np.empty((len(v), 2))
        points[:, 0] = x0[which] + along * dx[which]
        points[:, 1] = y0[which] + along * dy[which]
        normals[:, 0] = nx[which]
        normals[:, 1] = ny[which]
        kind = self._seg_kind[which]
        arcs = np.flatnonzero(kind == 1)
        if len(arcs):
            segment = which[arcs]
            cx, cy, r, sign = (column[segment] for column in self._seg_columns[:4])
            angle = (2 * math.pi) * (self._seg_offset[segment] + self._seg_slope[segment] * s[arcs])
            cos, sin = np.cos(angle), np.sin(angle)
            points[arcs, 0], points[arcs, 1] = cx + r * cos, cy + r * sin
            normals[arcs, 0], normals[arcs, 1] = sign * cos, sign * sin
        for index, (shape, sign_) in enumerate(self._seg_others):
            rows = np.flatnonzero(kind == 2 + index)
            if len(rows):
                segment = which[rows]
                p, nrm = shape._perimeter(self._seg_offset[segment] + self._seg_slope[segment] * s[rows])
                points[rows], normals[rows] = p, sign_ * nrm
        return points, normals

    def area(self, nodes: int = 32) -> float:
        r""":math:`|\Omega| = \frac12 \oint (x - x_0) \cdot n \, ds` (the divergence theorem), by Gauss-Legendre
        on every kept interval split at its piece's corners: exact on straight edges, spectrally accurate on arcs."""
        g, w = np.polynomial.legendre.leggauss(nodes)
        center = 0.5 * (self.domain.bounds[0] + self.domain.bounds[1])
        total = 0.0
        for leaf, sign, a, b in self.pieces:
            breaks = leaf._perimeter_breaks
            cuts = np.concatenate([[a], breaks[(breaks > a) & (breaks < b)], [b]])
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                u = 0.5 * (hi - lo) * g + 0.5 * (hi + lo)
                p, nrm = leaf._perimeter(u)
                integrand = np.einsum("ij,ij->i", p - center, sign * nrm)
                total += 0.5 * leaf.boundary_measure * 0.5 * float(hi - lo) * float(w @ integrand)
        return float(total)


MAX_ROUNDS = 64
"""The most rounds of rejection before a sampler gives up (the domain is then (nearly) empty)."""


@dataclass(frozen=True, eq=True)
class _Combination(Geometry):
    """Two geometries of one dimension, combined (the shared part of the three operations; the module
    docstring's "Constructive geometry" has the formulas)."""

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

