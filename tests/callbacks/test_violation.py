"""ConstraintViolationMonitor with a stand-in task that returns {"objective", "constraints"} like
ConstrainedModule; expected values are recomputed with NumPy from the residuals the task produced."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from tests.helpers.lightning import MemoryLogger
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained.callbacks import ConstraintViolationMonitor

NAMES = ("max", "mean", "l1", "l2", "relative")


def _np_metrics(c: np.ndarray) -> dict[str, float]:
    a = np.abs(np.asarray(c, dtype=np.float64).reshape(-1))
    return {"max": a.max(), "mean": a.mean(), "l1": a.sum(), "l2": np.sqrt((a**2).sum())}



class ToyTask(LightningModule):
    """Residuals c = X w: train on a fixed constraint matrix, validate/test on row shards of X."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr
        self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
        self.register_buffer("a_train", torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))
        self.train_residuals: list[np.ndarray] = []

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        opt = self.optimizers()
        c = self.a_train @ self.w
        f = c.square().sum()
        opt.zero_grad()
        self.manual_backward(f)
        opt.step()
        self.train_residuals.append(c.detach().numpy().copy())
        return {"objective": f.detach(), "constraints": c.detach()}

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        (x,) = batch
        c = x @ self.w
        return {"objective": c.square().mean(), "constraints": c}

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        return self.validation_step(batch, batch_idx, dataloader_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))


def _loader(x: torch.Tensor, batch_size: int = 3) -> DataLoader:
    return DataLoader(TensorDataset(x), batch_size=batch_size)


def _trainer(callback: ConstraintViolationMonitor, logger: Logger | None = None, **kwargs: Any) -> Trainer:
    return Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=logger if logger is not None else False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        **kwargs,
    )


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        yield


def test_train_metrics_logged_per_step_from_that_steps_residuals() -> None:
    torch.manual_seed(0)
    task, logger = ToyTask(), MemoryLogger()
    monitor = ConstraintViolationMonitor(NAMES, stages=("train",))
    trainer = _trainer(monitor, logger, max_steps=5, limit_val_batches=0)
    trainer.fit(task, train_dataloaders=_loader(_rows(15, 1)))
    assert len(task.train_residuals) == 5
    expected = [_np_metrics(c) for c in task.train_residuals]
    for name in ("max", "mean", "l1", "l2"):
        got = logger.series(f"Violation/train/{name}")
        assert got == pytest.approx([e[name] for e in expected], rel=1e-6), name
    # relative: ||c_t|| / ||c_0||, c_0 the first step's residuals
    rel = logger.series("Violation/train/relative")
    assert rel == pytest.approx([e["l2"] / expected[0]["l2"] for e in expected], rel=1e-6)
    assert rel[-1] < rel[0]  # the toy problem reduces its violation
    assert not any(k.startswith("Violation/val") for _, m in logger.records for k in m)


def test_val_metrics_are_epoch_values_on_all_residuals_and_skip_sanity_check() -> None:
    torch.manual_seed(0)
    task, logger = ToyTask(), MemoryLogger()
    x_val = _rows(10, 2)
    monitor = ConstraintViolationMonitor(NAMES, stages=("val",))
    trainer = _trainer(monitor, logger, max_epochs=2, num_sanity_val_steps=1)
    trainer.fit(task, train_dataloaders=_loader(_rows(6, 1)), val_dataloaders=_loader(x_val))
    # the last validation ran with the final weights: recompute its residuals independently
    c_final = (x_val @ task.w.detach()).numpy()
    expected = _np_metrics(c_final)
    for name in ("max", "mean", "l1", "l2"):
        series = logger.series(f"Violation/val/{name}")
        assert len(series) == 2, name  # one value per epoch, none from the sanity check
        assert series[-1] == pytest.approx(expected[name], rel=1e-6), name
    # reference: the first (full) validation epoch, not the 1-batch sanity check
    l2 = logger.series("Violation/val/l2")
    rel = logger.series("Violation/val/relative")
    assert rel == pytest.approx([1.0, l2[1] / l2[0]], rel=1e-6)
    assert not any(k.startswith("Violation/train") for _, m in logger.records for k in m)


def test_test_stage_with_two_dataloaders_and_given_reference() -> None:
    task = ToyTask()
    x_a, x_b = _rows(7, 3), _rows(5, 4)
    monitor = ConstraintViolationMonitor(metrics=("l2", "mean", "relative"), references={"test": 2.0})
    results = _trainer(monitor).test(task, dataloaders=[_loader(x_a), _loader(x_b, batch_size=2)], verbose=False)
    w = task.w.detach()
    for idx, x in enumerate((x_a, x_b)):
        expected = _np_metrics((x @ w).numpy())
        got = results[idx]
        assert got[f"Violation/test/l2/dataloader_idx_{idx}"] == pytest.approx(expected["l2"], rel=1e-6)
        assert got[f"Violation/test/mean/dataloader_idx_{idx}"] == pytest.approx(expected["mean"], rel=1e-6)
        assert got[f"Violation/test/relative/dataloader_idx_{idx}"] == pytest.approx(expected["l2"] / 2.0, rel=1e-6)
        assert not any("/max" in k or "/l1" in k for k in got)


def test_validate_twice_resets_epoch_state() -> None:
    task = ToyTask()
    x = _rows(9, 5)
    monitor = ConstraintViolationMonitor(metrics=("l1",), stages=("val",))
    trainer = _trainer(monitor)
    first = trainer.validate(task, dataloaders=_loader(x), verbose=False)[0]["Violation/val/l1"]
    second = trainer.validate(task, dataloaders=_loader(x), verbose=False)[0]["Violation/val/l1"]
    expected = _np_metrics((x @ task.w.detach()).numpy())["l1"]
    assert first == pytest.approx(expected, rel=1e-6)
    assert second == pytest.approx(expected, rel=1e-6)  # not doubled


def test_metrics_live_on_the_callback_on_the_modules_device() -> None:
    task = ToyTask()
    monitor = ConstraintViolationMonitor()
    _trainer(monitor).validate(task, dataloaders=_loader(_rows(4, 6)), verbose=False)
    assert set(monitor.metrics.keys()) == {"val_0"}
    for metric in monitor.metrics["val_0"].values():
        assert metric.device == task.device
        assert metric.sync_on_compute is True
    monitor._stage_metrics("train", 0, task)
    assert all(m.sync_on_compute is False for m in monitor.metrics["train_0"].values())


def test_reference_survives_checkpoint_round_trip() -> None:
    task = ToyTask()
    x = _rows(6, 7)
    monitor = ConstraintViolationMonitor(metrics=("relative",), stages=("val",))
    _trainer(monitor).validate(task, dataloaders=_loader(x), verbose=False)
    norm0 = _np_metrics((x @ task.w.detach()).numpy())["l2"]
    state = monitor.state_dict()
    assert state["references"]["val_0"] == pytest.approx(norm0, rel=1e-6)

    resumed = ConstraintViolationMonitor(metrics=("relative",), stages=("val",))
    resumed.load_state_dict(state)
    with torch.no_grad():
        task.w.mul_(0.5)  # halves every residual
    out = _trainer(resumed).validate(task, dataloaders=_loader(x), verbose=False)[0]
    assert out["Violation/val/relative"] == pytest.approx(0.5, rel=1e-6)
    assert resumed.state_key == monitor.state_key


class NoConstraintsTask(ToyTask):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        (x,) = batch
        return {"objective": (x @ self.w).square().mean(), "constraints": None}


class PlainOutputTask(ToyTask):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        (x,) = batch
        return (x @ self.w).square().mean()


def test_no_constraints_logs_nothing_and_plain_output_warns_once() -> None:
    out = _trainer(ConstraintViolationMonitor()).validate(
        NoConstraintsTask(), dataloaders=_loader(_rows(4, 8)), verbose=False
    )[0]
    assert not any(k.startswith("Violation/") for k in out)
    with pytest.warns(UserWarning, match="no 'constraints' entry") as record:
        out = _trainer(ConstraintViolationMonitor()).validate(
            PlainOutputTask(), dataloaders=_loader(_rows(7, 8)), verbose=False
        )[0]
    assert sum("no 'constraints' entry" in str(w.message) for w in record) == 1
    assert not any(k.startswith("Violation/") for k in out)


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="Unknown violation metric"):
        ConstraintViolationMonitor(metrics=("max", "rms"))
    with pytest.raises(ValueError, match="Invalid stages"):
        ConstraintViolationMonitor(stages=("train", "validate"))
    with pytest.raises(ValueError, match="norm order"):
        ConstraintViolationMonitor(norm_order=3)
    with pytest.raises(ValueError, match="Invalid source"):
        ConstraintViolationMonitor(source="residual")
    with pytest.raises(ValueError, match="no train values"):
        ConstraintViolationMonitor(stages=("train",), source="validation_constraints")
    with pytest.raises(ValueError, match="unknown stage"):
        ConstraintViolationMonitor(references={"validation": 1.0})
    with pytest.raises(ValueError, match=">= 0"):
        ConstraintViolationMonitor(references={"val": -1.0})
    monitor = ConstraintViolationMonitor()
    with pytest.raises(ValueError, match="1-D tensor of residuals"):
        monitor._constraints_from({"constraints": [1.0, 2.0]}, "val")
    assert math.isclose(ConstraintViolationMonitor(norm_order=float("inf")).norm_order, math.inf)


def test_configurable_from_yaml_with_jsonargparse() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ConstraintViolationMonitor, "monitor")
    cfg = parser.parse_string(
        "monitor:\n  metrics: [max, relative]\n  stages: [val]\n  norm_order: inf\n  references: {val: 2.0}\n"
    )
    monitor = ConstraintViolationMonitor(**cfg.monitor.as_dict())
    assert monitor.metric_names == ("max", "relative")
    assert monitor.stages == ("val",)
    assert monitor.norm_order == math.inf
    assert monitor.references == {"val": 2.0}
    with pytest.raises(Exception, match="rms"):
        parser.parse_string("monitor:\n  metrics: [rms]\n")


@pytest.mark.ddp
def test_ddp_spawn_val_is_synced_over_shards_and_train_is_not_summed() -> None:
    """2 CPU processes: each rank validates half of the rows; train residuals are identical per rank."""
    task = ToyTask(lr=0.0)  # weights stay put, so the parent can recompute every residual
    x_val = _rows(10, 9)  # DistributedSampler: 5 rows per rank (batches of 3 and 2)
    monitor = ConstraintViolationMonitor(NAMES)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(task, train_dataloaders=_loader(_rows(8, 1), batch_size=2), val_dataloaders=_loader(x_val))
    got = {k: float(v) for k, v in trainer.callback_metrics.items()}
    w = task.w.detach()
    val = _np_metrics((x_val @ w).numpy())
    train = _np_metrics((task.a_train @ w).numpy())
    for name in ("max", "mean", "l1", "l2"):
        assert got[f"Violation/val/{name}"] == pytest.approx(val[name], rel=1e-6), name
        assert got[f"Violation/train/{name}"] == pytest.approx(train[name], rel=1e-6), name
    assert got["Violation/val/relative"] == pytest.approx(1.0, rel=1e-6)
    assert got["Violation/train/relative"] == pytest.approx(1.0, rel=1e-6)


def test_with_constrained_module_imposed_and_all_point_families() -> None:
    """The real task contract: CurveFit trained by SQP-Adam; Violation/* from the 3 imposed anchors,
    residual/* from the residual at all 101 validation points (one name, one meaning)."""
    from lit_constrained.optim import SQPAdam
    from lit_constrained.tasks.curve import CurveData, CurveFit

    class CurveFitAllPoints(CurveFit):
        def validation_constraints(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return (self.net(x) - y).squeeze(-1)

    torch.manual_seed(0)
    task = CurveFitAllPoints(hidden=8, optimizer=functools.partial(SQPAdam, lr=1e-2))
    data = CurveData(num_samples=32, batch_size=16)
    logger = MemoryLogger()
    imposed = ConstraintViolationMonitor(NAMES)
    everywhere = ConstraintViolationMonitor(NAMES, source="validation_constraints")
    assert everywhere.stages == ("val", "test")
    trainer = Trainer(
        accelerator="cpu", devices=1, callbacks=[imposed, everywhere], logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, max_steps=4,
        num_sanity_val_steps=0,
    )
    trainer.fit(task, datamodule=data)

    # train: the last step's (rank-mean) training residuals, m = 3 anchors
    assert task.last_step is not None and task.last_step.constraints is not None
    c_train = task.last_step.constraints.numpy()
    assert c_train.shape == (3,)
    expected = _np_metrics(c_train)
    for name in ("max", "mean", "l1", "l2"):
        assert logger.series(f"Violation/train/{name}")[-1] == pytest.approx(expected[name], rel=1e-5), name
    assert len(logger.series("Violation/train/l2")) == 4
    assert not any(k.startswith("residual/train") for _, m in logger.records for k in m)
    # val, at the final weights: the 3 anchors (Violation) and all 101 validation points (residual)
    x_val, y_val = data.val_set.tensors
    with torch.no_grad():
        c_anchor = (task.net(task.anchor_x).squeeze(-1) - task.anchor_y).numpy()
        c_all = (task.net(x_val) - y_val).squeeze(-1).numpy()
    for family, c in (("Violation", c_anchor), ("residual", c_all)):
        expected = _np_metrics(c)
        for name in ("max", "mean", "l1", "l2"):
            assert logger.series(f"{family}/val/{name}")[-1] == pytest.approx(expected[name], rel=1e-5), (family, name)
    # the module's own headline max equals the callbacks' max of the same family
    assert logger.series("Violation/val")[-1] == pytest.approx(logger.series("Violation/val/max")[-1], rel=1e-6)
    assert logger.series("residual/val")[-1] == pytest.approx(logger.series("residual/val/max")[-1], rel=1e-6)
