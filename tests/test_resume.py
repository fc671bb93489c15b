"""Exact resume: a run killed with SIGKILL and resumed from ``last`` equals the uninterrupted run, and so
does a finished run extended from its final ``last.ckpt`` to a larger ``max_steps`` / ``max_epochs``.

Every task (spring, chemistry, Burgers, Darcy) at a tiny size, full batch and mini-batch: the run is
killed (a real ``SIGKILL`` of its own process) a few steps after its last checkpoint, which lies
mid-epoch in mini-batch mode, then resumed from ``last`` in a new process. The final weights, the
optimizer state and every metric the logger received at every step must equal, bit for bit, those of the
uninterrupted run (CPU, one thread).

This file is also the worker: ``python tests/test_resume.py <task> <mode> <max_steps> <kill_at> <dir>
[--resume]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
MAX_STEPS = 11
KILL_AT = 8  # the process dies at the start of step 9 (0-based 8); the last checkpoint is after step 6
EVERY = 3


# --------------------------------------------------------------------------------------------- worker


def build(task: str, mode: str) -> tuple[Any, Any]:
    """A tiny task and its data module (mini-batch: 4 or 5 batches per epoch)."""
    import lightning.pytorch as pl
    from functools import partial

    from lit_constrained.optim import SQPAdam

    pl.seed_everything(0, verbose=False)
    opt = partial(SQPAdam, lr=1e-3)
    if task == "spring":
        from lit_constrained.tasks.spring import Spring, SpringData

        return Spring(hidden=8, depth=2, optimizer=opt), SpringData(batch_mode=mode, batch_fraction=0.2)
    if task == "chemistry":
        from lit_constrained.tasks.chemistry import Chemistry, ChemistryData

        data = ChemistryData(batch_mode=mode, batch_fraction=0.25, n_ic=4, n_val_ic=1, n_test_ic=1, n_times=8,
                             n_constraints=4, cache_dir=None)
        return Chemistry(hidden=8, depth=1, optimizer=opt), data
    if task == "burgers":
        from lit_constrained.tasks.burgers import Burgers, BurgersData

        data = BurgersData(batch_mode=mode, batch_fraction=0.25, n_train=1, n_val=1, n_test=1, n_x=8, n_t=8,
                           data_rows_per_ic=16, n_constraints=4, cache_dir=None)
        return Burgers(hidden=8, depth=1, n_x=8, optimizer=opt), data
    if task == "darcy":
        from lit_constrained.tasks.darcy import Darcy, DarcyData

        data = DarcyData(batch_mode=mode, batch_fraction=0.25, n_train=4, n_val=1, n_test=1, n_generate=12,
                         grid=8, n_constraints=4, cache_dir=None)
        return Darcy(hidden_channels=2, n_layers=1, n_modes=(4, 4), optimizer=opt), data
    raise ValueError(f"unknown task {task!r}")


def train(task: str, mode: str, max_steps: int, kill_at: int, workdir: Path, resume: bool) -> None:
    """Fit, checkpointing every ``EVERY`` steps; SIGKILL itself at the start of step ``kill_at``
    (-1: never); record the logged training metrics of every step and, at the end, the final state."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import Logger

    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint

    torch.set_num_threads(1)
    records = workdir / "metrics.jsonl"

    class Recorder(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            state = {"model": module.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}
            torch.save(state, workdir / "final.pt")

    class JsonlLogger(Logger):
        """Every ``log_metrics`` call as a JSON line (floats via repr: exact)."""

        name = "jsonl"
        version = 0

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            with records.open("a") as fh:
                fh.write(json.dumps({"step": step, "metrics": {k: float(v) for k, v in metrics.items()}}) + "\n")

    model, data = build(task, mode)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=JsonlLogger(), enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=1,
        callbacks=[Recorder(), CrashSafeCheckpoint(dirpath=str(workdir / "ckpt"), every_n_steps=EVERY)],
    )
    trainer.fit(model, datamodule=data, ckpt_path="last" if resume else None)


# --------------------------------------------------------------------------------------------- tests


def _run_worker(*args: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, __file__, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def _records(workdir: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], {}).update(row["metrics"])  # a step redone after the resume overrides
    return out


def _assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def kill_and_resume(task: str, mode: str, tmp_path: Path) -> tuple[Path, Path]:
    """An uninterrupted run (in this process), and a run SIGKILLed after step 8 and resumed from ``last``
    (step 6) in new processes."""
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    reference.mkdir()
    crashed.mkdir()
    threads = torch.get_num_threads()
    try:  # the uninterrupted run in this process (one subprocess fewer), on one thread like the workers
        train(task, mode, MAX_STEPS, -1, reference, resume=False)
    finally:
        torch.set_num_threads(threads)
    killed = _run_worker(task, mode, MAX_STEPS, KILL_AT, crashed)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (crashed / "final.pt").exists()
    saved = torch.load(crashed / "ckpt" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 6  # the resume point: mid-epoch in mini-batch mode (4-5 batches per epoch)
    resumed = _run_worker(task, mode, MAX_STEPS, -1, crashed, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return reference, crashed


def assert_same_trajectory(reference: Path, crashed: Path) -> None:
    """Final weights and optimizer state, and the value of every metric logged by both runs at every
    step, bit for bit (floats via repr)."""
    _assert_same(torch.load(reference / "final.pt", weights_only=False),
                 torch.load(crashed / "final.pt", weights_only=False), "final")
    expected, got = _records(reference), _records(crashed)
    assert sorted(expected) == list(range(MAX_STEPS)) and all(expected.values())
    for step, metrics in expected.items():
        common = set(metrics) & set(got.get(step, {}))
        assert common, f"step {step}: nothing logged after the resume"
        assert {k: metrics[k] for k in common} == {k: got[step][k] for k in common}, f"step {step}"


def assert_same_metric_names(reference: Path, crashed: Path) -> None:
    expected, got = _records(reference), _records(crashed)
    missing = {step: sorted(set(m) - set(got.get(step, {}))) for step, m in expected.items()}
    missing = {step: names for step, names in missing.items() if names}
    assert not missing, f"metrics logged by the uninterrupted run but not after the resume: {missing}"


@pytest.fixture(scope="module")
def spring_minibatch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return kill_and_resume("spring", "minibatch", tmp_path_factory.mktemp("spring_minibatch"))


def test_spring_minibatch_sigkill_mid_epoch_resumes_exactly(spring_minibatch: tuple[Path, Path]) -> None:
    assert_same_trajectory(*spring_minibatch)


def test_spring_minibatch_resume_logs_the_same_metric_names(spring_minibatch: tuple[Path, Path]) -> None:
    assert_same_metric_names(*spring_minibatch)


def fit_in_process(workdir: Path, resume: bool, **limits: int) -> dict[str, Any]:
    """Spring, mini-batch (5 batches an epoch), the default CrashSafeCheckpoint (adaptive interval, final
    save); the final weights, optimizer state, step and epoch."""
    import lightning.pytorch as pl

    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, data = build("spring", "minibatch")
        model.lr_decay = "none"  # a constant lr: the default decay follows each run's own length
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                             callbacks=[CrashSafeCheckpoint(dirpath=str(workdir))], **limits)
        trainer.fit(model, datamodule=data, ckpt_path="last" if resume else None)
    finally:
        torch.set_num_threads(threads)
    return {"model": model.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
            "global_step": trainer.global_step, "epoch": trainer.current_epoch}


@pytest.mark.parametrize(
    ("first", "longer"),
    [({"max_steps": 10, "max_epochs": -1}, {"max_steps": 13, "max_epochs": -1}),  # ends with an epoch
     ({"max_steps": 7, "max_epochs": -1}, {"max_steps": 13, "max_epochs": -1}),  # ends mid-epoch
     ({"max_epochs": 2}, {"max_epochs": 3})],
    ids=["max_steps_at_epoch_end", "max_steps_mid_epoch", "max_epochs"],
)
def test_a_finished_run_extended_from_its_last_checkpoint_equals_the_longer_run(
    first: dict[str, int], longer: dict[str, int], tmp_path: Path
) -> None:
    """The final last.ckpt is written at the last step's end (an on_train_end save resumed with
    max_steps ran one epoch's shuffle off: epoch e + 1 instead of e)."""
    reference = fit_in_process(tmp_path / "reference", resume=False, **longer)
    finished = fit_in_process(tmp_path / "extended", resume=False, **first)
    assert finished["global_step"] < reference["global_step"]
    extended = fit_in_process(tmp_path / "extended", resume=True, **longer)
    _assert_same(reference, extended, "extended run")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "mode"),
    [("spring", "full"), ("chemistry", "full"), ("chemistry", "minibatch"), ("burgers", "full"),
     ("burgers", "minibatch"), ("darcy", "full"), ("darcy", "minibatch")],
)
def test_sigkill_and_resume_is_exact(task: str, mode: str, tmp_path: Path) -> None:
    assert_same_trajectory(*kill_and_resume(task, mode, tmp_path))


if __name__ == "__main__":
    _task, _mode, _steps, _kill, _dir = sys.argv[1:6]
    train(_task, _mode, int(_steps), int(_kill), Path(_dir), resume="--resume" in sys.argv[6:])
