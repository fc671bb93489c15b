"""LineProgress: a progress report for logs that are not a terminal (files, CI, pipes).

A terminal progress bar redraws itself in place; written to a file every redraw stays (Lightning's
bar re-creates itself every epoch, so a full-batch run of 5000 one-batch epochs writes thousands of
bars). This callback prints one plain line at most every ``every_seconds`` seconds and at a few
fractions of the run::

    step 1000/5000 (20%)  8.1 s  train/objective 3.11e-01  train/violation_max 1.28e-05

``lit-constrained`` uses it instead of the bar when stdout is not a terminal and the config chose no
progress bar itself.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress import ProgressBar


class LineProgress(ProgressBar):
    """One line per ``every_seconds`` (and at each tenth of a known total), rank 0 only.

    Args:
        every_seconds: the most seconds between two lines.
    """

    def __init__(self, every_seconds: float = 30.0) -> None:
        super().__init__()
        self.every_seconds = float(every_seconds)
        self._enabled = True
        self._start = 0.0
        self._last = 0.0
        self._next_fraction = 0.1

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def _total_steps(self, trainer: pl.Trainer) -> int | None:
        total = trainer.estimated_stepping_batches
        return int(total) if total not in (None, float("inf")) and total > 0 else None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._last = time.perf_counter()
        self._next_fraction = 0.1

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        now = time.perf_counter()
        step = trainer.global_step
        total = self._total_steps(trainer)
        due_fraction = total is not None and step >= self._next_fraction * total
        if not due_fraction and now - self._last < self.every_seconds:
            return
        if total is not None:
            while self._next_fraction * total <= step:
                self._next_fraction += 0.1
        self._last = now
        of = f"/{total} ({100 * step / total:.0f}%)" if total else ""
        metrics = self.get_metrics(trainer, pl_module)
        shown = "  ".join(
            f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items() if k != "v_num"
        )
        print(f"step {step}{of}  {now - self._start:.1f} s  {shown}", flush=True)
