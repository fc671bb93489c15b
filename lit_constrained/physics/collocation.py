r"""Collocation points in a box :math:`\prod_i [a_i, b_i]`: interior, boundary, one face, an initial slice.

Every sampler is seeded and reproducible (the same arguments give the same points, bit for bit) and
returns a tensor of shape (n, d) (float64 unless ``dtype`` says otherwise). The methods:

* ``"uniform"``: i.i.d. uniform points (numpy's ``default_rng(seed)``);
* ``"lhs"``: a Latin hypercube (``scipy.stats.qmc.LatinHypercube``): every one of the n equal slices of
  each coordinate holds exactly one point;
* ``"sobol"``: a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``; its balance properties need n a
  power of 2, and scipy warns otherwise);
* ``"grid"``: a tensor grid with the same number of nodes k along every coordinate: in the interior the
  k^d nodes strictly inside (``linspace(a, b, k + 2)[1:-1]``), on a face the k^(d-1) nodes of the face
  (ends included), on the boundary the nodes of the k^d grid (ends included) that lie on it. n must
  match such a count; the error names the nearest ones.

The boundary is shared among the faces in proportion to their (d-1)-dimensional measure (largest
remainders), each face sampled on its own stream (``numpy.random.SeedSequence(seed).spawn``), so a
boundary sample is stratified by face. A space-time box names its coordinates (``names=("x", "t")``):
``boundary(n, dims=("x",))`` is then the spatial boundary over all times and ``initial(n, "t")`` the
slice t = a_t.

Example:
    >>> box = Box((0.0, 0.0), (1.0, 1.0))
    >>> box.interior(4, "lhs", seed=0).shape, box.boundary(8, seed=0).shape
    (torch.Size([4, 2]), torch.Size([8, 2]))
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

from lit_constrained.physics.geometry import (
    SAMPLING_METHODS, BoundarySample, Geometry, SamplingMethod, _check_count, _check_method, allocate,
    unit_cube_sample,
)
from lit_constrained.physics.operators import Coordinate, coordinate_index, default_names

__all__ = ["Box", "SamplingMethod", "SAMPLING_METHODS", "unit_cube_sample"]

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

    def initial(self, n: int, time: Coordinate = -1, method: SamplingMethod = "uniform", seed: int = 0,
                dtype: torch.dtype = torch.float64) -> Tensor:
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

    def boundary(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dims: Sequence[Coordinate] | None = None, dtype: torch.dtype = torch.float64) -> Tensor:
        """n points on the boundary: on the faces of the coordinates ``dims`` (default: all), shared in
        proportion to the faces' measures, face by face (lower then upper end of each coordinate in order).

        ``"grid"``: the nodes of the k^d grid (ends included) on those faces, each once (corners too).
        """
        return self._tensor(self._boundary_arrays(n, method, seed, dims, "Box.boundary")[0], dtype)

    def boundary_sample(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                        dtype: torch.dtype = torch.float64, dims: Sequence[Coordinate] | None = None) -> BoundarySample:
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
