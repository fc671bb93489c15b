"""The optimizer and LR scheduler as a module is given them (a class, ``functools.partial(Class, ...)``,
a ``{"class_path": ..., "init_args": {...}}`` dict, or LightningCLI's callable): the plain specs its
hyper-parameters store, the factories that build them, and the optimizer built (a ``TypeError`` for an
argument it does not take gets the hint of :mod:`~lit_constrained.module_parts.optimizer_arguments`); the
class a config names (:func:`class_named`) and a task's default optimizer class (:func:`default_optimizer_class`),
which the command line reads.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch.optim import Optimizer

from ..class_spec import SpecFactory, as_class_spec, import_class
from ..hints import add_hint, unexpected_keyword
from .optimizer_arguments import optimizer_argument_hint, optimizer_classes

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


def class_named(path: str) -> type | None:
    """The class a config names: a full class path (a module next to the working directory importable, as
    a run imports it) or an optimizer's short name (``SQPAdam``, ``Adam``); None when none is found or its
    import fails (the parser then reports it)."""
    if "." not in path:
        return next((c for c in optimizer_classes() if c.__name__ == path), None)
    if os.path.isfile(f"{path.split('.')[0]}.py") and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a task next to the config
    try:
        return import_class(path)
    except Exception:  # noqa: BLE001  (any import failure: the caller's parser reports it)
        return None


def default_optimizer_class(task: type) -> type | None:
    """The class of the ``optimizer`` default of ``task``'s nearest ``__init__`` that takes one (a class or
    a class-path dict; None otherwise)."""
    for owner in task.__mro__:
        init = vars(owner).get("__init__")
        parameter = inspect.signature(init).parameters.get("optimizer") if init is not None else None
        if parameter is not None:
            default = parameter.default
            return default if isinstance(default, type) else class_named(str(default.get("class_path"))) if isinstance(default, dict) else None
    return None
