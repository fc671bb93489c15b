"""module_parts/optimizer_arguments.py: the hint for an optimizer given an argument it does not take."""

from __future__ import annotations

import inspect

import torch

import lit_constrained.optim as optim
from lit_constrained.module_parts.optimizer_arguments import optimizer_argument_hint, optimizer_classes


def _takes(cls: type, argument: str) -> bool:
    return argument in inspect.signature(cls.__init__).parameters


def test_the_classes_are_the_packages_optimizers_then_torchs() -> None:
    classes = list(optimizer_classes())
    ours = [c for c in classes if c.__module__.startswith("lit_constrained")]
    assert {c.__name__ for c in ours} == {n for n in optim.__all__
                                           if isinstance(getattr(optim, n), type)
                                           and issubclass(getattr(optim, n), torch.optim.Optimizer)}
    assert classes[:len(ours)] == ours and torch.optim.Adam in classes  # the package's first


def test_sqp_adam_given_momentum_names_the_package_optimizers_that_take_it() -> None:
    hint = optimizer_argument_hint(optim.SQPAdam, "momentum")
    takers = [n for n in optim.__all__ if isinstance(getattr(optim, n), type)
              and issubclass(getattr(optim, n), torch.optim.Optimizer) and _takes(getattr(optim, n), "momentum")]
    assert takers and hint.startswith("SQPAdam takes no 'momentum'")
    for name in takers:
        assert f"lit_constrained.optim.{name}" in hint, name
    own = [p for p in inspect.signature(optim.SQPAdam.__init__).parameters if p not in ("self", "params")]
    assert f"its arguments are {', '.join(own)}." in hint
