"""The two paths of every operator agree: ordinary autograd on a batch (outside transforms) and torch.func
(inside a transform), for scalar and vector fields, first and second order, and their parameter
gradients (the objective's backward through a Laplacian)."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from lit_constrained.physics import derivatives, divergence, gradient, hessian, laplacian, partial

F64 = torch.float64


def network(k: int) -> torch.nn.Module:
    torch.manual_seed(k)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, k)).to(F64)


def field(net: torch.nn.Module, k: int):
    return (lambda x: net(x)[:, 0]) if k == 1 else net


OPERATORS = {
    "partial": lambda u, x: partial(u, x, "y"),
    "partial2": lambda u, x: partial(u, x, 0, order=2),
    "mixed": lambda u, x: partial(u, x, ("x", "z")),
    "gradient": gradient,
    "hessian": hessian,
    "laplacian": laplacian,
    "laplacian_xy": lambda u, x: laplacian(u, x, dims=("x", "y")),
    "derivatives": lambda u, x: derivatives(u, x).laplacian() + derivatives(u, x, order=1).partial("z"),
}


def inside_a_transform(op, u, x: torch.Tensor) -> torch.Tensor:
    """op at each point under vmap: the torch.func path."""
    return vmap(lambda xi: op(u, xi[None])[0])(x)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("name", list(OPERATORS))
def test_autograd_and_torch_func_paths_agree(name, k):
    net = network(k)
    u = field(net, k)
    x = torch.rand(7, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    op = OPERATORS[name]
    plain = op(u, x)
    transformed = inside_a_transform(op, u, x)
    torch.testing.assert_close(plain, transformed, rtol=1e-12, atol=1e-12)
    # the weights' gradient of a loss on the operator: the same on both paths
    params = list(net.parameters())
    grads = [torch.autograd.grad(value.pow(2).sum(), params, allow_unused=True) for value in (plain, transformed)]
    for a, b, p in zip(*grads, params):  # (None: a parameter the operator does not depend on, e.g. the last bias)
        torch.testing.assert_close(torch.zeros_like(p) if a is None else a, torch.zeros_like(p) if b is None else b,
                                   rtol=1e-10, atol=1e-12)


def test_divergence_paths_agree():
    net = network(3)
    x = torch.rand(5, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(divergence(net, x), inside_a_transform(divergence, net, x), rtol=1e-12, atol=1e-12)


def test_nested_operators_stay_differentiable_on_the_autograd_path():
    """An operator of a field that itself uses an operator: d/dy (du/dx) = the mixed second derivative."""
    net = network(1)
    u = field(net, 1)
    x = torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(3))
    nested = partial(lambda z: partial(u, z, "x"), x, "y")
    torch.testing.assert_close(nested, hessian(u, x)[:, 0, 1], rtol=1e-12, atol=1e-12)
