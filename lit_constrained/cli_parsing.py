r"""The argument parser of ``lit-constrained``: plain-words help, no abbreviations, no silent loss of
optimizer arguments, and the run's resolved config saved without touching the user's files.

* Help text comes from the classes' docstrings, written for Sphinx; :func:`plain_words` turns
  ``:class:`~pkg.Name``` into ``Name``, ````code```` into ``code`` and ``:math:`\alpha``` into ``alpha``.
* ``allow_abbrev=False``: ``--trainer.max_epoch 5`` is an error, not a silent prefix match.
* Switching a class on the command line (``--model.optimizer torch.optim.Adam`` over a config that
  gave ``SQPAdam`` with ``rho``, ``h``) keeps the init args the new class takes; jsonargparse would drop
  the others silently, :func:`check_no_dropped_init_args` makes that an error naming them.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_GREEK = re.compile(r"\\(alpha|beta|gamma|delta|epsilon|zeta|eta|theta|lambda|mu|nu|rho|sigma|tau|phi|omega)\b")
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
    """jsonargparse's help formatter with docstring markup turned into plain words."""

    def format_help(self) -> str:
        return plain_words(super().format_help())


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


DESCRIPTION = "lit-constrained: train networks with hard equality constraints (PyTorch Lightning)."


class ConstrainedArgumentParser(LightningArgumentParser):
    """LightningArgumentParser with plain help, abbreviations off and dropped init args recorded.

    The nested parsers jsonargparse makes for class arguments (``--model.optimizer.help``) are of the
    same class, so they get the same behaviour.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("description", DESCRIPTION)
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("logger", _PARSE_LOGGER)
        super().__init__(*args, **kwargs)


def explicit_class_values(argv: list[str]) -> bool:
    """Whether a class argument is given whole on the command line (``--x '{class_path: ..., init_args: ...}'``)."""
    return any(arg.lstrip().startswith("{") and "init_args" in arg for arg in argv)


def check_no_dropped_init_args(argv: list[str]) -> str | None:
    """The error message if parsing dropped init args on a class switch (None if nothing was dropped)."""
    messages, DROPPED_INIT_ARGS.messages = DROPPED_INIT_ARGS.messages, []
    if not messages or explicit_class_values(argv):
        return None
    return (
        "Switching a class on the command line would silently drop init args the new class does not take:\n  "
        + "\n  ".join(messages)
        + "\nGive the new class with all its arguments instead, e.g. "
        "--model.optimizer '{class_path: torch.optim.Adam, init_args: {lr: 0.001}}', or edit the config."
    )


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
