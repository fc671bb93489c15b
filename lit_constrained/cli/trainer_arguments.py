"""The Lightning Trainer's arguments, from its signature, for the checks made before Lightning is imported.

The names are ``inspect.signature(Trainer.__init__)`` (and of ``fit``, ``validate``, ``test``,
``predict``), what jsonargparse itself reads to build the ``--trainer.*`` options, never Lightning's
source text. Importing the Trainer takes seconds (torch and Lightning), so the signature is read once
per installed Lightning and kept as a small JSON file in the user's cache directory
(``$XDG_CACHE_HOME/lit_constrained``, else ``~/.cache/lit_constrained``), keyed by the path, size and
modification time of Lightning's ``trainer.py`` (found without importing anything): an upgraded
Lightning is read again. The first use (no cache for this Lightning) imports the Trainer, which the run
imports a moment later anyway; every later one reads the file (milliseconds).

:func:`cached_trainer_arguments` never imports Lightning (the help page uses it: without a cache it says
so and shows no count).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

#: the Trainer's methods whose arguments a config may set: its constructor and the subcommands
METHODS = ("__init__", "fit", "validate", "test", "predict")

#: argument names per method (``self`` left out), in the signature's order
TrainerArguments = dict[str, tuple[str, ...]]


def _key() -> str | None:
    """``<path>:<size>:<mtime_ns>`` of the installed Lightning's ``trainer.py``, found without importing
    anything (an upgrade or a reinstall rewrites it); None without Lightning."""
    try:
        spec = importlib.util.find_spec("lightning")  # a top-level package: located, not executed
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py"
    try:
        stat = path.stat()
    except OSError:
        path = Path(spec.origin)
        stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def cache_file() -> Path:
    """Where the signature is kept (``$XDG_CACHE_HOME/lit_constrained/trainer_arguments.json``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "lit_constrained" / "trainer_arguments.json"


def read_signature() -> TrainerArguments:
    """The argument names of the Trainer's :data:`METHODS`, from ``inspect.signature`` (imports the
    Trainer's module: seconds, the first time in a process)."""
    import inspect

    from lightning.pytorch.trainer.trainer import Trainer  # start-up speed: only on a cache miss

    return {method: tuple(name for name in inspect.signature(getattr(Trainer, method)).parameters if name != "self")
            for method in METHODS}


def cached_trainer_arguments() -> TrainerArguments | None:
    """The cached signature of the installed Lightning's Trainer, or None (no cache for this Lightning,
    or none installed). Imports nothing of Lightning."""
    key = _key()
    try:
        content = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return None
    if key is None or not isinstance(content, dict) or content.get("key") != key:
        return None
    arguments = content.get("arguments")
    if not isinstance(arguments, dict) or set(arguments) != set(METHODS):
        return None
    return {method: tuple(arguments[method]) for method in METHODS}


def trainer_arguments() -> TrainerArguments | None:
    """The Trainer's arguments: the cache, else the signature read now (and cached: a cache that cannot
    be written is skipped silently); None without Lightning installed."""
    cached = cached_trainer_arguments()
    if cached is not None:
        return cached
    key = _key()
    if key is None:
        return None
    arguments = read_signature()
    from lit_constrained.io import write_atomic  # (its socket import: only when the cache is written)

    try:
        text = json.dumps({"key": key, "arguments": arguments}, indent=1)
        write_atomic(cache_file(), lambda tmp: tmp.write_text(text))
    except OSError:
        pass
    return arguments
