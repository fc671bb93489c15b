"""StepSizeMonitor: reads tau, zeta (the step's diagnostics), f* (optimizer.state) and the lr, logs them every step."""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained.callbacks.step_size import StepSizeMonitor, step_size_values
from lit_constrained.optim.momo import MoMo, MoMoAdam
from tests.helpers.lightning import quiet_trainer


def _one_step(opt: torch.optim.Optimizer, params: list[torch.Tensor], diagnostics: bool = True) -> None:
    loss = sum((p**2).sum() for p in params) + 0.5
    loss.backward()
    if isinstance(getattr(opt, "diagnostics", None), dict):
        opt.step(lambda: loss, diagnostics=diagnostics)
    else:
        opt.step(lambda: loss)


def _floats(values: dict) -> dict[str, float]:
    return {key: float(value) for key, value in values.items()}


# ---------------------------------------------------------------------------- reading the state


def test_reads_momo_state_and_lr() -> None:
    x = torch.ones(3, requires_grad=True)
    opt = MoMo([x], lr=0.7, estimate_lower_bound=True, lower_bound=-1.0)
    _one_step(opt, [x])
    got = step_size_values(opt)
    assert all(isinstance(got[key], torch.Tensor) and got[key].shape == () for key in ("lower_bound", "tau", "zeta"))
    assert _floats(got) == {
        "lower_bound": float(opt.state["global"]["lower_bound"]),  # the current estimate (state)
        "tau": float(opt.diagnostics["tau"]),  # this step's (diagnostics)
        "zeta": float(opt.diagnostics["zeta"]),
        "lr": 0.7,
    }
    assert got["lower_bound"] != -1.0  # the estimate moved
    _one_step(opt, [x], diagnostics=False)  # a step without diagnostics: the estimate only
    assert _floats(step_size_values(opt)) == {"lower_bound": float(opt.state["global"]["lower_bound"]), "lr": 0.7}


def test_several_groups_get_a_suffix_and_the_global_bound_does_not() -> None:
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    opt = MoMoAdam([{"params": [a]}, {"params": [b], "lr": 1e-3}], lr=0.1)
    _one_step(opt, [a, b])
    got = step_size_values(opt)
    assert set(got) == {"lower_bound", "tau/group0", "zeta/group0", "tau/group1", "zeta/group1", "lr/group0", "lr/group1"}
    assert got["lr/group1"] == 1e-3 and float(got["tau/group1"]) == float(opt.diagnostics["tau/group1"])
    assert float(got["tau/group1"]) == pytest.approx(1e-3 / (1 - 0.9))  # the cap of group 1


def test_other_optimizers_and_layouts() -> None:
    x = torch.ones(2, requires_grad=True)
    adam = torch.optim.Adam([x], lr=3e-3)
    _one_step(adam, [x])
    assert step_size_values(adam) == {"lr": 3e-3}  # nothing recorded: only the lr, no error
    assert step_size_values(adam, log_lr=False) == {}

    sgd = torch.optim.SGD([x], lr=0.1)  # a custom layout: top-level scalars and a diagnostics dict
    sgd.state["tau"] = torch.tensor(0.25)
    sgd.state["diagnostics"] = {"zeta": 2.0, "lower_bound": torch.zeros(3), "flag": True}
    sgd.state["other"] = {"tau": "not a number"}
    assert _floats(step_size_values(sgd)) == {"tau": 0.25, "zeta": 2.0, "lr": 0.1}
    assert step_size_values(sgd, keys=("zeta",), log_lr=False) == {"zeta": 2.0}
    sgd.diagnostics = {"zeta": torch.tensor(3.0), "tau": torch.tensor([1.0, 2.0])}  # this step's, preferred
    assert _floats(step_size_values(sgd, log_lr=False)) == {"tau": 0.25, "zeta": 3.0}


@pytest.mark.parametrize(
    "kwargs", [dict(keys=("tau", "")), dict(keys=(1,)), dict(prefix="")]
)
def test_bad_arguments_raise(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="Invalid"):
        StepSizeMonitor(**kwargs)


# ---------------------------------------------------------------------------- in a Trainer


class ManualRegression(pl.LightningModule):
    """Minimal manual-optimization module: opt.step(closure=lambda: loss), as the package's stepper does."""

    def __init__(self, make_optimizer: Any) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Linear(3, 1)
        self.make_optimizer = make_optimizer

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = (self.net(x) - y).pow(2).mean()
        opt.zero_grad()
        self.manual_backward(loss)
        if isinstance(getattr(opt.optimizer, "diagnostics", None), dict):
            opt.step(closure=lambda: loss, diagnostics=True)
        else:
            opt.step(closure=lambda: loss)
        return loss.detach()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.parameters())


def _data(n: int = 64) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    return DataLoader(TensorDataset(x, y), batch_size=8)


def _trainer(tmp_path: Path, callbacks: list, max_steps: int, **kwargs: Any) -> pl.Trainer:
    logger = CSVLogger(tmp_path, name="run", version=0)
    return quiet_trainer(max_steps=max_steps, callbacks=callbacks, logger=logger, log_every_n_steps=1, **kwargs)


def _csv_series(tmp_path: Path) -> dict[str, list[float]]:
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    series: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value not in ("", None) and key != "step":
                series.setdefault(key, []).append(float(value))
    return series


def test_logs_every_step_to_the_logger_and_callback_metrics(tmp_path: Path) -> None:
    torch.manual_seed(0)
    steps = 6
    module = ManualRegression(functools.partial(MoMo, lr=0.5, estimate_lower_bound=True, lower_bound=-5.0))
    trainer = _trainer(tmp_path, [StepSizeMonitor()], steps)
    trainer.fit(module, train_dataloaders=_data())

    optimizer = trainer.optimizers[0]
    metrics = trainer.callback_metrics
    assert float(metrics["step_size/lower_bound"]) == pytest.approx(float(optimizer.state["global"]["lower_bound"]), rel=1e-6)
    assert float(metrics["step_size/tau"]) == pytest.approx(float(optimizer.diagnostics["tau"]), rel=1e-6)
    assert float(metrics["step_size/zeta"]) == pytest.approx(float(optimizer.diagnostics["zeta"]), rel=1e-6)
    assert float(metrics["step_size/lr"]) == 0.5

    series = _csv_series(tmp_path)
    for key in ("step_size/lower_bound", "step_size/tau", "step_size/zeta", "step_size/lr"):
        assert len(series[key]) == steps, key
    # MoMo (rho = 1): the step used is min(lr, zeta), at every logged step
    for tau, zeta, lr in zip(series["step_size/tau"], series["step_size/zeta"], series["step_size/lr"]):
        assert tau == pytest.approx(min(lr, zeta), rel=1e-6)
    # the online estimate moved from the user's start value -5 (f*_1 is the floor)
    assert all(f >= -5.0 for f in series["step_size/lower_bound"]) and series["step_size/lower_bound"][-1] > -5.0


def test_a_plain_torch_optimizer_gives_the_lr_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = ManualRegression(functools.partial(torch.optim.Adam, lr=1e-2))
    trainer = _trainer(tmp_path, [StepSizeMonitor(prefix="adam")], 4)
    trainer.fit(module, train_dataloaders=_data())
    series = _csv_series(tmp_path)
    assert series["adam/lr"] == pytest.approx([1e-2] * 4, rel=1e-6)  # logged as float32
    assert not any(key in series for key in ("adam/tau", "adam/zeta", "adam/lower_bound"))


def test_with_constrained_module_and_momo_adam(tmp_path: Path) -> None:
    """The package's task contract: a ConstrainedModule (manual optimization via its stepper)."""
    from lit_constrained.tasks.curve import CurveData, CurveFit

    torch.manual_seed(0)
    steps = 5
    task = CurveFit(hidden=8, optimizer=functools.partial(MoMoAdam, lr=0.1, estimate_lower_bound=True))
    trainer = _trainer(tmp_path, [StepSizeMonitor()], steps, limit_val_batches=0)
    trainer.fit(task, datamodule=CurveData(num_samples=32, batch_size=16))
    series = _csv_series(tmp_path)
    assert len(series["step_size/tau"]) == steps
    # MoMo-Adam: tau = min(lr / (1 - beta1^k), zeta)
    for k, (tau, zeta) in enumerate(zip(series["step_size/tau"], series["step_size/zeta"]), start=1):
        assert tau == pytest.approx(min(0.1 / (1 - 0.9**k), zeta), rel=1e-6)
    assert series["step_size/lower_bound"][-1] == pytest.approx(float(trainer.optimizers[0].state["global"]["lower_bound"]))


def test_a_resumed_run_continues_the_same_step_sizes(tmp_path: Path) -> None:
    """Lightning checkpoints keep MoMo's loss model (state["global"]): 4 + 4 steps with a resume == 8 straight."""
    from lit_constrained.tasks.curve import CurveData, CurveFit

    class FullBatch(CurveData):  # every step sees the same batch, whatever the epoch bookkeeping on resume
        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.train_set, batch_size=len(self.train_set), shuffle=False)

    def make_task() -> CurveFit:
        torch.manual_seed(0)
        return CurveFit(hidden=8, optimizer=functools.partial(MoMoAdam, lr=0.1, estimate_lower_bound=True))

    def fit(path: Path, steps: int, ckpt: str | None = None) -> tuple[CurveFit, dict[str, list[float]]]:
        task = make_task()
        trainer = _trainer(path, [StepSizeMonitor()], steps, limit_val_batches=0)
        # weights_only=False: the checkpoint holds the optimizer callable (a functools.partial)
        trainer.fit(task, datamodule=FullBatch(num_samples=32), ckpt_path=ckpt, weights_only=False)
        if ckpt is None:
            trainer.save_checkpoint(path / "end.ckpt")
        return task, _csv_series(path)

    straight, s_series = fit(tmp_path / "straight", 8)
    fit(tmp_path / "first", 4)
    resumed, r_series = fit(tmp_path / "resumed", 8, ckpt=str(tmp_path / "first" / "end.ckpt"))
    for key in ("step_size/tau", "step_size/zeta", "step_size/lower_bound"):
        assert r_series[key] == pytest.approx(s_series[key][4:], rel=1e-6), key
    for p, q in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
