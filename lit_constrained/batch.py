"""Operations on a batch: a tensor or a nested dict / list / tuple / namedtuple of tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor


def map_tensors(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``batch`` with ``fn`` applied to every tensor (containers rebuilt, other leaves kept)."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(v, fn) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def cast_floats(batch: Any, dtype: torch.dtype) -> Any:
    """Cast every floating tensor of a batch to ``dtype`` (integer and bool tensors unchanged)."""
    return map_tensors(batch, lambda t: t.to(dtype) if t.is_floating_point() else t)


def clone_tensors(batch: Any) -> Any:
    """Copies of the batch's tensors made outside inference mode (so autograd can use them)."""
    return map_tensors(batch, Tensor.clone)


def as_task_sees_it(module: Any, batch: Any) -> Any:
    """``batch`` as the module's hooks (objective, constraints) receive it in the training step: a
    ConstrainedModule's ``prepare_batch`` (e.g. its dtype cast) applied; for callbacks that keep a
    batch from ``on_train_batch_end`` and call the task's hooks on it later."""
    prepare = getattr(module, "prepare_batch", None)
    return prepare(batch) if callable(prepare) else batch
