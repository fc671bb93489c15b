"""What a task's class declares, read against the module's defaults: whether it declares ``imposed()``
or its own ``constraints()``, and which Jacobian the default ``constraint_jacobian`` computes (its
``jacobian_method``, checked at construction).

The module's own class is passed in as ``base`` (the class whose hooks are the defaults): the module
parts never import :mod:`lit_constrained.module`.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

JacobianMethod = Literal["auto", "pointwise", "batched", "loop"]
"""How :meth:`ConstrainedModule.constraint_jacobian` differentiates c (see its ``jacobian_method``)."""


def checked_jacobian_method(method: Any) -> JacobianMethod:
    """``method`` if it is one of :data:`JacobianMethod`, else a ``ValueError`` naming them."""
    if method not in get_args(JacobianMethod):
        raise ValueError(f"jacobian_method must be 'auto', 'pointwise', 'batched' or 'loop', got {method!r}.")
    return method


def overrides(task: Any, base: type, hook: str) -> bool:
    """Whether ``task``'s class replaces ``base``'s ``hook``."""
    return getattr(type(task), hook) is not getattr(base, hook)


def declares_imposed(task: Any, base: type) -> bool:
    """Whether the task declares its constraints as per-point parts (``imposed()``)."""
    return overrides(task, base, "imposed")


def has_constraints(task: Any, base: type) -> bool:
    """Whether the task declares constraints at all: its own ``constraints()`` or ``imposed()``."""
    return overrides(task, base, "constraints") or declares_imposed(task, base)


def uses_pointwise_jacobian(task: Any, base: type) -> bool:
    """Whether the default ``constraint_jacobian`` runs the per-point engine over ``imposed()``:
    ``jacobian_method="pointwise"`` (an error without ``imposed()``), or ``"auto"`` with ``imposed()``
    declared and the default ``constraints()`` (their concatenation)."""
    if task.jacobian_method == "pointwise":
        if not declares_imposed(task, base):
            raise ValueError(
                f"jacobian_method='pointwise' needs {type(task).__name__}.imposed() (the per-point parts to "
                "differentiate); declare it, or use jacobian_method='auto'."
            )
        return True
    return task.jacobian_method == "auto" and declares_imposed(task, base) and not overrides(task, base, "constraints")
