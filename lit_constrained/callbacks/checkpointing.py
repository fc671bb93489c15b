"""Crash-safe checkpointing: a ``last.ckpt`` often enough that a crash loses little, rarely enough that
saving costs little, and a clean stop on SIGTERM / SIGINT.

:class:`CrashSafeCheckpoint` is a ``ModelCheckpoint`` that keeps one rolling ``last.ckpt`` (no top-k
files) in a directory that does not change between runs (``<save_dir>/<name>/checkpoints`` of the first
logger, or ``<default_root_dir>/checkpoints``), so ``--ckpt_path last`` finds it after a crash. The
``lit-constrained`` command adds one to every run that has checkpointing enabled and no
``ModelCheckpoint`` of its own, and a :class:`~lit_constrained.callbacks.signals.StopOnSignal` to every
run whose callbacks do not handle signals (a user's ``ModelCheckpoint`` does not switch them off).

When to save (``every_n_steps=None``, the default): the save interval adapts so that saving costs at
most ``overhead`` (5 %) of the training time. With ``t_save`` the measured duration of a save and
``t_step`` the measured mean duration of a training step (excluding saves),

.. math::

    N = \\max\\left(1, \\left\\lceil \\frac{t_\\text{save}}{\\text{overhead} \\cdot t_\\text{step}}
    \\right\\rceil\\right), \\qquad \\frac{t_\\text{save}}{N\\, t_\\text{step}} \\le \\text{overhead},

re-estimated after every save (running means). At most ``t_save / overhead`` seconds of work (20 saves'
worth) are lost in a crash. A first ``last.ckpt`` is written after step 1, the final one after the
run's last step.

Under DDP a save is a collective (every rank takes part), so whether a step saves must be the same
decision on every rank: it depends on the step count and N only, and N is rank 0's estimate, broadcast
to every rank at each save (the ranks' own timings differ, and a save entered by one rank only
deadlocks the run).

The final save happens at the end of the run's last training step (``max_steps`` reached, or the
last batch of the last epoch), the point every periodic save uses: a run extended from it (a larger
``max_steps`` or ``max_epochs``) takes exactly the steps of an uninterrupted longer run. (A save after
the fit loop has closed the epoch, at ``on_train_end``, resumes one epoch's shuffle off under
``max_steps``: Lightning restores it as an epoch already consumed. It is kept only for runs that end
otherwise, e.g. by early stopping.)

Signals (``handle_signals=True``): the :class:`~lit_constrained.callbacks.signals.StopOnSignal`
behaviour, saving through this callback: all ranks stop after the same step, ``last.ckpt`` is written,
the step is logged, and the process exits with status 1 and a one-line message saying where the
checkpoint is and how to resume.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lit_constrained.callbacks.signals import StopOnSignal, TrainingInterrupted, training_ends_after_batch

__all__ = ["CrashSafeCheckpoint", "MissingCheckpointError", "TrainingInterrupted", "resolve_last",
           "handles_signals", "stable_checkpoint_dir", "with_default_checkpoint"]


def stable_checkpoint_dir(trainer: "pl.Trainer") -> str:
    """``<save_dir>/<name>/checkpoints`` of the trainer's first logger (no version: the same for every
    run of the experiment), or ``<default_root_dir>/checkpoints`` without a logger."""
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        name = logger.name if logger.name else ""
        return os.path.join(str(save_dir), str(name), "checkpoints")
    return os.path.join(str(trainer.default_root_dir), "checkpoints")


class CrashSafeCheckpoint(ModelCheckpoint):
    """A rolling ``last.ckpt`` every N training steps (N adaptive by default), after the last step and
    on SIGTERM/SIGINT.

    Args:
        dirpath: where ``last.ckpt`` goes (default: :func:`stable_checkpoint_dir`).
        every_n_steps: a fixed interval in optimizer steps; ``None`` (default) adapts it to keep the
            saving cost at most ``overhead`` of the training time.
        overhead: the target fraction of training time spent saving (adaptive mode), in (0, 1).
        max_every_n_steps: upper bound of the adaptive interval (bounds the work a crash loses when
            saving is slow relative to a step).
        handle_signals: stop, save and exit on SIGTERM/SIGINT
            (:class:`~lit_constrained.callbacks.signals.StopOnSignal`, saving through this callback).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_steps: int | None = None,
        overhead: float = 0.05,
        max_every_n_steps: int = 10_000,
        handle_signals: bool = True,
    ) -> None:
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
            raise ValueError(f"every_n_steps must be a positive integer or None (adaptive), got {every_n_steps!r}.")
        if not 0.0 < overhead < 1.0:
            raise ValueError(f"overhead must lie in (0, 1), got {overhead!r}.")
        if max_every_n_steps < 1:
            raise ValueError(f"max_every_n_steps must be >= 1, got {max_every_n_steps!r}.")
        # no top-k files and no epoch/validation saves: only the rolling last.ckpt, saved by the hooks below
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, every_n_epochs=0)
        self.every_n_steps = every_n_steps
        self.overhead = float(overhead)
        self.max_every_n_steps = int(max_every_n_steps)
        self.handle_signals = handle_signals
        self.signals = StopOnSignal(save=self.save_now) if handle_signals else None
        self.interval = every_n_steps or 1
        self.save_seconds: list[float] = []  # the last 20 saves' durations (the interval's estimate)
        self.total_save_seconds = 0.0
        self.num_saves = 0
        self._step_seconds = 0.0
        self._steps_timed = 0
        self._last_batch_end: float | None = None
        self._last_saved_step = -1
        self.clock: Callable[[], float] = time.perf_counter
        """The clock the step and save durations are read from (seconds; a test injects its own)."""

    @property
    def state_key(self) -> str:
        return "CrashSafeCheckpoint"

    # ------------------------------------------------------------------ where
    # Lightning resolves fit(ckpt_path="last") before any callback hook runs, by calling this private
    # method of every ModelCheckpoint (no public hook, no public "where is the last checkpoint"): the
    # override is what points that lookup at the stable directory. If Lightning renames it, "last" looks
    # in the versioned directory and starts fresh with a warning: tests/callbacks/test_checkpointing.py::
    # test_the_private_checkpoint_hooks_exist and ::test_fit_ckpt_path_last_finds_the_stable_directory fail
    def _find_last_checkpoints(self, trainer: "pl.Trainer") -> set[str]:
        if self.dirpath is None:
            self.dirpath = stable_checkpoint_dir(trainer)
        return super()._find_last_checkpoints(trainer)

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = stable_checkpoint_dir(trainer)
        super().setup(trainer, pl_module, stage)
        if self.signals is not None:
            self.signals.setup(trainer, pl_module, stage)

    # ------------------------------------------------------------------ when
    def mean_step_seconds(self) -> float | None:
        """The measured mean duration of a training step (saves excluded), or None before two steps."""
        return self._step_seconds / self._steps_timed if self._steps_timed else None

    def proposed_interval(self) -> int:
        """N from this process's timings (the module docstring's formula); the current N in fixed mode or
        before a step and a save were timed."""
        step = self.mean_step_seconds()
        if self.every_n_steps is not None or step is None or not self.save_seconds:
            return self.interval
        save = sum(self.save_seconds) / len(self.save_seconds)
        needed = math.ceil(save / (self.overhead * max(step, 1e-9)))
        return max(1, min(self.max_every_n_steps, needed))

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        super().on_train_start(trainer, pl_module)
        # a resumed run starts from a saved step: count the interval from there
        self._last_saved_step = trainer.global_step if trainer.global_step > 0 else -1
        if self.signals is not None:
            self.signals.on_train_start(trainer, pl_module)

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int) -> None:
        if self.signals is not None:
            self.signals.on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._last_batch_end is None:
            self._last_batch_end = self.clock()

    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = self.clock()
        if self._last_batch_end is not None:
            self._step_seconds += now - self._last_batch_end
            self._steps_timed += 1
        if self._due(trainer.global_step) or training_ends_after_batch(trainer, batch_idx):
            self._save_last(trainer)
        if self.signals is not None:
            self.signals.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._last_batch_end = self.clock()

    def _due(self, step: int) -> bool:
        """Fixed interval: every multiple of ``every_n_steps``. Adaptive: after step 1, then whenever
        ``interval`` steps have passed since the last save. The same answer on every rank."""
        if self.every_n_steps is not None:
            return step % self.every_n_steps == 0
        return self._last_saved_step < 0 or step - self._last_saved_step >= self.interval

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.signals is not None:  # only step-based and final saves
            self.signals.on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.signals is not None:
            self.signals.on_validation_start(trainer, pl_module)

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        return

    def on_sanity_check_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.signals is not None:
            self.signals.on_sanity_check_start(trainer, pl_module)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.global_step != self._last_saved_step:  # a run ended otherwise than by its step/epoch limit
            self._save_last(trainer)
        if self.signals is not None:
            self.signals.on_train_end(trainer, pl_module)

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if self.signals is not None:
            self.signals.on_exception(trainer, pl_module, exception)

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self.signals is not None:
            self.signals.teardown(trainer, pl_module, stage)
        super().teardown(trainer, pl_module, stage)

    def save_now(self, trainer: "pl.Trainer") -> str:
        """Write ``last.ckpt`` at this step unless it already was (every rank calls it); its path."""
        if trainer.global_step != self._last_saved_step:
            self._save_last(trainer)
        return self.last_model_path

    def _save_last(self, trainer: "pl.Trainer") -> None:
        # ModelCheckpoint's own private last-checkpoint machinery (_should_skip_saving_checkpoint,
        # _save_last_checkpoint, _monitor_candidates): it has no public "save last.ckpt now", and these keep
        # its bookkeeping (last_model_path, last-v1 naming, the step saved, the loggers told) what Lightning
        # expects. If one is renamed, saving raises AttributeError at the first step (loud), and
        # tests/callbacks/test_checkpointing.py::test_the_private_checkpoint_hooks_exist names it
        if self._should_skip_saving_checkpoint(trainer):
            return
        start = self.clock()
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        elapsed = self.clock() - start
        self.total_save_seconds += elapsed
        self.num_saves += 1
        self.save_seconds = [*self.save_seconds[-19:], elapsed]
        self._last_saved_step = trainer.global_step
        # every rank is here (the decision to save is shared): take rank 0's N, so the next save is too
        self.interval = int(trainer.strategy.broadcast(self.proposed_interval(), src=0))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["interval"] = self.interval
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.interval = int(state_dict.get("interval", self.interval))


def _as_list(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


def has_checkpoint_callback(callbacks: Any) -> bool:
    """Whether a (list of) callback(s) already holds a ``ModelCheckpoint``."""
    return any(isinstance(cb, ModelCheckpoint) for cb in _as_list(callbacks))


def handles_signals(callbacks: Any) -> bool:
    """Whether a (list of) callback(s) decides what SIGTERM/SIGINT do: a StopOnSignal, or a
    CrashSafeCheckpoint (whose ``handle_signals`` is the user's choice)."""
    return any(isinstance(cb, (StopOnSignal, CrashSafeCheckpoint)) for cb in _as_list(callbacks))


def with_default_checkpoint(trainer_config: dict[str, Any]) -> list[Any] | None:
    """The trainer's callbacks plus the package's defaults; None: unchanged.

    * a :class:`CrashSafeCheckpoint` when checkpointing is enabled (``enable_checkpointing`` not
      False) and no ``ModelCheckpoint`` is configured (it handles the signals too);
    * otherwise a :class:`~lit_constrained.callbacks.signals.StopOnSignal` unless a callback already
      handles signals: with a user's ``ModelCheckpoint`` a stop writes ``last.ckpt`` in its
      directory; with checkpointing off it stops cleanly and saves nothing.
    """
    items = _as_list(trainer_config.get("callbacks"))
    if trainer_config.get("enable_checkpointing") is not False and not has_checkpoint_callback(items):
        return items + [CrashSafeCheckpoint()]
    if not handles_signals(items):
        return items + [StopOnSignal()]
    return None


class MissingCheckpointError(FileNotFoundError):
    """``ckpt_path='last'`` with no ``last.ckpt`` to resume from."""


#: the ``ckpt_path`` value that resumes from ``last`` when there is one and starts fresh otherwise
LAST_OR_FRESH = "last-or-fresh"


def resolve_last(trainer: "pl.Trainer", ckpt_path: str | None) -> str | None:
    """Check a ``ckpt_path`` of ``"last"`` before fitting.

    ``"last"`` with no last checkpoint in any ``ModelCheckpoint``'s directory raises
    :class:`MissingCheckpointError` naming the directories (Lightning itself only warns and trains
    from scratch). ``"last-or-fresh"`` is the opt-in to start fresh: it becomes ``"last"`` when a last
    checkpoint exists and ``None`` otherwise. Other values are returned unchanged.
    """
    if ckpt_path not in ("last", LAST_OR_FRESH):
        return ckpt_path
    found: set[str] = set()
    searched: list[str] = []
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint):
            # the very lookup Lightning makes for ckpt_path="last" (private, no public equivalent: see
            # CrashSafeCheckpoint._find_last_checkpoints), so this check and Lightning's resume agree
            found |= {p for p in callback._find_last_checkpoints(trainer) if Path(p).is_file()}
            searched.append(str(callback.dirpath))
    if found:
        return "last"
    if ckpt_path == LAST_OR_FRESH:
        rank_zero_info(f"lit-constrained: no last checkpoint in {searched}: starting fresh.")
        return None
    where = ", ".join(searched) if searched else "nowhere (checkpointing is disabled)"
    raise MissingCheckpointError(
        f"--ckpt_path last: no last checkpoint found (searched {where}). Pass the checkpoint's path, "
        f"or --ckpt_path {LAST_OR_FRESH} to resume when one exists and start fresh otherwise."
    )
