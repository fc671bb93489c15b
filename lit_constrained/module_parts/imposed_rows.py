"""The rows of c that a task's ``imposed()`` parts make: the parts as they are evaluated (in the module's
``constraint_dtype``: :func:`~lit_constrained.module_parts.constraint_precision.promote_parts`), where
each part lies in the last c (its :class:`~lit_constrained.imposed.PartLayout`, which carries the part's
sense: the step reads the rows' signs from it, :func:`~lit_constrained.imposed.layout_signs`), and the
parts' Jacobian: by the task's per-point engine (linear in m; each part's data mapped with its points),
or, for a declaration with a :class:`~lit_constrained.imposed.Coupled` part, the general autograd
Jacobian of c.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ..imposed import Coupled, Part, PartLayout, check_parts, concatenate_parts, imposed_values, part_layout
from ..jacobians import constraint_jacobian
from .constraint_precision import promote_parts
from .row_choice import RowChoice


def _size(layout: Sequence[PartLayout]) -> int:
    return sum(part.size for part in layout)


class ImposedRows:
    """What a module remembers of its constraint rows between hooks: the layout of the imposed parts in
    the c of the last :meth:`concatenate` (names, offsets, sizes and senses)."""

    def __init__(self) -> None:
        self.layout: tuple[PartLayout, ...] | None = None
        """Name, offset, size and sense of each part in the last c (None: no parts concatenated yet)."""

    def evaluated_parts(self, task: Any, batch: Any) -> dict[str, Part] | None:
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

    def concatenate(self, parts: Mapping[str, Part] | None) -> Tensor | None:
        """c of ``parts``: each part's residual at its points flattened row-major over (N, k), concatenated
        in order; their layout is recorded (None: no parts, nothing recorded)."""
        if parts is None:
            return None
        values = imposed_values(parts)
        self.layout = part_layout(values, parts)
        return concatenate_parts(values)

    def jacobian(
        self, task: Any, batch: Any, constraints: Tensor, params: Sequence[Tensor], rows: slice | None
    ) -> Tensor:
        """J of ``task.imposed(batch)`` (the rows ``rows``; all: None): by ``task.pointwise_jacobian``, in
        the parameters' dtype (``constraints``, which must be the parts' residuals, may be float64: a
        promoted residual's gradient with respect to float32 parameters is float32 already, so a float64
        J would only hold the same numbers at twice the memory, for the optimizer to round back); with a
        :class:`~lit_constrained.imposed.Coupled` part, the general autograd Jacobian of ``constraints``."""
        name = type(task).__name__
        parts = self.evaluated_parts(task, batch)
        if parts is None:
            raise ValueError(f"{name}.imposed() returned None, but constraints() returned a tensor.")
        if any(isinstance(part, Coupled) for part in parts.values()):
            if task.jacobian_method == "pointwise":
                raise ValueError(f"jacobian_method='pointwise' differentiates per-point parts only, but {name}.imposed() "
                                 "declares a Coupled part; use jacobian_method='auto'.")
            return constraint_jacobian(constraints, params, method="auto", rows=rows)
        layout = self.layout
        if layout is None or [p.name for p in layout] != list(parts) or _size(layout) != constraints.numel():
            layout = part_layout(imposed_values(parts), parts)  # constraints() was overridden: read the widths anew
        if _size(layout) != constraints.numel():
            raise ValueError(
                f"{name}.constraints() has {constraints.numel()} entries but imposed() declares "
                f"{_size(layout)}: with the pointwise Jacobian they must be the same residuals."
            )
        specs = [(part.residual, part.points, piece.width, part.data) for part, piece in zip(parts.values(), layout)]
        floating = [p.dtype for p in params if p.is_floating_point()]
        dtype = floating[0] if floating and all(d == floating[0] for d in floating) else constraints.dtype
        return task.pointwise_jacobian(task, params, specs, rows=rows, dtype=dtype)
