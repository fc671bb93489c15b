"""jsonargparse's errors as one line with the fix: :func:`phrase_error` reads the message jsonargparse
raised (the key, the value, the class it was given to) and says it again in the words of a config,
from the classes themselves (imported by the parse that failed): the argument a class does not take
and the nearest it does, the type an argument wants and its default, the nearest class or module of a
typo, the nearest Trainer argument (``difflib`` throughout). A message it does not recognize is left
as jsonargparse wrote it.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lit_constrained.class_spec import import_class
from lit_constrained.cli.help import NO_CONFIG
from lit_constrained.hints import argument_message, init_arguments, task_kwargs_hint
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.optimizer_arguments import optimizer_argument_hint, optimizer_classes

#: a run given no task or no data, as LightningCLI reports it
RUN_NEEDS_TASK_AND_DATA = (
    "a run needs its task and its data: give a config naming them (model: class_path: ..., "
    "data: class_path: ...), --config CONFIG (e.g. configs/spring/recommended/sqp_adam.yaml), or --model and --data"
)


def _nearest(name: str, choices: Sequence[str], shown: str = "{}") -> str:
    close = difflib.get_close_matches(name, sorted(set(choices)), n=1)
    return f" (did you mean {shown.format(close[0])}?)" if close else ""


def config_paths(argv: Sequence[str]) -> list[str]:
    """The values of ``-c``/``--config`` in ``argv`` (``--config X`` and ``--config=X``)."""
    paths = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-c", "--config")]
    return paths + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]


def _where(argv: Sequence[str], name: str) -> str:
    """``"--model.init_args.x: "`` for the option of ``argv`` that sets ``name``, else the last config."""
    option = next((a.split("=", 1)[0] for a in argv if a.startswith("--") and
                   re.split(r"[.=]", a[2:].split("=", 1)[0])[-1] == name), None)
    configs = config_paths(argv)
    return f"{option}: " if option else f"--config {configs[-1]}: " if configs else ""


def trainer_argument_error(name: str, subcommand: str) -> str:
    """``'max_step' is not a Trainer argument (did you mean max_steps?)``, from the Trainer's signature."""
    from lightning.pytorch import Trainer

    return (f"{name!r} is not a Trainer argument{_nearest(name, init_arguments(Trainer))}; "
            f"lit-constrained {subcommand} --help-all lists them all")


def _unknown_option(message: str, subcommand: str) -> str | None:
    """An option or config key no parser has: a Trainer argument, a section of the subcommand."""
    found = re.search(r"does not accept option '([\w.]+)'|unrecognized arguments: --([\w.]+)", message)
    if found is None:
        return None
    key = found.group(1) or found.group(2)
    head, _, rest = key.partition(".")
    if head == "trainer" and rest:
        return trainer_argument_error(rest.split(".")[0], subcommand)
    from lightning.pytorch import Trainer

    sections = ["seed_everything", "trainer", "model", "data", "ckpt_path", "optimizer", "lr_scheduler",
                *init_arguments(getattr(Trainer, subcommand, Trainer.fit))]
    return f"{key!r} is not a section or argument of {subcommand}{_nearest(key, sections)}"


def _described(annotation: Any) -> tuple[str, list[str]]:
    """The values an annotation admits in a config's words (``"a number or 'full'"``) and its strings."""
    words, literals = [], []
    for part in typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else [annotation]:
        if typing.get_origin(part) is typing.Literal:
            literals += [v for v in typing.get_args(part) if isinstance(v, str)]
            words += [repr(v) for v in typing.get_args(part)]
        else:
            words.append({float: "a number", int: "an integer", bool: "true or false", type(None): "null",
                          str: "a string"}.get(part, getattr(part, "__name__", str(part))))
    return " or ".join(dict.fromkeys(words)), literals


def _parameter(class_path: str, name: str) -> tuple[type, inspect.Parameter, Any] | None:
    """(the class, its ``name`` parameter, the resolved annotation) of ``class_path``, following a
    task's ``**kwargs`` to ConstrainedModule; None where it takes no such argument."""
    try:
        cls = import_class(class_path)
    except Exception:  # noqa: BLE001  (a hint never hides the error it explains)
        return None
    for owner in (cls, ConstrainedModule) if issubclass(cls, ConstrainedModule) else (cls,):
        for klass in owner.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            parameter = inspect.signature(init).parameters.get(name)
            if parameter is not None:
                hints = typing.get_type_hints(init)
                return cls, parameter, hints.get(name, parameter.annotation)
            break
    return None


#: a nearest string shown quoted, as the config would hold it
QUOTED = "'{}'"


def _bad_value(message: str, argv: Sequence[str]) -> str | None:
    """A value its annotation cannot take: ``SQPAdam's lr must be a number, got 'fast'; e.g. lr: 0.001
    (the default)``."""
    keys = re.findall(r'Parser key "(\w+)"', message)
    if not keys:
        return None
    key = keys[-1]
    after = message[message.rindex(f'Parser key "{key}"'):]
    given = re.search(r"(?:Given|Got) value: (.*?)(?:\. Got value:|\n|$)", after)
    if given is None:
        return None
    value = given.group(1)
    paths = re.findall(r"class_path='([\w.]+)'", after) + re.findall(r"class_path '([\w.]+)'", message)[::-1]
    found = next((p for p in map(lambda c: _parameter(c, key), paths) if p is not None), None)
    if found is None:
        return None
    cls, parameter, annotation = found
    wanted, literals = _described(annotation)
    default = parameter.default
    example = ("" if default is inspect.Parameter.empty else
               f"; e.g. {key}: {'null' if default is None else str(default).lower() if isinstance(default, bool) else default}"
               " (the default)")
    return (f"{_where(argv, key)}{cls.__name__}'s {key} must be {wanted}, got {value!r}"
            f"{_nearest(value, literals, QUOTED)}{example}")


def _not_accepted(message: str, argv: Sequence[str]) -> str | None:
    """An argument a class does not take: which class takes it, or the nearest it does take."""
    found = re.findall(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    found += [(c, a) for a, c in re.findall(r"Option '(\w+)' is not accepted\. Got value: Namespace\(class_path='([\w.]+)'",
                                            message)]
    for class_path, argument in found[::-1]:
        try:
            cls = import_class(class_path)
        except Exception:  # noqa: BLE001
            continue
        hint = class_argument_hint(cls, argument)
        if issubclass(cls, ConstrainedModule) and argument in init_arguments(ConstrainedModule):
            hint = f"Option {argument!r} is not accepted; fix: {hint}"  # the task's code drops it: say so
        return f"{_where(argv, argument)}{hint}"
    return None


def class_path_error(message: str) -> str | None:
    """A class or module that does not exist, with the nearest that does: "module 'torch.optim' has no
    attribute 'Adm'", "No module named 'exp_fti'", an optimizer's short name that names nothing."""
    missing = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
    if missing:
        module_name, name = missing.groups()
        module = sys.modules.get(module_name)
        classes = [n for n, v in vars(module).items() if isinstance(v, type)] if module is not None else []
        return f"{module_name} has no {name!r}{_nearest(name, classes, module_name + '.{}')}"
    module = re.search(r"No module named '([\w.]+)'", message)
    if module:
        name = module.group(1)
        beside = [f[:-3] for f in os.listdir(".") if f.endswith(".py")]
        return (f"there is no module {name!r} (no {name}.py in the working directory {os.getcwd()}, and none "
                f"installed){_nearest(name, beside)}")
    short = re.search(r'Parser key "optimizer":\s*- Expected a path but (\w+) either not accessible', message)
    if short:
        names = [c.__name__ for c in optimizer_classes()]
        return f"the optimizer {short.group(1)!r} is not one of lit_constrained.optim or torch.optim{_nearest(short.group(1), names)}"
    return None


def _config_file(message: str, argv: Sequence[str]) -> str | None:
    """A config that is missing or not YAML, named as it was given."""
    missing = re.search(r'Parser key "config":\s*File does not exist: \'(.*?)\'', message)
    if missing:
        given = next((p for p in config_paths(argv) if os.path.abspath(p) == missing.group(1)), missing.group(1))
        return f"--config {given}: no such file (in the working directory {os.getcwd()})"
    if "Problems parsing config" not in message:
        return None
    import yaml

    for path in config_paths(argv):
        try:
            yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as error:
            mark = getattr(error, "problem_mark", None)
            line = f" at line {mark.line + 1}" if mark is not None else ""
            return f"--config {path}: not valid YAML{line}: {getattr(error, 'problem', None) or error}"
    return None


def phrase_error(message: str, argv: Sequence[str], subcommand: str = "fit") -> str:
    """jsonargparse's error ``message`` (for the command line ``argv``) as one line with its fix, or the
    message as it is where none of the phrasings applies."""
    for phrased in (_config_file(message, argv), _unknown_option(message, subcommand), _not_accepted(message, argv),
                    class_path_error(message), _bad_value(message, argv)):
        if phrased:
            where = "" if phrased.startswith("--") or not config_paths(argv) else f"--config {config_paths(argv)[-1]}: "
            return where + phrased
    required = re.search(r"the following arguments are required: (.*)", message)
    if required and re.search(r"\b(model|data)\b", required.group(1)):
        return NO_CONFIG.format(subcommand=subcommand) if not config_paths(argv) else f"{message.strip()}; fix: {RUN_NEEDS_TASK_AND_DATA}"
    return message


def class_argument_hint(cls: type, argument: str) -> str:
    """The hint for ``cls`` given ``argument``, which it does not take: a task given one of
    ConstrainedModule's arguments must pass ``**kwargs`` on (:func:`~lit_constrained.hints.task_kwargs_hint`);
    an optimizer names the optimizers that take it
    (:func:`~lit_constrained.module_parts.optimizer_arguments.optimizer_argument_hint`); another class
    lists its arguments and the nearest."""
    if issubclass(cls, ConstrainedModule) and argument in init_arguments(ConstrainedModule):
        return task_kwargs_hint(cls, argument)
    if issubclass(cls, torch.optim.Optimizer):
        return optimizer_argument_hint(cls, argument)
    return argument_message(cls.__name__, argument, init_arguments(cls), [])
