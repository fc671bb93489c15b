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
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics.operators import Coordinate, coordinate_index, default_names

__all__ = ["Box", "SamplingMethod", "SAMPLING_METHODS", "unit_cube_sample"]

SamplingMethod = Literal["uniform", "lhs", "sobol", "grid"]
SAMPLING_METHODS: tuple[str, ...] = ("uniform", "lhs", "sobol", "grid")
Side = Literal["lower", "upper"]


def _check_count(n: int, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what}: the number of points must be a positive integer, got {n!r}.")


def _check_method(method: str) -> None:
    if method not in SAMPLING_METHODS:
        raise ValueError(f"Unknown sampling method {method!r}: use one of {SAMPLING_METHODS}.")


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


def _nearest(counts: dict[int, int], n: int) -> str:
    """The valid counts just below and above n, as text."""
    values = sorted(set(counts))
    below = [v for v in values if v < n][-1:]
    above = [v for v in values if v > n][:1]
    return " or ".join(str(v) for v in below + above)


@dataclass(frozen=True)
class Box:
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

    def boundary(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dims: Sequence[Coordinate] | None = None, dtype: torch.dtype = torch.float64) -> Tensor:
        """n points on the boundary: on the faces of the coordinates ``dims`` (default: all), shared in
        proportion to the faces' measures, face by face (lower then upper end of each coordinate in order).

        ``"grid"``: the nodes of the k^d grid (ends included) on those faces, each once (corners too).
        """
        _check_count(n, "Box.boundary")
        _check_method(method)
        axes = list(range(self.dim)) if dims is None else sorted({self.index(c) for c in dims})
        if not axes:
            raise ValueError("Box.boundary: dims is empty; name at least one coordinate whose faces to sample.")
        if method == "grid":
            others = self.dim - len(axes)
            k = self._nodes_per_axis(n, lambda k: k**self.dim - k**others * (k - 2) ** len(axes), "Box.boundary", 2)
            nodes = self._grid_nodes(range(self.dim), k, ends=True)
            on = np.zeros(len(nodes), dtype=bool)
            for axis in axes:
                on |= (nodes[:, axis] == self.lower[axis]) | (nodes[:, axis] == self.upper[axis])
            return self._tensor(nodes[on], dtype)
        faces = self._face_measures(axes)
        total = sum(m for *_, m in faces)
        shares = [n * m / total for *_, m in faces]
        counts = [int(math.floor(s)) for s in shares]
        by_remainder = sorted(range(len(faces)), key=lambda j: (counts[j] - shares[j], j))
        for j in by_remainder[: n - sum(counts)]:
            counts[j] += 1
        streams = np.random.SeedSequence(seed).spawn(len(faces))
        blocks = []
        for (axis, side, _), count, stream in zip(faces, counts, streams):
            if count:
                free = [i for i in range(self.dim) if i != axis]
                unit = unit_cube_sample(count, len(free), method, np.random.default_rng(stream))
                blocks.append(self._on_face(axis, side, self._scale(unit, free)))
        return self._tensor(np.concatenate(blocks), dtype)

    def grid(self, points_per_axis: int | Sequence[int], dtype: torch.dtype = torch.float64) -> Tensor:
        """The tensor grid with ``points_per_axis`` nodes along each coordinate, ends included (a test grid):
        shape (prod k_i, d), row-major (the last coordinate fastest)."""
        ks = [points_per_axis] * self.dim if isinstance(points_per_axis, int) else list(points_per_axis)
        if len(ks) != self.dim or any(isinstance(k, bool) or not isinstance(k, int) or k < 2 for k in ks):
            raise ValueError(f"Box.grid: points_per_axis must be {self.dim} integers >= 2, got {points_per_axis!r}.")
        mesh = np.meshgrid(*(np.linspace(a, b, k) for a, b, k in zip(self.lower, self.upper, ks)), indexing="ij")
        return self._tensor(np.stack([m.reshape(-1) for m in mesh], axis=1), dtype)
