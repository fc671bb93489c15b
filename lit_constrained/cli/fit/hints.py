"""jsonargparse's errors as one line with the fix (:func:`phrase_error`): the key, the value and the class
of jsonargparse's message, said again in a config's words from the classes the failed parse imported (the
argument a class does not take, the type an argument wants and its default, the nearest name by
``difflib``). A message it does not recognize is left as jsonargparse wrote it."""

from __future__ import annotations

import difflib
import inspect
import os
import re
import sys
import types
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


def _unknown_option(message: str, argv: Sequence[str], subcommand: str) -> str | None:
    """An option or config key no parser has: a Trainer argument, a section of the subcommand."""
    from lightning.pytorch import Trainer

    found = re.search(r"does not accept option '([\w.]+)'|unrecognized arguments: --([\w.]+)", message)
    if found is None:
        return None
    head, _, rest = (key := found.group(1) or found.group(2)).partition(".")
    if head == "trainer" and rest:
        name = rest.split(".")[0]
        return (f"{name!r} is not a Trainer argument{_nearest(name, init_arguments(Trainer))}; "
                f"lit-constrained {subcommand} --help-all lists them all")
    sections = ["seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler",
                *init_arguments(getattr(Trainer, subcommand, Trainer.fit))]
    return f"{key!r} is not a section or argument of {subcommand}{_nearest(key, sections)}"


def _described(annotation: Any) -> tuple[str, list[str]]:
    """The values an annotation admits in a config's words (``"a number or 'full'"``) and its strings."""
    words, literals = [], []
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for part in typing.get_args(annotation) if union else [annotation]:
        if typing.get_origin(part) is typing.Literal:
            literals += [v for v in typing.get_args(part) if isinstance(v, str)]
            words += [repr(v) for v in typing.get_args(part)]
        else:
            words.append({float: "a number", int: "an integer", bool: "true or false", type(None): "null",
                          str: "a string"}.get(part, getattr(part, "__name__", str(part))))
    return " or ".join(dict.fromkeys(words)), literals


def _parameter(class_path: str, name: str) -> tuple[type, inspect.Parameter, Any] | None:
    """(the class, its ``name`` parameter, its annotation) of ``class_path`` (a task's ``**kwargs`` followed
    to ConstrainedModule), or None."""
    try:
        cls = import_class(class_path)
        for owner in (cls, ConstrainedModule) if issubclass(cls, ConstrainedModule) else (cls,):
            init = next(k.__dict__["__init__"] for k in owner.__mro__ if "__init__" in k.__dict__)
            if name in inspect.signature(init).parameters:
                parameter = inspect.signature(init).parameters[name]
                return cls, parameter, typing.get_type_hints(init).get(name, parameter.annotation)
    except Exception:  # noqa: BLE001  (a hint never hides the error it explains)
        return None
    return None


def _bad_value(message: str, argv: Sequence[str], subcommand: str) -> str | None:
    """A value its annotation cannot take: ``SQPAdam's lr must be a number, got 'fast'; e.g. lr: 0.001
    (the default)``; the class is the innermost the message names with that argument."""
    keys = re.findall(r'Parser key "(\w+)"', message)
    after = message[message.rindex(f'Parser key "{keys[-1]}"'):] if keys else ""
    given = re.search(r"(?:Given|Got) value: (.*?)(?:\. Got value:|\n|$)", after)
    paths = re.findall(r"class_path='([\w.]+)'", after) + re.findall(r"class_path '([\w.]+)'", message)[::-1]
    found = next((p for p in (_parameter(c, keys[-1]) for c in paths) if p is not None), None) if given else None
    if found is None:
        return None
    (cls, parameter, annotation), key, value = found, keys[-1], given.group(1)
    wanted, literals = _described(annotation)
    default = parameter.default
    shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
    example = "" if default is inspect.Parameter.empty else f"; e.g. {key}: {shown} (the default)"
    return (f"{_where(argv, key)}{cls.__name__}'s {key} must be {wanted}, got {value!r}"
            f"{_nearest(value, literals, repr('{}'))}{example}")


def _not_accepted(message: str, argv: Sequence[str], subcommand: str) -> str | None:
    """An argument a class does not take: a task given ConstrainedModule's must pass ``**kwargs`` on, an
    optimizer's names the optimizers that take it, another class's the nearest it takes."""
    found = re.findall(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    found += [(c, a) for a, c in re.findall(r"Option '(\w+)' is not accepted\. Got value: Namespace\(class_path='([\w.]+)'",
                                            message)]
    for class_path, argument in found[::-1]:
        try:
            cls = import_class(class_path)
        except Exception:  # noqa: BLE001
            continue
        if issubclass(cls, ConstrainedModule) and argument in init_arguments(ConstrainedModule):  # the task drops it
            return f"{_where(argv, argument)}Option {argument!r} is not accepted; fix: {task_kwargs_hint(cls, argument)}"
        return _where(argv, argument) + (optimizer_argument_hint(cls, argument) if issubclass(cls, torch.optim.Optimizer)
                                         else argument_message(cls.__name__, argument, init_arguments(cls), []))
    return None


def _class_path(message: str, argv: Sequence[str], subcommand: str) -> str | None:
    """A class or module that does not exist, with the nearest that does: "module 'torch.optim' has no
    attribute 'Adm'", "No module named 'exp_fti'", an optimizer's short name that names nothing."""
    if missing := re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message):
        module_name, name = missing.groups()
        classes = [n for n, v in getattr(sys.modules.get(module_name), "__dict__", {}).items() if isinstance(v, type)]
        return f"{module_name} has no {name!r}{_nearest(name, classes, module_name + '.{}')}"
    if module := re.search(r"No module named '([\w.]+)'", message):
        beside = [f[:-3] for f in os.listdir(".") if f.endswith(".py")]
        return (f"there is no module {module.group(1)!r} (no {module.group(1)}.py in the working directory "
                f"{os.getcwd()}, and none installed){_nearest(module.group(1), beside)}")
    if short := re.search(r'Parser key "optimizer":\s*- Expected a path but (\w+) either not accessible', message):
        names = [c.__name__ for c in optimizer_classes()]
        return f"the optimizer {short.group(1)!r} is not one of lit_constrained.optim or torch.optim{_nearest(short.group(1), names)}"
    return None


def _config_file(message: str, argv: Sequence[str], subcommand: str) -> str | None:
    """A config that is missing or not YAML, named as it was given."""
    if missing := re.search(r'Parser key "config":\s*File does not exist: \'(.*?)\'', message):
        given = next((p for p in config_paths(argv) if os.path.abspath(p) == missing.group(1)), missing.group(1))
        return f"--config {given}: no such file (in the working directory {os.getcwd()})"
    import yaml

    for path in config_paths(argv) if "Problems parsing config" in message else ():
        try:
            yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as error:
            mark = getattr(error, "problem_mark", None)
            return f"--config {path}: not valid YAML{f' at line {mark.line + 1}' if mark else ''}: {getattr(error, 'problem', error)}"
    return None


def phrase_error(message: str, argv: Sequence[str], subcommand: str = "fit") -> str:
    """jsonargparse's error ``message`` (for the command line ``argv``) as one line with its fix, or the
    message as it is where none of the phrasings applies."""
    for phrasing in (_config_file, _unknown_option, _not_accepted, _class_path, _bad_value):
        if phrased := phrasing(message, argv, subcommand):
            configs = config_paths(argv)
            return phrased if phrased.startswith("--") or not configs else f"--config {configs[-1]}: {phrased}"
    required = re.search(r"the following arguments are required: (.*)", message)
    if required and re.search(r"\b(model|data)\b", required.group(1)):
        return f"{message.strip()}; fix: {RUN_NEEDS_TASK_AND_DATA}" if config_paths(argv) else NO_CONFIG.format(subcommand=subcommand)
    return message
