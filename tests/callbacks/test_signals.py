"""StopOnSignal on one process: the stop after the signalled step with that step logged, one
``last.ckpt`` whatever the checkpoint callback, the check interval, a repeated Ctrl+C; and
LauncherWatchdog's view of its parent. (Two processes: tests/test_ddp_cli.py.)"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_constrained.callbacks.signals import (
    StopOnSignal,
    TrainingInterrupted,
    training_ends_after_batch,
    training_ends_after_epoch,
)
from lit_constrained.callbacks.watchdog import LauncherWatchdog
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData, CurveFit

from tests.helpers.lightning import MemoryLogger, quiet_trainer

SIGNAL_AT = 5  # the signal arrives during step 6 (global_step 5 at its start)


class SignalAt(pl.Callback):
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == SIGNAL_AT:
            os.kill(os.getpid(), self.signum)


def fit_until_signal(tmp_path: Path, checkpoint: ModelCheckpoint | None, signum: int = signal.SIGTERM
                     ) -> tuple[pl.Trainer, MemoryLogger, TrainingInterrupted]:
    pl.seed_everything(0, verbose=False)
    model = CurveFit(hidden=8, optimizer=partial(SQPAdam, lr=1e-2))
    logger = MemoryLogger()
    callbacks: list[pl.Callback] = [SignalAt(signum), StopOnSignal()]
    if checkpoint is not None:
        callbacks.append(checkpoint)
    trainer = quiet_trainer(max_steps=100, limit_val_batches=0, logger=logger, log_every_n_steps=1,
                            enable_checkpointing=checkpoint is not None, callbacks=callbacks,
                            default_root_dir=str(tmp_path))
    previous = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.fit(model, datamodule=CurveData(num_samples=64, batch_size=16))
    assert signal.getsignal(signum) == previous  # the handlers are given back
    return trainer, logger, info.value


@pytest.mark.parametrize("save_last", [None, "link"])
def test_a_users_model_checkpoint_gets_a_last_checkpoint_at_the_stopped_step(tmp_path: Path, save_last: Any) -> None:
    """A user's ModelCheckpoint (here every 2 steps, top-k files) does not switch off the signal
    handling: last.ckpt in its directory at the stopped step, the stopped step's metrics logged, exit
    status 1. A ``save_last="link"`` symlink is replaced, never written through."""
    own = ModelCheckpoint(dirpath=str(tmp_path / "own"), every_n_train_steps=2, save_top_k=-1, save_last=save_last)
    trainer, logger, stop = fit_until_signal(tmp_path, own)
    step = SIGNAL_AT + 1
    assert trainer.global_step == step
    assert stop.code == f"lit-constrained: SIGTERM received: stopped after step {step}, saved {own.dirpath}/last.ckpt; " \
                        "resume with --ckpt_path last (or the path)."
    last = Path(own.dirpath) / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == step
    if last.is_symlink():  # re-linked by the user's callback, which saved the same step right after
        assert last.resolve().name.endswith(f"step={step}.ckpt")
    for topk in Path(own.dirpath).glob("epoch=*-step=*.ckpt"):  # the user's own files hold their own steps
        assert torch.load(topk, weights_only=False)["global_step"] == int(topk.stem.rsplit("=", 1)[1])
    logged = [s for s, m in logger.records if "Objective/train" in m and "Violation/train" in m]
    assert logged == list(range(step))  # logger step = global step - 1: the stopped step is there


def test_without_checkpointing_the_stop_says_nothing_was_saved(tmp_path: Path) -> None:
    trainer, logger, stop = fit_until_signal(tmp_path, None, signal.SIGINT)
    assert trainer.global_step == SIGNAL_AT + 1
    assert stop.code.startswith(f"lit-constrained: SIGINT received: stopped after step {SIGNAL_AT + 1}; nothing saved")
    assert not list(tmp_path.rglob("*.ckpt"))


def test_the_fit_ends_after_the_last_step_or_epoch_the_same_way_on_every_rank() -> None:
    def trainer(**kwargs: Any) -> Any:
        base = dict(max_steps=-1, max_epochs=3, global_step=4, current_epoch=0, num_training_batches=5, should_stop=False)
        return SimpleNamespace(**{**base, **kwargs})

    assert not training_ends_after_batch(trainer(), batch_idx=4)  # the first epoch's last batch
    assert training_ends_after_batch(trainer(current_epoch=2), batch_idx=4)  # the last epoch's
    assert not training_ends_after_batch(trainer(current_epoch=2), batch_idx=3)
    assert training_ends_after_batch(trainer(max_steps=4), batch_idx=0)
    assert training_ends_after_batch(trainer(should_stop=True), batch_idx=0)
    assert not training_ends_after_batch(trainer(max_epochs=-1), batch_idx=4)
    assert training_ends_after_epoch(trainer(current_epoch=2)) and not training_ends_after_epoch(trainer())


class FakeClock:
    """A clock that reads ``now`` (seconds), moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ranks_meet_about_every_check_seconds() -> None:
    """K_next = min(K_max, 2 K, max(1, ceil(t_check / t_step))) from rank 0's timing; other ranks propose 0.
    On an injected clock, with steps of 2^-8 s (exact in binary): ceil(1 s / 2^-8 s) = 256."""
    clock = FakeClock()
    stop = StopOnSignal(check_seconds=1.0, max_check_steps=1000)
    stop.clock = clock
    rank0 = SimpleNamespace(is_global_zero=True)

    def proposal(check_every: int, steps: int, per_step: float) -> int:
        stop._check_every, stop._steps_since_check = check_every, steps
        stop._last_check = clock.now - steps * per_step
        return stop._proposal(rank0)

    assert proposal(4, 4, 2.0**-8) == 8  # 256 steps fit in a check: at most doubled
    assert proposal(1000, 10, 2.0**-8) == 256
    assert proposal(1000, 10, 2.0**-2) == 4  # 4 steps a second
    assert proposal(1000, 10, 2.0) == 1  # 2 s a step: every step
    assert proposal(1000, 10, 2.0**-20) == 1000  # K_max
    assert proposal(300, 10, 0.0) == 600  # no time measured: doubled
    assert stop._proposal(SimpleNamespace(is_global_zero=False)) == 0
    with pytest.raises(ValueError, match="max_check_steps"):
        StopOnSignal(max_check_steps=0)


def test_a_repeated_sigint_within_seconds_is_the_same_ctrl_c(capsys: pytest.CaptureFixture) -> None:
    """On an injected clock: a SIGINT at most REPEAT_SECONDS (3 s) after the first is the same Ctrl+C;
    a later one aborts, after the checkpoint being written if one is."""
    clock = FakeClock()
    stop = StopOnSignal()
    stop.clock = clock
    stop._on_signal(signal.SIGINT, None)
    assert stop._noted == signal.SIGINT and stop._noted_at == clock.now
    assert capsys.readouterr().err.count("SIGINT received") == 1
    clock.now += 3.0
    stop._on_signal(signal.SIGINT, None)  # the launcher's copy of the terminal's Ctrl+C, 3 s late: no abort
    assert stop._noted == signal.SIGINT and stop._noted_at == clock.now - 3.0 and not stop._abort_after_save
    assert capsys.readouterr().err == ""  # noted once
    clock.now += 0.5
    stop._saving = True
    stop._on_signal(signal.SIGINT, None)  # a second Ctrl+C while last.ckpt is written: right after it
    assert stop._abort_after_save
    stop._saving = False
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl+C, later: abort now
        stop._on_signal(signal.SIGINT, None)


def test_the_clocks_are_the_systems_by_default() -> None:
    assert StopOnSignal().clock is time.perf_counter
    assert LauncherWatchdog().clock is time.monotonic


def test_the_watchdog_watches_only_ranks_a_launcher_started(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not LauncherWatchdog.started_by_a_launcher()  # pytest's parent runs another command
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert LauncherWatchdog.started_by_a_launcher()
    dog = LauncherWatchdog()
    dog._parent = os.getppid()
    assert dog.failure() is None
    dog._parent = 2**22 + 17  # not our parent (any more): re-parented
    assert "launching process" in (dog.failure() or "")


def test_the_watchdog_ends_a_rank_once_a_failure_lasted_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an injected clock, polled every 0.5 s with a 5 s grace: a failure seen at 1.5 s and gone at
    2.5 s ends nothing; one seen again from 4.0 s on ends the rank at 9.0 s, its first poll 5 s later."""
    clock = FakeClock()
    clock.now = 0.0
    dog = LauncherWatchdog(grace_seconds=5.0, poll_seconds=0.5)
    dog.clock = clock
    ended: list[tuple[float, str]] = []

    class Polls:
        """The watch loop's Event: each wait passes its timeout on the clock; set once the rank ended."""

        def wait(self, timeout: float) -> bool:
            clock.now += timeout
            return bool(ended) or clock.now > 60.0

        def is_set(self) -> bool:
            return bool(ended)

    failing = lambda: 1.5 <= clock.now < 2.5 or clock.now >= 4.0  # noqa: E731
    monkeypatch.setattr(dog, "_stop", Polls())
    monkeypatch.setattr(dog, "failure", lambda: "the launching process (pid 7) has ended" if failing() else None)
    monkeypatch.setattr(dog, "_end", lambda failure: ended.append((clock.now, failure)))
    dog._watch()
    assert ended == [(9.0, "the launching process (pid 7) has ended")]
