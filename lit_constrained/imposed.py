r"""What a task imposes: the named parts of ``imposed()`` (:class:`Imposed`, :class:`Coupled`), their
senses and per-point data, and their constraint vector.

A task declares its hard constraints once, as named parts (``ConstrainedModule.imposed(batch)``), each
carrying everything the step needs: its residual, where it is imposed, its sense and any per-point
data (normals, weights, values)::

    def imposed(self, batch):
        return {"pde": Imposed(self.pde_residual, batch["x_pde"]),
                "wall": Imposed(self.flux, self.x_wall, data=self.n_wall),            # residual(x, n)
                "obstacle": Imposed(self.gap, batch["x_obstacle"], sense=">="),
                "mass": Coupled(lambda: self.mass(batch) - 1)}                     # one row of many points

An :class:`Imposed` part :math:`p` has the residual :math:`r_p : (N_p, d_p) \to (N_p,)` or
:math:`(N_p, k_p)` (called ``r_p(X_p)``, or ``r_p(X_p, D_p)`` with its per-point data :math:`D_p`: a
tensor or a dict of tensors, each with :math:`N_p` rows) and points
:math:`X_p \in \mathbb{R}^{N_p \times d_p}`; row i of :math:`r_p` depends ONLY on :math:`X_p[i]` (and
:math:`D_p[i]`). A :class:`Coupled` part's rows may each depend on many points (an integral, a
whole-field operator). The constraint vector is the concatenation, parts in their order, each row-major
over :math:`(N_p, k_p)`:

.. math::

    c = \big(\operatorname{vec}(r_1(X_1)), \dots, \operatorname{vec}(r_P(X_P))\big) \in \mathbb{R}^m,
    \qquad m = \textstyle\sum_p N_p k_p,

so constraint :math:`o_p + i k_p + j` is component j of part p at its point i (:math:`o_p` the
part's offset). Because each row of an :class:`Imposed` part depends on one point only, the Jacobian of
c is assembled point by point (:mod:`lit_constrained.jacobians.pointwise`, the data mapped along with
the points), linear in m. Each part's sense gives its rows' signs (:func:`layout_signs`), which the
step reads from the parts' layout. This module imports no Lightning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Union

import torch
from torch import Tensor

__all__ = [
    "AUTO", "SENSES", "Coupled", "Imposed", "Part", "PointData", "check_count", "PartLayout", "SenseRows", "Sense",
    "active_rows", "check_sense", "concatenate_parts", "imposed_values", "layout_signs", "part_layout", "part_values",
    "split_parts", "take_points", "violated_part",
]

Sense = str
"""One of :data:`SENSES`: ``"="`` (residual = 0), ``"<="`` (residual <= 0), ``">="`` (residual >= 0)."""

SENSES: tuple[str, ...] = ("=", "<=", ">=")
"""The senses a constraint row takes (``"="``: an equality, the default)."""

_SIGN = {"=": 0, "<=": 1, ">=": -1}


def check_sense(sense: object, owner: str = "Imposed") -> str:
    """``sense`` if it is one of :data:`SENSES`, else a ValueError naming the three choices."""
    if not isinstance(sense, str) or sense not in _SIGN:
        raise ValueError(
            f"{owner}: sense must be '=' (residual = 0), '<=' (residual <= 0) or '>=' (residual >= 0), "
            f"got {sense!r}."
        )
    return sense

RESERVED_PART_NAMES = frozenset({"train", "val", "test"})
"""Names a part may not take: the stages of the ``Violation/<stage>`` tags (a part's own violation is
logged as ``Violation/<name>/<stage>``)."""


PointData = Union[Tensor, Mapping[str, Tensor]]
"""Per-point data of an :class:`Imposed` part: a tensor, or a dict of tensors, each with one row per point."""


def take_points(data: PointData | None, index: Any) -> PointData | None:
    """``data`` at the points ``index`` (a slice or an index tensor), the same for a tensor and each
    tensor of a dict (None: None)."""
    if data is None or isinstance(data, Tensor):
        return None if data is None else data[index]
    return {key: value[index] for key, value in data.items()}


def _check_data(data: object, n: int) -> None:
    """A clear error unless ``data`` is None, a tensor or a dict of tensors with ``n`` rows each."""
    if data is None:
        return
    items = [("data", data)] if isinstance(data, Tensor) else (
        [(f"data[{key!r}]", value) for key, value in data.items()] if isinstance(data, Mapping) else None)
    if not items:
        raise TypeError(f"Imposed.data must be a tensor or a non-empty dict of tensors (one row per point), got "
                        f"{type(data).__name__ if not isinstance(data, Mapping) else 'an empty dict'}.")
    for label, value in items:
        if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != n:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"Imposed.{label} must be a tensor with one row per point ({n}, ...), got {got}.")


@dataclass(frozen=True)
class Imposed:
    """One part of the hard constraints: ``residual(points) = 0`` (or ``<= 0``, ``>= 0``: ``sense``) at
    every point.

    Attributes:
        residual: ``points (N, d) -> (N,)`` or ``(N, k)``, or ``(points, data) -> ...`` when the part has
            ``data``; row i depends ONLY on ``points[i]`` (and ``data``'s row i). It calls the task's
            network (e.g. a bound method using ``self.net``). The per-point Jacobian evaluates it under
            ``torch.func`` with functional parameters, one point at a time (a batch of ONE point, shape
            (1, d), and its data's row, shape (1, ...)); a residual whose input derivatives use plain
            ``torch.autograd.grad`` still works there, on the slower chunked-autograd path.
        points: the imposed points, ``(N, d)`` (a buffer or an entry of the batch).
        sense: ``"="`` (default: ``residual = 0``), ``"<="`` (``residual <= 0``) or ``">="``
            (``residual >= 0``, e.g. ``u - psi >= 0`` for an obstacle ``psi``), for every row of the part.
        count: how many of ``points`` are imposed. None (default): every point. An integer k: k points
            of the pool ``points``, chosen by the module (spread over the pool, or its largest residuals
            with ``imposed_choice="largest"``, re-chosen every ``rechoose_every`` steps:
            :mod:`lit_constrained.module_parts.row_choice`).
            ``"auto"``: the module also chooses how many, within its cost budget (an imposed step at
            most ``imposed_cost_ratio`` times the unconstrained step, measured) and the rank of J.
        data: per-point data handed to the residual beside the points (None, the default: the residual
            takes the points only): a tensor ``(N, ...)`` or a dict of them (e.g. the outward normals
            of boundary points, a weight or a boundary value per point). It travels with the points
            wherever they go: cut with them to the chosen points of a ``count``, mapped with them in the
            per-point Jacobian, cast with them to the ``constraint_dtype``.
    """

    residual: Callable[..., Tensor]
    points: Tensor
    sense: Sense = "="
    count: int | str | None = None
    data: PointData | None = None

    def __post_init__(self) -> None:
        check_sense(self.sense)
        if not callable(self.residual):
            raise TypeError(f"Imposed.residual must be callable (points -> residuals), got {type(self.residual).__name__}.")
        if not isinstance(self.points, Tensor) or self.points.dim() != 2:
            shape = tuple(self.points.shape) if isinstance(self.points, Tensor) else type(self.points).__name__
            raise ValueError(f"Imposed.points must be a 2-D tensor (N points, d coordinates), got {shape}.")
        check_count(self.count)
        _check_data(self.data, self.points.shape[0])

    def values(self) -> Tensor:
        """The residual at the part's points: ``residual(points)``, or ``residual(points, data)``."""
        return self.residual(self.points) if self.data is None else self.residual(self.points, self.data)

    def at(self, index: Any) -> Imposed:
        """The part at the points ``index`` only (a slice or an index tensor; its data cut with them)."""
        return dataclasses.replace(self, points=self.points[index], data=take_points(self.data, index))

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Imposed:
        """The part with its points and data on ``device`` (e.g. the task's: ``part.to(self.device)``), the
        floating ones cast to ``dtype`` (None: kept)."""
        def move(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        data = None if self.data is None else (move(self.data) if isinstance(self.data, Tensor)
                                               else {key: move(value) for key, value in self.data.items()})
        return dataclasses.replace(self, points=move(self.points), data=data)


@dataclass(frozen=True)
class Coupled:
    """A part of the hard constraints whose rows are not pointwise: ``residual() = 0`` (or ``<= 0``,
    ``>= 0``: ``sense``), each row free to depend on many points (an integral such as a mass
    :math:`\\int p - 1`, a finite-difference stencil of a whole field).

    Attributes:
        residual: ``() -> ()``, ``(m,)`` or ``(m, k)``: the part's rows, computed from the task's network
            (e.g. ``lambda: self.mass(batch) - 1``).
        sense: ``"="`` (default), ``"<="`` or ``">="``, for every row of the part.

    A declaration with a :class:`Coupled` part is differentiated as a whole by the general autograd
    Jacobian of c (:func:`~lit_constrained.jacobians.batched.constraint_jacobian`: batched, falling back
    to the row loop) and evaluated in the network's dtype (``constraint_dtype`` promotes per-point
    residuals only).
    """

    residual: Callable[[], Tensor]
    sense: Sense = "="

    def __post_init__(self) -> None:
        check_sense(self.sense, "Coupled")
        if not callable(self.residual):
            raise TypeError(f"Coupled.residual must be callable (() -> rows), got {type(self.residual).__name__}.")

    def values(self) -> Tensor:
        """The part's rows."""
        return self.residual()


Part = Union[Imposed, Coupled]
"""One named part of ``imposed()``: per-point (:class:`Imposed`) or coupled rows (:class:`Coupled`)."""


AUTO = "auto"
"""``Imposed(..., count="auto")``: the module chooses how many points of the pool to impose."""


def check_count(count: object) -> None:
    """A ValueError unless ``count`` is None, ``"auto"`` or an integer >= 1."""
    if count is None or count == AUTO:
        return
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"Imposed: count must be None (every point imposed), an integer >= 1 (that many points of the pool, "
            f"chosen by the module) or 'auto' (the module chooses how many), got {count!r}."
        )


@dataclass(frozen=True)
class PartLayout:
    """Where a part's rows lie in c: rows ``[offset, offset + size)``, ``size = points * width``, and the
    part's ``sense`` (``"="``, ``"<="`` or ``">="``)."""

    name: str
    offset: int
    points: int
    width: int
    sense: Sense = "="

    @property
    def size(self) -> int:
        return self.points * self.width


def check_parts(parts: Mapping[str, Part], owner: str = "imposed()") -> None:
    """Clear errors for a malformed declaration (not a mapping of names to :class:`Imposed` or :class:`Coupled`)."""
    if not isinstance(parts, Mapping):
        raise TypeError(f"{owner} must return a mapping of part names to Imposed (or None), got {type(parts).__name__}.")
    for name, part in parts.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"{owner}: part names must be non-empty strings without '/', got {name!r}.")
        if name in RESERVED_PART_NAMES:
            raise ValueError(
                f"{owner}: the part name {name!r} is reserved (it is a stage of the Violation/<stage> tags); "
                "rename the part, e.g. 'pde' or 'boundary'."
            )
        if not isinstance(part, (Imposed, Coupled)):
            raise TypeError(f"{owner}[{name!r}] must be an Imposed(residual, points) or a Coupled(residual), got "
                            f"{type(part).__name__}.")


def _check_values(name: str, values: Tensor, part: Part) -> Tensor:
    """``values`` as (N, k): an :class:`Imposed` residual returns (N,) or (N, k) for N points, a
    :class:`Coupled` one (), (m,) or (m, k)."""
    if not isinstance(values, Tensor):
        raise TypeError(f"the residual of part {name!r} returned {type(values).__name__}, not a tensor.")
    if isinstance(part, Coupled):
        if values.dim() <= 2:
            return values.reshape(1, 1) if values.dim() == 0 else (values[:, None] if values.dim() == 1 else values)
        raise ValueError(f"the residual of the coupled part {name!r} returned shape {tuple(values.shape)}: it must "
                         "return (), (m,) or (m, k).")
    n = part.points.shape[0]
    if values.dim() == 1 and values.shape[0] == n:
        return values[:, None]
    if values.dim() == 2 and values.shape[0] == n:
        return values
    raise ValueError(
        f"the residual of part {name!r} returned shape {tuple(values.shape)} for {n} points: it must "
        f"return ({n},) or ({n}, k), row i depending only on point i."
    )


def part_values(name: str, part: Part) -> Tensor:
    """One part's residual at its points (a :class:`Coupled` part: its rows), checked, as ``(N, k)``."""
    return _check_values(name, part.values(), part)


def imposed_values(parts: Mapping[str, Part]) -> dict[str, Tensor]:
    """Every part's residual at its points, each as ``(N, k)`` (attached to the graph as computed)."""
    check_parts(parts)
    return {name: part_values(name, part) for name, part in parts.items()}


def part_layout(
    values: Mapping[str, Tensor], parts: Mapping[str, Part] | None = None
) -> tuple[PartLayout, ...]:
    """The rows of c each part occupies (from the parts' ``(N, k)`` values, in order), each with its
    part's sense (from ``parts``; without them every part is an equality)."""
    layout, offset = [], 0
    for name, v in values.items():
        sense = parts[name].sense if parts is not None and name in parts else "="
        layout.append(PartLayout(name, offset, v.shape[0], v.shape[1], sense))
        offset += v.shape[0] * v.shape[1]
    return tuple(layout)


def concatenate_parts(values: Mapping[str, Tensor]) -> Tensor:
    """c: the parts' ``(N, k)`` values, each flattened row-major, concatenated in order (m,)."""
    flat = [v.reshape(-1) for v in values.values()]
    if not flat:
        raise ValueError("imposed() returned no parts: return None for a task without constraints.")
    dtype = flat[0].dtype
    for v in flat[1:]:
        dtype = torch.promote_types(dtype, v.dtype)
    return torch.cat([v.to(dtype) for v in flat])


def split_parts(c: Tensor, layout: tuple[PartLayout, ...]) -> dict[str, Tensor]:
    """Each part's entries of a constraint vector of the layout's length (views of ``c``)."""
    m = sum(part.size for part in layout)
    if c.numel() != m:
        raise ValueError(f"a constraint vector of {c.numel()} entries does not match the parts' {m} rows.")
    return {part.name: c[part.offset:part.offset + part.size] for part in layout}


# ----------------------------------------------------------------------------------------- the senses
@lru_cache(maxsize=64)
def layout_signs(layout: tuple[PartLayout, ...]) -> Tensor | None:
    """The per-row signs :math:`s \\in \\{0, +1, -1\\}^m` (int8: 0 ``"="``, +1 ``"<="``, -1 ``">="``) of the
    parts' rows, by each part's sense; None when every part is an equality (the step is then the
    equality step, unchanged). The same tensor for the same layout (the step caches its split of the
    rows by it): read it, never write it."""
    if all(part.sense == "=" for part in layout):
        return None
    return torch.cat([torch.full((part.size,), _SIGN[part.sense], dtype=torch.int8) for part in layout])


def violated_part(c: Tensor, signs: Tensor | None) -> Tensor:
    r""":math:`v`: ``c`` on the equality rows, :math:`\max(s_i c_i, 0)` on the inequality rows (the part
    by which a row violates its bound; differentiable, as c). ``signs`` None: ``c`` itself. ``c`` may hold
    W copies of the m rows (the ranks' union): the m signs then repeat."""
    if signs is None:
        return c
    flat = c.reshape(-1)
    s = signs.to(flat.device)
    if flat.numel() != s.numel():
        if s.numel() == 0 or flat.numel() % s.numel():
            raise ValueError(f"{flat.numel()} constraint rows do not match the {s.numel()} senses.")
        s = s.repeat(flat.numel() // s.numel())
    signed = flat * s.to(flat.dtype)
    return torch.where(s == 0, flat, signed.clamp_min(0)).reshape(c.shape)


def active_rows(g: Tensor, tol: float | None = None) -> int:
    r"""How many rows of :math:`g \le 0` are active: :math:`g_i \ge -\mathrm{tol}` (within ``tol`` of the
    bound, or past it). Default ``tol``: :math:`\sqrt{\varepsilon}` of g's dtype (1.5e-8 in float64,
    3.5e-4 in float32)."""
    if g.numel() == 0:
        return 0
    if tol is None:
        tol = torch.finfo(g.dtype).eps ** 0.5 if g.is_floating_point() else 0.0
    return int((g.detach() >= -tol).sum())


@dataclass(frozen=True)
class SenseRows:
    """The equality rows E and the inequality rows I of a constraint vector, by its signs.

    Built once per layout on the host (:meth:`of`): ``equality`` and ``inequality`` index the rows
    (sorted), ``sign`` is :math:`s_I` (+1 or -1). Rows that are contiguous are taken as views (no copy
    of J's rows), and a split of them makes no host sync."""

    equality: Tensor
    inequality: Tensor
    sign: Tensor
    equality_span: tuple[int, int] | None
    inequality_span: tuple[int, int] | None
    all_upper: bool  # every inequality row is "<=" (g = c_I, no sign to apply)
    _copies: dict = field(default_factory=dict, compare=False, repr=False)  # (name, device, dtype) -> tensor

    def _on(self, name: str, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``self.<name>`` on ``like``'s device (and in ``dtype``), copied there once (no copy a step)."""
        key = (name, like.device, dtype)
        if key not in self._copies:
            self._copies[key] = getattr(self, name).to(like.device, dtype)
        return self._copies[key]

    @staticmethod
    def of(signs: Tensor) -> SenseRows:
        """The rows of ``signs`` (int, on any device: read on the host once)."""
        signs = signs.detach().to("cpu").reshape(-1)
        equality = torch.nonzero(signs == 0).reshape(-1)
        inequality = torch.nonzero(signs != 0).reshape(-1)
        sign = signs[inequality]
        return SenseRows(equality, inequality, sign, _span(equality), _span(inequality), bool((sign > 0).all()))

    @property
    def p(self) -> int:
        """The number of inequality rows."""
        return int(self.inequality.numel())

    @property
    def m(self) -> int:
        """The number of equality rows."""
        return int(self.equality.numel())

    def _rows(self, t: Tensor, name: str, span: tuple[int, int] | None) -> Tensor:
        if span is not None:
            return t.narrow(0, span[0], span[1])
        return t.index_select(0, self._on(name, t))

    def equalities(self, c: Tensor) -> Tensor:
        """:math:`c_E` (or :math:`J_E`)."""
        return self._rows(c, "equality", self.equality_span)

    def inequalities(self, c: Tensor) -> Tensor:
        """:math:`g = s_I c_I` (or :math:`G = s_I J_I`): the rows that must be <= 0."""
        g = self._rows(c, "inequality", self.inequality_span)
        if self.all_upper:
            return g
        return g * self._on("sign", g, g.dtype).reshape((-1,) + (1,) * (g.dim() - 1))

    def split(self, c: Tensor, J: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """:math:`(c_E, J_E, g, G)` with :math:`g = s_I c_I`, :math:`G = s_I J_I` (J None: both None)."""
        JE = None if J is None else self.equalities(J)
        G = None if J is None else self.inequalities(J)
        return self.equalities(c), JE, self.inequalities(c), G


def _span(index: Tensor) -> tuple[int, int] | None:
    """``(start, length)`` when the sorted ``index`` is one run of consecutive rows (or empty)."""
    n = index.numel()
    if n == 0:
        return (0, 0)
    start = int(index[0])
    return (start, n) if int(index[-1]) - start + 1 == n else None
