"""module_parts.validation_pass: as many validation batches as Lightning's own validation loop takes,
each through the strategy's device transfer and the precision plugin's cast."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained.module_parts.validation_pass import as_loader_list, batch_limit, validation_batches


@pytest.mark.parametrize("limit", [1, 3, 25, 0.1, 0.25, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("length", [4, 7, 10])
def test_batch_limit_is_lightnings_count(limit: int | float, length: int) -> None:
    # Lightning's own rule for limit_val_batches (it refuses a fraction that leaves no batch)
    expected = _parse_num_batches(RunningStage.VALIDATING, length, limit) if limit * length >= 1 else 1
    assert min(batch_limit(limit, range(length)), length) == expected


def test_batch_limit_of_an_iterable_without_a_length() -> None:
    assert batch_limit(0.5, iter(range(10))) == math.inf
    assert batch_limit(2, iter(range(10))) == 2


class _Recorder:
    """A strategy and precision plugin that record what they were given."""

    def __init__(self) -> None:
        self.moved: list[tuple[int, Any]] = []

    def batch_to_device(self, batch: Any, dataloader_idx: int = 0) -> Any:
        self.moved.append((dataloader_idx, batch))
        return batch

    def convert_input(self, batch: Any) -> Any:
        return [t.double() for t in batch]


def test_validation_batches_limits_each_loader_and_casts() -> None:
    recorder = _Recorder()
    trainer = SimpleNamespace(limit_val_batches=2, strategy=recorder, precision_plugin=recorder)
    first = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=2)
    second = DataLoader(TensorDataset(torch.arange(3.0)), batch_size=1)
    batches = list(validation_batches(trainer, as_loader_list([first, second])))
    assert [index for index, _ in recorder.moved] == [0, 0, 1, 1]  # 2 batches of each loader
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0], [2.0, 3.0], [0.0], [1.0]]
    assert all(b[0].dtype == torch.float64 for b in batches)  # the plugin's cast


def test_one_loader_is_a_list_of_one() -> None:
    loader = DataLoader(TensorDataset(torch.zeros(2)))
    assert as_loader_list(loader) == [loader] and as_loader_list((loader, loader)) == [loader, loader]
