"""What ``lit-constrained`` answers before Lightning is imported (importing torch and Lightning takes
seconds: 3-10 s measured on a shared 2-core machine).

* :func:`preflight`: the errors that the command line and its config files can be checked for without
  importing what they name: no ``--config`` at all (and no ``--model``/``--data``); a ``--config`` file
  that is missing, unreadable or not a YAML mapping; a
  key of a config or a ``--trainer.<name>`` / ``--<key>`` option that is not an argument of Lightning's
  ``Trainer`` or of the subcommand; a ``class_path`` whose module or class does not exist (a file next
  to the config, a module of this package, a short optimizer name: ``exp_fti.ExpFit``,
  ``lit_constrained.optim.SQPAdm``), with the nearest that does; an argument (``init_args``, in a config
  or as ``--model.init_args.NAME``) that the task's ``__init__`` does not take (its own, and
  ConstrainedModule's where it hands ``**kwargs`` to ``super().__init__``; a task without ``**kwargs``
  given ``num_threads``) or that an optimizer of ``lit_constrained.optim`` does not take (``momentum``
  for SQPAdam; the default optimizer where none is named), with the nearest it does take; and a value
  its annotation cannot take (``lr: fast`` for a ``float``, ``rho: ful`` for ``float | Literal["full"]``;
  annotations of numbers, booleans, None and literals, through the type aliases of the class's files).
  Signatures are read from the source files with :mod:`ast`, nothing is imported; where a class or a
  signature cannot be read so (a class from another package, an ``__init__`` that keeps its
  ``**kwargs``, an annotation of another type), the check is left to LightningCLI. One line each, with
  the fix, and no usage dump.

Errors found only once the classes are imported come from LightningCLI;
:meth:`lit_constrained.cli.fit.parser.ConstrainedArgumentParser.error` prints them without the usage dump
too, with the same fixes (:func:`lit_constrained.cli.fit.hints.cli_error_hint`). This module imports neither
torch nor Lightning.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from lit_constrained.cli.preflight.classes import _check_class_arguments
from lit_constrained.cli.preflight.errors import UNSET as _UNSET
from lit_constrained.cli.preflight.errors import PreflightError
from lit_constrained.cli.preflight.sources import (
    class_path_of_spec, constrained_module_arguments, optimizer_names, own_arguments,
)
from lit_constrained.cli.trainer_arguments import trainer_arguments

__all__ = ["HELP_ALL", "NO_CONFIG", "PreflightError", "class_path_of_spec", "config_paths", "constrained_module_arguments",
           "optimizer_names", "own_arguments", "preflight", "read_config", "run_preflight"]

HELP_ALL = "--help-all"

#: arguments of the Trainer's fit/validate/test/predict that LightningCLI fills itself (not config keys)
#: an option of the model's optimizer: --model[.init_args].optimizer[.<rest>] (group 1: the rest)
_OPTIMIZER_OPTION = re.compile(r"^model\.(?:init_args\.)?optimizer(?:\.(.+))?$")

_FILLED_BY_THE_CLI = frozenset({"self", "model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule"})


def _trainer_signatures() -> dict[str, frozenset[str]] | None:
    """The argument names of ``Trainer.__init__`` and of its fit/validate/test/predict, from its signature
    (:func:`lit_constrained.cli.trainer_arguments.trainer_arguments`: cached per installed Lightning; the
    first use imports the Trainer); None without Lightning."""
    arguments = trainer_arguments()
    return None if arguments is None else {method: frozenset(names) for method, names in arguments.items()}


def _nearest(name: str, choices: frozenset[str]) -> str:
    close = difflib.get_close_matches(name, sorted(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def config_paths(args: Sequence[str]) -> list[str]:
    """The values of ``-c``/``--config`` in ``args`` (``--config X`` and ``--config=X``)."""
    paths = []
    for index, arg in enumerate(args):
        if arg in ("-c", "--config") and index + 1 < len(args):
            paths.append(args[index + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def _option_names(args: Sequence[str]) -> list[str]:
    """The ``--name`` options of ``args`` (values skipped), without ``=value``, up to a bare ``--``."""
    names = []
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("--"):
            names.append(arg[2:].split("=", 1)[0])
    return names


def _option_values(args: Sequence[str]) -> list[tuple[str, object]]:
    """``(name, value)`` of the ``--name value`` / ``--name=value`` options of ``args`` (up to a bare
    ``--``), the value read as YAML (as jsonargparse reads it: ``1e-2``, ``true``, ``null``); the value
    is ``_UNSET`` for an option without one."""
    import yaml

    found: list[tuple[str, object]] = []
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if not arg.startswith("--"):
            continue
        name, equals, text = arg[2:].partition("=")
        if not equals:
            following = args[index + 1] if index + 1 < len(args) else None
            if following is None or following.startswith("--"):
                found.append((name, _UNSET))
                continue
            text = following
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        found.append((name, value))
    return found


def read_config(path: str) -> dict:
    import yaml  # PyYAML: imported in milliseconds

    if not os.path.isfile(path):
        raise PreflightError(f"--config {path}: no such file (in the working directory {os.getcwd()})")
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise PreflightError(f"--config {path}: cannot be read ({error})") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise PreflightError(f"--config {path}: not valid YAML{line}: {problem}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise PreflightError(f"--config {path}: a config is a mapping of sections (trainer:, model:, data:), "
                             f"got a {type(content).__name__}")
    return content


def _check_keys(where: str, keys: Sequence[str], section: str, allowed: frozenset[str], subcommand: str) -> None:
    for key in keys:
        name = key.rstrip("+")  # jsonargparse's list append, --trainer.callbacks+=...
        if name not in allowed:
            what = "a Trainer argument" if section == "trainer" else f"a section or argument of {subcommand}"
            raise PreflightError(
                f"{where}: {name!r} is not {what}{_nearest(name, allowed)}; lit-constrained {subcommand} --help-all "
                "lists them all"
            )


#: what ``lit-constrained <subcommand>`` without a config answers (a run needs a task and its data)
NO_CONFIG = ("no --config given: a run needs a config naming its task and its data (model: class_path: ..., "
             "data: class_path: ...), e.g. lit-constrained {subcommand} --config "
             "configs/spring/recommended/sqp_adam.yaml (the repository's configs/), or --model and --data; "
             "lit-constrained {subcommand} --help lists the options")


def _check_something_to_run(subcommand: str, args: Sequence[str], top_level_configs: Sequence[str]) -> None:
    """A subcommand given neither a config (its own or a top-level one) nor the task and the data
    as options: LightningCLI's answer would be "required: fit.data, fit.model", after seconds."""
    if config_paths(args) or top_level_configs or any(arg in ("-h", "--help") for arg in args):
        return
    given = {name.split("=", 1)[0].split(".", 1)[0] for name in _option_names(args)}
    if "model" not in given and "data" not in given:
        raise PreflightError(NO_CONFIG.format(subcommand=subcommand))


def preflight(subcommand: str, args: Sequence[str], top_level_configs: Sequence[str] = ()) -> None:
    """Raise :class:`PreflightError` for what can be checked of ``lit-constrained [--config
    <top_level_configs>] <subcommand> <args>`` without importing Lightning (see the module docstring);
    return quietly otherwise."""
    configs = [(path, read_config(path)) for path in config_paths(args)]
    signatures = _trainer_signatures()
    if signatures is None or subcommand not in signatures:
        _check_something_to_run(subcommand, args, top_level_configs)
        return
    trainer_arguments = signatures["__init__"]
    sections = frozenset({"seed_everything", "trainer", "model", "data"}) | (signatures[subcommand] - _FILLED_BY_THE_CLI)
    for path, content in configs:
        _check_keys(f"--config {path}", list(content), "top", sections, subcommand)
        trainer = content.get("trainer")
        if isinstance(trainer, dict):
            _check_keys(f"--config {path} (trainer)", list(trainer), "trainer", trainer_arguments, subcommand)
    names = _option_names(args)
    for name in names:
        head, _, rest = name.partition(".")
        if head == "trainer" and rest:
            _check_keys(f"--{name}", [rest.split(".", 1)[0]], "trainer", trainer_arguments, subcommand)
        elif not rest and head not in ("config", "help", "print_config", HELP_ALL[2:]):
            _check_keys(f"--{name}", [head], "top", sections, subcommand)
    _check_something_to_run(subcommand, args, top_level_configs)  # after the options' own mistakes
    model_options, optimizer_options, optimizer_named = [], [], None
    for name, value in _option_values(args):
        parts = name.split(".")
        optimizer = _OPTIMIZER_OPTION.match(name)
        if optimizer is not None:
            rest = optimizer.group(1)
            if rest in (None, "class_path"):
                optimizer_named = (f"--{name} {value}", value) if isinstance(value, str) else optimizer_named
            elif rest != "help" and rest != "init_args" and len(rest.split(".")) <= 2:
                optimizer_options.append((f"--{name}", rest.split(".")[-1], value))
        elif name.startswith("model.init_args.") and len(parts) == 3:
            model_options.append((f"--{name}", parts[2], value))
    model = next((content.get("model") for _, content in reversed(configs) if content.get("model") is not None), None)
    data = next((content.get("data") for _, content in reversed(configs) if content.get("data") is not None), None)
    where = f"--config {configs[-1][0]}" if configs else "the command line"
    _check_class_arguments(where, model, model_options, optimizer_options, data, optimizer_named)



def run_preflight(subcommand: str, args: Sequence[str], top_level_configs: Sequence[str] = ()) -> None:
    """:func:`preflight`, its error printed in one line (``lit-constrained <subcommand>: error: ...``) and
    exit status 2, as argparse does."""
    try:
        preflight(subcommand, args, top_level_configs)
    except PreflightError as error:
        sys.stderr.write(f"lit-constrained {subcommand}: error: {error}\n")
        raise SystemExit(2) from None
