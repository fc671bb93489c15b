r"""The argument parser of ``lit-constrained``, on public hooks of argparse, jsonargparse and LightningCLI only.

* Plain-words help (:func:`plain_words`: ``:class:`~pkg.Name``` -> ``Name``, ``:math:`\alpha``` ->
  ``alpha``), wide enough that no class path is cut (:class:`PlainHelpFormatter`); no abbreviations.
* Errors in one line with the fix (:func:`~lit_constrained.cli.fit.hints.phrase_error`).
* ``--model.init_args.optimizer.init_args.max_normal_step null``: jsonargparse hands a value two class
  levels down on as the text ``f"--key={value}"``, so the null it read arrived as ``"None"``, a string to
  YAML; the parser's loader (jsonargparse's public ``set_loader``) reads the value ``None`` as null, as
  the help shows a null default. (A config's ``None`` is still the string: the loader reads a whole file.)
* Before parsing: a class switch that would drop init args (:func:`check_no_dropped_init_args`); after,
  a class a config names starts from its own defaults, not the default class's (:func:`with_own_defaults`),
  and ``--print_config`` shows that (:func:`print_config_request`).
"""

from __future__ import annotations

import inspect
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from jsonargparse import DefaultHelpFormatter, get_loader, set_loader
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback

from lit_constrained.cli.fit.hints import config_paths, phrase_error
from lit_constrained.cli.help import DESCRIPTION
from lit_constrained.module_parts.optimizer_specs import class_named, default_optimizer_class

_ROLE, _LITERAL = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]+)`"), re.compile(r"``([^`]+)``")
_GREEK = re.compile(r"\\(alpha|beta|gamma|delta|epsilon|zeta|eta|theta|lambda|mu|nu|rho|sigma|tau|phi|omega)(?![a-zA-Z])")
_TEXT = re.compile(r"\\(?:text|mathrm|operatorname)\{([^}]*)\}")
_SYMBOLS = {r"\|": "||", r"\le": "<=", r"\ge": ">=", r"\cdot": "*", r"\_": "_", r"\,": " ", r"\sqrt": "sqrt",
            r"\top": "T", r"\hat": "", r"\min": "min", r"\max": "max", r"\infty": "inf", r"\to": "->"}


def plain_words(text: str) -> str:
    """Sphinx/reST markup of a docstring as plain text (for terminal help)."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = _GREEK.sub(r"\1", _TEXT.sub(r"\1", _LITERAL.sub(r"\1", text)))
    for symbol, plain in _SYMBOLS.items():
        text = text.replace(symbol, plain)
    return text


#: the help column's least width: the longest word of ``--help-all`` (a class path) fits it, so argparse's
#: wrapping never cuts one ("lit_const rained.callbacks...")
HELP_COLUMN = 100


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, at least :data:`HELP_COLUMN` wide (argparse's public ``width``)."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        position = kwargs.get("max_help_position", 24)
        kwargs.setdefault("width", max(shutil.get_terminal_size().columns - 2, position + HELP_COLUMN))
        super().__init__(prog, **kwargs)


_YAML, PARSER_MODE = get_loader("yaml"), "lit_constrained_yaml"
set_loader(PARSER_MODE, lambda text: None if text.strip() == "None" else _YAML(text),  # (the module docstring)
           exceptions=(__import__("yaml").YAMLError,))


class ConstrainedArgumentParser(LightningArgumentParser):
    """LightningArgumentParser with plain help, abbreviations off, null at any depth and one-line errors
    (also in the nested parsers jsonargparse makes for class arguments: they are of this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prog", "lit-constrained")
        kwargs.setdefault("description", DESCRIPTION)
        kwargs.setdefault("formatter_class", PlainHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("parser_mode", PARSER_MODE)
        super().__init__(*args, **kwargs)
        self.argv: list[str] = []  # the command line given to parse_args (for the error's words)

    def format_help(self) -> str:
        """The help with docstring markup as plain words (:func:`plain_words`)."""
        return plain_words(super().format_help())

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        self.argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """jsonargparse's error as one line with its fix and where the options are listed; exit status 2."""
        if not self.exit_on_error:
            super().error(message, ex)  # raises (jsonargparse's nested parsers catch it)
        # jsonargparse's own error() names the subcommand's parser so (an attribute it sets on the error)
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        subcommand = prog.split()[-1] if " " in prog else next((a for a in self.argv if a in _LIGHTNING_SUBCOMMANDS), None)
        prog = f"{prog.split()[0]} {subcommand}" if subcommand else prog
        line = phrase_error(message, self.argv, subcommand or "fit")
        sys.stderr.write(f"{prog}: error: {line} (the options: {prog} --help)\n")
        self.exit(2)


_LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: an option of the model's optimizer: --model[.init_args].optimizer[.<rest>] (group 1: the rest)
_OPTIMIZER_OPTION = re.compile(r"^model\.(?:init_args\.)?optimizer(?:\.(.+))?$")


def _split(args: Sequence[str]) -> tuple[list[str], list[str], str | None]:
    """(the options before the subcommand, the subcommand's own up to ``--``, the subcommand)."""
    end, after_config = args.index("--") if "--" in args else len(args), False
    for index, arg in enumerate(args[:end]):
        if arg in _LIGHTNING_SUBCOMMANDS and not after_config:
            return list(args[:index]), list(args[index + 1:end]), arg
        after_config = arg in ("-c", "--config")
    return [], list(args[:end]), None


def _options(own: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index, name, value) of the ``--name value`` / ``--name=value`` options of ``own``."""
    return [(i, a[2:].partition("=")[0], a.partition("=")[2] if "=" in a else (own[i + 1] if i + 1 < len(own) else ""))
            for i, a in enumerate(own) if a.startswith("--")]


def _models(args: Sequence[str]) -> list[dict]:
    """The ``model`` sections of the configs ``args`` gives, in order ([] for one unreadable: the parser's)."""
    import yaml

    top, own, subcommand = _split(args)
    try:
        sections = [yaml.safe_load(Path(p).read_text()) for p in config_paths(top)]
        sections = [s.get(subcommand) if isinstance(s, dict) and subcommand else s for s in sections]
        sections += [yaml.safe_load(Path(p).read_text()) for p in config_paths(own)]
    except (OSError, yaml.YAMLError):
        return []
    return [s["model"] for s in sections if isinstance(s, dict) and isinstance(s.get("model"), dict)]


def _optimizer_of(model: dict) -> Any:
    return model.get("optimizer", (model.get("init_args") or {}).get("optimizer"))


def _same(a: Any, b: Any) -> bool:
    return list(a) == list(b) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else a == b


def check_no_dropped_init_args(args: Sequence[str]) -> str | None:
    """The error for a bare optimizer class on the command line (``--model.optimizer torch.optim.Adam``) that
    would drop init args the config set at other than their defaults (jsonargparse drops them silently)."""
    switched = [(n, v) for _, n, v in _options(_split(args)[1]) if (m := _OPTIMIZER_OPTION.match(n))
                and m.group(1) in (None, "class_path") and not v.lstrip().startswith("{")]
    old = next((o for o in map(_optimizer_of, _models(args)[::-1]) if isinstance(o, dict) and o.get("init_args")), None)
    if not switched or old is None:
        return None
    new, old_class = class_named(switched[-1][1]), class_named(str(old.get("class_path")))
    if new is None or old_class is None or new is old_class:
        return None
    taken, defaults = inspect.signature(new).parameters, inspect.signature(old_class).parameters
    dropped = {k: v for k, v in old["init_args"].items()
               if k not in taken and (k not in defaults or not _same(defaults[k].default, v))}
    if not dropped or any(p.kind is p.VAR_KEYWORD for p in taken.values()):
        return None
    return (f"--{switched[-1][0]} {switched[-1][1]} would drop init args the config sets for {old_class.__name__}: "
            f"{new.__name__} does not take {dropped}; give the new class with all its arguments instead, e.g. "
            f"--model.optimizer '{{class_path: {new.__module__}.{new.__name__}, init_args: {{lr: 0.001}}}}', or edit the config")


def with_own_defaults(model: Any, given: Any) -> None:
    """Every init arg of the model's optimizer that neither a config nor an option gave (``given``: the
    model section parsed without defaults) is the named class's own default, in place. Why: jsonargparse
    expands the default class's init args (SQP-Adam's lr 1e-3, eps 1e-7) and keeps those of the same name
    when a config names another class: MoMo would get lr 1e-3, not its own 1.0 (and ``--print_config``
    shows the page after this: :func:`print_config_request`)."""
    spec = (model.get("init_args") or {}).get("optimizer") if hasattr(model, "get") else None
    task = class_named(str(model.get("class_path"))) if spec is not None and model.get("class_path") else None
    named = class_named(str(spec.get("class_path"))) if hasattr(spec, "get") and spec.get("init_args") else None
    if task is None or named is None or named is default_optimizer_class(task):
        return
    given_spec = ((given.get("init_args") or {}).get("optimizer") if hasattr(given, "get") else None) or {}
    kept = set((given_spec.get("init_args") or {}).keys()) if hasattr(given_spec, "get") else set()
    for name, parameter in inspect.signature(named).parameters.items():
        if name in spec["init_args"] and name not in kept and parameter.default is not parameter.empty:
            spec["init_args"][name] = parameter.default


_PRINT_FLAGS = {"": None, "skip_default": "skip_default", "skip_unset": "skip_unset", "skip_null": "skip_unset"}


def print_config_request(args: Sequence[str]) -> tuple[list[str], tuple[str, bool] | None]:
    """``args`` without ``--print_config[=flags]``, and (its flags, whether it follows the subcommand), when a
    config or an option names the optimizer: :func:`with_own_defaults` resets init args after the parse and
    jsonargparse prints inside it, so the command prints that page itself (:func:`printed_config`); ``args``
    and None otherwise (jsonargparse's page is right, and it also prints a config that does not validate)."""
    top, own, subcommand = _split(args)
    end = args.index("--") if "--" in args else len(args)
    asked = [(i, a) for i, a in enumerate(args[:end]) if a.partition("=")[0] == "--print_config"]
    named = any(_optimizer_of(m) for m in _models(args)) or any(_OPTIMIZER_OPTION.match(n) for _, n, _ in _options(own))
    flags, of_section = (asked[-1][1].partition("=")[2], subcommand is not None and asked[-1][0] > len(top)) if asked else ("", False)
    if not asked or not named or not set(flags.split(",")) <= set(_PRINT_FLAGS) or (flags and not of_section):
        return list(args), None  # (jsonargparse's page; its flags on the main parser: its own error)
    return [a for i, a in enumerate(args) if i not in {i for i, _ in asked}], (flags, of_section)


def printed_config(parser: Any, config: Any, flags: str) -> str:
    """The ``--print_config[=flags]`` page of the parsed ``config`` by ``parser`` (the subcommand's, for its
    section), as jsonargparse prints it: its public ``dump`` with the flags' options."""
    return parser.dump(config, **{"skip_unset": False, **{_PRINT_FLAGS[f]: True for f in flags.split(",") if f}})


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run's own log directory; without a logger there
    is none (the working directory may hold the user's ``config.yaml``): nothing is written then."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.logger is None:
            return
        super().setup(trainer, pl_module, stage)
