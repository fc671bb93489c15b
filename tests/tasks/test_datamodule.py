"""The tasks' DataModule base: hyperparameters, the cache, the loaders of each split."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode, EpochShuffleSampler


class Squares(RowDataModule):
    """Rows ``x = 0..n-1`` and ``y = x^2`` per split; an ``anchor`` whole in the training batches."""

    cache_name = "squares"

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.3,
        n_train: int = 10,
        n_val: int = 3,
        cache_dir: str | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.generated = 0

    def generation_args(self) -> dict[str, Any]:
        return {"n_train": self.hparams.n_train, "n_val": self.hparams.n_val}

    def generate(self, n_train: int, n_val: int) -> dict[str, np.ndarray]:
        self.generated += 1
        out = {}
        for split, n in (("train", n_train), ("val", n_val), ("test", 0)):
            out[f"{split}_x"] = np.arange(n, dtype=np.float64)
            out[f"{split}_y"] = np.arange(n, dtype=np.float64) ** 2
        return out

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {key: self.tensors[f"{split}_{key}"] for key in ("x", "y")}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        return {"anchor": torch.ones(2)} if split == "train" else {}


def test_hyperparameters_are_the_subclass_arguments_in_order() -> None:
    dm = Squares(batch_mode="minibatch", n_val=4)
    assert list(dm.hparams.items()) == [
        ("batch_mode", "minibatch"), ("batch_fraction", 0.3), ("n_train", 10), ("n_val", 4),
        ("cache_dir", None), ("num_workers", 0),
    ]
    for bad in (dict(batch_mode="half"), dict(batch_fraction=0.0), dict(batch_fraction=1.5)):
        with pytest.raises(ValueError, match="batch_mode|batch_fraction"):
            Squares(**bad)  # type: ignore[arg-type]


def test_loaders_of_each_split() -> None:
    dm = Squares(batch_mode="full")
    dm.setup()
    (batch,) = list(dm.train_dataloader())
    assert torch.equal(batch["y"], torch.arange(10.0) ** 2) and torch.equal(batch["anchor"], torch.ones(2))
    (val,) = list(dm.val_dataloader())
    assert set(val) == {"x", "y"} and torch.equal(val["x"], torch.arange(3.0))
    with pytest.raises(ValueError, match="Squares: the test split is empty"):
        dm.test_dataloader()

    mini = Squares(batch_mode="minibatch", batch_fraction=0.3, num_workers=0)
    mini.setup()
    loader = mini.train_dataloader()
    assert isinstance(loader.sampler, EpochShuffleSampler)
    batches = list(loader)
    assert [len(b["x"]) for b in batches] == [math.ceil(0.3 * 10)] * 3 + [1]
    x = torch.cat([b["x"] for b in batches])
    assert sorted(x.tolist()) == list(range(10))  # one pass over the rows
    assert all(torch.equal(b["y"], b["x"] ** 2) for b in batches)
    (val,) = list(mini.val_dataloader())  # evaluation: one batch, in order, whatever the mode
    assert torch.equal(val["x"], torch.arange(3.0))


def test_arrays_are_cached_under_cache_dir(tmp_path: Path) -> None:
    first = Squares(cache_dir=str(tmp_path))
    first.prepare_data()
    first.setup()
    assert first.generated == 1 and len(list(tmp_path.glob("squares-*.npz"))) == 1
    second = Squares(cache_dir=str(tmp_path))
    second.prepare_data()
    second.setup()
    assert second.generated == 0  # loaded from the file
    for key, value in first.arrays.items():
        np.testing.assert_array_equal(second.arrays[key], value)
    uncached = Squares(cache_dir=None)
    uncached.setup()
    uncached.setup()  # set up once
    assert uncached.generated == 1 and len(list(tmp_path.glob("*.npz"))) == 1
