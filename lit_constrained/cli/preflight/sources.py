"""What the early checks read of a class without importing it: its source file, parsed with :mod:`ast`
(its ``__init__``'s arguments, annotations and defaults, its bases, the type aliases and constants of
its files), for a file next to the config or a module of this package."""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


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
    return Path(__file__).resolve().parents[2]  # lit_constrained/ (this file: lit_constrained/cli/preflight/)


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
    """The optimizers a package module of this package exports: the classes of its ``__all__`` whose
    ``__init__`` takes an ``lr``, read from the files its ``__init__.py`` imports them from (only those
    files are parsed: the help page is built from them)."""
    init = _package_dir().joinpath(*module.split(".")[1:], "__init__.py")
    try:
        tree = ast.parse(init.read_text())
    except (OSError, SyntaxError):
        return []
    exported, found = _exported(module), []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            classes = _classes_in(init.parent.joinpath(*node.module.split(".")).with_suffix(".py"))
            found += [a.name for a in node.names if a.name in exported and a.name in classes
                      and "lr" in (classes[a.name].names or ())]
    return sorted(found)


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
