r"""The space-time cylinder :math:`\Omega \times [t_0, t_1]` of a geometry :math:`\Omega`: points (x, t).

* ``interior(n)``: :math:`(x, t)` with x from ``geometry.interior`` and t uniform (LHS, Sobol) in
  :math:`[t_0, t_1]`, each on its own seeded stream;
* ``initial(n)``: the slice :math:`\Omega \times \{t_0\}`;
* ``boundary_sample(n)`` / ``boundary(n)``: the lateral boundary :math:`\partial\Omega \times [t_0, t_1]`,
  with the spatial outward normals :math:`(n_x, 0)` (a time-dependent Dirichlet, Neumann or Robin
  condition); ``final(n)`` the slice at :math:`t_1`.

A :class:`~lit_constrained.physics.geometry.Geometry` of dimension d + 1: ``measure``
:math:`|\Omega|(t_1 - t_0)`; ``boundary_measure`` (= ``lateral_measure``) the lateral
:math:`|\partial\Omega|(t_1 - t_0)`, the boundary that ``boundary_sample`` draws from (the slices are
``initial`` and ``final``); ``signed_distance`` the cylinder's, exact where the geometry's is,
:math:`\|\max(q, 0)\| + \min(\max_i q_i, 0)` with :math:`q = (\mathrm{sd}_\Omega(x), |t - t_c| - \tau)`
(:math:`t_c` the interval's middle, :math:`\tau` its half-length); ``normal`` the nearest piece's:
:math:`(n_\Omega(x), 0)` on the lateral boundary, :math:`(0, \pm 1)` nearer a slice. The time is the last
coordinate, named ``time_name`` (default ``"t"``).

Example:
    >>> from lit_constrained.physics import Disk, SpaceTime
    >>> cylinder = SpaceTime(Disk((0.0, 0.0), 1.0), (0.0, 2.0))
    >>> cylinder.names, cylinder.initial(3)[:, 2].tolist()
    (('x', 'y', 't'), [0.0, 0.0, 0.0])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics.collocation import SamplingMethod, _check_count, _no_grid, unit_interval_sample
from lit_constrained.physics.geometry import BoundarySample, Geometry

__all__ = ["SpaceTime"]


@dataclass(frozen=True)
class SpaceTime(Geometry):
    r""":math:`\Omega \times [t_0, t_1]`.

    Args:
        geometry: the spatial domain :math:`\Omega` (any :class:`~lit_constrained.physics.geometry.Geometry`).
        interval: :math:`(t_0, t_1)`, :math:`t_1 > t_0`.
        time_name: the name of the time coordinate (the last one).
    """

    geometry: Geometry
    interval: Sequence[float]
    time_name: str = "t"

    def __post_init__(self) -> None:
        if not isinstance(self.geometry, Geometry):
            raise TypeError(f"SpaceTime needs a Geometry (Box, Disk, Polygon, ...), got {type(self.geometry).__name__}.")
        interval = tuple(float(t) for t in self.interval)
        if len(interval) != 2 or not all(math.isfinite(t) for t in interval) or interval[1] <= interval[0]:
            raise ValueError(f"SpaceTime needs a time interval (t0, t1) with t1 > t0, got {self.interval!r}.")
        if self.time_name in self.geometry.names:
            raise ValueError(f"SpaceTime: the time's name {self.time_name!r} is already a spatial coordinate's; "
                             "pass time_name=... or rename the geometry's coordinates.")
        object.__setattr__(self, "interval", interval)

    @property
    def dim(self) -> int:
        """The spatial dimension + 1."""
        return self.geometry.dim + 1

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.geometry.names, self.time_name) if self.geometry.names else ()

    @property
    def duration(self) -> float:
        return self.interval[1] - self.interval[0]

    @property
    def measure(self) -> float:
        return self.geometry.measure * self.duration

    @property
    def lateral_measure(self) -> float:
        r""":math:`|\partial\Omega|(t_1 - t_0)`."""
        return self.geometry.boundary_measure * self.duration

    @property
    def boundary_measure(self) -> float:
        """The lateral boundary's measure (the boundary :meth:`boundary_sample` draws from)."""
        return self.lateral_measure

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lower, upper = self.geometry.bounds
        return np.append(lower, self.interval[0]), np.append(upper, self.interval[1])

    def _offsets(self, x: np.ndarray) -> np.ndarray:
        """q = (sd_Omega(x), |t - t_c| - tau) at numpy points (N, d + 1): (N, 2)."""
        middle, half = 0.5 * (self.interval[0] + self.interval[1]), 0.5 * self.duration
        return np.stack([self.geometry._signed_distance(x[:, :-1]), np.abs(x[:, -1] - middle) - half], axis=1)

    def _signed_distance(self, x: np.ndarray) -> np.ndarray:
        q = self._offsets(x)
        outside = np.linalg.norm(np.maximum(q, 0.0), axis=1)
        return outside + np.minimum(q.max(axis=1), 0.0)

    def _normal(self, x: np.ndarray) -> np.ndarray:
        """(n_Omega(x), 0) where the lateral boundary is the nearer (ties: lateral), else (0, ±1)."""
        q = self._offsets(x)
        lateral = q[:, 0] >= q[:, 1]
        normals = np.zeros_like(x)
        normals[:, :-1] = np.where(lateral[:, None], self.geometry._normal(x[:, :-1]), 0.0)
        middle = 0.5 * (self.interval[0] + self.interval[1])
        normals[:, -1] = np.where(lateral, 0.0, np.where(x[:, -1] >= middle, 1.0, -1.0))
        return normals

    def _boundary_numpy(self, n: int, method: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The lateral boundary's points and normals (for a constructive geometry of cylinders)."""
        points, normals = self.boundary_sample(n, method, int(rng.integers(2**63)))
        return points.numpy(), normals.numpy()

    def _times(self, n: int, method: str, stream: np.random.SeedSequence) -> np.ndarray:
        unit = unit_interval_sample(n, method, np.random.default_rng(stream))
        return self.interval[0] + self.duration * unit

    @staticmethod
    def _with_time(x: Tensor, t: np.ndarray | float) -> Tensor:
        times = torch.as_tensor(t, dtype=x.dtype).expand(x.shape[0]) if np.ndim(t) == 0 else torch.from_numpy(t).to(x.dtype)
        return torch.cat([x, times[:, None]], dim=1)

    def interior(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> Tensor:
        """n points (x, t), x inside the geometry and t in the interval (each on its own stream; no grid)."""
        _check_count(n, "SpaceTime.interior")
        _no_grid(method, "SpaceTime.interior")
        space, time = np.random.SeedSequence(seed).spawn(2)
        x = self.geometry.interior(n, method, int(space.generate_state(1)[0]), dtype)
        return self._with_time(x, self._times(n, method, time))

    def initial(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                dtype: torch.dtype = torch.float64) -> Tensor:
        r"""n points of the initial slice :math:`\Omega \times \{t_0\}`."""
        return self._with_time(self.geometry.interior(n, method, seed, dtype), self.interval[0])

    def final(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
              dtype: torch.dtype = torch.float64) -> Tensor:
        r"""n points of the final slice :math:`\Omega \times \{t_1\}`."""
        return self._with_time(self.geometry.interior(n, method, seed, dtype), self.interval[1])

    def boundary_sample(self, n: int, method: SamplingMethod = "uniform", seed: int = 0,
                        dtype: torch.dtype = torch.float64) -> BoundarySample:
        r"""n points of the lateral boundary :math:`\partial\Omega \times [t_0, t_1]` and their outward
        unit normals :math:`(n_x, 0)` ((n, d + 1) each; no grid)."""
        _check_count(n, "SpaceTime.boundary_sample")
        _no_grid(method, "SpaceTime.boundary_sample")
        space, time = np.random.SeedSequence(seed).spawn(2)
        x, normals = self.geometry.boundary_sample(n, method, int(space.generate_state(1)[0]), dtype)
        return BoundarySample(self._with_time(x, self._times(n, method, time)), self._with_time(normals, 0.0))
