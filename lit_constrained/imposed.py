r"""What a task imposes, point by point: :class:`Imposed` parts and their constraint vector.

A task declares its hard constraints as named parts (``ConstrainedModule.imposed(batch)``), each a
per-point residual and the points where it must vanish::

    def imposed(self, batch):
        return {"pde": Imposed(self.pde_residual, batch["x_pde"]),
                "boundary": Imposed(self.boundary_residual, self.x_bc)}

Part :math:`p` has the residual :math:`r_p : (N_p, d_p) \to (N_p,)` or :math:`(N_p, k_p)` and points
:math:`X_p \in \mathbb{R}^{N_p \times d_p}`; row i of :math:`r_p(X_p)` depends ONLY on
:math:`X_p[i]`. The constraint vector is the concatenation, parts in their order, each row-major
over :math:`(N_p, k_p)`:

.. math::

    c = \big(\operatorname{vec}(r_1(X_1)), \dots, \operatorname{vec}(r_P(X_P))\big) \in \mathbb{R}^m,
    \qquad m = \textstyle\sum_p N_p k_p,

so constraint :math:`o_p + i k_p + j` is component j of part p at its point i (:math:`o_p` the
part's offset). Because each row depends on one point only, the Jacobian of c is assembled point by
point (:mod:`lit_constrained.optim.pointwise`), linear in m. This module imports no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Imposed", "PartLayout", "imposed_values", "part_layout", "concatenate_parts", "split_parts"]

RESERVED_PART_NAMES = frozenset({"train", "val", "test"})
"""Names a part may not take: the stages of the ``Violation/<stage>`` tags (a part's own violation is
logged as ``Violation/<name>/<stage>``)."""


@dataclass(frozen=True)
class Imposed:
    """One part of the hard constraints: ``residual(points) = 0`` at every point.

    Attributes:
        residual: ``points (N, d) -> (N,)`` or ``(N, k)``; row i depends ONLY on ``points[i]``. It
            calls the task's network (e.g. a bound method using ``self.net``). The per-point
            Jacobian evaluates it under ``torch.func`` with functional parameters, one point at a
            time (a batch of ONE point, shape (1, d)); a residual whose input derivatives use plain
            ``torch.autograd.grad`` still works there, on the slower chunked-autograd path.
        points: the imposed points, ``(N, d)`` (a buffer or an entry of the batch).
    """

    residual: Callable[[Tensor], Tensor]
    points: Tensor

    def __post_init__(self) -> None:
        if not callable(self.residual):
            raise TypeError(f"Imposed.residual must be callable (points -> residuals), got {type(self.residual).__name__}.")
        if not isinstance(self.points, Tensor) or self.points.dim() != 2:
            shape = tuple(self.points.shape) if isinstance(self.points, Tensor) else type(self.points).__name__
            raise ValueError(f"Imposed.points must be a 2-D tensor (N points, d coordinates), got {shape}.")


@dataclass(frozen=True)
class PartLayout:
    """Where a part's rows lie in c: rows ``[offset, offset + size)``, ``size = points * width``."""

    name: str
    offset: int
    points: int
    width: int

    @property
    def size(self) -> int:
        return self.points * self.width


def check_parts(parts: Mapping[str, Imposed], owner: str = "imposed()") -> None:
    """Clear errors for a malformed declaration (not a mapping of names to :class:`Imposed`)."""
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
        if not isinstance(part, Imposed):
            raise TypeError(f"{owner}[{name!r}] must be an Imposed(residual, points), got {type(part).__name__}.")


def _check_values(name: str, values: Tensor, points: Tensor) -> Tensor:
    """``values`` as (N, k): a residual returns (N,) or (N, k) for N points."""
    if not isinstance(values, Tensor):
        raise TypeError(f"the residual of part {name!r} returned {type(values).__name__}, not a tensor.")
    n = points.shape[0]
    if values.dim() == 1 and values.shape[0] == n:
        return values[:, None]
    if values.dim() == 2 and values.shape[0] == n:
        return values
    raise ValueError(
        f"the residual of part {name!r} returned shape {tuple(values.shape)} for {n} points: it must "
        f"return ({n},) or ({n}, k), row i depending only on point i."
    )


def imposed_values(parts: Mapping[str, Imposed]) -> dict[str, Tensor]:
    """Every part's residual at its points, each as ``(N, k)`` (attached to the graph as computed)."""
    check_parts(parts)
    return {name: _check_values(name, part.residual(part.points), part.points) for name, part in parts.items()}


def part_layout(values: Mapping[str, Tensor]) -> tuple[PartLayout, ...]:
    """The rows of c each part occupies (from the parts' ``(N, k)`` values, in order)."""
    layout, offset = [], 0
    for name, v in values.items():
        layout.append(PartLayout(name, offset, v.shape[0], v.shape[1]))
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
