r"""Primitive shapes: the box :math:`\prod_i [a_i, b_i]`, the ball :math:`\{x : |x - c| \le r\}` in any
dimension (:class:`Disk` in 2D) and the simple polygon (2D), with the
:class:`~lit_constrained.physics.geometry.Geometry` API.

The box (:class:`Box`): interior, boundary, one face, an initial slice, facing pairs across a coordinate.

* ``"grid"``: a tensor grid with the same number of nodes k along every coordinate: in the interior the
  k^d nodes strictly inside (``linspace(a, b, k + 2)[1:-1]``), on a face the k^(d-1) nodes of the face
  (ends included), on the boundary the nodes of the k^d grid (ends included) that lie on it. n must
  match such a count; the error names the nearest ones.
* The boundary is shared among the faces in proportion to their (d-1)-dimensional measure (largest
  remainders), each face sampled on its own stream (``numpy.random.SeedSequence(seed).spawn``), so a
  boundary sample is stratified by face. A space-time box names its coordinates (``names=("x", "t")``):
  ``boundary(n, dims=("x",))`` is then the spatial boundary over all times and ``initial(n, time="t")``
  the slice t = a_t.

The other shapes' samplers map points of the unit cube (uniform, LHS or Sobol, :func:`unit_cube_sample`) by
measure-preserving maps, so the stratification of LHS and Sobol carries over:

* disk interior :math:`(u_1, u_2) \mapsto c + r\sqrt{u_1}(\cos 2\pi u_2, \sin 2\pi u_2)` (equal areas);
  circle :math:`u \mapsto c + r(\cos 2\pi u, \sin 2\pi u)`, normal :math:`(x - c)/r`;
* sphere (3D) by Archimedes' map :math:`(u_1, u_2) \mapsto (\sqrt{1-z^2}\cos 2\pi u_2, \sqrt{1-z^2}\sin 2\pi u_2, z)`,
  :math:`z = 1 - 2u_1`; a ball in d >= 3 (and spheres in d >= 4) by d normal deviates
  (:math:`\Phi^{-1}` of the unit-cube coordinates) normalized, the radius :math:`r u^{1/d}`;
* polygon interior by an ear-clipping triangulation: :math:`u_1` picks the triangle in proportion to its
  area and is rescaled within it, then :math:`(u_1, u_2) \mapsto (1-\sqrt{u_1})A + \sqrt{u_1}(1-u_2)B +
  \sqrt{u_1}u_2C`; its boundary by arc length, each edge's normal the edge turned clockwise (the vertices
  counter-clockwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics.collocation import (
    SamplingMethod, _check_count, _check_method, _no_grid, allocate, unit_cube_sample,
)
from lit_constrained.physics.geometry import BoundarySample, Geometry, to_tensor
from lit_constrained.physics.operators import Coordinate, coordinate_index, default_names

__all__ = ["Ball", "Box", "Disk", "Polygon"]


def _names(names: Sequence[str], dim: int, what: str) -> tuple[str, ...]:
    names = tuple(names) if names else default_names(dim)
    if names and (len(names) != dim or len(set(names)) != len(names)):
        raise ValueError(f"{what} names={names} must be {dim} distinct names, one per coordinate.")
    return names


def _gaussian(unit: np.ndarray) -> np.ndarray:
    """Standard normal deviates from unit-cube points (the inverse normal CDF, clipped off 0 and 1)."""
    from scipy.special import ndtri

    return ndtri(np.clip(unit, 1e-16, 1 - 1e-16))


Side = Literal["lower", "upper"]


def _nearest(counts: dict[int, int], n: int) -> str:
    """The valid counts just below and above n, as text."""
    values = sorted(set(counts))
    below = [v for v in values if v < n][-1:]
    above = [v for v in values if v > n][:1]
    return " or ".join(str(v) for v in below + above)


@dataclass(frozen=True)
class Box(Geometry):
    r"""The box :math:`\prod_i [a_i, b_i]` with named coordinates.

    Every sampler takes ``(n, method, seed, dtype)`` in this order, as every geometry's; what picks a part
    of the box comes first where it is required (``face(coordinate, side, n, ...)``,
    ``periodic_pairs(coordinate, n, ...)``) and by keyword where it has a default (``dims=`` of
    :meth:`boundary` and :meth:`boundary_sample`, ``time=`` of :meth:`initial`).

    Args:
        lower: the lower corner :math:`(a_1, \dots, a_d)`.
        upper: the upper corner :math:`(b_1, \dots, b_d)`, each :math:`b_i > a_i`.
        names: the coordinates' names (default ``x``, ``y``, ``z`` for d <= 3), used to name a face,
            the time coordinate or the ``dims`` of a boundary.
    """

    lower: Sequence[float]
    upper: Sequence[float]
    names: Sequence[str] = field(default=())

    def __post_init__(self) -> None:
        lower = tuple(float(a) for a in self.lower)
        upper = tuple(float(b) for b in self.upper)
        if not lower or len(lower) != len(upper):
            raise ValueError(f"Box needs lower and upper corners of the same length >= 1, got {lower} and {upper}.")
        if not all(math.isfinite(a) and math.isfinite(b) and b > a for a, b in zip(lower, upper)):
            raise ValueError(f"Box needs finite corners with upper > lower in every coordinate, got {lower}, {upper}.")
        names = tuple(self.names) if self.names else default_names(len(lower))
        if names and (len(names) != len(lower) or len(set(names)) != len(names)):
            raise ValueError(f"Box names={names} must be {len(lower)} distinct names, one per coordinate.")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "names", names)

    @classmethod
    def unit(cls, dim: int, names: Sequence[str] = ()) -> Box:
        """The unit cube :math:`[0, 1]^{dim}`."""
        return cls((0.0,) * dim, (1.0,) * dim, names)

    @property
    def dim(self) -> int:
        return len(self.lower)

    def index(self, coordinate: Coordinate) -> int:
        """The index of a coordinate given by index or name."""
        return coordinate_index(coordinate, self.dim, self.names or None)

    # ------------------------------------------------------------------ helpers
    def _scale(self, unit: np.ndarray, axes: Sequence[int]) -> np.ndarray:
        lo = np.asarray(self.lower)[list(axes)]
        hi = np.asarray(self.upper)[list(axes)]
        return lo + (hi - lo) * unit

    def _on_face(self, axis: int, side: Side, free_points: np.ndarray) -> np.ndarray:
        """Points on the face x_axis = a or b, given their d - 1 other coordinates (n, d - 1)."""
        if side not in ("lower", "upper"):
            raise ValueError(f"A face's side is 'lower' or 'upper', got {side!r}.")
        free = [i for i in range(self.dim) if i != axis]
        points = np.empty((free_points.shape[0], self.dim))
        points[:, free] = free_points
        points[:, axis] = self.lower[axis] if side == "lower" else self.upper[axis]
        return points

    @staticmethod
    def _tensor(points: np.ndarray, dtype: torch.dtype) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(points)).to(dtype)

    def _axis_nodes(self, axis: int, k: int, ends: bool) -> np.ndarray:
        nodes = np.linspace(self.lower[axis], self.upper[axis], k if ends else k + 2)
        return nodes if ends else nodes[1:-1]

    def _grid_nodes(self, axes: Sequence[int], k: int, ends: bool) -> np.ndarray:
        """The tensor grid (row-major, the last axis fastest) of ``axes`` with k nodes each: (k^|axes|, |axes|)."""
        if not axes:
            return np.zeros((1, 0))
        mesh = np.meshgrid(*(self._axis_nodes(a, k, ends) for a in axes), indexing="ij")
        return np.stack([m.reshape(-1) for m in mesh], axis=1)

    @staticmethod
    def _nodes_per_axis(n: int, count: Callable[[int], int], what: str, smallest: int) -> int:
        """The k with count(k) == n (count increasing in k), or an error naming the nearest valid n."""
        counts: dict[int, int] = {}
        k = smallest
        while True:
            c = count(k)
            counts[c] = k
            if c >= n or k > n + 2:
                break
            k += 1
        if n in counts:
            return counts[n]
        raise ValueError(f"{what}: a grid cannot have n = {n} points here; the nearest grids have {_nearest(counts, n)}.")

    # ------------------------------------------------------------------ samplers
    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points in the box (``"grid"``: the k^d nodes strictly inside, n = k^d)."""
        _check_count(n, "Box.interior")
        _check_method(method)
        if method == "grid":
            k = self._nodes_per_axis(n, lambda k: k**self.dim, "Box.interior", 1)
            return self._tensor(self._grid_nodes(range(self.dim), k, ends=False), dtype)
        unit = unit_cube_sample(n, self.dim, method, np.random.default_rng(seed))
        return self._tensor(self._scale(unit, range(self.dim)), dtype)

    def face(self, coordinate: Coordinate, side: Side, n: int, method: SamplingMethod = "uniform", seed: int = 0,
             dtype: torch.dtype = torch.float64) -> Tensor:
        """n points on the face where ``coordinate`` is at its ``"lower"`` or ``"upper"`` end
        (``"grid"``: the k^(d-1) nodes of the face, ends included)."""
        _check_count(n, "Box.face")
        _check_method(method)
        axis = self.index(coordinate)
        free = [i for i in range(self.dim) if i != axis]
        if method == "grid":
            if not free and n != 1:
                raise ValueError(f"Box.face: the faces of a 1-D box are single points; a grid has n = 1, got {n}.")
            k = self._nodes_per_axis(n, lambda k: k ** len(free), "Box.face", 2) if free else 1
            return self._tensor(self._on_face(axis, side, self._grid_nodes(free, k, ends=True)), dtype)
        unit = unit_cube_sample(n, len(free), method, np.random.default_rng(seed))
        return self._tensor(self._on_face(axis, side, self._scale(unit, free)), dtype)

    def initial(self, n: int, method: SamplingMethod = "uniform", seed: int = 0, dtype: torch.dtype = torch.float64,
                *, time: Coordinate = -1) -> Tensor:
        """n points of the initial slice, where ``time`` (default: the last coordinate) is at its lower end."""
        return self.face(time, "lower", n, method, seed, dtype)

    def _face_measures(self, axes: Sequence[int]) -> list[tuple[int, Side, float]]:
        widths = [b - a for a, b in zip(self.lower, self.upper)]
        faces = []
        for axis in axes:
            measure = math.prod(w for i, w in enumerate(widths) if i != axis)
            faces += [(axis, "lower", measure), (axis, "upper", measure)]
        return faces

    def _boundary_arrays(self, n: int, method: str, seed: int, dims: Sequence[Coordinate] | None,
                         what: str) -> tuple[np.ndarray, np.ndarray]:
        """The boundary points of :meth:`boundary` and their outward unit normals (numpy (n, d) each)."""
        _check_count(n, what)
        _check_method(method)
        axes = list(range(self.dim)) if dims is None else sorted({self.index(c) for c in dims})
        if not axes:
            raise ValueError(f"{what}: dims is empty; name at least one coordinate whose faces to sample.")
        if method == "grid":
            others = self.dim - len(axes)
            k = self._nodes_per_axis(n, lambda k: k**self.dim - k**others * (k - 2) ** len(axes), what, 2)
            nodes = self._grid_nodes(range(self.dim), k, ends=True)
            normals = np.zeros_like(nodes)
            for axis in axes:
                normals[:, axis] = (nodes[:, axis] == self.upper[axis]).astype(float) - (nodes[:, axis] == self.lower[axis])
            on = np.any(normals != 0, axis=1)
            normals = normals[on]  # a corner node: the normalized sum of its faces' normals
            return nodes[on], normals / np.linalg.norm(normals, axis=1, keepdims=True)
        faces = self._face_measures(axes)
        counts = allocate(n, [m for *_, m in faces])
        streams = np.random.SeedSequence(seed).spawn(len(faces))
        blocks, normals = [], []
        for (axis, side, _), count, stream in zip(faces, counts, streams):
            if count:
                free = [i for i in range(self.dim) if i != axis]
                unit = unit_cube_sample(count, len(free), method, np.random.default_rng(stream))
                blocks.append(self._on_face(axis, side, self._scale(unit, free)))
                normal = np.zeros((count, self.dim))
                normal[:, axis] = -1.0 if side == "lower" else 1.0
                normals.append(normal)
        return np.concatenate(blocks), np.concatenate(normals)

    def boundary(self, n: int, method: SamplingMethod = "uniform", seed: int = 0, dtype: torch.dtype = torch.float64,
                 *, dims: Sequence[Coordinate] | None = None) -> Tensor:
        """n points on the boundary: on the faces of the coordinates ``dims`` (default: all), shared in
        proportion to the faces' measures, face by face (lower then upper end of each coordinate in order).

        ``"grid"``: the nodes of the k^d grid (ends included) on those faces, each once (corners too).
        """
        return self._tensor(self._boundary_arrays(n, method, seed, dims, "Box.boundary")[0], dtype)

    def boundary_sample(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                        dtype: torch.dtype = torch.float64, *, dims: Sequence[Coordinate] | None = None) -> BoundarySample:
        """The points of :meth:`boundary` (the same arguments give the same points) and their outward unit
        normals :math:`\\pm e_i` (a grid's corner node: the normalized sum of its faces' normals)."""
        points, normals = self._boundary_arrays(n, method, seed, dims, "Box.boundary_sample")
        return BoundarySample(self._tensor(points, dtype), self._tensor(normals, dtype))

    def periodic_pairs(self, coordinate: Coordinate, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                       dtype: torch.dtype = torch.float64) -> Tensor:
        """n pairs of points facing each other across ``coordinate``: ``[x_left, x_right]`` side by side,
        (n, 2 d), x_left on the face where the coordinate is at its lower end and x_right the same point
        moved to the upper end (:func:`~lit_constrained.physics.operators.periodic_difference` imposes
        u(x_left) - u(x_right) = 0 on them; the points of ``face(coordinate, "lower", ...)``)."""
        left = self.face(coordinate, "lower", n, method, seed, dtype)
        right = left.clone()
        axis = self.index(coordinate)
        right[:, axis] = self.upper[axis]
        return torch.cat([left, right], dim=1)

    # ------------------------------------------------------------------ as a Geometry
    @cached_property
    def _center(self) -> np.ndarray:
        return 0.5 * (np.asarray(self.lower) + np.asarray(self.upper))

    @cached_property
    def _half(self) -> np.ndarray:
        return 0.5 * (np.asarray(self.upper) - np.asarray(self.lower))

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.lower), np.asarray(self.upper)

    @property
    def measure(self) -> float:
        r""":math:`\prod_i (b_i - a_i)`."""
        return math.prod(b - a for a, b in zip(self.lower, self.upper))

    @property
    def boundary_measure(self) -> float:
        """The faces' total measure (2 for a 1-D box: its two end points)."""
        return float(sum(m for *_, m in self._face_measures(range(self.dim))))

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        q = np.abs(x - self._center) - self._half
        positive = np.maximum(q, 0.0)
        outside = np.sqrt(np.einsum("ij,ij->i", positive, positive))
        return outside + np.minimum(q.max(axis=1), 0.0)

    def _normal(self, x: np.ndarray) -> np.ndarray:
        """The normal of the face with the largest :math:`|x_i - c_i| - h_i` (the nearest one from inside)."""
        offset = x - self._center
        axis = (np.abs(offset) - self._half).argmax(axis=1)
        normals = np.zeros_like(x)
        rows = np.arange(len(x))
        normals[rows, axis] = np.where(offset[rows, axis] >= 0, 1.0, -1.0)
        return normals

    def _boundary_numpy(self, n: int, method: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self._boundary_arrays(n, method, int(rng.integers(2**63)), None, "Box.boundary_sample")

    _perimeter_straight = True  # its boundary map is straight between the corners

    @cached_property
    def _perimeter_breaks(self) -> np.ndarray:
        width, height = 2 * self._half
        return np.array([0.0, width, width + height, 2 * width + height, 2 * (width + height)]) / (2 * (width + height))

    def _perimeter(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """2D: counter-clockwise from the lower-left corner (bottom, right, top, left side)."""
        if self.dim != 2:
            raise ValueError("A box's arc-length map is its 2D rectangle's.")
        (ax, ay), (bx, by) = self.lower, self.upper
        width, height = bx - ax, by - ay
        arc = np.mod(u, 1.0) * (2 * (width + height))
        side = (arc >= width).astype(np.intp) + (arc >= width + height) + (arc >= 2 * width + height)
        points = np.empty((len(arc), 2))
        points[:, 0] = np.choose(side, [ax + arc, bx, bx - (arc - width - height), ax])
        points[:, 1] = np.choose(side, [ay, ay + (arc - width), by, by - (arc - 2 * width - height)])
        outward = np.array([[0.0, -1.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
        return points, outward[side]

    def grid(self, points_per_axis: int | Sequence[int], dtype: torch.dtype = torch.float64) -> Tensor:
        """The tensor grid with ``points_per_axis`` nodes along each coordinate, ends included (a test grid):
        shape (prod k_i, d), row-major (the last coordinate fastest)."""
        ks = [points_per_axis] * self.dim if isinstance(points_per_axis, int) else list(points_per_axis)
        if len(ks) != self.dim or any(isinstance(k, bool) or not isinstance(k, int) or k < 2 for k in ks):
            raise ValueError(f"Box.grid: points_per_axis must be {self.dim} integers >= 2, got {points_per_axis!r}.")
        mesh = np.meshgrid(*(np.linspace(a, b, k) for a, b, k in zip(self.lower, self.upper, ks)), indexing="ij")
        return self._tensor(np.stack([m.reshape(-1) for m in mesh], axis=1), dtype)


@dataclass(frozen=True, eq=True)
class Ball(Geometry):
    r"""The closed ball :math:`\{x \in \mathbb{R}^d : |x - c| \le r\}`.

    Args:
        center: :math:`c`, d coordinates.
        radius: :math:`r > 0`.
        names: the coordinates' names (default ``x``, ``y``, ``z`` for d <= 3).
    """

    center: Sequence[float]
    radius: float
    names: Sequence[str] = field(default=())

    def __post_init__(self) -> None:
        center = tuple(float(c) for c in self.center)
        if not center or not all(math.isfinite(c) for c in center):
            raise ValueError(f"{type(self).__name__} needs a finite center of >= 1 coordinates, got {self.center!r}.")
        radius = float(self.radius)
        if not (math.isfinite(radius) and radius > 0):
            raise ValueError(f"{type(self).__name__} needs a finite radius > 0, got {self.radius!r}.")
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "radius", radius)
        object.__setattr__(self, "names", _names(self.names, len(center), type(self).__name__))

    @property
    def dim(self) -> int:
        return len(self.center)

    @cached_property
    def _c(self) -> np.ndarray:
        return np.asarray(self.center)

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._c - self.radius, self._c + self.radius

    @property
    def measure(self) -> float:
        r""":math:`\pi^{d/2} r^d / \Gamma(d/2 + 1)`."""
        d = self.dim
        return math.pi ** (d / 2) * self.radius**d / math.gamma(d / 2 + 1)

    @property
    def boundary_measure(self) -> float:
        r""":math:`d\,|B| / r` (the sphere's area; 2 points for d = 1)."""
        return 2.0 if self.dim == 1 else self.dim * self.measure / self.radius

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        if self.dim == 2:
            return np.hypot(x[:, 0] - self.center[0], x[:, 1] - self.center[1]) - self.radius
        offset = x - self._c
        return np.sqrt(np.einsum("ij,ij->i", offset, offset)) - self.radius

    def _normal(self, x: np.ndarray) -> np.ndarray:
        offset = x - self._c
        norm = np.linalg.norm(offset, axis=1, keepdims=True)
        at_center = norm[:, 0] == 0
        offset[at_center] = np.eye(self.dim)[0]  # the center: every direction is nearest; e_1
        norm[at_center] = 1.0
        return offset / norm

    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points of the ball (uniform in volume; no grid)."""
        _check_count(n, f"{type(self).__name__}.interior")
        _no_grid(method, f"{type(self).__name__}.interior")
        d, rng = self.dim, np.random.default_rng(seed)
        if d == 1:
            unit = unit_cube_sample(n, 1, method, rng)
            return to_tensor(self._c + self.radius * (2 * unit - 1), dtype)
        if d == 2:
            unit = unit_cube_sample(n, 2, method, rng)
            r, angle = self.radius * np.sqrt(unit[:, :1]), 2 * math.pi * unit[:, 1:]
            return to_tensor(self._c + r * np.concatenate([np.cos(angle), np.sin(angle)], axis=1), dtype)
        unit = unit_cube_sample(n, d + 1, method, rng)
        direction = _gaussian(unit[:, :d])
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        return to_tensor(self._c + self.radius * unit[:, d:] ** (1.0 / d) * direction, dtype)

    @property
    def _perimeter_circle(self) -> tuple[float, float, float] | None:
        return (self.center[0], self.center[1], self.radius) if self.dim == 2 else None

    def _perimeter(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.dim != 2:
            raise ValueError("A ball's arc-length map is its 2D circle's.")
        angle = 2 * math.pi * u
        normals = np.stack([np.cos(angle), np.sin(angle)], axis=1)
        return self._c + self.radius * normals, normals

    def _boundary_numpy(self, n: int, method: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        d = self.dim
        if d == 2:
            return super()._boundary_numpy(n, method, rng)
        if d == 1:  # the two end points, n shared (the first gets the odd one)
            normals = np.where(np.arange(n)[:, None] < (n + 1) // 2, -1.0, 1.0)
            return self._c + self.radius * normals, normals
        _no_grid(method, f"{type(self).__name__}.boundary_sample in {d}D")
        if d == 3:
            unit = unit_cube_sample(n, 2, method, rng)
            z, angle = 1 - 2 * unit[:, 0], 2 * math.pi * unit[:, 1]
            rho = np.sqrt(np.clip(1 - z**2, 0.0, None))
            normals = np.stack([rho * np.cos(angle), rho * np.sin(angle), z], axis=1)
        else:
            normals = _gaussian(unit_cube_sample(n, d, method, rng))
            normals /= np.linalg.norm(normals, axis=1, keepdims=True)
        return self._c + self.radius * normals, normals


class Disk(Ball):
    r"""The closed disk :math:`\{x \in \mathbb{R}^2 : |x - c| \le r\}` (a :class:`Ball` in 2D).

    Boundary "grid": the n angles :math:`2\pi(i + 1/2)/n`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim != 2:
            raise ValueError(f"Disk is 2D (a center of 2 coordinates), got {self.center!r}; use Ball in {self.dim}D.")


def _segments_cross(p: np.ndarray, q: np.ndarray, r: np.ndarray, s: np.ndarray) -> bool:
    """Whether the closed segments pq and rs intersect (orientation tests)."""
    def orient(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
        return float((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]))

    d1, d2, d3, d4 = orient(r, s, p), orient(r, s, q), orient(p, q, r), orient(p, q, s)
    if ((d1 > 0) != (d2 > 0)) and ((d3 > 0) != (d4 > 0)) and d1 * d2 < 0 and d3 * d4 < 0:
        return True

    def on(a: np.ndarray, b: np.ndarray, c: np.ndarray, o: float) -> bool:
        return o == 0 and min(a[0], b[0]) <= c[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])

    return on(r, s, p, d1) or on(r, s, q, d2) or on(p, q, r, d3) or on(p, q, s, d4)


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def _ear_clip(vertices: np.ndarray) -> np.ndarray:
    """Triangles (t, 3) of vertex indices of a simple counter-clockwise polygon, by ear clipping."""
    remaining = list(range(len(vertices)))
    triangles = []
    while len(remaining) > 3:
        for k in range(len(remaining)):
            i, j, l = remaining[k - 1], remaining[k], remaining[(k + 1) % len(remaining)]
            a, b, c = vertices[i], vertices[j], vertices[l]
            if _cross(a, b, c) <= 0:  # a reflex (or flat) corner is no ear
                continue
            others = [m for m in remaining if m not in (i, j, l)]
            inside = any(_cross(a, b, vertices[m]) >= 0 and _cross(b, c, vertices[m]) >= 0
                         and _cross(c, a, vertices[m]) >= 0 for m in others)
            if not inside:
                triangles.append((i, j, l))
                remaining.pop(k)
                break
        else:
            raise ValueError("Polygon: no ear found (the polygon is degenerate: repeated or collinear vertices?).")
    triangles.append(tuple(remaining))
    return np.asarray(triangles)


@dataclass(frozen=True, eq=True)
class Polygon(Geometry):
    r"""A closed simple polygon in 2D, given by its vertices in order (either orientation; no repeat of
    the first at the end).

    Area by the shoelace formula :math:`\frac12 |\sum_i x_i y_{i+1} - x_{i+1} y_i|`; the boundary by arc
    length (boundary "grid": the arc-length nodes :math:`(i + 1/2) L / n`); the outward normal of the edge
    from :math:`v_i` to :math:`v_{i+1}` (counter-clockwise) is :math:`(\Delta y, -\Delta x) / |\Delta v|`.
    """

    vertices: Sequence[Sequence[float]]
    names: Sequence[str] = field(default=())

    def __post_init__(self) -> None:
        v = np.asarray(self.vertices, dtype=np.float64)
        if v.ndim != 2 or v.shape[1] != 2 or len(v) < 3 or not np.isfinite(v).all():
            raise ValueError(f"Polygon needs >= 3 finite 2D vertices (k, 2), got shape {v.shape}.")
        k = len(v)
        if np.any(np.all(v == np.roll(v, -1, axis=0), axis=1)):
            raise ValueError("Polygon: two consecutive vertices coincide (give each corner once).")
        for i in range(k):
            for j in range(i + 1, k):
                if j == i + 1 or (i == 0 and j == k - 1):
                    continue
                if _segments_cross(v[i], v[(i + 1) % k], v[j], v[(j + 1) % k]):
                    raise ValueError(f"Polygon: edges {i} and {j} intersect; the polygon must be simple.")
        signed = 0.5 * float(np.sum(v[:, 0] * np.roll(v[:, 1], -1) - np.roll(v[:, 0], -1) * v[:, 1]))
        if signed == 0:
            raise ValueError("Polygon: zero area.")
        if signed < 0:
            v = v[::-1]
        object.__setattr__(self, "vertices", tuple(tuple(float(c) for c in row) for row in v))
        object.__setattr__(self, "names", _names(self.names, 2, "Polygon"))

    @property
    def dim(self) -> int:
        return 2

    @cached_property
    def _v(self) -> np.ndarray:
        return np.asarray(self.vertices)

    @cached_property
    def _edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Starts (k, 2), vectors (k, 2), lengths (k,), outward normals (k, 2)."""
        start = self._v
        vector = np.roll(start, -1, axis=0) - start
        length = np.linalg.norm(vector, axis=1)
        normal = np.stack([vector[:, 1], -vector[:, 0]], axis=1) / length[:, None]
        return start, vector, length, normal

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._v.min(axis=0), self._v.max(axis=0)

    @property
    def measure(self) -> float:
        v = self._v
        return 0.5 * float(np.sum(v[:, 0] * np.roll(v[:, 1], -1) - np.roll(v[:, 0], -1) * v[:, 1]))

    @property
    def boundary_measure(self) -> float:
        return float(self._edges[2].sum())

    def _nearest_edge(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distance to the boundary (N,) and the index of the nearest edge (N,)."""
        start, vector, length, _ = self._edges
        rel = x[:, None, :] - start[None]  # (N, k, 2)
        t = np.clip(np.einsum("nkj,kj->nk", rel, vector) / length**2, 0.0, 1.0)
        gap = rel - t[..., None] * vector[None]
        dist = np.linalg.norm(gap, axis=2)
        nearest = dist.argmin(axis=1)
        return dist[np.arange(len(x)), nearest], nearest

    def _inside(self, x: np.ndarray) -> np.ndarray:
        """The crossing-number test (strictly inside, up to points on the boundary)."""
        a, b = self._v, np.roll(self._v, -1, axis=0)
        xs, ys = x[:, :1], x[:, 1:]
        straddles = (a[None, :, 1] > ys) != (b[None, :, 1] > ys)
        with np.errstate(divide="ignore", invalid="ignore"):
            at = a[None, :, 0] + (ys - a[None, :, 1]) * (b[None, :, 0] - a[None, :, 0]) / (b[None, :, 1] - a[None, :, 1])
        return (np.sum(straddles & (xs < at), axis=1) % 2) == 1

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        dist, _ = self._nearest_edge(x)
        return np.where(self._inside(x), -dist, dist)

    def _normal(self, x: np.ndarray) -> np.ndarray:
        _, nearest = self._nearest_edge(x)
        return self._edges[3][nearest]

    @cached_property
    def _triangles(self) -> tuple[np.ndarray, np.ndarray]:
        """The triangulation's corners (t, 3, 2) and the cumulative area fractions (t + 1,)."""
        corners = self._v[_ear_clip(self._v)]
        a, b, c = corners[:, 0], corners[:, 1], corners[:, 2]
        areas = 0.5 * np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0]))
        return corners, np.concatenate([[0.0], np.cumsum(areas) / areas.sum()])

    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points of the polygon (uniform in area; no grid)."""
        _check_count(n, "Polygon.interior")
        _no_grid(method, "Polygon.interior")
        unit = unit_cube_sample(n, 2, method, np.random.default_rng(seed))
        corners, cumulative = self._triangles
        which = np.clip(np.searchsorted(cumulative, unit[:, 0], side="right") - 1, 0, len(corners) - 1)
        u = (unit[:, 0] - cumulative[which]) / (cumulative[which + 1] - cumulative[which])
        root, w = np.sqrt(np.clip(u, 0.0, 1.0))[:, None], unit[:, 1:]
        a, b, c = corners[which, 0], corners[which, 1], corners[which, 2]
        return to_tensor((1 - root) * a + root * (1 - w) * b + root * w * c, dtype)

    @cached_property
    def _breaks(self) -> np.ndarray:
        length = self._edges[2]
        return np.concatenate([[0.0], np.cumsum(length) / length.sum()])

    _perimeter_straight = True  # its boundary map is straight between the corners

    @property
    def _perimeter_breaks(self) -> np.ndarray:
        return self._breaks

    def _perimeter(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start, vector, _, normal = self._edges
        breaks = self._breaks
        u = np.mod(u, 1.0)
        edge = np.clip(np.searchsorted(breaks, u, side="right") - 1, 0, len(start) - 1)
        t = (u - breaks[edge]) / (breaks[edge + 1] - breaks[edge])
        return start[edge] + t[:, None] * vector[edge], normal[edge]
