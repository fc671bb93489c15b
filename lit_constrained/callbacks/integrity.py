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

A full disk usually shows first in the logger: TensorBoard's writer thread gets ``ENOSPC`` and Lightning's
TensorBoard logger reports it as ``ValueError: you tried to log <number> which is currently not
supported``. On an exception whose chain holds ``ENOSPC``, this callback prints one line saying so, with
the directories the run writes to and the last checkpoint, before the traceback.
"""

from __future__ import annotations

import errno
import sys
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


def disk_full(exception: BaseException) -> bool:
    """Whether ``exception`` was caused by a full disk or quota (``ENOSPC`` / ``EDQUOT``) at any depth."""
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in _chain(exception))


class CheckpointIntegrity(Callback):
    """Hashes and verifies the Trainer's checkpoints; names a full disk when a run dies of one."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
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

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not disk_full(exception) or any(isinstance(e, CheckpointWriteError) for e in _chain(exception)[:1]):
            return  # not a full disk, or already said clearly by the checkpoint writer
        logs = getattr(trainer.logger, "log_dir", None) if trainer.logger is not None else None
        ckpt = trainer.checkpoint_callback
        last = getattr(ckpt, "last_model_path", "") if ckpt is not None else ""
        misreported = any(isinstance(e, ValueError) and "you tried to log" in str(e) for e in _chain(exception))
        print(
            f"lit-constrained: the disk is full (No space left on device) while the run was writing "
            f"{'its logs under ' + str(logs) if logs else 'its files'}: free some space or write elsewhere "
            f"(--trainer.default_root_dir); the last checkpoint written is {last or 'none'}"
            + ("; the 'you tried to log ...' ValueError below is how Lightning's TensorBoard logger reports the "
               "full disk." if misreported else "."),
            file=sys.stderr,
            flush=True,
        )
