"""CheckpointIntegrity: every checkpoint a Trainer writes carries a content hash, every one it loads is
checked, and a full disk is called a full disk.

At ``setup`` (before Lightning restores ``ckpt_path``) the strategy's ``CheckpointIO`` is wrapped in
:class:`~lit_constrained.checkpoint_integrity.IntegrityCheckpointIO` (Lightning's public
``strategy.checkpoint_io`` setter), so ``trainer.fit(ckpt_path=...)``, ``--ckpt_path`` and every
``ModelCheckpoint`` save go through it. :class:`~lit_constrained.module.ConstrainedModule` adds this
callback to every Trainer (``configure_callbacks``). Every checkpoint saved records the task class
(:func:`~lit_constrained.module_parts.checkpoint_trust.record_task`), and every one restored, by any route
(a path, ``last``, ``best``), must name only trusted modules and be of the module's task class and
shapes (:func:`~lit_constrained.module_parts.checkpoint_trust.check_against_module`), refused before
anything is restored or imported otherwise. At the start of a fit, rank 0 removes the temporary files
that a process killed mid-save left in the checkpoint directories (``.last.ckpt.<pid>.<hex>.tmp`` of a
process no longer running on this host: :func:`~lit_constrained.io.remove_stale_temporaries`).

A file system that fills up (``ENOSPC``, ``EDQUOT``) or turns read-only or unwritable (``EROFS``,
``EACCES``, ``EPERM``) mid-run usually shows first in the logger: TensorBoard's writer thread dies with
the OSError (its traceback printed by the thread), and Lightning's TensorBoard logger reports it as
``ValueError: you tried to log <number> which is currently not supported``. During a fit this callback
prints one line first instead, naming the directory that cannot be written, the cause, the checkpoint
directory and the last checkpoint (:func:`write_failure_line`): in place of the writer thread's traceback
when that thread fails, else when the run's exception reaches ``on_exception``. ``lit-constrained`` then
ends with that line and exit status 1 (:func:`write_failure_line` of the exception), not the traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lit_constrained.checkpoint_integrity import CheckpointWriteError, install_integrity_io
from lit_constrained.io import remove_stale_temporaries
from lit_constrained.module_parts import checkpoint_trust


def _chain(exception: BaseException | None) -> list[BaseException]:
    """``exception`` and its causes/contexts, outermost first (each once)."""
    seen: list[BaseException] = []
    while exception is not None and all(exception is not other for other in seen):
        seen.append(exception)
        exception = exception.__cause__ or exception.__context__
    return seen


FULL = (errno.ENOSPC, errno.EDQUOT)
"""A full disk or quota."""
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
"""A read-only file system, or a file or directory the process may not write."""


def disk_full(exception: BaseException) -> bool:
    """Whether ``exception`` was caused by a full disk or quota (``ENOSPC`` / ``EDQUOT``) at any depth."""
    return any(isinstance(e, OSError) and e.errno in FULL for e in _chain(exception))


def write_failure(exception: BaseException | None) -> OSError | None:
    """The OSError of a full or unwritable file system (:data:`FULL`, :data:`UNWRITABLE`) in
    ``exception``'s chain (the innermost), or None."""
    found = [e for e in _chain(exception) if isinstance(e, OSError) and e.errno in (*FULL, *UNWRITABLE)]
    return found[-1] if found else None


def _directory_of(error: OSError) -> str | None:
    name = error.filename
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not name:
        return None
    name = str(name)
    return name if os.path.isdir(name) else os.path.dirname(name) or "."


def write_failure_line(exception: BaseException | None, trainer: Any = None) -> str | None:
    """One line for a run that cannot write its files any more (None when ``exception`` is not such a
    failure): the directory, the cause, where the checkpoints go and the last one written, the fix."""
    error = write_failure(exception)
    if error is None:
        return None
    cause = error.strerror or str(error)
    code = errno.errorcode.get(error.errno, "") if error.errno else ""
    directory = _directory_of(error)
    where = f"write to {directory}" if directory else "write its files"
    ckpt = getattr(trainer, "checkpoint_callback", None) if trainer is not None else None
    ckpt_dir = getattr(ckpt, "dirpath", None) if ckpt is not None else None
    last = getattr(ckpt, "last_model_path", "") if ckpt is not None else ""
    checkpoints = (f"; checkpoints go to {ckpt_dir}, the last written: {last or 'none'}" if ckpt_dir
                   else f"; the last checkpoint written: {last}" if last else "")
    fix = ("free some space or write elsewhere" if error.errno in FULL
           else "make it writable (a read-only mount, its permissions) or write elsewhere")
    misreported = any(isinstance(e, ValueError) and "you tried to log" in str(e) for e in _chain(exception))
    full = "the disk is full: " if error.errno in FULL else ""
    return (f"lit-constrained: {full}the run cannot {where}: {cause}{f' ({code})' if code else ''}{checkpoints}. "
            f"{fix[0].upper() + fix[1:]} (--trainer.default_root_dir, the checkpoint callback's dirpath)"
            + ("; Lightning's TensorBoard logger reports this as 'you tried to log ...'." if misreported else "."))


def _tensorboard_writer_thread(thread: Any) -> bool:
    """Whether ``thread`` is the event-file writer thread of a TensorBoard ``SummaryWriter``."""
    return type(thread).__module__.startswith(("tensorboard.", "torch.utils.tensorboard"))


class CheckpointIntegrity(Callback):
    """Hashes and verifies the Trainer's checkpoints; names a full disk when a run dies of one."""

    def __init__(self) -> None:
        self._trainer: Any = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        _SAID.clear()  # a new fit: its write failure gets its line
        _watch_writer_threads(self)  # the TensorBoard writer thread's failure: one line, first
        checkpoint_io = install_integrity_io(trainer.strategy)

        def check_loaded(checkpoint: Any, source: str) -> None:
            checkpoint_trust.check_against_module(checkpoint, pl_module, source, trainer.datamodule)

        checkpoint_io.check_loaded = check_loaded  # this fit's module (setup runs before ckpt_path is read)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after every callback's setup (the checkpoint directories are resolved), before the first save
        if not trainer.is_global_zero:
            return
        directories = {str(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
        removed = [path for directory in sorted(directories) for path in remove_stale_temporaries(directory)]
        if removed:
            names = ", ".join(path.name for path in removed)
            rank_zero_info(f"lit-constrained: removed {len(removed)} temporary file(s) of an interrupted save "
                           f"(their process no longer runs) from {', '.join(sorted(directories))}: {names}")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint_trust.record_task(checkpoint, pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if _WATCHING.get("callback") is self:
            _WATCHING.pop("callback")

    def thread_failed(self, args: Any) -> bool:
        """A TensorBoard writer thread that cannot write: print one line (once) and return True; False for
        any other thread failure (shown as usual)."""
        line = write_failure_line(args.exc_value, self._trainer) if _tensorboard_writer_thread(args.thread) else None
        if line is None:
            return False
        _say(line, write_failure(args.exc_value))
        return True

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if "error" in _SAID or any(isinstance(e, CheckpointWriteError) for e in _chain(exception)[:1]):
            return  # already said in one line: by the writer thread's hook, or by the checkpoint writer itself
        line = write_failure_line(exception, trainer)
        if line is not None and trainer.is_global_zero:
            _say(line, write_failure(exception))


#: the fit's CheckpointIntegrity whose trainer a failing writer thread belongs to (the latest set up)
_WATCHING: dict[str, CheckpointIntegrity] = {}


def _excepthook(args: Any) -> None:
    """``threading.excepthook`` once a fit has run: the watching callback's one line for a TensorBoard
    writer thread that cannot write (:meth:`CheckpointIntegrity.thread_failed`), else the previous hook."""
    callback = _WATCHING.get("callback")
    if callback is not None and callback.thread_failed(args):
        return
    _previous_excepthook(args)


_previous_excepthook = threading.excepthook


def _watch_writer_threads(callback: CheckpointIntegrity) -> None:
    """Install :func:`_excepthook` (once; it passes other failures to the hook it replaced) for ``callback``."""
    global _previous_excepthook
    if threading.excepthook is not _excepthook:
        _previous_excepthook = threading.excepthook
        threading.excepthook = _excepthook
    _WATCHING["callback"] = callback


#: the write failure this fit's line was printed for: one line a fit, whichever reporter comes first (the
#: writer thread's hook, on_exception, the command line; a file system gone read-only fails several files
#: of one directory, each its own OSError). Cleared when a fit is set up.
_SAID: dict[str, OSError | None] = {}
_SAID_LOCK = threading.Lock()


def _say(line: str, error: OSError | None) -> None:
    with _SAID_LOCK:
        if "error" in _SAID:
            return
        _SAID["error"] = error
    print(line, file=sys.stderr, flush=True)


def exit_after_write_failure(exception: BaseException, trainer: Any = None) -> None:
    """End ``lit-constrained`` after a run that could not write its files: its one line
    (:func:`write_failure_line`) unless this fit printed one already, then exit status 1 instead of the
    traceback. Re-raises ``exception`` when it is no such failure."""
    error = write_failure(exception)
    if error is None:
        raise exception
    _say(write_failure_line(exception, trainer), error)
    raise SystemExit(1) from None
