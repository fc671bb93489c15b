"""Crashes made cheap and nothing silently wrong: the rolling ``last.ckpt`` (CrashSafeCheckpoint), the
``--ckpt_path last`` check, SIGTERM/SIGINT, bounded ``on_nonfinite: skip``, complex constraints and
mixed precision."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor

from lit_constrained.callbacks.checkpointing import (
    CrashSafeCheckpoint,
    MissingCheckpointError,
    resolve_last,
    with_default_checkpoint,
)
from lit_constrained.callbacks.signals import StopOnSignal
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData, CurveFit

from tests.helpers.lightning import quiet_trainer

REPO = Path(__file__).resolve().parents[2]


def curve(**kwargs: Any) -> tuple[CurveFit, CurveData]:
    pl.seed_everything(0, verbose=False)
    return CurveFit(hidden=8, optimizer=partial(SQPAdam, lr=1e-2), **kwargs), CurveData(num_samples=64, batch_size=16)


# --------------------------------------------------------------------------- the rolling last.ckpt


def test_fixed_interval_saves_on_multiples_and_at_the_end(tmp_path: Path) -> None:
    saved: list[int] = []

    class Spy(CrashSafeCheckpoint):
        def _save_last(self, trainer: pl.Trainer) -> None:
            super()._save_last(trainer)
            saved.append(trainer.global_step)

    model, data = curve()
    trainer = quiet_trainer(max_steps=10, callbacks=[Spy(dirpath=str(tmp_path), every_n_steps=4)],
                            enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    assert saved == [4, 8, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 10


def test_adaptive_interval_keeps_saving_under_the_overhead_budget() -> None:
    """N = ceil(t_save / (overhead * t_step)): a save 100x a step at 5 % gives N = 2000, the smallest N
    whose overhead t_save / (N t_step) is within the budget."""
    cb = CrashSafeCheckpoint(overhead=0.05)
    cb.save_seconds = [0.1]
    cb._step_seconds, cb._steps_timed = 0.001 * 50, 50
    interval = cb.proposed_interval()
    assert interval == 2000
    assert 0.1 / (interval * 0.001) <= 0.05 + 1e-12 < 0.1 / ((interval - 1) * 0.001)  # the smallest such N
    cb.save_seconds = [2e-5]  # a save at 2 % of a step: every step
    assert cb.proposed_interval() == 1
    cb.save_seconds = [1e3]
    assert cb.proposed_interval() == cb.max_every_n_steps
    fixed = CrashSafeCheckpoint(every_n_steps=7)
    fixed.save_seconds, fixed._step_seconds, fixed._steps_timed = [1e3], 1e-3, 1
    assert fixed.proposed_interval() == 7


class FakeClock:
    """A clock that moves only when told: ``advance(seconds)``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StepTakes(pl.Callback):
    """Every training step lasts ``seconds`` on ``clock`` (Lightning runs it before the checkpoint callbacks)."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.clock.advance(self.seconds)


def test_adaptive_mode_measures_its_own_overhead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an injected clock a step takes 2^-10 s and a save 2^-8 s (4 steps): at overhead 1/4 the callback
    measures both exactly and saves every N = ceil(2^-8 / (2^-2 2^-10)) = 16 steps, after step 1 (its
    first measurement) and at the end: steps 1, 17, 33 and 40."""
    step, save = 2.0**-10, 2.0**-8
    clock = FakeClock()
    cb = CrashSafeCheckpoint(dirpath=str(tmp_path), overhead=0.25)
    cb.clock = clock
    saved: list[int] = []
    write = cb._save_last_checkpoint

    def timed_write(trainer: pl.Trainer, candidates: Any) -> None:
        write(trainer, candidates)
        saved.append(trainer.global_step)
        clock.advance(save)

    monkeypatch.setattr(cb, "_save_last_checkpoint", timed_write)
    model, data = curve()
    trainer = quiet_trainer(max_steps=40, callbacks=[StepTakes(clock, step), cb], enable_checkpointing=True,
                            limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    assert saved == [1, 17, 33, 40]
    assert cb.interval == 16 and cb.mean_step_seconds() == step
    assert cb.save_seconds == [save] * 4 and cb.num_saves == 4 and cb.total_save_seconds == 4 * save
    assert clock.now == 40 * step + 4 * save
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 40


def test_the_clock_is_perf_counter_by_default() -> None:
    assert CrashSafeCheckpoint().clock is time.perf_counter


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="every_n_steps"):
        CrashSafeCheckpoint(every_n_steps=0)
    with pytest.raises(ValueError, match="overhead"):
        CrashSafeCheckpoint(overhead=1.5)


def test_defaults_add_a_checkpoint_when_unconfigured_and_signal_handling_always() -> None:
    added = with_default_checkpoint({"callbacks": None})
    assert added is not None and len(added) == 1 and isinstance(added[0], CrashSafeCheckpoint)
    assert added[0].signals is not None  # the crash-safe checkpoint handles the signals itself
    off = with_default_checkpoint({"enable_checkpointing": False})
    assert off is not None and [type(cb) for cb in off] == [StopOnSignal]
    own = pl.callbacks.ModelCheckpoint()
    with_own = with_default_checkpoint({"callbacks": [own]})
    assert with_own is not None and with_own[0] is own and [type(cb) for cb in with_own[1:]] == [StopOnSignal]
    assert with_default_checkpoint({"callbacks": [own, StopOnSignal()]}) is None
    # a CrashSafeCheckpoint configured with handle_signals=False: the user's choice stands
    assert with_default_checkpoint({"callbacks": [CrashSafeCheckpoint(handle_signals=False)]}) is None


def test_ckpt_path_last_without_a_checkpoint_is_an_error(tmp_path: Path) -> None:
    trainer = quiet_trainer(callbacks=[CrashSafeCheckpoint(dirpath=str(tmp_path))], enable_checkpointing=True)
    with pytest.raises(MissingCheckpointError, match=str(tmp_path)):
        resolve_last(trainer, "last")
    assert resolve_last(trainer, "last-or-fresh") is None
    assert resolve_last(trainer, "some.ckpt") == "some.ckpt"
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert resolve_last(trainer, "last") == "last"
    assert resolve_last(trainer, "last-or-fresh") == "last"


#: ModelCheckpoint's private methods CrashSafeCheckpoint and resolve_last override or call (no public
#: equivalent: see the comments beside them in lit_constrained/callbacks/checkpointing.py)
PRIVATE_MODEL_CHECKPOINT_API = ("_find_last_checkpoints", "_should_skip_saving_checkpoint",
                                "_save_last_checkpoint", "_monitor_candidates")


def test_the_private_checkpoint_hooks_exist() -> None:
    missing = [name for name in PRIVATE_MODEL_CHECKPOINT_API if not callable(getattr(pl.callbacks.ModelCheckpoint, name, None))]
    assert not missing, (
        f"lightning {pl.__version__}: ModelCheckpoint has no {missing}; CrashSafeCheckpoint "
        "(lit_constrained/callbacks/checkpointing.py) overrides or calls them: move it to what replaced them"
    )


def test_fit_ckpt_path_last_finds_the_stable_directory(tmp_path: Path) -> None:
    """A second run (a new logger version) resumes with plain ``Trainer.fit(ckpt_path="last")`` from the
    first run's ``last.ckpt`` in ``<save_dir>/<name>/checkpoints``: Lightning's own lookup of "last" reaches
    CrashSafeCheckpoint's directory (the override of its private ``_find_last_checkpoints``)."""
    from lightning.pytorch.loggers import CSVLogger

    def run(max_steps: int, ckpt_path: str | None) -> pl.Trainer:
        model, data = curve()
        trainer = quiet_trainer(max_steps=max_steps, limit_val_batches=0, enable_checkpointing=True,
                                logger=CSVLogger(str(tmp_path), name="run"),
                                callbacks=[CrashSafeCheckpoint(every_n_steps=2, handle_signals=False)])
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return trainer

    first = run(2, None)
    stable = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert first.checkpoint_callback.last_model_path == str(stable) and stable.is_file()
    second = run(4, "last")
    assert second.logger.version == 1  # a new version directory, the same checkpoint directory
    assert second.ckpt_path is not None and Path(second.ckpt_path) == stable, (
        f"fit(ckpt_path='last') resumed from {second.ckpt_path!r}, not {stable}: Lightning no longer calls "
        "ModelCheckpoint._find_last_checkpoints (overridden by CrashSafeCheckpoint)"
    )
    assert second.global_step == 4


@pytest.mark.slow
def test_cli_ckpt_path_last_without_checkpoint_exits_with_the_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "lit_constrained.cli", "fit", "--config", str(REPO / "configs/curve/sqp_adam.yaml"),
           "--trainer.max_steps", "2", "--ckpt_path", "last"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "no last checkpoint found" in done.stderr and "last-or-fresh" in done.stderr


# --------------------------------------------------------------------------- signals

_SIGNAL_WORKER = """
import os, signal, sys
from functools import partial
import lightning.pytorch as pl
import torch
from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData, CurveFit

class SignalAt(pl.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == 5:
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))

pl.seed_everything(0, verbose=False)
model = CurveFit(hidden=8, optimizer=partial(SQPAdam, lr=1e-2))
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1000, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, limit_val_batches=0,
                     callbacks=[SignalAt(), CrashSafeCheckpoint(dirpath=sys.argv[1], every_n_steps=1000)])
trainer.fit(model, datamodule=CurveData(num_samples=64, batch_size=16))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_signal_saves_last_and_exits_nonzero_with_one_line(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", _SIGNAL_WORKER, str(tmp_path), name], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"lit-constrained: {name} received: stopped after step 6"), done.stderr[-2000:]
    assert "--ckpt_path last" in last_line
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 6


# --------------------------------------------------------------------------- on_nonfinite: skip is bounded


class NaNFromStep(CurveFit):
    """f turns NaN from optimizer step ``start`` on (``where="f"``), or only one gradient does."""

    def __init__(self, start: int = 3, where: str = "f", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start, self.where = start, where

    def objective(self, batch: Any) -> Tensor:
        f = super().objective(batch)
        if self.trainer.global_step < self.start:
            return f
        if self.where == "f":
            return f * float("nan")
        # finite value (0), NaN gradient: d sqrt(x)/dx at 0 is inf, times 0
        return f + 0.0 * torch.sqrt(0.0 * self.net[2].weight.abs().sum())


def test_skip_raises_after_k_consecutive_skips_naming_step_tensor_and_last_values() -> None:
    pl.seed_everything(0, verbose=False)
    model = NaNFromStep(hidden=8, optimizer=partial(SQPAdam, lr=1e-2), on_nonfinite="skip")
    model.stepper.max_consecutive_skips = 4
    trainer = quiet_trainer(max_steps=1000, limit_val_batches=0)
    with pytest.raises(FloatingPointError) as info:
        trainer.fit(model, datamodule=CurveData(num_samples=64, batch_size=16))
    message = str(info.value)
    assert "at step 3" in message and "objective f" in message
    assert "4 consecutive batches skipped" in message
    assert "last finite step 2: f=" in message and "max|c|=" in message
    assert trainer.global_step == 3


def test_a_nonfinite_gradient_is_named_by_parameter() -> None:
    pl.seed_everything(0, verbose=False)
    model = NaNFromStep(where="grad", hidden=8, optimizer=partial(SQPAdam, lr=1e-2))
    trainer = quiet_trainer(max_steps=10, limit_val_batches=0)
    with pytest.raises(FloatingPointError, match=r"at step 3: the gradient of net\.2\.weight \(last finite step 2"):
        trainer.fit(model, datamodule=CurveData(num_samples=64, batch_size=16))


def test_a_finite_step_resets_the_skip_count() -> None:
    from lit_constrained.stepping import TrainingStepper

    stepper = TrainingStepper(on_nonfinite="skip", max_consecutive_skips=3)
    assert stepper.max_consecutive_skips == 3 and stepper.consecutive_skips == 0
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        TrainingStepper(max_consecutive_skips=0)


# --------------------------------------------------------------------------- complex constraints


class ComplexConstraints(CurveFit):
    def constraints(self, batch: Any) -> Tensor:
        c = super().constraints(batch)
        return torch.complex(c, 0.3 * torch.ones_like(c))


def test_complex_constraints_are_rejected_with_the_fix() -> None:
    pl.seed_everything(0, verbose=False)
    model = ComplexConstraints(hidden=8)
    with pytest.raises(ValueError, match=r"complex residuals.*torch\.cat\(\[c\.real, c\.imag\]\)"):
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, datamodule=CurveData(num_samples=64))


# --------------------------------------------------------------------------- mixed precision


def _final_violation(precision: str, max_corrections: int = 3) -> float:
    """max |c| after 150 full-batch SQP-Adam steps on the curve task (fp32 reaches ~1e-5)."""
    pl.seed_everything(0, verbose=False)
    model = CurveFit(hidden=16, optimizer=partial(SQPAdam, lr=1e-2, max_corrections=max_corrections))
    data = CurveData(num_samples=64, batch_size=64)
    quiet_trainer(max_steps=150, precision=precision, limit_val_batches=0).fit(model, datamodule=data)
    with torch.no_grad():
        return float(model.constraints(None).abs().max())


@pytest.mark.slow  # ~10-30 s: CPU bfloat16 autocast is slow
def test_bf16_mixed_keeps_the_constraints_in_float32() -> None:
    fp32 = _final_violation("32-true")
    bf16 = _final_violation("bf16-mixed")
    assert fp32 < 1e-4
    assert bf16 <= 10 * fp32, (bf16, fp32)


@pytest.mark.slow
def test_without_the_float32_constraints_bf16_caps_the_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: constraints under autocast (bfloat16) end 100x+ above fp32 (measured 1e-2 vs 1e-5)."""
    import contextlib

    import lit_constrained.stepping as stepping

    # (the step alone, max_corrections=0: the control measures what bfloat16 residuals do to the step's
    # normal part, which the post-step corrections would otherwise partly hide)
    fp32 = _final_violation("32-true", max_corrections=0)
    monkeypatch.setattr(stepping, "constraint_precision", lambda device: contextlib.nullcontext())
    assert _final_violation("bf16-mixed", max_corrections=0) > 100 * fp32


def test_constraints_run_outside_autocast() -> None:
    from lit_constrained.stepping import constraint_precision

    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
        with constraint_precision(torch.device("cpu")):
            assert layer(x).dtype == torch.float32


@pytest.mark.parametrize("precision", ["16-mixed", "16-true", "bf16-true"])
def test_precisions_that_cap_the_constraints_are_refused(precision: str) -> None:
    from types import SimpleNamespace

    from lit_constrained.module_parts.trainer_checks import check_trainer

    # (on a CPU Lightning itself turns 16-mixed into bf16-mixed: check the rule on the setting itself)
    with pytest.raises(ValueError, match="bf16-mixed"):
        check_trainer(SimpleNamespace(precision=precision), "CurveFit")


def test_bf16_true_is_refused_at_fit() -> None:
    model, data = curve()
    with pytest.raises(ValueError, match="bf16-true"):
        quiet_trainer(max_steps=1, precision="bf16-true", limit_val_batches=0).fit(model, datamodule=data)
