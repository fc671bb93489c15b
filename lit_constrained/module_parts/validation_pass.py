"""A validation outside Lightning's loop: the batches as Lightning's validation feeds them, and the pass
at the initial weights that starts the validation curves at step 0 (where the training curves start).

Lightning validates only after the first training steps (its sanity check is not logged), so the
module runs this pass at the start of training (``validate_at_start``), and the end-of-fit summary
runs the same batches at the final weights when the run's last validation was not at the last step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from ..metrics.functional import violation_max
from .evaluation import evaluate
from .step_logging import part_violations
from .tags import OBJECTIVE, RESIDUAL, VIOLATION, tag
from .tensorboard import write_scalars


def batch_limit(limit: int | float, loader: Any) -> float:
    """How many batches of ``loader`` Lightning's ``limit_val_batches`` lets a validation see (an int:
    that many; a fraction: ``int(fraction * len(loader))``, at least 1, as Lightning counts them)."""
    if isinstance(limit, int):
        return limit
    if limit >= 1.0:
        return math.inf
    try:
        return max(1, int(limit * len(loader)))
    except TypeError:  # an iterable without a length
        return math.inf


def overrides_hook(datamodule: pl.LightningDataModule, name: str) -> bool:
    """Whether the DataModule defines ``name`` itself (LightningDataModule's raises)."""
    return getattr(type(datamodule), name, None) is not getattr(pl.LightningDataModule, name, None)


def as_loader_list(loaders: Any) -> list[Any]:
    """One validation loader or several (a list or tuple), as a list."""
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def validation_batches(trainer: Any, loaders: Sequence[Any]) -> Iterator[Any]:
    """The batches of ``loaders`` as Lightning's validation loop hands them to ``validation_step``: at
    most ``limit_val_batches`` of each (:func:`batch_limit`), moved to the device by the strategy
    (with the batch-transfer hooks) and cast by the precision plugin (e.g. 64-true's float64 cast).
    Evaluate each inside ``trainer.precision_plugin.val_step_context()``, as the loop does."""
    for index, loader in enumerate(loaders):
        limit = batch_limit(trainer.limit_val_batches, loader)
        for batch in loader if math.isinf(limit) else itertools.islice(loader, int(limit)):
            batch = trainer.strategy.batch_to_device(batch, dataloader_idx=index)
            yield trainer.precision_plugin.convert_input(batch)


def validate_at_start(module: Any) -> bool:
    """Write the validation values at the initial weights at step 0: the headline tags and the task's
    metrics, reduced over the ranks (mean of the batch means, max of the maxima). The loaders are the
    DataModule's ``val_dataloader()`` or those given to ``fit``; none, or ``limit_val_batches=0``: nothing
    is written. Returns whether it validated."""
    trainer = module.trainer
    datamodule = getattr(trainer, "datamodule", None)
    loaders: Any = None
    if datamodule is not None and overrides_hook(datamodule, "val_dataloader"):
        loaders = datamodule.val_dataloader()
    elif trainer.val_dataloaders is not None:
        loaders = trainer.val_dataloaders
    if loaders is None or trainer.limit_val_batches == 0:
        return False
    sums: dict[str, Tensor] = {}
    maxima: dict[str, Tensor] = {}
    batches = 0
    was_training = module.training
    module.eval()
    try:
        for batch in validation_batches(trainer, as_loader_list(loaders)):
            with trainer.precision_plugin.val_step_context():
                f, c, r, metrics = evaluate(module, batch, "val")
            batches += 1
            for key, value in {tag(OBJECTIVE, "val"): f, **{f"val/{k}": v for k, v in metrics.items()}}.items():
                value = torch.as_tensor(value, dtype=torch.float64, device=f.device)
                sums[key] = sums.get(key, 0.0) + value
            peaks = {tag(VIOLATION, "val"): c, tag(RESIDUAL, "val"): r}
            if c is not None:
                peaks.update(part_violations(module.imposed_layout, c, "val"))
            for key, value in peaks.items():
                if value is not None and value.numel():
                    peak = violation_max(value).double()
                    maxima[key] = torch.maximum(maxima[key], peak) if key in maxima else peak
    finally:
        module.train(was_training)
    if not batches:
        return False
    names = list(sums) + list(maxima)
    means = trainer.strategy.reduce(torch.stack([sums[k] for k in sums]) / batches, reduce_op="mean")
    peaks = torch.stack([maxima[k] for k in maxima]) if maxima else means.new_zeros(0)
    peaks = trainer.strategy.all_gather(peaks).reshape(-1, len(maxima)).amax(0) if maxima else peaks
    numbers = torch.cat([means.reshape(-1), peaks.reshape(-1)]).tolist()
    write_scalars(trainer, dict(zip(names, numbers)), step=0)
    return True
