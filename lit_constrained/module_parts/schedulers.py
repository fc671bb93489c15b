"""When the LR schedulers step: manual optimization leaves it to the module.

A ``ReduceLROnPlateau`` is stepped at the end of every validation during fit, with the validation
metric the module names (``lr_scheduler_monitor``; missing: an error listing the logged metrics); every
other scheduler after every optimizer step that was not skipped, as Lightning's ``"interval": "step"``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau


def optimizer_config(optimizer: Optimizer, scheduler: Any | None) -> Any:
    """What ``configure_optimizers`` returns for ``optimizer`` and an optional ``scheduler``.

    The scheduler config's ``interval`` says when the module steps it (Lightning's
    ``LearningRateMonitor`` reads it): ``"step"`` for every scheduler but ``ReduceLROnPlateau``, which
    keeps Lightning's default, ``"epoch"`` (the default validation cadence). The monitored metric is
    the module's ``lr_scheduler_monitor``, not a ``"monitor"`` key: Lightning drops that key in manual
    optimization."""
    if scheduler is None:
        return optimizer
    if isinstance(scheduler, ReduceLROnPlateau):
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler}}
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def schedulers(trainer: Any) -> list[Any]:
    """The schedulers of ``trainer``'s ``lr_scheduler_configs``."""
    return [config.scheduler for config in trainer.lr_scheduler_configs]


def step_after_optimizer_step(trainer: Any) -> None:
    """Every scheduler but ``ReduceLROnPlateau``, after an optimizer step."""
    for scheduler in schedulers(trainer):
        if not isinstance(scheduler, ReduceLROnPlateau):
            scheduler.step()


def step_at_validation_end(trainer: Any, monitor: str) -> None:
    """Every ``ReduceLROnPlateau``, with the validation metric ``monitor`` (during fit; not in the sanity
    check or a ``trainer.validate``): the metrics logged with ``sync_dist`` are the same on every rank,
    so the lr stays the same too."""
    if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
        return
    plateaus = [s for s in schedulers(trainer) if isinstance(s, ReduceLROnPlateau)]
    if not plateaus:
        return
    metrics = trainer.callback_metrics
    if monitor not in metrics:
        logged = ", ".join(sorted(metrics)) or "none"
        raise KeyError(
            f"ReduceLROnPlateau monitors {monitor!r}, which this validation did not "
            f"log (logged: {logged}). Set the module's lr_scheduler_monitor to one of them."
        )
    value = metrics[monitor]
    for scheduler in plateaus:
        scheduler.step(value)
