r"""Conditions of a geometry as imposed parts: ``dirichlet``, ``neumann`` and ``periodic`` build an
:class:`~lit_constrained.imposed.Imposed` whose points are sampled on the domain once, whose per-point
data (the outward normals, the prescribed values, the facing points) travel with the points, and whose
residual is the condition::

    plate = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.2)
    wall = plate.dirichlet(self.u, 64, value=0.0)                 # u = 0 on the whole boundary
    hole = plate.neumann(self.u, 32, on=Disk((0.5, 0.5), 0.2))    # du/dn = 0 on the hole only
    sides = Box.unit(2).periodic(self.u, "x", 16)                 # u(0, y) = u(1, y)

    def imposed(self, batch):
        return {"pde": Imposed(self.pde, batch["x"]), "wall": wall.to(self.device), ...}

For the sampled points :math:`x_i` (outward unit normals :math:`n_i`, values :math:`g_i = g(x_i)`):

.. math::

    \text{dirichlet: } u(x_i) - g_i, \qquad
    \text{neumann: } \partial u / \partial n\,(x_i) - g_i = n_i \cdot \nabla u(x_i) - g_i, \qquad
    \text{periodic: } L u(x_i) - L u(x_i + \ell e_k)

(:math:`L` the identity or a given operator, :math:`\ell` the box's length along the coordinate k). Each
residual is a small frozen dataclass of the field (equal for the same field, so the per-point Jacobian
remembers its path across steps) and runs inside the per-point Jacobian: the normal derivative is one
``jvp`` along each point's own normal (:func:`~lit_constrained.physics.operators.normal_derivative`).
The points come from the geometry's seeded samplers (``method``, ``seed``), in ``dtype`` (default: torch's
default dtype, the network's); a part is data, so it moves with :meth:`~lit_constrained.imposed.Imposed.to`
(e.g. to the task's device) and can be cut to k chosen points (``count``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import torch
from torch import Tensor

from lit_constrained.imposed import Imposed, Sense
from lit_constrained.physics.operators import Coordinate, Field, coordinate_index, normal_derivative

if TYPE_CHECKING:
    from lit_constrained.physics.geometry import Geometry

__all__ = ["Conditions", "DirichletResidual", "NeumannResidual", "PeriodicResidual", "Value"]

Value = Union[float, Tensor, Callable[[Tensor], Tensor]]
"""A prescribed value: a number (everywhere), a tensor (N,) or (N, k) (one row per point), or a function of
the points ``g(x) -> (N,)`` or ``(N, k)`` (evaluated once, at the sampled points)."""


def _values_at(value: Value, points: Tensor, dtype: torch.dtype) -> Tensor:
    """The prescribed values at ``points`` as one row per point (N,) or (N, k), in ``dtype``."""
    if callable(value):
        values = value(points)
    elif isinstance(value, Tensor):
        values = value
    else:
        values = torch.full((points.shape[0],), float(value), dtype=dtype)
    if not isinstance(values, Tensor) or values.dim() not in (1, 2) or values.shape[0] != points.shape[0]:
        got = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"a condition's value must give one row per point, ({points.shape[0]},) or "
                         f"({points.shape[0]}, k), got {got}.")
    return values.to(dtype)


def _minus(field: Tensor, value: Tensor) -> Tensor:
    """``field - value``, a value of one number per point (N,) set against every component of (N, k)."""
    return field - (value[:, None] if field.dim() == 2 and value.dim() == 1 else value)


@dataclass(frozen=True)
class DirichletResidual:
    """:math:`u(x) - g`: ``(points, {"value": g}) -> (N,)`` or ``(N, k)``."""

    u: Field

    def __call__(self, x: Tensor, data: dict[str, Tensor]) -> Tensor:
        return _minus(self.u(x), data["value"])


@dataclass(frozen=True)
class NeumannResidual:
    r""":math:`\partial u/\partial n - g`: ``(points, {"normals": n, "value": g}) -> (N,)`` or ``(N, k)``;
    ``dims``: the coordinates the normals span (None: all)."""

    u: Field
    dims: tuple[Coordinate, ...] | None = None

    def __call__(self, x: Tensor, data: dict[str, Tensor]) -> Tensor:
        return _minus(normal_derivative(self.u, x, data["normals"], self.dims), data["value"])


@dataclass(frozen=True)
class PeriodicResidual:
    r""":math:`L u(x) - L u(x')` for each point x and its facing point x' (``data["partner"]``); L the
    identity or ``operator(u, x)`` (e.g. ``lambda u, x: partial(u, x, "x")``)."""

    u: Field
    operator: Callable[[Field, Tensor], Tensor] | None = None

    def __call__(self, x: Tensor, data: dict[str, Tensor]) -> Tensor:
        partner = data["partner"]
        if self.operator is None:
            return self.u(x) - self.u(partner)
        return self.operator(self.u, x) - self.operator(self.u, partner)


def _boundary_points(domain: Geometry, on: Geometry | None, n: int, method: str, seed: int) -> tuple[Tensor, Tensor]:
    """n boundary points (float64) and the outward unit normals there: of ``domain``, or of the piece ``on``
    (its boundary points on the domain's boundary, the normals the domain's)."""
    if on is None:
        points, normals = domain.boundary_sample(n, method=method, seed=seed, dtype=torch.float64)
        return points, normals
    points = on.boundary(n, method=method, seed=seed, dtype=torch.float64)
    kept = domain.signed_distance(points).abs() <= domain.TOLERANCE * domain.scale
    if not bool(kept.any()):
        raise ValueError(f"no boundary point of {type(on).__name__} lies on the boundary of {type(domain).__name__}: "
                         "`on` names a piece of this domain's boundary (e.g. a hole cut out of it).")
    points = points[kept]
    return points, domain.normal(points)


def _dtype(dtype: torch.dtype | None) -> torch.dtype:
    return torch.get_default_dtype() if dtype is None else dtype


class Conditions:
    """The conditions a geometry builds as imposed parts (a base of
    :class:`~lit_constrained.physics.geometry.Geometry`; the module docstring has the formulas)."""

    def dirichlet(
        self: Geometry, u: Field, n: int, value: Value = 0.0, *, on: Geometry | None = None,
        method: str = "uniform", seed: int = 0, dtype: torch.dtype | None = None, sense: Sense = "=",
        count: int | str | None = None,
    ) -> Imposed:
        r""":math:`u = g` at n boundary points (``on``: only where the boundary of that piece lies on this
        domain's, e.g. a hole): an :class:`~lit_constrained.imposed.Imposed` of
        :class:`DirichletResidual`, the values :math:`g(x_i)` its data ``"value"``. ``sense``: ``"<="``
        or ``">="`` for :math:`u \le g` or :math:`u \ge g`; ``count``: as :class:`Imposed`'s."""
        points, _ = _boundary_points(self, on, n, method, seed)
        data = {"value": _values_at(value, points, _dtype(dtype))}
        return Imposed(DirichletResidual(u), points.to(_dtype(dtype)), sense=sense, count=count, data=data)

    def neumann(
        self: Geometry, u: Field, n: int, value: Value = 0.0, *, on: Geometry | None = None,
        dims: Sequence[Coordinate] | None = None, method: str = "uniform", seed: int = 0,
        dtype: torch.dtype | None = None, sense: Sense = "=", count: int | str | None = None,
    ) -> Imposed:
        r""":math:`\partial u / \partial n = g` at n boundary points (``on``: as :meth:`dirichlet`'s): an
        :class:`~lit_constrained.imposed.Imposed` of :class:`NeumannResidual`, the outward unit normals
        its data ``"normals"`` (the normal derivative is taken along each point's own) and
        :math:`g(x_i)` its data ``"value"``. ``dims``: the coordinates the normals span (e.g.
        ``("x", "y")`` of a space-time point; the normals' other entries are 0)."""
        points, normals = _boundary_points(self, on, n, method, seed)
        kind = _dtype(dtype)
        data = {"normals": normals.to(kind), "value": _values_at(value, points, kind)}
        if dims is not None:
            names = getattr(self, "names", None) or None
            data["normals"] = data["normals"][:, [coordinate_index(c, points.shape[1], names) for c in dims]]
        residual = NeumannResidual(u, None if dims is None else tuple(dims))
        return Imposed(residual, points.to(kind), sense=sense, count=count, data=data)

    def periodic(
        self: Geometry, u: Field, coordinate: Coordinate, n: int, *,
        operator: Callable[[Field, Tensor], Tensor] | None = None, method: str = "uniform", seed: int = 0,
        dtype: torch.dtype | None = None, count: int | str | None = None,
    ) -> Imposed:
        r""":math:`L u(x) = L u(x')` at n points x of the lower face across ``coordinate`` and the points x'
        facing them on the upper face (a box's ``periodic_pairs``): an
        :class:`~lit_constrained.imposed.Imposed` of :class:`PeriodicResidual`, the facing points its
        data ``"partner"``; ``operator(u, x)``: L (default: the identity, periodic values)."""
        pairs = getattr(self, "periodic_pairs", None)
        if pairs is None:
            raise TypeError(f"{type(self).__name__} has no facing faces: periodic() needs a Box (its periodic_pairs).")
        both = pairs(coordinate, n, method=method, seed=seed, dtype=_dtype(dtype))
        d = both.shape[1] // 2
        return Imposed(PeriodicResidual(u, operator), both[:, :d], count=count,
                       data={"partner": both[:, d:].contiguous()})
