r"""The argument parser of ``lit-constrained``: plain-words help, no abbreviations, no silent loss of
optimizer arguments, and the run's resolved config saved without touching the user's files.

* Help text comes from the classes' docstrings, written for Sphinx; :func:`plain_words` turns
  ``:class:`~pkg.Name``` into ``Name``, ````code```` into ``code`` and ``:math:`\alpha``` into ``alpha``.
* ``allow_abbrev=False``: ``--trainer.max_epoch 5`` is an error, not a silent prefix match.
* Switching a class on the command line (``--model.optimizer torch.optim.Adam`` over a config that
  gave ``SQPAdam`` with ``rho``, ``h``) keeps the init args the new class takes; jsonargparse would drop
  the others silently, :func:`check_no_dropped_init_args` makes that an error naming them.
* An optimizer argument given where no optimizer is named (``--model.init_args.optimizer.init_args.lr
  1e-2`` over a config that leaves the default): jsonargparse would give it to the base class
  ``torch.optim.Optimizer`` (which takes no ``lr``); :func:`with_the_default_optimizer` names the default
  optimizer's class first, so the argument reaches the optimizer the run uses.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

from lit_constrained.cli import preflight
from lit_constrained.class_spec import import_class
from lit_constrained.cli.fit.hints import cli_error_hint

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_GREEK = re.compile(r"\\(alpha|beta|gamma|delta|epsilon|zeta|eta|theta|lambda|mu|nu|rho|sigma|tau|phi|omega)(?![a-zA-Z])")
_TEXT = re.compile(r"\\(?:text|mathrm|operatorname)\{([^}]*)\}")
_SYMBOLS = {r"\|": "||", r"\le": "<=", r"\ge": ">=", r"\cdot": "*", r"\_": "_", r"\,": " ", r"\sqrt": "sqrt",
            r"\top": "T", r"\hat": "", r"\min": "min", r"\max": "max", r"\infty": "inf", r"\to": "->"}


def plain_words(text: str) -> str:
    """Sphinx/reST markup of a docstring as plain text (for terminal help)."""

    def role(match: re.Match) -> str:
        tilde, target = match.groups()
        return target.rsplit(".", 1)[-1] if tilde else target

    text = _ROLE.sub(role, text)
    text = _LITERAL.sub(r"\1", text)
    text = _TEXT.sub(r"\1", text)
    text = _GREEK.sub(r"\1", text)
    for symbol, plain in _SYMBOLS.items():
        text = text.replace(symbol, plain)
    return text


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, wrapping at spaces only (argparse's wrapping cuts a word longer
    than the column: "lit_const rained.callbacks..."). The markup is turned into plain words by the
    parser (:meth:`ConstrainedArgumentParser.format_help`)."""

    # argparse's only wrapping hook is the formatter's private _split_lines (its formatter classes are
    # public by name only): if argparse renames it, help wraps mid-word again, and
    # tests/test_cli_parsing.py::test_the_private_hooks_the_parser_relies_on_exist fails naming it
    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


class _DroppedInitArgs(logging.Handler):
    """Collects jsonargparse's (debug-level) reports of init args discarded on a class_path change."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "discarding init_args" in message:
            self.messages.append(message)


DROPPED_INIT_ARGS = _DroppedInitArgs()
_PARSE_LOGGER = logging.getLogger("lit_constrained.cli.parsing")
_PARSE_LOGGER.setLevel(logging.DEBUG)
_PARSE_LOGGER.propagate = False
_PARSE_LOGGER.addHandler(DROPPED_INIT_ARGS)


DESCRIPTION = "lit-constrained: train networks with hard constraints, inequalities and bounds included (PyTorch Lightning)."


class ConstrainedArgumentParser(LightningArgumentParser):
    """LightningArgumentParser with plain help, abbreviations off and dropped init args an error.

    The nested parsers jsonargparse makes for class arguments (``--model.optimizer.help``) are of the
    same class, so they get the same behaviour.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prog", "lit-constrained")
        kwargs.setdefault("description", DESCRIPTION)
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("logger", _PARSE_LOGGER)
        super().__init__(*args, **kwargs)
        self._argv: list[str] | None = None  # set for the parser the command line is given to

    def format_help(self) -> str:
        """The help with docstring markup as plain words (:func:`plain_words`)."""
        return plain_words(super().format_help())

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        self._argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """jsonargparse's error without its usage dump (tens of lines before the one that matters): the
        message, the fix where one is known (:func:`lit_constrained.cli.fit.hints.cli_error_hint`: an argument a
        task or an optimizer does not take) and where the options are listed; exit status 2."""
        if not self.exit_on_error:
            super().error(message, ex)  # raises (jsonargparse's nested parsers catch it)
        self.logger.error(message)
        # jsonargparse's own error() names the subcommand's parser so (an attribute it sets on the error);
        # without it the message names "lit-constrained" instead of "lit-constrained fit"
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        hint = cli_error_hint(message)
        sys.stderr.write(f"{prog}: error: {message}\n" + (f"fix: {hint}\n" if hint else "")
                         + f"(the options: {prog} --help)\n")
        self.exit(2)

    # jsonargparse's private _parse_common is the one point of every parse (parse_args, parse_object,
    # subcommands) after the arguments are read (class switches done) and before --print_config is
    # answered; no public hook lies between the two. If it is renamed, dropped init args pass silently:
    # tests/test_cli_parsing.py::test_the_private_hooks_the_parser_relies_on_exist fails naming it.
    def _parse_common(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        error = check_no_dropped_init_args(self._argv) if self._argv is not None else None
        if error:
            self.error(error)
        return super()._parse_common(cfg, *args, **kwargs)


def explicit_class_values(argv: list[str]) -> bool:
    """Whether a class argument is given whole on the command line (``--x '{class_path: ..., init_args: ...}'``)."""
    return any(arg.lstrip().startswith("{") and "init_args" in arg for arg in argv)


_DISCARD = re.compile(r"class_path change from '([^']+)' to '([^']+)', discarding init_args: (\{.*\})\.?$", re.S)


def _set_init_args(message: str) -> tuple[str, str, dict[str, Any]] | None:
    """(old class, new class, dropped args that differ from the old class's defaults) of one report."""
    match = _DISCARD.search(message)
    if match is None:
        return None
    old, new, text = match.groups()
    try:
        dropped = ast.literal_eval(text)
        defaults = inspect.signature(import_class(old)).parameters
    except (ValueError, SyntaxError, ImportError, TypeError):
        return old, new, {"(unparsed)": text}
    changed = {
        k: v for k, v in dropped.items()
        if k not in defaults or not _same(v, defaults[k].default)
    }
    return (old, new, changed) if changed else None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def check_no_dropped_init_args(argv: list[str]) -> str | None:
    """The error message if parsing dropped init args on a class switch that the user had set (an arg
    dropped at its old class's default value loses nothing); None otherwise."""
    messages, DROPPED_INIT_ARGS.messages = DROPPED_INIT_ARGS.messages, []
    if not messages or explicit_class_values(argv):
        return None
    lost: dict[tuple[str, str], dict[str, Any]] = {}
    for message in messages:
        found = _set_init_args(message)
        if found is not None:
            lost.setdefault(found[:2], {}).update(found[2])
    if not lost:
        return None
    lines = [f"{new.rsplit('.', 1)[-1]} does not take {dropped} (set for {old})" for (old, new), dropped in lost.items()]
    return (
        "Switching a class on the command line would silently drop init args you set:\n  "
        + "\n  ".join(lines)
        + "\nGive the new class with all its arguments instead, e.g. "
        "--model.optimizer '{class_path: torch.optim.Adam, init_args: {lr: 0.001}}', or edit the config."
    )


#: an option of the model's optimizer: --model[.init_args].optimizer[.<rest>] (group 1: the rest)
_OPTIMIZER_OPTION = re.compile(r"^model\.(?:init_args\.)?optimizer(?:\.(.+))?$")

_LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _names_optimizer(model: Any) -> bool:
    """Whether a config's ``model`` section (a dict, a class path) gives an ``optimizer``."""
    if not isinstance(model, dict):
        return False
    init_args = model.get("init_args")
    return "optimizer" in model or (isinstance(init_args, dict) and "optimizer" in init_args)


def with_the_default_optimizer(args: Sequence[str], default_class_path: str) -> list[str]:
    """``args`` (a LightningCLI command line, ``[top-level options] [subcommand] <options>``) with
    ``--model.init_args.optimizer=<default_class_path>`` inserted before the first option that sets an
    argument of the model's optimizer (``--model.init_args.optimizer.init_args.lr 1e-2``, or its short
    forms ``--model.optimizer.lr``, ...) when nothing names the optimizer's class: no config (read as
    YAML) gives the model an ``optimizer``, no option gives ``--model[.init_args].optimizer`` or a whole
    ``--model``/``--model.init_args`` mentioning it, and the task's own ``__init__`` (where its source can
    be read, :mod:`lit_constrained.cli.preflight`) has no ``optimizer`` default of its own.

    Why: :class:`~lit_constrained.module.ConstrainedModule`'s default optimizer is a function (so that a
    config naming another class starts from that class's own defaults), and jsonargparse, given an
    argument for it without a class, takes the annotation's base class ``torch.optim.Optimizer``, which
    takes no ``lr``. Otherwise ``args`` is returned as it is (a config that cannot be read: its error is
    LightningCLI's to report)."""
    args = [str(a) for a in args]
    end = args.index("--") if "--" in args else len(args)
    after_config, split = False, None
    for index, arg in enumerate(args[:end]):
        if arg in _LIGHTNING_SUBCOMMANDS and not after_config:
            split = index
            break
        after_config = arg in ("-c", "--config")
    top, own, subcommand = (args[:split], args[split + 1:end], args[split]) if split is not None else ([], args[:end], None)
    first = None
    for index, arg in enumerate(own):
        if not arg.startswith("--"):
            continue
        name, equals, value = arg[2:].partition("=")
        if not equals:
            value = own[index + 1] if index + 1 < len(own) else ""
        if name in ("model", "model.init_args") and "optimizer" in value:
            return args
        match = _OPTIMIZER_OPTION.match(name)
        if match is None or match.group(1) == "help":
            continue
        if match.group(1) in (None, "class_path"):
            return args  # the class is named on the command line
        if first is None:
            first = index
    if first is None:
        return args
    try:
        sections = [content.get(subcommand) if subcommand else content
                    for content in map(preflight.read_config, preflight.config_paths(top))]
        sections += [preflight.read_config(path) for path in preflight.config_paths(own)]
    except preflight.PreflightError:
        return args
    models = [section.get("model") for section in sections if isinstance(section, dict) and section.get("model")]
    if any(_names_optimizer(model) for model in models):
        return args
    model_class = preflight.class_path_of_spec(models[-1]) if models else None
    if model_class is not None and "optimizer" in preflight.own_arguments(model_class):
        return args  # the task's __init__ has an optimizer default of its own
    offset = (split + 1) if split is not None else 0
    return [*args[:offset + first], f"--model.init_args.optimizer={default_class_path}", *args[offset + first:]]


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run's log directory, never over a file.

    With a logger, each run has its own version directory (stock LightningCLI behaviour). Without a
    logger (``--trainer.logger false``) there is no run directory, and the working directory may hold
    the user's own ``config.yaml``: nothing is written then (``--print_config`` shows the config).
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.logger is None:
            return
        super().setup(trainer, pl_module, stage)
