"""The base of the tasks' DataModules: numpy arrays generated from the arguments (cached as ``.npz``),
served as dict batches of rows.

A task's data are a few tensors whose first dimension indexes *rows* (grid points, samples, ...) per
split, plus tensors every batch needs whole (the constraint points, the same on every rank). The base
does everything that is not the problem:

* the hyperparameters (``save_hyperparameters``: exactly the subclass's ``__init__`` arguments) and
  the ``batch_mode`` / ``batch_fraction`` check;
* the arrays: :meth:`~RowDataModule.generate` from :meth:`~RowDataModule.generation_args`, cached
  under ``hparams.cache_dir`` when the class names a :attr:`~RowDataModule.cache_name`
  (:func:`~lit_constrained.tasks.cache.cached_arrays`), generated in ``prepare_data`` (rank 0) and
  loaded in ``setup`` (every rank);
* the loaders (:func:`~lit_constrained.tasks.sampling.row_loader`): training batches of all rows
  (``"full"``) or of ``ceil(batch_fraction * rows)`` rows in a seeded, resumable per-epoch shuffle
  (``"minibatch"``), with ``num_workers`` worker processes; validation and test: one batch of all
  the split's rows, in order.

A subclass says which tensors are rows and which are whole in each split (:meth:`~RowDataModule.rows`,
:meth:`~RowDataModule.fixed`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lit_constrained.tasks.cache import cached_arrays
from lit_constrained.tasks.sampling import BatchMode, ResumableLoader, RowCollate, check_batch_mode, row_loader

Split = Literal["train", "val", "test"]


class RowDataModule(L.LightningDataModule, ABC):
    """Arrays generated from the arguments (and cached), served as batches of rows.

    A subclass passes ``batch_mode``, ``batch_fraction`` and ``num_workers`` up, implements
    :meth:`generation_args`, :meth:`generate` and :meth:`rows`, and may override :meth:`fixed` (tensors
    attached whole to every batch of a split) and :meth:`as_tensors` (tensors derived from the arrays).
    Setting :attr:`cache_name` caches the arrays under ``self.hparams.cache_dir`` (``None``: no cache).

    After ``setup``, ``self.arrays`` holds the numpy arrays and ``self.tensors`` the tensors the
    batches are sliced from.

    Args:
        batch_mode: ``"full"`` (every training row in one batch per epoch) or ``"minibatch"``.
        batch_fraction: fraction of the training rows per mini-batch step, in (0, 1].
        num_workers: DataLoader worker processes of the training loader.
    """

    #: name of the cache files (``<cache_name>-<hash>.npz``); ``""``: not cached (cheap, deterministic)
    cache_name: str = ""
    #: raise when the generator's output changes for the same arguments (part of the cache key)
    generator_version: str = "1"

    def __init__(self, batch_mode: BatchMode, batch_fraction: float, num_workers: int) -> None:
        super().__init__()
        check_batch_mode(batch_mode, batch_fraction)
        # the hyperparameters are the subclass's __init__ arguments (the caller's frame), as if it had
        # called save_hyperparameters itself
        caller = inspect.currentframe()
        self.save_hyperparameters(frame=caller.f_back if caller is not None else None)
        self.batch_mode = batch_mode
        self.batch_fraction = float(batch_fraction)
        self.num_workers = num_workers
        self.arrays: dict[str, np.ndarray] = {}
        self.tensors: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ the arrays
    @abstractmethod
    def generation_args(self) -> dict[str, Any]:
        """The generator's arguments (also the cache key)."""

    @abstractmethod
    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        """The task's arrays, generated from ``generation_args()``."""

    def as_tensors(self, arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        """The tensors the batches are sliced from (default: each array as a tensor, memory shared)."""
        return {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in arrays.items()}

    def _load(self) -> dict[str, np.ndarray]:
        args = self.generation_args()
        if not self.cache_name:
            return self.generate(**args)
        cache_dir = self.hparams.get("cache_dir")
        cache_dir = None if cache_dir is None else Path(cache_dir)
        return cached_arrays(self.cache_name, args, lambda: self.generate(**args), cache_dir, self.generator_version)

    def prepare_data(self) -> None:
        """Generate and cache once (rank 0), so other ranks only load."""
        if self.cache_name and not self.tensors:
            self._load()

    def setup(self, stage: str | None = None) -> None:
        if self.tensors:
            return
        self.arrays = self._load()
        self.tensors = self.as_tensors(self.arrays)

    # ------------------------------------------------------------------ the batches
    @abstractmethod
    def rows(self, split: Split) -> dict[str, Tensor]:
        """The tensors of ``split`` indexed by row (the same first dimension), in batch key order."""

    def fixed(self, split: Split) -> dict[str, Tensor]:
        """Tensors attached whole to every batch of ``split`` (default: none)."""
        return {}

    def collate(self, split: Split) -> RowCollate:
        """The collate function of ``split``'s loader: its rows sliced, its fixed tensors whole."""
        return RowCollate(rows=self.rows(split), fixed=self.fixed(split))

    def _n_rows(self, split: Split) -> int:
        return int(next(iter(self.rows(split).values())).shape[0])

    def train_dataloader(self) -> ResumableLoader:
        n = self._n_rows("train")
        return row_loader(n, self.collate("train"), self.batch_mode, self.batch_fraction, True, self.num_workers)

    def _eval_loader(self, split: Split) -> ResumableLoader:
        n = self._n_rows(split)
        if n == 0:
            raise ValueError(f"{type(self).__name__}: the {split} split is empty (n_{split} = 0); set n_{split} >= 1.")
        return row_loader(n, self.collate(split), "full", 1.0, False)

    def val_dataloader(self) -> ResumableLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> ResumableLoader:
        return self._eval_loader("test")
