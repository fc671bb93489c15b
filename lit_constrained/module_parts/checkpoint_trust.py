"""What a checkpoint of the module may hold: finite weights when it is written; when it is read, only
class paths from trusted modules, and the content its hash says.

``load_from_checkpoint`` rebuilds the module from the hyper-parameters, which hold the optimizer (and a
LightningCLI run's classes) as class paths: rebuilding imports them, and importing a module runs its
code. So before Lightning reads the file, :func:`check_before_loading` reads it with ``weights_only=True``
and checks every importable name against the allowlist: ``lit_constrained``, ``torch``, ``lightning``
(:data:`~lit_constrained.class_spec.TRUSTED_MODULES`), the task's own module and the caller's
``trusted_modules`` (:func:`~lit_constrained.checkpoint_integrity.check_before_loading`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor

from ..class_spec import TRUSTED_MODULES


def trusted_modules_for(task_class: type, trusted_modules: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules whose classes a checkpoint of ``task_class`` may name: the package's, torch's,
    Lightning's, the task's own module and ``trusted_modules``."""
    return (*TRUSTED_MODULES, task_class.__module__, *trusted_modules)


def check_before_loading(
    checkpoint_path: str | Path | IO, task_class: type, trusted_modules: Iterable[str] = ()
) -> str | Path | IO:
    """Check a checkpoint of ``task_class`` before it is loaded (a ``weights_only=True`` read): readable,
    naming only trusted modules (:func:`trusted_modules_for`), matching its content hash. Returns the
    path, or a rewound in-memory copy of a file object; raises
    :class:`~lit_constrained.class_spec.UntrustedClassPathError` before anything is imported."""
    from ..checkpoint_integrity import check_before_loading as check_file

    return check_file(checkpoint_path, trusted_modules_for(task_class, trusted_modules))


def refuse_nonfinite_weights(checkpoint: Mapping[str, Any]) -> None:
    """Raise before a checkpoint is written if a floating or complex parameter of its ``state_dict`` holds NaN/inf
    (an FNO's spectral weights are complex)."""
    for name, tensor in checkpoint.get("state_dict", {}).items():
        numeric = isinstance(tensor, Tensor) and (tensor.is_floating_point() or tensor.is_complex())
        if numeric and not bool(torch.isfinite(tensor).all()):
            raise FloatingPointError(f"Refusing to write a checkpoint: parameter {name!r} holds NaN/inf.")
