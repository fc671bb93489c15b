"""Small Trainer factory for tests."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


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
