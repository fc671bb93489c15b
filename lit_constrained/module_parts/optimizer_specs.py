"""The optimizer and LR scheduler as a module is given them (a class, ``functools.partial(Class, ...)``,
a ``{"class_path": ..., "init_args": {...}}`` dict, or LightningCLI's callable): the plain specs its
hyper-parameters store, the factories that build them, and the optimizer built (a ``TypeError`` for an
argument it does not take gets the hint of :mod:`~lit_constrained.module_parts.optimizer_arguments`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch.optim import Optimizer

from ..class_spec import SpecFactory, as_class_spec, import_class
from ..hints import add_hint, unexpected_keyword
from .optimizer_arguments import optimizer_argument_hint

Specs = dict[str, dict[str, Any] | None]
"""``{"optimizer": spec, "lr_scheduler": spec or None}``, each spec ``{"class_path", "init_args"}``."""


def given_factories(
    optimizer: Any, lr_scheduler: Any, default: Callable[..., Optimizer], default_spec: dict[str, Any]
) -> tuple[Specs, Callable[..., Optimizer], Callable[..., Any] | None]:
    """The plain specs of ``optimizer`` and ``lr_scheduler`` (``default_spec`` for the module's
    ``default``), the optimizer's factory and the scheduler's (None: no scheduler): each the callable
    given, else its spec's class. A lambda or closure is rejected (it is code, not data), as is
    ``optimizer=None``."""
    optimizer_spec = default_spec if optimizer is default else as_class_spec(optimizer, "optimizer")
    if optimizer_spec is None:
        raise TypeError("optimizer=None: pass an optimizer class (or leave the default SQP-Adam).")
    lr_scheduler_spec = as_class_spec(lr_scheduler, "lr_scheduler")
    optimizer_factory = optimizer if callable(optimizer) else SpecFactory(optimizer_spec)
    lr_scheduler_factory = (
        None if lr_scheduler is None else lr_scheduler if callable(lr_scheduler) else SpecFactory(lr_scheduler_spec)
    )
    return {"optimizer": optimizer_spec, "lr_scheduler": lr_scheduler_spec}, optimizer_factory, lr_scheduler_factory


def build_optimizer(
    factory: Callable[..., Optimizer], params: Iterable[Any], spec: Mapping[str, Any] | None
) -> Optimizer:
    """``factory(params)``; a ``TypeError`` for an argument the class of ``spec`` does not take names
    which optimizers take it (:func:`~lit_constrained.module_parts.optimizer_arguments.optimizer_argument_hint`)."""
    try:
        return factory(params)
    except TypeError as error:
        argument, given = unexpected_keyword(error), spec or {}
        if argument is None or not given.get("class_path"):
            raise
        raise add_hint(error, optimizer_argument_hint(import_class(given["class_path"]), argument))
