"""Shared task helpers: the MLP builder, row batches, the npz cache, dtype names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lit_constrained.tasks.common import RowCollate, cached_arrays, cast_floats, mlp, row_loader, torch_dtype


def test_mlp_shapes_and_parameter_counts() -> None:
    # (in, hidden, depth, out) -> number of weights and biases, counted by hand
    for args, expected in [((1, 32, 3, 1), 64 + 2 * 1056 + 33), ((5, 64, 3, 4), 384 + 2 * 4160 + 260)]:
        net = mlp(*args)
        assert sum(p.numel() for p in net.parameters()) == expected
        assert net(torch.zeros(7, args[0])).shape == (7, args[3])
    assert sum(isinstance(layer, nn.Tanh) for layer in mlp(2, 8, 3, 1)) == 3
    assert isinstance(mlp(2, 8, 1, 1, activation=nn.ReLU)[1], nn.ReLU)
    with pytest.raises(ValueError, match="hidden"):
        mlp(1, 0, 3, 1)
    with pytest.raises(ValueError, match="depth"):
        mlp(1, 8, -1, 1)


def test_row_loader_full_and_minibatch() -> None:
    rows = {"x": torch.arange(10.0)[:, None], "y": torch.arange(10.0) * 2}
    collate = RowCollate(rows, fixed={"anchor": torch.ones(3)})
    full = list(row_loader(10, collate, "full", 0.3, shuffle=True))
    assert len(full) == 1 and torch.equal(full[0]["x"][:, 0], torch.arange(10.0))
    torch.manual_seed(0)
    mini = list(row_loader(10, collate, "minibatch", 0.3, shuffle=True))
    assert [len(b["y"]) for b in mini] == [3, 3, 3, 1]
    x = torch.cat([b["x"][:, 0] for b in mini])
    assert sorted(x.tolist()) == list(range(10))  # one pass over the rows
    for b in mini:
        assert torch.equal(b["y"], 2 * b["x"][:, 0]) and torch.equal(b["anchor"], torch.ones(3))
    with pytest.raises(ValueError, match="same first dimension"):
        RowCollate({"x": torch.zeros(3), "y": torch.zeros(4)})


def test_cached_arrays_round_trip(tmp_path: Path) -> None:
    calls = []

    def generate() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"a": np.arange(4.0), "b": np.eye(2, dtype=bool)}

    first = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    second = cached_arrays("thing", {"n": 4}, generate, tmp_path)
    assert len(calls) == 1
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    cached_arrays("thing", {"n": 5}, generate, tmp_path)  # other arguments: another file
    assert len(calls) == 2 and len(list(tmp_path.glob("thing-*.npz"))) == 2
    cached_arrays("thing", {"n": 4}, generate, None)  # no cache
    assert len(calls) == 3


def test_dtype_names_and_cast() -> None:
    assert torch_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("half")
    batch = cast_floats({"x": torch.zeros(2, dtype=torch.float64), "i": torch.zeros(2, dtype=torch.long)},
                        torch.float32)
    assert batch["x"].dtype == torch.float32 and batch["i"].dtype == torch.long
