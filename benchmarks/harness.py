"""How the benchmarks time things: quiet Lightning output, a per-step timer callback, and interleaved
blocks with medians (A, B, C, A, B, C, ...: load changes on a shared machine hit every candidate alike).

The scripts run from ``benchmarks/`` (``python benchmarks/bench_x.py``), so they import this module as
``harness``.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch


def quiet() -> None:
    """Silence warnings and Lightning's info logging (the benchmarks print their own tables)."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(pl.Callback):
    """Seconds of every training step, ``on_train_batch_start`` to ``on_train_batch_end`` (objective,
    constraints, Jacobian, backward, collectives, optimizer step, logging), in ``times``. On CUDA the
    device is synchronized at both ends, so the time covers the step's kernels."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        synchronize(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        synchronize(pl_module.device)
        self.times.append(time.perf_counter() - self._start)


def interleaved_medians(
    runners: Mapping[str, Callable[[int], Any]],
    repeats: int,
    block: int,
    warmup: int = 0,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Median seconds per call of each runner, timed in interleaved blocks.

    ``runners[name](k)`` does k calls of what is timed (k steps, k Jacobians). First each runner does
    ``warmup`` untimed calls (allocations, first-step state); then ``repeats`` rounds in which each
    runner in turn does ``block`` calls, timed together (the device synchronized at both ends when
    ``device`` is CUDA). Returns, per runner, the median over rounds of (block time / block).
    """
    for run in runners.values():
        if warmup:
            run(warmup)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            if device is not None:
                synchronize(device)
            start = time.perf_counter()
            run(block)
            if device is not None:
                synchronize(device)
            times[name].append((time.perf_counter() - start) / block)
    return {name: statistics.median(t) for name, t in times.items()}


def repeated(fn: Callable[[], Any]) -> Callable[[int], None]:
    """A runner for :func:`interleaved_medians` that calls ``fn()`` k times."""

    def run(calls: int) -> None:
        for _ in range(calls):
            fn()

    return run
