"""When the LR schedulers step (manual optimization leaves it to the module), and the lr decay the
module adds when no scheduler is named (:func:`default_decay`).

A ``ReduceLROnPlateau`` is stepped at the end of every validation during fit, with the validation
metric the module names (``lr_scheduler_monitor``; missing: an error listing the logged metrics); every
other scheduler after every optimizer step that was not skipped, as Lightning's ``"interval": "step"``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal

from lightning.pytorch.trainer.states import TrainerFn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from ..optim import SQPAdam, SQPHeavyBall

LrDecay = Literal["cosine", "linear", "none"]
LR_DECAYS: tuple[str, ...] = ("cosine", "linear", "none")

FINAL_LR_FRACTION = 0.01
"""The decayed lr at the last step, as a fraction of the optimizer's lr (1e-3 -> 1e-5)."""


def check_lr_decay(value: object) -> LrDecay:
    """``value`` if it is one of :data:`LR_DECAYS`, else a ValueError naming them."""
    if value not in LR_DECAYS:
        raise ValueError(f"Invalid lr_decay={value!r}: 'cosine' (the default), 'linear' or 'none' (a constant lr).")
    return value  # type: ignore[return-value]


def decay_factor(decay: LrDecay, step: int, total: int) -> float:
    r"""The lr at ``step`` of ``total`` as a fraction of the optimizer's lr, from 1 to
    :math:`f = 0.01` (:data:`FINAL_LR_FRACTION`), constant after ``total``:

    * ``"cosine"``: :math:`f + (1 - f)\,(1 + \cos(\pi t / T)) / 2`;
    * ``"linear"``: :math:`1 - (1 - f)\, t / T`;
    * ``"none"``: 1."""
    t = min(step, total) / total
    if decay == "cosine":
        return FINAL_LR_FRACTION + (1.0 - FINAL_LR_FRACTION) * (1.0 + math.cos(math.pi * t)) / 2.0
    if decay == "linear":
        return 1.0 - (1.0 - FINAL_LR_FRACTION) * t
    return 1.0


class RunLength:
    """The run's number of optimizer steps, read once, when the decay first needs it.

    ``read`` is the Trainer's ``estimated_stepping_batches``; it loads the train dataloader when the
    Trainer has not yet, so it is never read in ``configure_optimizers``: there it would set the data up
    before a resumed run's loop state is restored, and a mid-epoch resume under DDP would no longer
    continue bit-identically. The first optimizer step has the data set up; step 0 needs no length."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self._steps: float | None = None

    def __call__(self) -> float:
        if self._steps is None:
            self._steps = float(self._read())
        return self._steps


def _decayed(decay: LrDecay, length: RunLength, step: int) -> float:
    """:func:`decay_factor` at ``step`` of the run's length (1 at step 0 and when the length is not
    known: infinite or < 1)."""
    if step == 0:
        return 1.0
    steps = length()
    if not math.isfinite(steps) or steps < 1:
        return 1.0
    return decay_factor(decay, step, int(steps))


def default_decay(optimizer: Optimizer, decay: LrDecay, steps: Callable[[], float]) -> LRScheduler | None:
    """The schedule a module gives one of the package's projected SQP optimizers (SQP-Adam,
    SQP-heavy-ball) when it names no scheduler: the lr times :func:`decay_factor` over the run's
    ``steps()`` optimizer steps (the Trainer's ``estimated_stepping_batches``, read at the first step:
    :class:`RunLength`), a ``LambdaLR``.

    A ``LambdaLR`` multiplies the optimizer's base lr, so an lr written into the scheduler (the
    Lipschitz callback's, :func:`~lit_constrained.optim.lr_setting.set_lr`) is decayed the same way, and
    a resumed run with a longer Trainer decays over its new length from the step it resumes at (the
    factor is a function of the step, not a state; the scheduler's state_dict holds no length). None (a
    constant lr) for ``"none"`` or for any other optimizer (torch.optim's keep their own lr, so a
    baseline stays plain); a constant lr too when the run's length is not known."""
    if decay == "none" or not isinstance(optimizer, (SQPAdam, SQPHeavyBall)):
        return None
    return LambdaLR(optimizer, functools.partial(_decayed, decay, RunLength(steps)))


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
