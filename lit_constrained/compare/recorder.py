"""EpochRecorder: the per-epoch history of one comparison run, written to a JSON file.

After every training epoch (validation has run by then) it records

* ``train_objective``: the mean of the epoch's training-step objectives (the mini-batch estimates);
* ``val_<name>`` for every ``val/<name>`` metric (the task's test metrics), ``val_objective`` (the
  full objective), ``val_violation_max`` (the residual at all validation points) and
  ``val_imposed_violation``, at the weights reached at the end of the epoch (see :func:`record_key`);
* ``violation_max``: :math:`\\max_i |c_i(x)|` of the m IMPOSED constraints at the end-of-epoch weights
  (``constraints(batch)`` on the last training batch: the constraint points are fixed);
* ``step`` (optimizer steps so far) and ``time_per_step_s`` (the epoch's mean wall time of a training
  step: f, c, J, backward and the optimizer step, without data loading or validation).

The same numbers go to the TensorBoard logger under ``epoch/<name>`` with the epoch as x axis. The
history is written when the fit ends and, with the exception, when it fails (e.g. a non-finite
objective), so a diverged run still has its curve up to the failure.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lit_constrained.batch import as_task_sees_it

from .records import write_json


def _number(value: Any) -> float:
    if isinstance(value, Tensor):
        value = value.detach()
        value = value.item() if value.numel() == 1 else float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


#: The module's validation tags ``<Family>/val`` and their record keys (``val/<name>`` maps to ``val_<name>``).
VAL_FAMILIES = {"Objective": "val_objective", "residual": "val_violation_max", "Violation": "val_imposed_violation"}


def record_key(metric: str) -> str | None:
    """The history key of a logged validation metric, None for other metrics.

    ``val/<name>`` (the task's evaluation metrics; older versions also logged ``val/objective`` and
    ``val/violation_max`` this way) becomes ``val_<name>``; ``Objective/val`` ``val_objective``,
    ``residual/val`` (max residual at all validation points) ``val_violation_max`` and
    ``Violation/val`` (max |c| of the imposed constraints) ``val_imposed_violation``.
    """
    family, _, stage = metric.partition("/")
    if family == "val" and stage:
        return "val_" + stage
    if stage == "val":
        return VAL_FAMILIES.get(family)
    return None


class EpochRecorder(pl.Callback):
    """Record per-epoch objective, test metrics and constraint violation to ``history_path`` (JSON).

    Args:
        history_path: where the JSON list of per-epoch records is written.
        log_to_tensorboard: also add the records as ``epoch/<name>`` scalars (x axis: epoch).
    """

    def __init__(self, history_path: str, log_to_tensorboard: bool = True) -> None:
        super().__init__()
        self.history_path = str(history_path)
        self.log_to_tensorboard = log_to_tensorboard
        self.history: list[dict[str, float]] = []
        self.fit_seconds = float("nan")
        self._objectives: list[float] = []
        self._step_seconds: list[float] = []
        self._step_start = 0.0
        self._fit_start = 0.0
        self._last_batch: Any = None
        self._validated = False

    # ------------------------------------------------------------------ timing and step values
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_start = time.perf_counter()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._objectives = []
        self._step_seconds = []
        self._validated = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validated = True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_seconds.append(time.perf_counter() - self._step_start)
        if isinstance(outputs, dict) and outputs.get("objective") is not None:
            self._objectives.append(_number(outputs["objective"]))
        self._last_batch = as_task_sees_it(pl_module, batch)

    # ------------------------------------------------------------------ the epoch record
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record: dict[str, float] = {
            "epoch": float(trainer.current_epoch + 1),
            "step": float(trainer.global_step),
            "train_objective": sum(self._objectives) / len(self._objectives) if self._objectives else math.nan,
            "time_per_step_s": sum(self._step_seconds) / len(self._step_seconds) if self._step_seconds else math.nan,
            "violation_max": self._imposed_violation(pl_module),
        }
        for key, value in trainer.callback_metrics.items():
            name = record_key(key)
            if self._validated and name is not None:  # else stale values of an earlier epoch
                record[name] = _number(value)
        self.history.append(record)
        if self.log_to_tensorboard:
            self._log(trainer, record)

    def _imposed_violation(self, pl_module: pl.LightningModule) -> float:
        constraints = getattr(pl_module, "constraints", None)
        if self._last_batch is None or constraints is None:
            return math.nan
        with torch.inference_mode(False), torch.enable_grad():
            c = constraints(self._last_batch)
        if c is None or not isinstance(c, Tensor) or c.numel() == 0:
            return math.nan
        return float(c.detach().abs().max())

    @staticmethod
    def _log(trainer: pl.Trainer, record: dict[str, float]) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        epoch = int(record["epoch"])
        for logger in trainer.loggers:
            if not isinstance(logger, TensorBoardLogger):
                continue
            for key, value in record.items():
                if key not in ("epoch", "step") and math.isfinite(value):
                    logger.experiment.add_scalar(f"epoch/{key}", value, global_step=epoch)

    # ------------------------------------------------------------------ output
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._write(exception)

    def _write(self, exception: BaseException | None) -> None:
        self.fit_seconds = time.perf_counter() - self._fit_start if self._fit_start else math.nan
        write_json(
            self.history_path,
            {
                "history": self.history,
                "fit_seconds": self.fit_seconds,
                "exception": None if exception is None else f"{type(exception).__name__}: {exception}",
            },
        )
