"""What a checkpoint of the module may hold: finite weights when it is written; when it is read, only
class paths from trusted modules, and the content its hash says.

``load_from_checkpoint`` rebuilds the module from the hyper-parameters, which hold the optimizer (and a
LightningCLI run's classes) as class paths: rebuilding imports them, and importing a module runs its
code. So before Lightning reads the file, :func:`check_before_loading` reads it with ``weights_only=True``
and checks every importable name against the allowlist: ``lit_constrained``, ``torch``, ``lightning``
(:data:`~lit_constrained.class_spec.TRUSTED_MODULES`), the task's own module and the caller's
``trusted_modules`` (:func:`~lit_constrained.checkpoint_integrity.check_before_loading`).
:class:`TrustedLoading` is that ``load_from_checkpoint``, mixed into the module.

**A checkpoint of this task.** Every checkpoint records the task class that wrote it
(:data:`TASK_KEY`, :func:`record_task`; a LightningCLI run's also hold it as ``hyper_parameters._class_path``).
A checkpoint of another task class (a chemistry checkpoint given to a spring config) is refused before
anything is restored, as is one whose parameters have other names or shapes than the module's (another
configuration of the task): one :class:`CheckpointMismatchError` naming the file and both classes
(:func:`refuse_another_task`, :func:`refuse_other_shapes`; a command line's ``--ckpt_path``:
:func:`check_run_checkpoint`). Two classes are "another task" when neither
is a subclass of the other (a subclass of the task loads its parent's checkpoint, if the shapes fit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch
from torch import Tensor

from ..checkpoint_integrity import CheckpointError, read_checkpoint
from ..class_spec import (
    TASK_KEY,
    TRUSTED_MODULES,
    check_checkpoint_names,
    class_path_of,
    class_paths_in,
    import_class,
    importable_names_in,
    imported_class,
    is_trusted,
)
from ..hints import SetupError

_SHOWN = 3  # parameters named in a shape mismatch before "and N more"


class CheckpointMismatchError(CheckpointError, SetupError):
    """A checkpoint of another task class, or of other parameter names or shapes, than the module it is
    given to (nothing was restored). ``lit-constrained`` prints it as one line (a
    :class:`~lit_constrained.hints.SetupError`)."""


def trusted_modules_for(task_class: type, trusted_modules: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules whose classes a checkpoint of ``task_class`` may name: the package's, torch's,
    Lightning's, the task's own module and ``trusted_modules``."""
    return (*TRUSTED_MODULES, task_class.__module__, *trusted_modules)


def check_before_loading(
    checkpoint_path: str | Path | IO, task_class: type, trusted_modules: Iterable[str] = ()
) -> str | Path | IO:
    """Check a checkpoint of ``task_class`` before it is loaded (a ``weights_only=True`` read): readable,
    naming only trusted modules (:func:`trusted_modules_for`), matching its content hash, written by
    ``task_class``, a subclass or a parent of it (:func:`refuse_another_task`). Returns the path, or a
    rewound in-memory copy of a file object; raises
    :class:`~lit_constrained.class_spec.UntrustedClassPathError` before anything is imported (the recorded
    task class is one of the names checked: :data:`~lit_constrained.class_spec.TASK_KEY`)."""
    from ..checkpoint_integrity import check_before_loading as check_file

    trusted = trusted_modules_for(task_class, trusted_modules)

    def of_this_task(checkpoint: Mapping[str, Any], source: str) -> None:
        refuse_another_task(checkpoint, task_class, source, trusted=trusted,
                            how=f"{task_class.__name__}.load_from_checkpoint")

    return check_file(checkpoint_path, trusted, inspect=of_this_task)


class TrustedLoading:
    """Mixed into a LightningModule (before it in the bases): its ``load_from_checkpoint`` checks the file
    first (:func:`check_before_loading`)."""

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path | IO,
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        trusted_modules: Iterable[str] = (),
        **kwargs: Any,
    ) -> Any:
        """Lightning's ``load_from_checkpoint``, refusing class paths from untrusted modules.

        The hyper-parameters hold the optimizer (and a LightningCLI run's classes) as class paths;
        rebuilding the module imports them, and importing a module runs its code. So each class path is
        checked first, from a ``weights_only=True`` read: it must lie in ``lit_constrained``, ``torch``,
        ``lightning``, this task's own module, or one of ``trusted_modules``; otherwise
        :class:`~lit_constrained.class_spec.UntrustedClassPathError` is raised and nothing is imported
        (:mod:`~lit_constrained.module_parts.checkpoint_trust`). Loads with ``weights_only=True`` (torch's
        safe default; everything the package saves is plain data). An explicit ``weights_only=False``
        runs pickle code anyway and skips the check.
        """
        if weights_only is not False:
            checkpoint_path = check_before_loading(checkpoint_path, cls, trusted_modules)
        return super().load_from_checkpoint(  # type: ignore[misc]  # LightningModule's, next in the bases
            checkpoint_path, map_location=map_location, hparams_file=hparams_file, strict=strict,
            weights_only=weights_only, **kwargs,
        )


def refuse_nonfinite_weights(checkpoint: Mapping[str, Any]) -> None:
    """Raise before a checkpoint is written if a floating or complex parameter of its ``state_dict`` holds NaN/inf
    (an FNO's spectral weights are complex)."""
    for name, tensor in checkpoint.get("state_dict", {}).items():
        numeric = isinstance(tensor, Tensor) and (tensor.is_floating_point() or tensor.is_complex())
        if numeric and not bool(torch.isfinite(tensor).all()):
            raise FloatingPointError(f"Refusing to write a checkpoint: parameter {name!r} holds NaN/inf.")


def record_task(checkpoint: dict[str, Any], module: Any) -> None:
    """Record in ``checkpoint`` (:data:`TASK_KEY`) the class of the task that writes it."""
    checkpoint[TASK_KEY] = class_path_of(type(module))


def checkpoint_task(checkpoint: Mapping[str, Any]) -> str | None:
    """The task class path a checkpoint records: :data:`TASK_KEY`, else a LightningCLI run's
    ``hyper_parameters._class_path``; None for a checkpoint that records neither (plain Lightning)."""
    recorded = checkpoint.get(TASK_KEY)
    if isinstance(recorded, str):
        return recorded
    hparams = checkpoint.get("hyper_parameters")
    recorded = hparams.get("_class_path") if isinstance(hparams, Mapping) else None
    return recorded if isinstance(recorded, str) else None


def _class_path(task: Any) -> str | None:
    """The class path of a class, an instance, a class path or a config's ``{class_path: ...}`` (None: none)."""
    if isinstance(task, Mapping) or hasattr(task, "class_path"):
        task = task.get("class_path") if isinstance(task, Mapping) else task.class_path
    if isinstance(task, str) or task is None:
        return task
    return class_path_of(task if isinstance(task, type) else type(task))


def _known_class(task: Any, class_path: str, trusted: tuple[str, ...]) -> type | None:
    """``task``'s class without importing anything untrusted: the class itself (a class or an instance),
    else the class ``class_path`` names if its module is imported already or trusted (then imported),
    else None."""
    if isinstance(task, type):
        return task
    if task is not None and not isinstance(task, (str, Mapping)) and not hasattr(task, "class_path"):
        return type(task)
    found = imported_class(class_path)
    if found is None and is_trusted(class_path, trusted):
        try:
            found = import_class(class_path, trusted)
        except (ImportError, ValueError, TypeError):
            return None
    return found


def refuse_another_task(
    checkpoint: Mapping[str, Any], task: Any, source: str, *, trusted: Iterable[str] = (), how: str = ""
) -> None:
    """Raise :class:`CheckpointMismatchError` if ``checkpoint`` (read from ``source``) was written by a task
    class unrelated to ``task`` (a class, an instance, a class path or a config's model section): another
    class path, and neither class a subclass of the other. ``how`` says where ``task`` comes from (e.g.
    "the config's model").

    The comparison is on names first. A class is looked at (for the subclass relation) only if it is
    imported already or its module is one of ``trusted``: a name recorded in a forged checkpoint is never
    imported here, whatever the caller checked before (importing a module runs its code)."""
    recorded = checkpoint_task(checkpoint)
    expected_path = _class_path(task)
    if recorded is None or expected_path is None or recorded == expected_path:
        return
    trusted = tuple(trusted)
    written, expected = _known_class(recorded, recorded, trusted), _known_class(task, expected_path, trusted)
    if written is not None and expected is not None and (issubclass(expected, written) or issubclass(written, expected)):
        return
    name = recorded.rpartition(".")[2]
    expected_name = expected_path.rpartition(".")[2]
    raise CheckpointMismatchError(
        f"{source} is a checkpoint of {recorded}, not of {expected_path}"
        f"{f' ({how})' if how else ''}: nothing was restored. Resume it with a config of {name} (the task that "
        f"wrote it), or {name}.load_from_checkpoint(...) it; to train {expected_name}, give its own "
        "checkpoint or none (start fresh)."
    )


def _shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, Tensor) or isinstance(value, torch.nn.parameter.UninitializedTensorMixin):
        return None
    return tuple(value.shape)


def refuse_other_shapes(checkpoint: Mapping[str, Any], module: torch.nn.Module, source: str) -> None:
    """Raise :class:`CheckpointMismatchError` if the ``state_dict`` of ``checkpoint`` (read from
    ``source``) does not fit ``module``: a parameter or buffer of another shape, or (when the module loads
    strictly, ``strict_loading``) one that either side lacks. Lazy (uninitialized) parameters are not compared."""
    saved = checkpoint.get("state_dict")
    if not isinstance(saved, Mapping):
        return
    own = module.state_dict()
    other = [f"{key} {_shape(saved[key])} in the checkpoint, {_shape(own[key])} in the module"
             for key in own if key in saved and None not in (_shape(saved[key]), _shape(own[key]))
             and _shape(saved[key]) != _shape(own[key])]
    problems = []
    if other:
        problems.append("other shapes: " + "; ".join(other[:_SHOWN]) + (f" and {len(other) - _SHOWN} more" if len(other) > _SHOWN else ""))
    if getattr(module, "strict_loading", True) is not False:
        missing = [key for key in own if key not in saved]
        unexpected = [key for key in saved if key not in own]
        for what, keys in (("not in the checkpoint", missing), ("not in the module", unexpected)):
            if keys:
                problems.append(f"{len(keys)} {what} ({', '.join(keys[:_SHOWN])}{', ...' if len(keys) > _SHOWN else ''})")
    if not problems:
        return
    recorded = checkpoint_task(checkpoint)
    written = f"{recorded}" if recorded else "a task that did not record its class"
    raise CheckpointMismatchError(
        f"{source} (a checkpoint of {written}) does not fit this {class_path_of(type(module))}: its parameters "
        f"have {'; '.join(problems)}. It was written by another configuration (e.g. another hidden size or "
        "depth): resume it with the configuration that wrote it, or start fresh (no ckpt_path); nothing was restored."
    )


def check_run_checkpoint(ckpt_path: Any, run_config: Mapping[str, Any], model: Any) -> None:
    """A run's ``ckpt_path`` (the command line's, before LightningCLI reads the file) refused when its
    hyper-parameters name a class path outside the trusted modules and those of the run's config
    (``run_config``), or another task than ``model`` (the config's); nothing imported."""
    if not ckpt_path or not Path(str(ckpt_path)).is_file():
        return
    checkpoint = read_checkpoint(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
    trusted = (*TRUSTED_MODULES, *{path.rpartition(".")[0] for path in class_paths_in(run_config)})
    check_checkpoint_names(checkpoint, trusted, str(ckpt_path))
    refuse_another_task(checkpoint, model, str(ckpt_path), trusted=trusted, how="the config's model")


def trusted_for_module(module: Any, datamodule: Any = None) -> tuple[str, ...]:
    """The modules a checkpoint restored into ``module`` may name: :func:`trusted_modules_for` its class,
    the ``datamodule``'s module, and the modules of the names its own hyper-parameters and the
    ``datamodule``'s hold (what the run's config or code gave it: a checkpoint of the same run names no more)."""
    own = [type(datamodule).__module__] if datamodule is not None else []
    for holder in (module, datamodule):
        hparams = getattr(holder, "hparams", None)
        if isinstance(hparams, Mapping):
            own += [name.rpartition(".")[0] for _, name in importable_names_in(dict(hparams))]
    return trusted_modules_for(type(module), [name for name in own if name])


def check_against_module(
    checkpoint: Mapping[str, Any], module: torch.nn.Module, source: str, datamodule: Any = None
) -> None:
    """What a checkpoint restored into a live ``module`` must be, on every route (``trainer.fit(ckpt_path=...)``,
    ``--ckpt_path PATH``, ``last``, ``best``): naming only trusted modules (:func:`trusted_for_module`;
    nothing is imported: :class:`~lit_constrained.class_spec.UntrustedClassPathError`), of its task class
    (:func:`refuse_another_task`) and of its parameter names and shapes (:func:`refuse_other_shapes`)."""
    trusted = trusted_for_module(module, datamodule)
    check_checkpoint_names(checkpoint, trusted, source)
    refuse_another_task(checkpoint, module, source, trusted=trusted, how="the module it is restored into")
    refuse_other_shapes(checkpoint, module, source)
