"""Small Trainer factory for tests."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger


def quiet_trainer(**kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


class MemoryLogger(Logger):
    """Keeps every (step, metrics) pair it is given, on every rank (no rank-zero filter); its presence
    also makes Lightning convert the logged values, as a real logger does."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.records.append((int(step or 0), {k: float(v) for k, v in metrics.items()}))

    def series(self, key: str) -> list[float]:
        return [m[key] for _, m in self.records if key in m]
