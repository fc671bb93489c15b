"""Stopping on SIGTERM / SIGINT: every rank stops after the same step, one ``last.ckpt``, exit status 1.

:class:`StopOnSignal` replaces the SIGTERM and SIGINT handlers for the fit. A handler only notes the
signal (nothing collective runs inside it: Lightning's own SIGTERM handler broadcasts a tensor from the
handler, which pairs with whatever collective the other ranks happen to be in, and deadlocks). The
decision to stop is taken at the end of a training step, the same step on every rank:

* one process: after the step during which the signal arrived;
* W > 1 processes: at agreed checks, one all-reduce (max) of ``[signal code, proposal]``. The signal
  code is the rank's noted signal (0: none), so the ranks stop when any of them was signalled, the
  launching process included (Lightning's launcher is rank 0; torchrun forwards its signal to every
  worker). The proposal is rank 0's next check interval, the only value that counts:

  .. math::

      K_{i+1} = \\min\\left(K_\\max,\\ 2 K_i,\\ \\max\\left(1, \\left\\lceil
      \\frac{t_\\text{check}}{\\bar t_\\text{step}} \\right\\rceil\\right)\\right), \\qquad K_0 = 1,

  with :math:`\\bar t_\\text{step}` rank 0's mean wall time per step since the previous check, so the
  ranks meet about every ``check_seconds`` (1 s) whatever a step costs, and all of them count the
  same K. (K at most doubles from one check to the next: the first checks come after steps 1, 3,
  7, 15, ..., so a signal at step s is acted on by step 2 s + 1 at the latest.) A signal therefore
  stops the run within about ``check_seconds`` plus one step.

Then the stop: ``last.ckpt`` is written at that step's end (by the run's checkpoint callback: a
:class:`~lit_constrained.callbacks.checkpointing.CrashSafeCheckpoint`, or ``last.ckpt`` in the
directory of the first ``ModelCheckpoint``; nothing when checkpointing is off), Lightning logs the
step's metrics as usual, and :class:`TrainingInterrupted` (exit status 1, one line saying where the
checkpoint is) is raised at the next hook (the next step's start, a validation's start or the epoch's
end). A stop agreed at the run's last step lets the run finish normally. A second Ctrl+C more than
3 s after the first aborts at once, or right after the checkpoint being written (within 3 s it is
the same Ctrl+C, delivered by the terminal and again by a launcher that forwards it, late when the
machine is loaded).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from types import FrameType
from typing import Any, Callable

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

#: signals handled, by code (the all-reduce takes the largest code noted on any rank)
HANDLED = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}

#: a repeated SIGINT within this many seconds is the same Ctrl+C (terminal and launcher both deliver it)
REPEAT_SECONDS = 3.0


class TrainingInterrupted(SystemExit):
    """Raised (exit status 1) on every rank after a SIGTERM/SIGINT once ``last.ckpt`` is written; on rank
    0 its text is the one-line message printed on exit (the other ranks exit 1 without a word)."""


def training_ends_after_batch(trainer: "pl.Trainer", batch_idx: int) -> bool:
    """Whether the fit ends after training batch ``batch_idx`` (``max_steps`` reached, the last batch of
    the last epoch, or ``should_stop`` already set): the same answer on every rank."""
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    last_epoch = max_epochs is not None and max_epochs != -1 and trainer.current_epoch + 1 >= max_epochs
    return (last_epoch and batch_idx + 1 >= trainer.num_training_batches) or trainer.should_stop


def training_ends_after_epoch(trainer: "pl.Trainer") -> bool:
    """In ``on_train_epoch_end``: whether the fit ends with this epoch."""
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    return (max_epochs is not None and max_epochs != -1 and trainer.current_epoch + 1 >= max_epochs) or trainer.should_stop


def save_last_on_stop(trainer: "pl.Trainer") -> str | None:
    """Write one ``last.ckpt`` at this step (a collective: every rank calls it) and return its path.

    A checkpoint callback with a ``save_now(trainer)`` method (CrashSafeCheckpoint) saves itself;
    otherwise ``last.ckpt`` goes into the directory of the first ``ModelCheckpoint``, where
    ``--ckpt_path last`` finds it (a ``save_last="link"`` symlink there is replaced, not written
    through). None: no checkpoint callback (checkpointing is off).
    """
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
    for callback in callbacks:
        save_now: Callable[[pl.Trainer], str | None] | None = getattr(callback, "save_now", None)
        if callable(save_now):
            return save_now(trainer)
    if not callbacks or callbacks[0].dirpath is None:
        return None
    callback = callbacks[0]
    path = os.path.join(str(callback.dirpath), f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
    if trainer.is_global_zero and os.path.islink(path):
        os.remove(path)
    trainer.save_checkpoint(path)
    return path


class StopOnSignal(Callback):
    """On SIGTERM / SIGINT: all ranks stop after the same step, save one ``last.ckpt``, exit status 1.

    Args:
        check_seconds: under DDP, about how often (wall time) the ranks agree on whether to stop.
        max_check_steps: the most steps between two such checks.
        save: writes the checkpoint at a stop (every rank calls it) and returns its path;
            default :func:`save_last_on_stop`.
    """

    def __init__(self, check_seconds: float = 1.0, max_check_steps: int = 1000,
                 save: Callable[["pl.Trainer"], str | None] | None = None) -> None:
        if not check_seconds >= 0:
            raise ValueError(f"check_seconds must be >= 0, got {check_seconds!r}.")
        if not (isinstance(max_check_steps, int) and max_check_steps >= 1):
            raise ValueError(f"max_check_steps must be a positive integer, got {max_check_steps!r}.")
        self.check_seconds = float(check_seconds)
        self.max_check_steps = max_check_steps
        self._save = save or save_last_on_stop
        self._noted: int = 0  # the signal noted on this rank (0: none)
        self._noted_at = 0.0
        self._previous: dict[int, Any] = {}
        self._check_every = 1  # steps between two checks (the same on every rank)
        self._steps_since_check = 0
        self._last_check = 0.0
        self._rank = 0
        self._saving = False
        self._abort_after_save = False
        self._stop: tuple[str, int, str | None] | None = None  # (signal, step, checkpoint) agreed, not yet raised
        self.clock: Callable[[], float] = time.perf_counter
        """The clock of the step timing and of a repeated Ctrl+C (seconds; a test injects its own)."""

    # ------------------------------------------------------------------ handlers
    def _install(self) -> None:
        """Replace the SIGTERM / SIGINT handlers (after Lightning registered its own, at fit start)."""
        if self._previous:
            return
        for signum in HANDLED:
            try:
                self._previous[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: leave the signals alone
                break

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            try:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            except ValueError:
                pass
        self._previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        now = self.clock()
        if signum == signal.SIGINT and self._noted and now - self._noted_at > REPEAT_SECONDS:
            if self._saving:  # never abort a checkpoint half-written: abort right after it
                self._abort_after_save = True
                return
            self._restore()  # a second Ctrl+C: stop now, without waiting for the step
            raise KeyboardInterrupt
        if self._noted:
            return
        self._noted, self._noted_at = int(signum), now
        where = f" (rank {self._rank})" if self._rank else ""
        print(f"lit-constrained{where}: {HANDLED[signal.Signals(signum)]} received: finishing the step, then "
              "saving last.ckpt (Ctrl+C again to abort).", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the decision
    def _proposal(self, trainer: "pl.Trainer") -> int:
        """Rank 0's next check interval K (the module docstring's formula); other ranks propose 0."""
        if not trainer.is_global_zero:
            return 0
        now = self.clock()
        per_step = (now - self._last_check) / max(self._steps_since_check, 1)
        if per_step <= 0.0:
            return min(self.max_check_steps, 2 * self._check_every)
        return max(1, min(self.max_check_steps, 2 * self._check_every, math.ceil(self.check_seconds / per_step)))

    def _agreed_signal(self, trainer: "pl.Trainer") -> int:
        """The signal every rank stops on (0: none), decided identically on every rank."""
        if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return self._noted
        self._steps_since_check += 1
        if self._steps_since_check < self._check_every:
            return 0
        votes = torch.tensor([self._noted, self._proposal(trainer)], dtype=torch.int64,
                             device=trainer.strategy.root_device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        code, self._check_every = (int(v) for v in votes.tolist())
        self._check_every = max(1, self._check_every)
        self._steps_since_check = 0
        self._last_check = self.clock()
        return code

    # ------------------------------------------------------------------ hooks
    def on_sanity_check_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._rank = trainer.global_rank
        self._install()

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._rank = trainer.global_rank
        self._install()
        self._last_check = self.clock()
        self._steps_since_check = 0

    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stop is not None:
            return
        code = self._agreed_signal(trainer)
        if code:
            name = HANDLED.get(signal.Signals(code), signal.Signals(code).name)
            self._saving = True
            try:
                self._stop = (name, trainer.global_step, self._save(trainer))
            finally:
                self._saving = False
            if self._abort_after_save:
                self._restore()
                raise KeyboardInterrupt

    def _raise_pending(self, trainer: "pl.Trainer") -> None:
        """Raise the agreed stop (rank 0 with the one-line message, the other ranks silently)."""
        if self._stop is None:
            return
        name, step, path = self._stop
        self._stop = None
        if not trainer.is_global_zero:
            raise TrainingInterrupted(1)
        if path is None:
            raise TrainingInterrupted(f"lit-constrained: {name} received: stopped after step {step}; nothing saved "
                                      "(checkpointing is off).")
        raise TrainingInterrupted(f"lit-constrained: {name} received: stopped after step {step}, saved {path}; "
                                  "resume with --ckpt_path last (or the path).")

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        self._raise_pending(trainer)

    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.state.fn == "fit":
            self._raise_pending(trainer)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not training_ends_after_epoch(trainer):
            self._raise_pending(trainer)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._stop is not None and trainer.is_global_zero:
            name, step, path = self._stop
            print(f"lit-constrained: {name} received at the run's last step {step}: the run finished"
                  + (f" (saved {path})." if path else "."), file=sys.stderr, flush=True)
        self._stop = None

    # The handlers stay until the fit's teardown (a signal during the last collectives or the shutdown
    # must not reach Lightning's handler, which broadcasts); after an exception Lightning's signal
    # connector puts back the handlers from before the fit, and this callback only forgets its own.
    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._previous = {}

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage == "fit":  # a new fit: nothing noted, checks from step 1
            self._noted, self._stop, self._check_every, self._steps_since_check = 0, None, 1, 0
            self._abort_after_save = False

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._restore()
