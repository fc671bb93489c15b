"""The tasks' shared model helpers: the MLP builder and dtype names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_constrained.batch import cast_floats

from lit_constrained.tasks.common import mlp, torch_dtype


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


def test_dtype_names_and_cast() -> None:
    assert torch_dtype("float64") is torch.float64
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("half")
    batch = cast_floats({"x": torch.zeros(2, dtype=torch.float64), "i": torch.zeros(2, dtype=torch.long)},
                        torch.float32)
    assert batch["x"].dtype == torch.float32 and batch["i"].dtype == torch.long
