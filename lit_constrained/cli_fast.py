"""What ``lit-constrained`` answers before Lightning is imported (importing torch and Lightning takes
seconds: 3-10 s measured on a shared 2-core machine).

* :func:`short_fit_help`: ``lit-constrained fit --help``, one page: the options a run uses and the
  commands that list the rest (``--help-all``: LightningCLI's complete help; a task's and an
  optimizer's arguments, e.g. ``--model.optimizer.help SQPAdam``).
* :func:`preflight`: the errors that the command line and its config files can be checked for without
  importing what they name: a ``--config`` file that is missing, unreadable or not a YAML mapping; a
  key of a config or a ``--trainer.<name>`` / ``--<key>`` option that is not an argument of Lightning's
  ``Trainer`` or of the subcommand; an argument (``init_args``) that the task's ``__init__`` does not
  take (a task in a file next to the config, e.g. one without ``**kwargs`` given ``num_threads``) or that
  an optimizer of ``lit_constrained.optim`` does not take (``momentum`` for SQPAdam). Signatures are read
  from the source files with :mod:`ast`, nothing is imported; where a class or a signature cannot be
  read so (a class from another package, an ``__init__`` with ``**kwargs`` or inherited), the check is
  left to LightningCLI. One line each, with the fix, and no usage dump.

Errors found only once the classes are imported come from LightningCLI;
:meth:`lit_constrained.cli_parsing.ConstrainedArgumentParser.error` prints them without the usage dump
too, with the same fixes (:func:`lit_constrained.hints.cli_error_hint`). This module imports neither
torch nor Lightning.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_constrained.hints import argument_message, task_kwargs_hint

SHORT_FIT_HELP = """\
usage: lit-constrained fit --config CONFIG [--KEY VALUE ...]

Train a task. A config (YAML) names the task (model: class_path: ...), its data (data: class_path: ...)
and the Trainer's settings; every key of it can be overridden on the command line.

options:
  -c, --config CONFIG    a config, e.g. configs/spring/recommended/sqp_adam.yaml (given twice: the later
                         overrides the earlier)
  --trainer.NAME VALUE   a Lightning Trainer argument: --trainer.max_epochs 100, --trainer.devices 2,
                         --trainer.precision bf16-mixed, --trainer.logger false
  --model.init_args.NAME VALUE
                         an argument of the task: --model.init_args.num_threads 1,
                         --model.init_args.max_grad_norm 1.0
  --model.init_args.optimizer.init_args.NAME VALUE
                         an argument of its optimizer: --model.init_args.optimizer.init_args.lr 1e-4
  --data.init_args.NAME VALUE
                         an argument of the data: --data.init_args.batch_mode minibatch
  --seed_everything SEED the seed of the run (weights, data order)
  --ckpt_path PATH       resume from a checkpoint; last: the newest last*.ckpt of the run's checkpoint
                         directory (an error without one), last-or-fresh: that or a fresh start
  --print_config         print the resolved config and exit

more help (these import Lightning: seconds):
  lit-constrained fit --help-all
      every option (all of the Trainer's arguments)
  lit-constrained fit --model.help lit_constrained.tasks.spring.Spring
      the arguments of a task (its own and ConstrainedModule's: optimizer, max_grad_norm, num_threads, ...)
  lit-constrained fit --config CONFIG --model.optimizer.help SQPAdam
      the arguments of an optimizer: SQPAdam, SQPHeavyBall, AdamCon, MoMo, MoMoAdam, ConstantStepAdam
      (lit_constrained.optim), SQPMoMoAdam (lit_constrained.optim.experimental) or torch.optim.Adam, ...
"""

HELP_ALL = "--help-all"

#: arguments of the Trainer's fit/validate/test/predict that LightningCLI fills itself (not config keys)
_FILLED_BY_THE_CLI = frozenset({"self", "model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule"})


def short_fit_help() -> str:
    return SHORT_FIT_HELP


class PreflightError(ValueError):
    """A command-line or config error found before Lightning is imported (its message is one line)."""


@functools.lru_cache(maxsize=1)
def _trainer_signatures() -> dict[str, frozenset[str]] | None:
    """The argument names of ``Trainer.__init__`` and of its fit/validate/test/predict, read from
    Lightning's source without importing it (None when the source cannot be read)."""
    # Lightning's file layout (lightning/pytorch/trainer/trainer.py, class Trainer), not an API: importing
    # it would take seconds. If it moves, the Trainer keys go unchecked here (LightningCLI still reports
    # them, slowly): tests/test_cli_first_day.py::test_the_early_checks_read_the_installed_trainer fails
    try:
        spec = importlib.util.find_spec("lightning")
        if spec is None or spec.origin is None:
            return None
        source = Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py"
        tree = ast.parse(source.read_text())
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            found = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in ("__init__", "fit", "validate", "test", "predict"):
                    arguments = item.args
                    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
                    found[item.name] = frozenset(names - {"self"})
            return found if "__init__" in found else None
    return None


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


def preflight(subcommand: str, args: Sequence[str]) -> None:
    """Raise :class:`PreflightError` for what can be checked of ``lit-constrained <subcommand> <args>``
    without importing Lightning (see the module docstring); return quietly otherwise."""
    configs = [(path, read_config(path)) for path in config_paths(args)]
    signatures = _trainer_signatures()
    if signatures is None or subcommand not in signatures:
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
    model_options = [n.split(".")[2] for n in names if n.startswith("model.init_args.") and len(n.split(".")) == 3]
    optimizer_options = [n.split(".")[4] for n in names
                         if n.startswith("model.init_args.optimizer.init_args.") and len(n.split(".")) == 5]
    model = next((content.get("model") for _, content in reversed(configs) if content.get("model") is not None), None)
    where = f"--config {configs[-1][0]}" if configs else "the command line"
    _check_class_arguments(where, model, model_options, optimizer_options)


@dataclass(frozen=True)
class _Signature:
    """A class's ``__init__`` as its source reads: the named arguments (``self`` and an optimizer's
    ``params`` left out), whether it takes ``**kwargs``, its base classes' names and whether its body
    sets ``requires`` to a set naming ``"constraints"`` (a hard-constrained optimizer)."""

    names: tuple[str, ...] | None  # None: no __init__ of its own
    var_keyword: bool
    bases: tuple[str, ...]
    requires_constraints: bool


def _classes_in(path: Path) -> dict[str, _Signature]:
    """The classes a source file defines at its top level (parsed once per file and modification)."""
    try:
        return _parsed_classes(path, path.stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=256)
def _parsed_classes(path: Path, mtime_ns: int) -> dict[str, _Signature]:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        names, var_keyword, requires = None, False, False
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                arguments = item.args
                listed = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]][1:]
                names = tuple(listed[1:] if listed[:1] == ["params"] else listed)
                var_keyword = arguments.kwarg is not None
            targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "requires" for t in targets) and item.value is not None:
                requires = "constraints" in ast.unparse(item.value)
        bases = tuple(ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases)
        found[node.name] = _Signature(names, var_keyword, bases, requires)
    return found


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _source_files(module: str) -> list[Path]:
    """The files that may define ``module``'s classes, found without importing anything: a top-level
    module (a file next to the config) or a module of this package (for a package, its files)."""
    if "." not in module:
        if module == "lit_constrained":
            return []
        beside = Path.cwd() / f"{module}.py"  # the working directory goes on sys.path before the import
        if beside.is_file():
            return [beside]
        try:
            spec = importlib.util.find_spec(module)  # a top-level name: found on sys.path, not executed
        except (ImportError, ValueError):
            return []
        origin = Path(spec.origin) if spec is not None and spec.origin not in (None, "built-in", "frozen") else None
        return [origin] if origin is not None and origin.suffix == ".py" else []
    head, _, rest = module.partition(".")
    if head != "lit_constrained":
        return []
    path = _package_dir().joinpath(*rest.split("."))
    if path.is_dir():
        return sorted(path.glob("*.py"))
    return [path.with_suffix(".py")] if path.with_suffix(".py").is_file() else []


def _resolve(class_path: str, default_module: str) -> tuple[str, _Signature, dict[str, _Signature]] | None:
    """(class name, its signature, the classes of its source files) of ``class_path`` (a short name is
    looked up in ``default_module``), or None when it cannot be read without importing."""
    module, _, name = class_path.rpartition(".")
    classes: dict[str, _Signature] = {}
    for path in _source_files(module or default_module):
        classes.update(_classes_in(path))
    if name not in classes:
        return None
    return name, classes[name], classes


def _requires_constraints(name: str, classes: dict[str, _Signature], seen: frozenset[str] = frozenset()) -> bool:
    signature = classes.get(name)
    if signature is None or name in seen:
        return False
    return signature.requires_constraints or any(
        _requires_constraints(base, classes, seen | {name}) for base in signature.bases)


def _constrained_module_arguments() -> tuple[str, ...]:
    signature = _classes_in(_package_dir() / "module.py").get("ConstrainedModule")
    return signature.names or () if signature is not None else ()


def _init_args(spec: object) -> tuple[str | None, dict]:
    """(class_path, init_args) of a config's class spec (a dict or a bare class path)."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, dict) and isinstance(spec.get("class_path"), str):
        init = spec.get("init_args")
        return spec["class_path"], init if isinstance(init, dict) else {}
    return None, {}


def class_path_of_spec(spec: object) -> str | None:
    """The ``class_path`` of a config's class spec (a dict or a bare class path), or None."""
    return _init_args(spec)[0]


def own_arguments(class_path: str) -> tuple[str, ...]:
    """The arguments the ``__init__`` of ``class_path``'s own class names, read from its source (a task
    in a file next to the config, or of this package); () when it has none or cannot be read so."""
    resolved = _resolve(class_path, "")
    return resolved[1].names or () if resolved is not None else ()


def _unknown_arguments(class_path: str | None, given: Iterator[str] | Sequence[str], default_module: str
                       ) -> tuple[str, _Signature, dict[str, _Signature], list[str]] | None:
    if class_path is None:
        return None
    resolved = _resolve(class_path, default_module)
    if resolved is None:
        return None
    name, signature, classes = resolved
    if signature.names is None or signature.var_keyword:
        return None
    unknown = [key for key in given if key not in signature.names]
    return (name, signature, classes, unknown) if unknown else None


def _check_class_arguments(where: str, model: object, extra_model: list[str], extra_optimizer: list[str]) -> None:
    """The task's and its optimizer's ``init_args`` against their ``__init__`` (read from source)."""
    class_path, init_args = _init_args(model)
    found = _unknown_arguments(class_path, [*init_args, *extra_model], "")
    if found is not None:
        name, _, _, unknown = found
        module_arguments = _constrained_module_arguments()
        hint = (task_kwargs_hint(type(name, (), {}), unknown[0]) if unknown[0] in module_arguments else
                argument_message(name, unknown[0], list(found[1].names or ()), []))
        raise PreflightError(f"{where}: {hint}")
    optimizer_path, optimizer_args = _init_args(init_args.get("optimizer"))
    found = _unknown_arguments(optimizer_path, [*optimizer_args, *extra_optimizer], "lit_constrained.optim")
    if found is not None:
        name, signature, classes, unknown = found
        exported = _exported("lit_constrained.optim")
        takers = [c for c, s in classes.items() if c != name and c in exported and unknown[0] in (s.names or ())]
        takers.sort(key=lambda c: not _requires_constraints(c, classes))  # the hard-constrained methods first
        raise PreflightError(f"{where}: " + argument_message(
            name, unknown[0], list(signature.names or ()), [f"lit_constrained.optim.{c}" for c in takers]))


def _exported(module: str) -> frozenset[str]:
    """The names in ``__all__`` of a package module of this package (read from its ``__init__.py``)."""
    init = _package_dir().joinpath(*module.split(".")[1:], "__init__.py")
    try:
        tree = ast.parse(init.read_text())
    except (OSError, SyntaxError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:
                return frozenset()
    return frozenset()


def run_preflight(subcommand: str, args: Sequence[str]) -> None:
    """:func:`preflight`, its error printed in one line (``lit-constrained <subcommand>: error: ...``) and
    exit status 2, as argparse does."""
    try:
        preflight(subcommand, args)
    except PreflightError as error:
        sys.stderr.write(f"lit-constrained {subcommand}: error: {error}\n")
        raise SystemExit(2) from None
