"""The hint for an optimizer given an argument it does not take (``SQPAdam(momentum=0.9)``): its own
arguments, the nearest of them, and which optimizers of the package (else of torch.optim) take it.

Next to the module part that raises it (:meth:`~lit_constrained.module.ConstrainedModule.configure_optimizers`
adds it to the ``TypeError``); the command line's error hints use it too. It reads the optimizers'
signatures, so it imports :mod:`lit_constrained.optim` and ``torch.optim``; the wording of the message
is :func:`lit_constrained.hints.argument_message` (pure text).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.optim

import lit_constrained.optim as package
from lit_constrained.hints import argument_message, init_arguments


def optimizer_classes() -> Iterator[type]:
    """The optimizers of lit_constrained.optim, then torch.optim's (the subclasses of
    ``torch.optim.Optimizer`` each exports, in the order of their names)."""
    for module in (package, torch.optim):
        for name in sorted(getattr(module, "__all__", dir(module))):
            value = getattr(module, name, None)
            if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer:
                yield value


def optimizer_argument_hint(cls: type, argument: str) -> str:
    """The hint for the optimizer class ``cls`` given ``argument``, which it does not take: its arguments,
    and which optimizers of the package take that argument, the hard-constrained ones first (the user of
    a ConstrainedModule most likely wants one of them); else up to four of torch.optim's."""
    takers = [c for c in optimizer_classes() if c is not cls and argument in init_arguments(c)]
    package_takers = [c for c in takers if c.__module__.startswith("lit_constrained")]
    shown = sorted(package_takers, key=lambda c: "constraints" not in getattr(c, "requires", ())) or takers[:4]
    names = [f"{c.__module__.split('.')[0]}.optim.{c.__name__}" for c in shown]
    return argument_message(cls.__name__, argument, init_arguments(cls), names)
