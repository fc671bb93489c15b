"""Count the host syncs an operation causes, for the sync-budget tests.

A "host sync" is an op whose result the host must wait for: reading a scalar out of a tensor
(``aten._local_scalar_dense``: ``float(t)``, ``t.item()``, ``bool(t)``, ``if t:``) and ops whose output
shape depends on the data (``aten.nonzero``, ``torch.where(cond)``, and boolean-mask indexing ``t[mask]``). On a GPU each
one stalls the stream; on the CPU they are free, so the tests count them with a dispatch mode instead.

    with SyncCounter() as syncs:
        optimizer.step(...)
    assert syncs.count <= 2, syncs.calls
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.nonzero_static.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten._unique2.default,
})


_INDEX_OPS = frozenset({torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default})


def _has_bool_index(args: tuple) -> bool:
    """Boolean-mask indexing (``t[mask]``): its output size depends on the data (a sync on a GPU)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


class SyncCounter(TorchDispatchMode):
    """A dispatch mode that records every host-syncing aten op run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.calls.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in SYNC_OPS or (func in _INDEX_OPS and _has_bool_index(args)):
            self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))
