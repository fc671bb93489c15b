"""The rows of c that a task's ``imposed()`` parts make: the parts as they are evaluated (in the module's
``constraint_dtype``: :func:`~lit_constrained.module_parts.constraint_precision.promote_parts`), where
each part lies in the last c (its :class:`~lit_constrained.imposed.PartLayout`), the per-row signs of the
rows' senses, and the parts' Jacobian by the task's per-point engine (linear in m).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ..imposed import (
    Imposed, PartLayout, check_parts, concatenate_parts, imposed_values, layout_signs, part_layout, sense_signs,
)
from .constraint_precision import promote_parts
from .row_choice import RowChoice


def _size(layout: Sequence[PartLayout]) -> int:
    return sum(part.size for part in layout)


class ImposedRows:
    """What a module remembers of its constraint rows between hooks: the layout of the imposed parts in
    the c of the last :meth:`concatenate` and the signs last computed (:meth:`signs`)."""

    def __init__(self) -> None:
        self.layout: tuple[PartLayout, ...] | None = None
        """Name, offset and size of each part in the last c (None: no parts concatenated yet)."""
        self._signs: tuple[Any, Tensor | None] | None = None  # (what they were computed from, the signs)

    def evaluated_parts(self, task: Any, batch: Any) -> dict[str, Imposed] | None:
        """``task.imposed(batch)`` as c and J evaluate it: checked, a part with a ``count`` cut to the
        points chosen from its pool (``task.row_choice``, :mod:`~lit_constrained.module_parts.row_choice`),
        each residual in the task's ``constraint_dtype`` (float64 at a float32 network's weights by default)."""
        parts = task.imposed(batch)
        if parts is None:
            return None
        check_parts(parts)
        choice = getattr(task, "row_choice", None)
        if choice is not None:
            parts = choice.apply(task, batch, parts)
        elif RowChoice.counted(parts):
            raise ValueError(f"{type(task).__name__}: Imposed(..., count=...) needs a ConstrainedModule (its row_choice).")
        return promote_parts(task, parts, getattr(task, "constraint_dtype", "native"))

    def concatenate(self, parts: Mapping[str, Imposed] | None) -> Tensor | None:
        """c of ``parts``: each ``residual(points)`` flattened row-major over (N, k), concatenated in
        order; their layout is recorded (None: no parts, nothing recorded)."""
        if parts is None:
            return None
        values = imposed_values(parts)
        self.layout = part_layout(values, parts)
        return concatenate_parts(values)

    def signs(self, senses: str | Sequence[str] | None, m: int) -> Tensor | None:
        """The int8 signs of the m rows (0 ``"="``, +1 ``"<="``, -1 ``">="``): of ``senses`` (a task's
        ``constraint_senses(m)``), else of the parts' senses by the recorded layout (None: no layout of
        m rows). The same tensor while what they are computed from stays the same."""
        if senses is not None:
            key: Any = ("senses", senses if isinstance(senses, str) else tuple(senses), m)
        else:
            if self.layout is None or _size(self.layout) != m:
                return None
            key = ("layout", self.layout)
        if self._signs is None or self._signs[0] != key:
            signs = sense_signs(key[1], m) if senses is not None else layout_signs(key[1])
            self._signs = (key, signs)
        return self._signs[1]

    def jacobian(
        self, task: Any, batch: Any, constraints: Tensor, params: Sequence[Tensor], rows: slice | None
    ) -> Tensor:
        """J of ``task.imposed(batch)`` by ``task.pointwise_jacobian`` (the rows ``rows``; all: None), in
        the parameters' dtype (``constraints``, which must be the parts' residuals, may be float64: a
        promoted residual's gradient with respect to float32 parameters is float32 already, so a float64
        J would only hold the same numbers at twice the memory, for the optimizer to round back)."""
        name = type(task).__name__
        parts = self.evaluated_parts(task, batch)
        if parts is None:
            raise ValueError(f"{name}.imposed() returned None, but constraints() returned a tensor.")
        layout = self.layout
        if layout is None or [p.name for p in layout] != list(parts) or _size(layout) != constraints.numel():
            layout = part_layout(imposed_values(parts), parts)  # constraints() was overridden: read the widths anew
        if _size(layout) != constraints.numel():
            raise ValueError(
                f"{name}.constraints() has {constraints.numel()} entries but imposed() declares "
                f"{_size(layout)}: with the pointwise Jacobian they must be the same residuals."
            )
        specs = [(part.residual, part.points, piece.width) for part, piece in zip(parts.values(), layout)]
        floating = [p.dtype for p in params if p.is_floating_point()]
        dtype = floating[0] if floating and all(d == floating[0] for d in floating) else constraints.dtype
        return task.pointwise_jacobian(task, params, specs, rows=rows, dtype=dtype)
