"""The early checks of the classes a config names: a module or class that does not exist (with the
nearest that does), an argument the class does not take, a value its annotation cannot take; all read
from the source files (:mod:`~lit_constrained.cli.preflight.sources`)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from lit_constrained.cli.preflight.errors import UNSET as _UNSET
from lit_constrained.cli.preflight.errors import PreflightError
from lit_constrained.cli.preflight.sources import (
    _Argument, _arguments, _constrained_module_arguments, _exported, _init_args,
    _package_dir, _read_source, _requires_constraints, _resolve, own_arguments,
)
from lit_constrained.hints import argument_message, task_kwargs_hint


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
