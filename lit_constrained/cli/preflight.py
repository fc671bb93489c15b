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

import ast
import difflib
import functools
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_constrained.cli.trainer_arguments import trainer_arguments
from lit_constrained.hints import argument_message, task_kwargs_hint

HELP_ALL = "--help-all"

#: arguments of the Trainer's fit/validate/test/predict that LightningCLI fills itself (not config keys)
#: an option of the model's optimizer: --model[.init_args].optimizer[.<rest>] (group 1: the rest)
_OPTIMIZER_OPTION = re.compile(r"^model\.(?:init_args\.)?optimizer(?:\.(.+))?$")

_FILLED_BY_THE_CLI = frozenset({"self", "model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule"})


class PreflightError(ValueError):
    """A command-line or config error found before Lightning is imported (its message is one line)."""


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


@dataclass(frozen=True)
class _Argument:
    """One argument of a class's ``__init__`` as its source reads: its annotation and default
    (unparsed source, None where absent) and the type aliases and constants of the files it was read
    from (to expand ``rho: Rho = DEFAULT_RHO``)."""

    name: str
    annotation: str | None
    default: str | None
    context: "_Context"


@dataclass(frozen=True)
class _Signature:
    """A class's ``__init__`` as its source reads: the named arguments (``self`` and an optimizer's
    ``params`` left out), whether it takes ``**kwargs`` and hands them to ``super().__init__``, its base
    classes' names and whether its body sets ``requires`` to a set naming ``"constraints"`` (a
    hard-constrained optimizer)."""

    names: tuple[str, ...] | None  # None: no __init__ of its own
    var_keyword: bool
    bases: tuple[str, ...]
    requires_constraints: bool
    forwards_kwargs: bool = False
    annotations: tuple[tuple[str, str | None, str | None], ...] = ()  # (name, annotation, default)


@dataclass(frozen=True)
class _SourceFile:
    """What a source file defines at its top level: its classes, type aliases (``Rho = Union[...]``),
    literal constants (``DEFAULT_LR = 1e-3``) and every name it defines or imports; ``open_namespace``
    when those names cannot be listed (``from x import *``, a module ``__getattr__``)."""

    classes: dict[str, _Signature]
    aliases: dict[str, str]
    constants: dict[str, object]
    names: frozenset[str]
    open_namespace: bool


@dataclass(frozen=True)
class _Context:
    """The classes, aliases and constants of a set of source files (a module's, a package's)."""

    classes: dict[str, _Signature]
    aliases: dict[str, str]
    constants: dict[str, object]


_EMPTY_FILE = _SourceFile({}, {}, {}, frozenset(), True)


def _read_source(path: Path) -> _SourceFile:
    """The top level of a source file (parsed once per file and modification)."""
    try:
        return _parsed_file(path, path.stat().st_mtime_ns)
    except OSError:
        return _EMPTY_FILE


def _classes_in(path: Path) -> dict[str, _Signature]:
    """The classes a source file defines at its top level."""
    return _read_source(path).classes


def _is_super_init_with(node: ast.AST, kwarg: str) -> bool:
    """Whether ``node`` is a call ``super().__init__(..., **<kwarg>)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
            and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwarg for k in node.keywords))


def _signature_of(node: ast.ClassDef) -> _Signature:
    names, var_keyword, requires, forwards, annotations = None, False, False, False, ()
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            arguments = item.args
            positional = [*arguments.posonlyargs, *arguments.args]
            defaults = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
            listed = list(zip([*positional, *arguments.kwonlyargs], [*defaults, *arguments.kw_defaults]))[1:]
            if [a.arg for a, _ in listed[:1]] == ["params"]:
                listed = listed[1:]
            names = tuple(a.arg for a, _ in listed)
            annotations = tuple((a.arg, ast.unparse(a.annotation) if a.annotation is not None else None,
                                 ast.unparse(d) if d is not None else None) for a, d in listed)
            var_keyword = arguments.kwarg is not None
            forwards = var_keyword and any(_is_super_init_with(n, arguments.kwarg.arg) for n in ast.walk(item))
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "requires" for t in targets) and item.value is not None:
            requires = "constraints" in ast.unparse(item.value)
    bases = tuple(ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases)
    return _Signature(names, var_keyword, bases, requires, forwards, annotations)


@functools.lru_cache(maxsize=256)
def _parsed_file(path: Path, mtime_ns: int) -> _SourceFile:
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return _EMPTY_FILE
    classes, aliases, constants, names, open_namespace = {}, {}, {}, set(), False
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
                continue  # the script part (if __name__ == "__main__":) does not run on import
            # names defined in a branch may exist: all are counted (a name is only ever said to be missing)
            for inner in ast.walk(node):
                if isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(inner.name)
                elif isinstance(inner, ast.alias):
                    open_namespace |= inner.name == "*"
                    names.add(inner.asname or inner.name.split(".")[0])
                elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    names.add(inner.id)
            continue
        if isinstance(node, ast.ClassDef):
            classes[node.name] = _signature_of(node)
            names.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            open_namespace |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                open_namespace |= alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names.add(name.id)
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                if isinstance(node.value, (ast.Subscript, ast.BinOp)):
                    aliases[targets[0].id] = ast.unparse(node.value)
                try:
                    constants[targets[0].id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return _SourceFile(classes, aliases, constants, frozenset(names), open_namespace)


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[1]  # lit_constrained/ (this file: lit_constrained/cli/)


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


def _context(paths: Sequence[Path]) -> _Context:
    """The classes, aliases and constants of ``paths`` together (the first definition of a name wins)."""
    classes: dict[str, _Signature] = {}
    aliases: dict[str, str] = {}
    constants: dict[str, object] = {}
    for path in paths:
        source = _read_source(path)
        for mine, theirs in ((classes, source.classes), (aliases, source.aliases), (constants, source.constants)):
            for key, value in theirs.items():
                mine.setdefault(key, value)
    return _Context(classes, aliases, constants)


def _resolve(class_path: str, default_module: str) -> tuple[str, _Signature, _Context] | None:
    """(class name, its signature, the context of its source files) of ``class_path`` (a short name is
    looked up in ``default_module``), or None when it cannot be read without importing."""
    module, _, name = class_path.rpartition(".")
    context = _context(_source_files(module or default_module))
    if name not in context.classes:
        return None
    return name, context.classes[name], context


def _requires_constraints(name: str, classes: dict[str, _Signature], seen: frozenset[str] = frozenset()) -> bool:
    signature = classes.get(name)
    if signature is None or name in seen:
        return False
    return signature.requires_constraints or any(
        _requires_constraints(base, classes, seen | {name}) for base in signature.bases)


def _constrained_module_context() -> _Context:
    """The package's top-level files (module.py's ConstrainedModule, the aliases it uses)."""
    return _context(sorted(_package_dir().glob("*.py")))


def optimizer_names(module: str) -> list[str]:
    """The optimizers a package module of this package exports (the classes of its ``__all__`` taking an
    ``lr``), read from its source files."""
    context = _context(_source_files(module))
    return [name for name in sorted(_exported(module))
            if name in context.classes and "lr" in (context.classes[name].names or ())]


def constrained_module_arguments() -> tuple[str, ...]:
    """The arguments of ConstrainedModule's ``__init__`` (read from module.py)."""
    return _constrained_module_arguments()


def _constrained_module_arguments() -> tuple[str, ...]:
    signature = _classes_in(_package_dir() / "module.py").get("ConstrainedModule")
    return signature.names or () if signature is not None else ()


def _arguments(name: str, context: _Context, seen: frozenset[str] = frozenset()) -> list[_Argument] | None:
    """Every argument ``name(...)`` takes, read from source: its own, and where its ``__init__`` takes
    ``**kwargs`` and hands them to ``super().__init__`` (or it has no ``__init__``), those of its first
    base (a class of the same files, or ConstrainedModule); None where that cannot be told so (an
    ``__init__`` that keeps its ``**kwargs``, a base of another package)."""
    signature = context.classes.get(name)
    if signature is None or name in seen:
        return None
    own = [_Argument(n, annotation, default, context) for n, annotation, default in signature.annotations]
    if signature.names is not None and not signature.var_keyword:
        return own
    if signature.var_keyword and not signature.forwards_kwargs:
        return None
    base = signature.bases[0] if signature.bases else None
    if base == "ConstrainedModule" and name != "ConstrainedModule":
        inherited = _arguments("ConstrainedModule", _constrained_module_context())
    elif base is not None and base in context.classes:
        inherited = _arguments(base, context, seen | {name})
    else:
        return None
    if inherited is None:
        return None
    return [*own, *(a for a in inherited if a.name not in {o.name for o in own})]


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


# --- class paths: a module or class that does not exist, with the nearest that does ---


def _module_names(path: Path) -> frozenset[str] | None:
    """The names a module file (or a package's ``__init__.py``) defines or imports, and for a package
    its submodules; None where they cannot be listed."""
    init = path / "__init__.py" if path.is_dir() else path
    source = _read_source(init)
    if source.open_namespace:
        return None
    submodules = {p.stem for p in path.glob("*.py")} | {p.name for p in path.iterdir() if p.is_dir()} if path.is_dir() else set()
    return source.names | submodules


def _siblings(directory: Path) -> list[str]:
    """The modules a directory holds (``x.py`` files and packages)."""
    if not directory.is_dir():
        return []
    return sorted({p.stem for p in directory.glob("*.py")} |
                  {p.name for p in directory.iterdir() if p.is_dir() and (p / "__init__.py").is_file()})


def _did_you_mean(name: str, choices: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, sorted(set(choices)), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _check_class_path(where: str, class_path: str, role: str) -> None:
    """Raise :class:`PreflightError` if ``class_path`` (the ``role`` of a config: the task, its data, its
    optimizer) names a module or a class that does not exist, where that can be told from the source
    files: a module next to the config or of this package; a short optimizer name among those of
    ``lit_constrained.optim`` and ``torch.optim`` (only when one is near it: a short name may name any
    optimizer class imported). Other packages' modules are left to LightningCLI."""
    module, _, name = class_path.rpartition(".")
    if not module:
        if role == "optimizer":
            known = _exported("lit_constrained.optim") | _torch_optim_names()
            hint = _did_you_mean(name, [n for n in known if n[:1].isupper()])
            if name not in known and hint:
                raise PreflightError(f"{where}: the optimizer {name!r} is not one of lit_constrained.optim or "
                                     f"torch.optim{hint}")
        return
    head, _, rest = module.partition(".")
    if head == "lit_constrained":
        path = _package_dir().joinpath(*rest.split(".")) if rest else _package_dir()
        if not (path.is_dir() or path.with_suffix(".py").is_file()):
            parent = ".".join(module.split(".")[:-1])
            raise PreflightError(f"{where}: class_path {class_path}: there is no module {module}"
                                 f"{_did_you_mean(path.name, _siblings(path.parent), parent + '.')}")
        names = _module_names(path if path.is_dir() else path.with_suffix(".py"))
    elif not rest:
        beside = Path.cwd() / f"{module}.py"
        package = Path.cwd() / module
        if beside.is_file() or (package / "__init__.py").is_file():
            names = _module_names(beside if beside.is_file() else package)
        else:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = True
            if found:
                return
            raise PreflightError(
                f"{where}: class_path {class_path}: there is no module {module!r} (no {module}.py in the working "
                f"directory {Path.cwd()}, and none installed){_did_you_mean(module, _siblings(Path.cwd()))}")
    else:
        return  # a module of another package: LightningCLI imports it and reports
    if names is not None and name not in names:
        classes = [n for n in names if n[:1].isupper()]
        raise PreflightError(f"{where}: {module} has no {name!r}{_did_you_mean(name, classes, module + '.')}")


def _torch_optim_names() -> frozenset[str]:
    """The names torch.optim's ``__init__.py`` defines or imports (read, not imported)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return frozenset()
    if spec is None or spec.origin is None:
        return frozenset()
    return _module_names(Path(spec.origin).parent / "optim") or frozenset()


# --- argument values: a value its annotation cannot take ---


def _annotation_atoms(node: ast.AST, aliases: dict[str, str], depth: int = 0) -> list[object] | None:
    """What an annotation admits, as atoms (``float``, ``int``, ``bool``, ``None``, a ``Literal``'s
    values as ``("literal", value)``), or None where it admits anything else (``str``, a tensor, a tuple,
    a class): then no value is checked."""
    if depth > 8:
        return None
    if isinstance(node, ast.Constant):
        if node.value is None:
            return [None]
        if isinstance(node.value, str):  # a string annotation
            try:
                return _annotation_atoms(ast.parse(node.value, mode="eval").body, aliases, depth + 1)
            except SyntaxError:
                return None
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name in ("float", "int", "bool"):
            return [name]
        if name in aliases:
            try:
                return _annotation_atoms(ast.parse(aliases[name], mode="eval").body, aliases, depth + 1)
            except SyntaxError:
                return None
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation_atoms(node.left, aliases, depth + 1), _annotation_atoms(node.right, aliases, depth + 1)
        return None if left is None or right is None else [*left, *right]
    if isinstance(node, ast.Subscript):
        head = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", None)
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            if not all(isinstance(e, ast.Constant) for e in elements):
                return None
            return [("literal", e.value) for e in elements]
        if head in ("Union", "Optional"):
            parts = [_annotation_atoms(e, aliases, depth + 1) for e in elements]
            if any(p is None for p in parts):
                return None
            return [a for p in parts for a in p] + ([None] if head == "Optional" else [])
    return None


_BOOLEAN_WORDS = frozenset({"true", "false", "yes", "no", "on", "off"})


def _fits(value: object, atoms: list[object]) -> bool:
    """Whether ``value`` (as YAML or the command line gives it: numbers may come as strings, ``1e-3``)
    is one of ``atoms``; a list or a mapping is not judged here."""
    if isinstance(value, (list, tuple, dict)):
        return True
    for atom in atoms:
        if atom is None and value is None:
            return True
        if isinstance(atom, tuple) and value == atom[1] and type(value) is type(atom[1]):
            return True
        if atom == "bool" and (isinstance(value, bool) or (isinstance(value, str) and value.lower() in _BOOLEAN_WORDS)):
            return True
        if atom in ("float", "int") and not isinstance(value, bool):
            if isinstance(value, int) or (atom == "float" and isinstance(value, float)):
                return True
            if isinstance(value, str):
                try:
                    (float if atom == "float" else int)(value)
                    return True
                except ValueError:
                    pass
    return False


def _described(atoms: list[object]) -> str:
    words = {"float": "a number", "int": "an integer", "bool": "true or false"}
    parts = [words[a] if isinstance(a, str) else "null" if a is None else repr(a[1]) for a in atoms]
    return " or ".join(dict.fromkeys(parts))


def _default_shown(argument: _Argument) -> str:
    """``"; e.g. lr: 0.001 (the default)"`` where the default is a literal or a constant of its files."""
    if argument.default is None:
        return ""
    try:
        value = ast.literal_eval(argument.default)
    except (ValueError, SyntaxError):
        if argument.default not in argument.context.constants:
            return ""
        value = argument.context.constants[argument.default]
    if not isinstance(value, (int, float, str, bool)) and value is not None:
        return ""
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
    return f"; e.g. {argument.name}: {shown} (the default)"


def _check_value(where: str, owner: str, argument: _Argument, value: object) -> None:
    if argument.annotation is None:
        return
    try:
        node = ast.parse(argument.annotation, mode="eval").body
    except SyntaxError:
        return
    atoms = _annotation_atoms(node, argument.context.aliases)
    if not atoms or _fits(value, atoms):
        return
    words = [str(a[1]) for a in atoms if isinstance(a, tuple) and isinstance(a[1], str)]
    hint = _did_you_mean(value, words) if isinstance(value, str) else ""
    hint = hint.replace("mean ", "mean '").replace("?)", "'?)") if hint else ""
    raise PreflightError(f"{where}: {owner}'s {argument.name} must be {_described(atoms)}, got {value!r}{hint}"
                         f"{_default_shown(argument)}")


# --- the task's and its optimizer's arguments ---


_UNSET = object()


def _default_optimizer() -> str | None:
    """The class path of ConstrainedModule's default optimizer (``DEFAULT_OPTIMIZER`` of module.py, read)."""
    spec = _read_source(_package_dir() / "module.py").constants.get("DEFAULT_OPTIMIZER")
    return spec.get("class_path") if isinstance(spec, dict) else None


def _check_class_arguments(where: str, model: object, extra_model: Sequence[tuple[str, str, object]],
                           extra_optimizer: Sequence[tuple[str, str, object]], data: object = None,
                           optimizer_named: tuple[str, str] | None = None) -> None:
    """The task's, its data's and its optimizer's class paths and ``init_args`` against their source:
    names they do not take, values their annotations cannot take (``extra_*``: ``(where, name,
    value)`` of command-line options, ``_UNSET`` for a value not given). The optimizer is the one the
    command line names (``optimizer_named``: the option and its class path; the config's arguments are then the parser's to carry
    over), else the config's, else the default one where the task has no optimizer default of its own."""
    class_path, init_args = _init_args(model)
    if class_path is not None:
        _check_class_path(where, class_path, "task")
    data_path, data_args = _init_args(data)
    if data_path is not None:
        _check_class_path(where, data_path, "data")
    optimizer_path, optimizer_args = _init_args(init_args.get("optimizer"))
    if optimizer_path is not None:
        _check_class_path(where, optimizer_path, "optimizer")
    if optimizer_named is not None:
        _check_class_path(optimizer_named[0], optimizer_named[1], "optimizer")
        optimizer_path, optimizer_args = optimizer_named[1], {}
    elif "optimizer" not in init_args and class_path is not None and "optimizer" not in own_arguments(class_path):
        optimizer_path = _default_optimizer()
    given = [(where, k, v) for k, v in init_args.items()] + list(extra_model)
    resolved = _resolve(class_path, "") if class_path is not None else None
    if resolved is not None:
        name, signature, context = resolved
        arguments = _arguments(name, context)
        if arguments is not None:
            accepted = {a.name: a for a in arguments}
            for at, key, value in given:
                if key not in accepted:
                    if key in _constrained_module_arguments() and not signature.var_keyword:
                        raise PreflightError(f"{at}: {task_kwargs_hint(type(name, (), {}), key)}")
                    raise PreflightError(f"{at}: " + argument_message(name, key, list(accepted), []))
                if value is not _UNSET and key != "optimizer" and key != "lr_scheduler":
                    _check_value(at, name, accepted[key], value)
    if data_path is not None:
        found = _resolve(data_path, "")
        arguments = _arguments(found[0], found[2]) if found is not None else None
        if arguments is not None:
            accepted = {a.name: a for a in arguments}
            for key, value in data_args.items():
                if key not in accepted:
                    raise PreflightError(f"{where}: " + argument_message(found[0], key, list(accepted), []))
                _check_value(where, found[0], accepted[key], value)
    given = [(where, k, v) for k, v in optimizer_args.items()] + list(extra_optimizer)
    found = _resolve(optimizer_path, "lit_constrained.optim") if optimizer_path is not None else None
    if found is None:
        return
    name, signature, context = found
    if signature.names is None or signature.var_keyword:
        return
    arguments = {a: _Argument(a, annotation, default, context) for a, annotation, default in signature.annotations}
    for at, key, value in given:
        if key not in arguments:
            exported = _exported("lit_constrained.optim")
            takers = [c for c, s in context.classes.items() if c != name and c in exported and key in (s.names or ())]
            takers.sort(key=lambda c: not _requires_constraints(c, context.classes))  # the hard-constrained methods first
            raise PreflightError(f"{at}: " + argument_message(
                name, key, list(signature.names or ()), [f"lit_constrained.optim.{c}" for c in takers]))
        if value is not _UNSET:
            _check_value(at, name, arguments[key], value)


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


def run_preflight(subcommand: str, args: Sequence[str], top_level_configs: Sequence[str] = ()) -> None:
    """:func:`preflight`, its error printed in one line (``lit-constrained <subcommand>: error: ...``) and
    exit status 2, as argparse does."""
    try:
        preflight(subcommand, args, top_level_configs)
    except PreflightError as error:
        sys.stderr.write(f"lit-constrained {subcommand}: error: {error}\n")
        raise SystemExit(2) from None
