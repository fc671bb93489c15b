"""The tasks' shared model helpers: the MLP builder and dtype names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_constrained.batch import cast_floats
import torch.autograd.forward_ad as fwAD

from lit_constrained.tasks.common import mlp, mlp_with_tangent, torch_dtype


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


def test_mlp_with_tangent_matches_forward_mode_ad_and_its_weight_gradients() -> None:
    """The hand-carried tangent against torch's forward-mode AD: values, and d/dweights of both."""
    torch.manual_seed(0)
    net = mlp(5, 12, 3, 4).double()
    x = torch.randn(9, 5, dtype=torch.float64)
    tangent = torch.randn(9, 5, dtype=torch.float64)
    with fwAD.dual_level():
        out, direction = fwAD.unpack_dual(net(fwAD.make_dual(x, tangent)))
    mine, my_direction = mlp_with_tangent(net, x, tangent)
    torch.testing.assert_close(mine, out, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(my_direction, direction, rtol=1e-13, atol=1e-13)
    weights = list(net.parameters())
    reference = torch.autograd.grad((direction.pow(2).sum() + out.sum()), weights)
    gradients = torch.autograd.grad((my_direction.pow(2).sum() + mine.sum()), weights)
    for g, r in zip(gradients, reference):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_mlp_with_tangent_rejects_other_layers() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with pytest.raises(TypeError, match="ReLU.*forward_ad"):
        mlp_with_tangent(net, torch.zeros(1, 2), torch.ones(1, 2))
