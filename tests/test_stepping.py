"""The step owner (lit_constrained/stepping.py) and the module's Lightning glue around it: the step
runs against a plain task and injected services (no Trainer), clipping goes through Lightning's
``clip_gradients``, and the LR schedulers are stepped as Lightning users expect."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import Tensor

from lit_constrained.optim import SQPAdam
from lit_constrained.stepping import ConstrainedTask, StepServices, TrainingStepper
from lit_constrained.tasks.curve import CurveData, CurveFit
from tests.helpers.lightning import quiet_trainer

F64 = torch.float64


# --------------------------------------------------------------------------- the narrow interface
class LinearlyConstrainedLeastSquares(torch.nn.Module):
    """min ||x - t||^2 s.t. A x = b: a task that is a plain nn.Module (no Lightning anywhere)."""

    constraints_shared = True

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.x = torch.nn.Parameter(torch.randn(5, generator=gen, dtype=F64))
        self.t = torch.randn(5, generator=gen, dtype=F64)
        self.A = torch.randn(2, 5, generator=gen, dtype=F64)
        self.b = torch.randn(2, generator=gen, dtype=F64)
        self.prepared: list[Any] = []

    def prepare_batch(self, batch: Any) -> Any:
        self.prepared.append(batch)
        return batch

    def objective(self, batch: Any) -> Tensor:
        return (self.x - self.t).pow(2).sum()

    def constraints(self, batch: Any) -> Tensor:
        return self.A @ self.x - self.b

    def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any, rows: slice | None = None) -> Tensor:
        return self.A if rows is None else self.A[rows]


def plain_services(task: torch.nn.Module, optimizer: torch.optim.Optimizer, **overrides: Any) -> StepServices:
    backward = lambda loss: loss.backward()  # noqa: E731
    return StepServices(optimizer=optimizer, optimizer_step=optimizer.step, backward=backward, **overrides)


def test_a_plain_task_steps_without_lightning_and_restores_linear_constraints() -> None:
    """SQP-Adam's full normal step (no safeguard) solves the linearized constraints: for linear ones
    A x+ = b after one step (J Delta x = -c, the tangential part in the null space of A)."""
    task = LinearlyConstrainedLeastSquares()
    assert isinstance(task, ConstrainedTask)
    optimizer = SQPAdam(task.parameters(), lr=1e-2, rho="full", max_normal_step=None)
    stepper = TrainingStepper()
    assert float((task.A @ task.x.detach() - task.b).abs().max()) > 0.1
    for step in range(3):
        result = stepper.step(task, ("batch", step), plain_services(task, optimizer, step_index=step))
        assert not result.skipped
        torch.testing.assert_close(task.A @ task.x.detach(), task.b, rtol=0, atol=1e-12)
    assert task.prepared == [("batch", 0), ("batch", 1), ("batch", 2)]  # the task's batch preparation ran
    assert result.constraints is not None and result.constraints.shape == (2,)


def test_the_step_uses_only_the_services_it_is_given() -> None:
    """Every service is called through the dataclass: backward, the optimizer's step (with the closure
    and what the optimizer requires), clipping, the printer of a skipped batch."""
    task = LinearlyConstrainedLeastSquares()
    optimizer = torch.optim.SGD(task.parameters(), lr=0.1)
    calls: list[str] = []

    def backward(loss: Tensor) -> None:
        calls.append("backward")
        loss.backward()

    def optimizer_step(closure: Any, **kwargs: Any) -> None:
        calls.append(f"step{sorted(kwargs)}")
        optimizer.step(closure)

    def clip(max_norm: float) -> None:
        calls.append(f"clip {max_norm}")

    services = StepServices(optimizer=optimizer, optimizer_step=optimizer_step, backward=backward, clip_gradients=clip)
    TrainingStepper(max_grad_norm=0.5).step(task, None, services)
    assert calls == ["backward", "clip 0.5", "step[]"]  # a torch optimizer gets no constraints/jacobian

    with torch.no_grad():
        task.x[0] = float("nan")
    printed: list[str] = []
    skipped = TrainingStepper(on_nonfinite="skip").step(
        task, None, plain_services(task, optimizer, step_index=7, report=printed.append)
    )
    assert skipped.skipped and printed and "at step 7" in printed[0]


# --------------------------------------------------------------------------- clipping through Lightning
def test_max_grad_norm_clips_through_lightning_as_a_hand_computed_clip(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGD with lr 1 moves the weights by minus the clipped gradient: g * min(1, max_norm / ||g||)."""
    torch.manual_seed(0)
    max_norm = 0.02
    model = CurveFit(hidden=8, optimizer=functools.partial(torch.optim.SGD, lr=1.0), max_grad_norm=max_norm)
    data = CurveData(num_samples=16, batch_size=16)
    data.setup("fit")
    x, y = next(iter(data.train_dataloader()))
    before = [p.detach().clone() for p in model.parameters()]
    grads = torch.autograd.grad(model.objective((x, y)), list(model.parameters()))
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads))
    assert norm > 10 * max_norm  # the clip is active
    expected = [g * (max_norm / (float(norm) + 1e-6)) for g in grads]  # torch's clip coefficient

    seen: list[Any] = []
    original = CurveFit.clip_gradients

    def spy(self: Any, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None) -> None:
        seen.append((gradient_clip_val, gradient_clip_algorithm))
        original(self, optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    monkeypatch.setattr(CurveFit, "clip_gradients", spy)
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, data)
    assert seen == [(max_norm, "norm")]
    for p, p0, g in zip(model.parameters(), before, expected):
        torch.testing.assert_close(p0 - p.detach(), g, rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------- schedulers
class ScriptedValidation(CurveFit):
    """Logs ``val/scripted`` = the next value of a script at each validation (one val batch)."""

    def __init__(self, script: list[float], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.script = script
        self.validations = 0
        self.lr_per_step: list[float] = []

    def evaluation_metrics(self, batch: Any, stage: str) -> dict[str, Tensor]:
        value = self.script[min(self.validations, len(self.script) - 1)]
        return {"scripted": torch.tensor(value)}

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.trainer.sanity_checking:
            self.validations += 1

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.lr_per_step.append(self.optimizers().optimizer.param_groups[0]["lr"])


def plateau_run(script: list[float], steps: int, monitor: str | None = "val/scripted", **trainer: Any) -> ScriptedValidation:
    torch.manual_seed(0)
    plateau = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, factor=0.5, patience=0)
    model = ScriptedValidation(
        script, hidden=8, optimizer=functools.partial(SQPAdam, lr=0.01), lr_scheduler=plateau,
        lr_scheduler_monitor=monitor,
    )
    options = dict(max_steps=steps, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1)
    options.update(trainer)
    quiet_trainer(**options).fit(model, CurveData(num_samples=16, batch_size=16))
    return model


def test_reduce_lr_on_plateau_drops_the_lr_only_when_the_validation_metric_plateaus() -> None:
    """Validation after steps 2, 4, ..., 12 logs 5, 4, 3, 3, 3, 2. patience 0: the lr halves at the
    4th and the 5th validation (no improvement), never between validations, whatever the training
    loss does (it falls at every step here)."""
    model = plateau_run([5.0, 4.0, 3.0, 3.0, 3.0, 2.0], steps=12, num_sanity_val_steps=2)
    assert model.validations == 6  # the sanity check does not count: it is not part of fit's stepping
    lr = 0.01
    expected = [lr] * 8 + [lr / 2] * 2 + [lr / 4] * 2  # the lr each of the 12 steps ran with
    assert model.lr_per_step == pytest.approx(expected, rel=0, abs=0)
    assert model.optimizers().optimizer.param_groups[0]["lr"] == lr / 4  # after the 6th (an improvement)
    assert model.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 6  # stepped once per validation


def test_reduce_lr_on_plateau_watches_the_validation_objective_by_default() -> None:
    from tests.helpers.lightning import MemoryLogger

    logger = MemoryLogger()
    model = plateau_run([1.0], steps=6, monitor=None, logger=logger)
    assert model.lr_scheduler_monitor == "Objective/val"
    scheduler = model.trainer.lr_scheduler_configs[0].scheduler
    logged = logger.series("Objective/val")
    assert scheduler.last_epoch == 3 and len(logged) >= 3  # three validations (and the one at the start)
    assert any(scheduler.best == pytest.approx(value, rel=1e-6) for value in logged[-3:])
    assert model.trainer.lr_scheduler_configs[0].interval == "epoch"  # Lightning's default: no false "step"


def test_a_missing_monitored_metric_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match=r"monitors 'val/nope'.*logged: .*val/scripted.*lr_scheduler_monitor"):
        plateau_run([1.0], steps=4, monitor="val/nope")


def test_other_schedulers_are_stepped_after_every_optimizer_step() -> None:
    torch.manual_seed(0)
    step_lr = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5)
    model = ScriptedValidation([1.0], hidden=8, optimizer=functools.partial(SQPAdam, lr=0.01), lr_scheduler=step_lr)
    trainer = quiet_trainer(max_steps=7, limit_val_batches=0)
    trainer.fit(model, CurveData(num_samples=16, batch_size=4))
    assert model.lr_per_step == [0.01] * 3 + [0.005] * 3 + [0.0025]
    assert trainer.lr_scheduler_configs[0].interval == "step"


def test_a_plateau_scheduler_in_a_fit_without_validation_warns() -> None:
    with pytest.warns(UserWarning, match="does not validate"):
        model = plateau_run([1.0], steps=2, limit_val_batches=0)
    assert model.lr_per_step == [0.01, 0.01]


def test_the_finiteness_flag_is_one_reduction_and_an_overflowing_sum_is_rechecked():
    """The fused flag sums each tensor (a NaN/inf anywhere makes the sum non-finite); finite entries
    whose float32 sum overflows read as "not finite" there, and the entrywise recheck clears them."""
    from lit_constrained.stepping import TrainingStepper

    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    f, c = torch.tensor(1.0), torch.zeros(2)
    big = torch.full((2, 3), 3e38)  # finite, but the sum overflows float32
    assert not bool(TrainingStepper._all_finite(f, c, big, [p]))
    assert TrainingStepper._entrywise_finite(f, c, big, [p])
    for bad in (float("nan"), float("inf")):
        J = torch.zeros(2, 3)
        J[1, 2] = bad
        assert not bool(TrainingStepper._all_finite(f, c, J, [p]))
        assert not TrainingStepper._entrywise_finite(f, c, J, [p])
    p.grad[0] = float("nan")
    assert not bool(TrainingStepper._all_finite(f, c, None, [p])) and not TrainingStepper._entrywise_finite(f, c, None, [p])
    p.grad[0] = 1.0
    assert bool(TrainingStepper._all_finite(f, c, torch.zeros(2, 3), [p]))
    spectral = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))  # an FNO's weights are complex
    spectral.grad = torch.tensor([1 + 1j, complex(0.0, float("nan"))], dtype=torch.complex64)
    assert not bool(TrainingStepper._all_finite(f, c, None, [p, spectral]))  # the NaN is in an imaginary part
    assert not TrainingStepper._entrywise_finite(f, c, None, [p, spectral])
    spectral.grad[1] = 2 - 1j
    assert bool(TrainingStepper._all_finite(f, c, None, [p, spectral]))
