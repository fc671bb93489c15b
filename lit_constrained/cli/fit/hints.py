"""The fixes the command line adds to a LightningCLI (jsonargparse) error, once the classes it names
are imported: an argument a task or an optimizer does not take, a class or a module that does not
exist, a run without its task and data. The parser prints them under the error
(:meth:`~lit_constrained.cli.fit.parser.ConstrainedArgumentParser.error`); the checks made before
Lightning is imported give the same words (:mod:`lit_constrained.cli.preflight`, through
:mod:`lit_constrained.hints`).
"""

from __future__ import annotations

import difflib
import os
import re
import sys

import torch

from lit_constrained.class_spec import import_class
from lit_constrained.hints import argument_message, init_arguments, task_kwargs_hint
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.optimizer_arguments import optimizer_argument_hint

#: a run given no task or no data, as LightningCLI reports it
RUN_NEEDS_TASK_AND_DATA = (
    "a run needs its task and its data: give a config naming them (model: class_path: ..., "
    "data: class_path: ...), --config CONFIG (e.g. configs/spring/recommended/sqp_adam.yaml), or --model and --data"
)


def cli_error_hint(message: str) -> str | None:
    """The fix for a LightningCLI (jsonargparse) error ``message``, or None: for an argument a class does
    not take ("Option 'num_threads' is not accepted"), :func:`class_argument_hint`; for a class path whose
    class or module does not exist, :func:`class_path_hints`; for a run without its task or its data,
    :data:`RUN_NEEDS_TASK_AND_DATA`."""
    found = list(re.findall(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message))
    found += [(cls, arg) for arg, cls in re.findall(
        r"Option '(\w+)' is not accepted\. Got value: Namespace\(class_path='([\w.]+)'", message)]
    hints = []
    for class_path, argument in found:
        try:
            cls = import_class(class_path)  # already imported by the parser that reported it
        except Exception:  # noqa: BLE001  (a hint never hides the error it explains)
            continue
        hints.append(class_argument_hint(cls, argument))
    hints += class_path_hints(message)
    required = re.search(r"the following arguments are required: (.*)", message)
    if required and re.search(r"\b(model|data)\b", required.group(1)):
        hints.append(RUN_NEEDS_TASK_AND_DATA)
    return " ".join(dict.fromkeys(hints)) or None


def class_path_hints(message: str) -> list[str]:
    """"did you mean" for a class path whose class or module does not exist, as jsonargparse reports
    them: "module 'torch.optim' has no attribute 'Adm'" (the nearest class of that module, which the
    parser has imported) and "No module named 'exp_fti'" (the nearest module file in the working
    directory)."""
    hints = []
    for module_name, name in re.findall(r"module '([\w.]+)' has no attribute '(\w+)'", message):
        module = sys.modules.get(module_name)
        classes = [n for n, v in vars(module).items() if isinstance(v, type)] if module is not None else []
        close = difflib.get_close_matches(name, classes, n=1)
        if close:
            hints.append(f"{module_name} has no {name!r}: did you mean {module_name}.{close[0]}?")
    for module_name in re.findall(r"No module named '(\w+)'", message):
        beside = [f[:-3] for f in os.listdir(".") if f.endswith(".py")]
        close = difflib.get_close_matches(module_name, beside, n=1)
        if close:
            hints.append(f"there is no module {module_name!r}: did you mean {close[0]} ({close[0]}.py in the "
                         "working directory)?")
    return hints


def class_argument_hint(cls: type, argument: str) -> str:
    """The hint for ``cls`` given ``argument``, which it does not take: a task given one of
    ConstrainedModule's arguments must pass ``**kwargs`` on (:func:`~lit_constrained.hints.task_kwargs_hint`);
    an optimizer names the optimizers that take it
    (:func:`~lit_constrained.module_parts.optimizer_arguments.optimizer_argument_hint`); another class
    lists its arguments."""
    if issubclass(cls, ConstrainedModule) and argument in init_arguments(ConstrainedModule):
        return task_kwargs_hint(cls, argument)
    if issubclass(cls, torch.optim.Optimizer):
        return optimizer_argument_hint(cls, argument)
    return argument_message(cls.__name__, argument, init_arguments(cls), [])
