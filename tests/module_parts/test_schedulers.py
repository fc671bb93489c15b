"""module_parts.schedulers: the interval each scheduler is declared with, and a ReduceLROnPlateau
stepped at validation end with the monitored metric (or an error listing what was logged)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

from lit_constrained.module_parts.schedulers import optimizer_config, step_after_optimizer_step, step_at_validation_end


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)


def _trainer(*schedulers: object, metrics: dict[str, torch.Tensor] | None = None, fn: str = TrainerFn.FITTING) -> SimpleNamespace:
    return SimpleNamespace(
        lr_scheduler_configs=[SimpleNamespace(scheduler=s) for s in schedulers], sanity_checking=False,
        state=SimpleNamespace(fn=fn), callback_metrics=metrics or {},
    )


def test_intervals() -> None:
    optimizer = _optimizer()
    assert optimizer_config(optimizer, None) is optimizer
    step = StepLR(optimizer, step_size=1)
    assert optimizer_config(optimizer, step)["lr_scheduler"] == {"scheduler": step, "interval": "step"}
    plateau = ReduceLROnPlateau(optimizer)
    assert optimizer_config(optimizer, plateau)["lr_scheduler"] == {"scheduler": plateau}  # Lightning's "epoch"


def test_plateau_steps_at_validation_end_only_and_others_after_a_step() -> None:
    optimizer = _optimizer()
    step, plateau = StepLR(optimizer, step_size=1, gamma=0.5), ReduceLROnPlateau(optimizer, patience=0, factor=0.1)
    trainer = _trainer(step, plateau, metrics={"Objective/val": torch.tensor(1.0)})
    optimizer.step()  # (no gradient: the weights stay) the step the schedulers follow
    step_after_optimizer_step(trainer)
    assert optimizer.param_groups[0]["lr"] == 0.5  # StepLR only
    step_at_validation_end(trainer, "Objective/val")  # the first value: the plateau's best
    step_at_validation_end(trainer, "Objective/val")  # no improvement, patience 0: lr x 0.1
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    step_at_validation_end(_trainer(plateau, fn=TrainerFn.VALIDATING), "missing")  # not during fit: nothing


def test_a_missing_monitor_names_what_was_logged() -> None:
    trainer = _trainer(ReduceLROnPlateau(_optimizer()), metrics={"val/mse": torch.tensor(1.0)})
    with pytest.raises(KeyError, match=r"monitors 'Objective/val'.*logged: val/mse.*lr_scheduler_monitor"):
        step_at_validation_end(trainer, "Objective/val")


def test_the_default_decay_follows_its_closed_form_and_reads_the_length_at_the_first_step() -> None:
    """The cosine and the linear decay against their formulas (lr to lr / 100 over T steps, constant
    after); the run's length is read once, at the first step past 0, never at construction."""
    import math

    from lit_constrained.module_parts.schedulers import default_decay
    from lit_constrained.optim import SQPAdam

    reads = []

    def length() -> float:
        reads.append(1)
        return 10.0

    for decay, closed_form in (("cosine", lambda t: 0.01 + 0.99 * (1 + math.cos(math.pi * t)) / 2),
                               ("linear", lambda t: 1 - 0.99 * t)):
        reads.clear()
        optimizer = SQPAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        scheduler = default_decay(optimizer, decay, length)
        assert reads == [] and optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
        for step in range(1, 13):
            scheduler.step()
            expected = 1e-3 * closed_form(min(step, 10) / 10)
            assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12), (decay, step)
        assert reads == [1]
    assert default_decay(SQPAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3), "none", length) is None
    assert default_decay(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3), "cosine", length) is None


def test_an_unknown_run_length_keeps_the_lr() -> None:
    from lit_constrained.module_parts.schedulers import default_decay
    from lit_constrained.optim import SQPAdam

    optimizer = SQPAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    scheduler = default_decay(optimizer, "cosine", lambda: float("inf"))
    for _ in range(5):
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 1e-3
