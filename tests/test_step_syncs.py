"""Host syncs of the training step (issue 16, item 5): the step owner makes at most ONE per step.

A host sync (``float(t)``, ``bool(t)``, ``t.item()``, data-dependent shapes) stalls the stream on an
accelerator; on the CPU it is free, so ``SyncCounter`` (a dispatch mode) counts the ops instead. A
whole Lightning fit of the curve example runs with a counter around every ``TrainingStepper.step``
and a nested counter around the optimizer's own ``step`` (the optimizer's syncs belong to the
optimizer's budget, tested with the optimizers): nested dispatch modes both see an op run under the
inner one, so the step owner's syncs are ``outer - inner``. Its budget: the one fused flag (finite f,
c, J and gradient), on every step, logging or not.

The counts of the logging (``training_step`` minus the stepper: the ``self.log`` calls) and of the
rest of Lightning's batch (from one ``on_train_batch_start`` to the next) are recorded too and
asserted only where they are the stepper's business; ``python tests/test_step_syncs.py`` prints them.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.helpers.sync_counting import SyncCounter  # noqa: E402

from lit_constrained.optim import SQPAdam  # noqa: E402
from lit_constrained.tasks.curve import CurveData, CurveFit  # noqa: E402
from tests.helpers.lightning import MemoryLogger

STEPS = 8
LOG_EVERY = 4  # steps 3 and 7 (0-based) are the logger's


class CountedCurve(CurveFit):
    """The curve example with sync counters around the stepper, the optimizer and training_step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.records: list[dict[str, Any]] = []

    def on_train_start(self) -> None:
        super().on_train_start()
        optimizer = self.optimizers().optimizer
        original_opt_step = optimizer.step
        original_stepper_step = self.stepper.step

        @functools.wraps(original_opt_step)
        def counted_opt_step(*args: Any, **kwargs: Any) -> Any:
            with SyncCounter() as counter:
                out = original_opt_step(*args, **kwargs)
            self._current["optimizer"] = counter.count
            return out

        def counted_stepper_step(*args: Any, **kwargs: Any) -> Any:
            with SyncCounter() as counter:
                out = original_stepper_step(*args, **kwargs)
            self._current["stepper"] = counter.count
            self._current["stepper_calls"] = dict(counter.calls)
            return out

        optimizer.step = counted_opt_step
        self.stepper.step = counted_stepper_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self._current: dict[str, Any] = {"optimizer": 0, "logging_step": self.is_logging_step_safe()}
        with SyncCounter() as counter:
            out = super().training_step(batch, batch_idx)
        self._current["training_step"] = counter.count
        self.records.append(self._current)
        return out

    def is_logging_step_safe(self) -> bool:
        """Lightning's cadence: the logger writes the batches whose (index + 1) is a multiple of n."""
        return (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0


class BatchSyncs(Callback):
    """Syncs from one ``on_train_batch_start`` to the next (the whole batch, Lightning's side included)."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self._counter: SyncCounter | None = None

    def _close(self) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self.counts.append(self._counter.count)
            self._counter = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._close()
        self._counter = SyncCounter()
        self._counter.__enter__()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._close()



def run(optimizer: Any, **module_kwargs: Any) -> tuple[CountedCurve, BatchSyncs]:
    torch.manual_seed(0)
    task = CountedCurve(hidden=16, optimizer=optimizer, **module_kwargs)
    batches = BatchSyncs()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=STEPS, logger=MemoryLogger(), log_every_n_steps=LOG_EVERY,
        callbacks=[batches], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(task, datamodule=CurveData(num_samples=64, batch_size=8))
    return task, batches


OPTIMIZERS = {
    "sqp_adam": functools.partial(SQPAdam, lr=1e-3),  # constraints and Jacobian path
    "torch_adam": functools.partial(torch.optim.Adam, lr=1e-3),  # objective only
    "sqp_adam_clipped": functools.partial(SQPAdam, lr=1e-3),  # with max_grad_norm (Lightning's clip_gradients)
}
MODULE_KWARGS = {"sqp_adam_clipped": {"max_grad_norm": 0.1}}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_step_owner_makes_one_host_sync_per_step(name: str) -> None:
    task, _ = run(OPTIMIZERS[name], **MODULE_KWARGS.get(name, {}))
    assert len(task.records) == STEPS
    for step, record in enumerate(task.records):
        own = record["stepper"] - record["optimizer"]
        assert own <= 1, (name, step, record)
    if name == "torch_adam":  # Adam (foreach, not capturable) reads its step counters on the host:
        assert all(r["optimizer"] > 0 for r in task.records)  # the inner counter sees them, and they are subtracted


def _table() -> None:  # pragma: no cover - a report for the README / the lead
    for name, optimizer in OPTIMIZERS.items():
        task, batches = run(optimizer, **MODULE_KWARGS.get(name, {}))
        print(f"{name}: step, logging step?, stepper (own), optimizer, logging (training_step - stepper), whole batch")
        for step, (r, whole) in enumerate(zip(task.records, batches.counts)):
            own = r["stepper"] - r["optimizer"]
            print(f"  {step} {r['logging_step']!s:5} {own} {r['optimizer']} {r['training_step'] - r['stepper']} {whole}")


if __name__ == "__main__":
    _table()
