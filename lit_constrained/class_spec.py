"""Classes as plain data: ``{"class_path": "pkg.mod.Class", "init_args": {...}}``.

A module's optimizer and LR scheduler are saved in its hyper-parameters in this form, never as Python
callables, so a checkpoint loads with ``torch.load(..., weights_only=True)`` (no pickle code runs) and
``load_from_checkpoint`` rebuilds the same optimizer. A class path read from a checkpoint is imported
only if its module is trusted: ``lit_constrained``, ``torch``, ``lightning``, the task's own module,
or a module the caller names (``trusted_modules``); anything else is rejected *before* it is imported.

What counts as a name is not only a ``class_path`` key: jsonargparse imports a plain dotted string given
for a class-typed argument (``hyper_parameters["optimizer"] = "somemodule.Thing"``), Lightning imports
``_instantiator``, and either may sit in a nested dict or list. So :func:`check_trusted` inspects every
string of the hyper-parameters that could be imported (:func:`importable_names_in`): a dotted path of
identifiers whose top-level module exists (a string whose first part names no module cannot run code).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .hints import SetupError

TRUSTED_MODULES: tuple[str, ...] = ("lit_constrained", "torch", "lightning", "pytorch_lightning")
"""Module roots whose classes a checkpoint may name (with the task's own module and the caller's)."""

_PLAIN_SCALARS = (bool, int, float, str, type(None))


def class_path_of(cls: type) -> str:
    """``module.QualName`` of a class (what ``import_class`` resolves back)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain data (None, bool, int, float, str, lists and str-keyed dicts of them)."""
    if isinstance(value, _PLAIN_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(
        f"{where} = {value!r} is not plain data (numbers, strings, booleans, None, lists, dicts): it "
        "cannot be stored in a checkpoint's hyper-parameters. Pass a number or string instead."
    )


def _unwrap_partial(value: functools.partial) -> tuple[Any, tuple, dict[str, Any]]:
    """(func, args, keywords) of a possibly nested ``functools.partial``."""
    func, args, keywords = value.func, tuple(value.args), dict(value.keywords)
    while isinstance(func, functools.partial):
        args = tuple(func.args) + args
        keywords = {**func.keywords, **keywords}
        func = func.func
    return func, args, keywords


def as_class_spec(value: Any, what: str) -> dict[str, Any] | None:
    """The plain ``{"class_path", "init_args"}`` form of a class factory (None stays None).

    Accepted: a class (``torch.optim.Adam``), ``functools.partial(Class, **init_args)``, a dict with
    ``class_path`` (and ``init_args``), or the callable LightningCLI builds from such a dict. A lambda,
    function or closure is rejected here, at construction: its code cannot be stored as data.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        if not isinstance(value.get("class_path"), str):
            raise TypeError(f"{what} as a dict needs a 'class_path' string, got {dict(value)!r}.")
        init_args = value.get("init_args") or {}
        return {"class_path": value["class_path"], "init_args": _plain(dict(init_args), f"{what}.init_args")}
    if isinstance(value, type):
        return {"class_path": class_path_of(value), "init_args": {}}
    if isinstance(value, functools.partial):
        func, args, keywords = _unwrap_partial(value)
        if isinstance(func, type) and not args:
            cls = func
        elif args and isinstance(args[-1], type) and getattr(func, "__module__", "").startswith("jsonargparse"):
            cls = args[-1]  # LightningCLI's callable from a config's class_path / init_args
        else:
            cls = None
        if cls is not None:
            return {"class_path": class_path_of(cls), "init_args": _plain(keywords, f"{what}.init_args")}
    raise TypeError(
        f"{what}={value!r} cannot be saved in the checkpoint (a lambda, function or closure is Python "
        f"code, not data). Pass a class, functools.partial(Class, **init_args) or a dict "
        f"{{'class_path': 'torch.optim.Adam', 'init_args': {{'lr': 1e-3}}}}, e.g. "
        f"{what}=functools.partial(torch.optim.Adam, lr=1e-3)."
    )


def is_trusted(class_path: str, trusted: Iterable[str]) -> bool:
    """Whether ``class_path``'s module is one of ``trusted`` or inside one of them."""
    module = class_path.rpartition(".")[0]
    return any(module == root or module.startswith(root + ".") for root in trusted if root)


def import_class(class_path: str, trusted: Iterable[str] | None = None) -> type:
    """The class named by a full dotted path, imported only if trusted (``trusted=None``: no check)."""
    module_name, _, name = class_path.rpartition(".")
    if not module_name:
        raise ValueError(f"class_path {class_path!r} must be a full dotted path, e.g. 'torch.optim.Adam'.")
    if trusted is not None and not is_trusted(class_path, trusted):
        raise UntrustedClassPathError([class_path], tuple(trusted))
    module = importlib.import_module(module_name)
    try:
        cls = getattr(module, name)
    except AttributeError:
        raise ValueError(f"class_path {class_path!r}: module {module_name!r} has no attribute {name!r}.") from None
    if not isinstance(cls, type):
        raise TypeError(f"class_path {class_path!r} names {cls!r}, not a class.")
    return cls


def imported_class(class_path: str) -> type | None:
    """The class ``class_path`` names if its module is imported already (``sys.modules``), else None:
    nothing is imported. A nested class (``module.Outer.Inner``) is found through its outer class."""
    parts = class_path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:split]))
        if found is None:
            continue
        for name in parts[split:]:
            found = getattr(found, name, None)
        return found if isinstance(found, type) else None
    return None


def build(spec: Mapping[str, Any], *args: Any) -> Any:
    """``Class(*args, **init_args)`` from a plain spec."""
    return import_class(spec["class_path"])(*args, **dict(spec.get("init_args") or {}))


class SpecFactory:
    """A picklable-free factory ``(*args) -> Class(*args, **init_args)`` from a plain spec."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = {"class_path": spec["class_path"], "init_args": dict(spec.get("init_args") or {})}

    def __call__(self, *args: Any) -> Any:
        return build(self.spec, *args)

    def __repr__(self) -> str:
        return f"SpecFactory({self.spec!r})"


def looks_importable(value: str) -> bool:
    """Whether ``value`` is a dotted path that an import of it could resolve (``pkg.mod.Name``).

    A dotted path of identifiers (what jsonargparse's and Lightning's imports accept) whose top-level
    module is already imported or can be found on ``sys.path`` (found, not imported: no code runs).
    ``"data.npz"`` with no module ``data`` is not importable; a path with ``/`` or spaces never is.
    """
    parts = value.strip().split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return False
    top = parts[0]
    if top in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a broken finder or a malformed name: treat as importable
        return True
    if spec is None:
        return False
    if spec.origin not in (None, "namespace"):
        return True  # a module or a regular package: importing it runs its code
    # a namespace package (a plain directory, e.g. data/): only a submodule named next could run code
    locations = list(spec.submodule_search_locations or [])
    return any(
        (Path(location) / parts[1]).is_dir() or any(Path(location).glob(f"{parts[1]}.*")) for location in locations
    )


def importable_names_in(data: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """``(key path, name)`` of every string in ``data`` (dict values and list items at any depth) that
    :func:`looks_importable`; the key path reads like ``optimizer.init_args.betas[0]``."""
    if isinstance(data, str):
        if looks_importable(data):
            yield where or "(top level)", data.strip()
    elif isinstance(data, Mapping):
        for key, value in data.items():
            yield from importable_names_in(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from importable_names_in(value, f"{where}[{index}]")


def class_paths_in(data: Any) -> Iterator[str]:
    """Every string stored under a ``class_path`` / ``_class_path`` key, at any depth of ``data``."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            if key in ("class_path", "_class_path") and isinstance(value, str):
                yield value
            else:
                yield from class_paths_in(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from class_paths_in(value)


class UntrustedClassPathError(SetupError):
    """A checkpoint or config names a class outside the trusted modules (nothing was imported). A
    :class:`~lit_constrained.hints.SetupError`: ``lit-constrained`` prints it as one line, exit status 2.

    ``class_paths`` are the untrusted names, ``keys`` where each was found (same order)."""

    def __init__(
        self, class_paths: list[str], trusted: tuple[str, ...], keys: list[str] | None = None, source: str | None = None
    ) -> None:
        self.class_paths = class_paths
        self.keys = keys or []
        self.trusted = trusted
        found = (
            ", ".join(f"{path!r} at {key}" for key, path in zip(self.keys, class_paths))
            if self.keys else ", ".join(map(repr, class_paths))
        )
        where = f"The checkpoint {source}" if source else "The checkpoint"
        roots = sorted({path.split(".")[0] for path in class_paths})
        super().__init__(
            f"{where} names {found}, outside the trusted modules ({', '.join(trusted)}); nothing was imported "
            "(importing a module runs its code). If you trust this checkpoint, name the module(s): "
            f"load_from_checkpoint(path, trusted_modules={roots!r}) in Python, or name the class in the config "
            "(e.g. as the model's optimizer) on the command line."
        )


def check_trusted(data: Any, trusted: Iterable[str], source: str | None = None) -> None:
    """Raise :class:`UntrustedClassPathError` if ``data`` names anything importable outside ``trusted``.

    Every importable-looking string counts (:func:`importable_names_in`), whatever its key: a
    ``class_path``, a plain string given for a class argument, an ``_instantiator``. ``source`` (the
    file) is named in the error.
    """
    trusted = tuple(trusted)
    bad = [(key, name) for key, name in importable_names_in(data) if not is_trusted(name, trusted)]
    if bad:
        raise UntrustedClassPathError([name for _, name in bad], trusted, [key for key, _ in bad], source)


TASK_KEY = "lit_constrained_task"
"""The checkpoint entry naming the task class that wrote it (``module.QualName``; written by
:func:`lit_constrained.module_parts.checkpoint_trust.record_task`)."""

NAMING_SECTIONS: tuple[str, ...] = (
    TASK_KEY, "hyper_parameters", "datamodule_hyper_parameters", "hparams", "module_arguments",
)
"""The checkpoint entries that name something importable: the task class the package recorded
(:data:`TASK_KEY`, compared with the module's class), and the sections Lightning and jsonargparse build
objects from (``load_from_checkpoint``, ``--ckpt_path``; the last two are Lightning's legacy names). Every
other section is state loaded into objects already built, and names nothing to import."""


def check_checkpoint_names(checkpoint: Mapping[str, Any], trusted: Iterable[str], source: str | None = None) -> None:
    """:func:`check_trusted` over a loaded checkpoint's :data:`NAMING_SECTIONS` (keys read
    ``hyper_parameters.optimizer``, ``lit_constrained_task``); ``source`` names the file in the error."""
    check_trusted({key: checkpoint[key] for key in NAMING_SECTIONS if key in checkpoint}, trusted, source)
