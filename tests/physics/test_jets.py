"""A network's jet (one forward pass of stacked derivative streams) against ordinary autograd's input
derivatives of the same network, and the per-point Jacobian through a jet against a dense autograd
Jacobian of the residual."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import vmap

from lit_constrained.jacobians import pointwise_jacobian
from lit_constrained.physics import derivatives, laplacian
from lit_constrained.physics.jets import Jet, all_pairs, diagonal_pairs, field_jet, sequential_jet
from lit_constrained.tasks.pinnacle import HeatPinnacle, PoissonPinnacle

F64 = torch.float64


def network(activation: type[nn.Module], k: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 12), activation(), nn.Identity(), nn.Linear(12, 12), activation(),
                         nn.Linear(12, k)).to(F64)


def autograd_derivatives(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value (N, k), gradient (N, k, d), Hessian (N, k, d, d) by nested torch.autograd.grad."""
    z = x.clone().requires_grad_(True)
    u = net(z)
    grads, hessians = [], []
    for c in range(u.shape[1]):
        (g,) = torch.autograd.grad(u[:, c].sum(), z, create_graph=True)
        rows = [torch.autograd.grad(g[:, i].sum(), z, retain_graph=True)[0] for i in range(z.shape[1])]
        grads.append(g)
        hessians.append(torch.stack(rows, dim=1))
    return u, torch.stack(grads, dim=1), torch.stack(hessians, dim=1)


@pytest.mark.parametrize("activation", [nn.Tanh, nn.Sigmoid, nn.SiLU])
@pytest.mark.parametrize("k", [1, 2])
def test_the_jet_is_autograds_derivatives(activation: type[nn.Module], k: int) -> None:
    net = network(activation, k)
    x = torch.rand(9, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    value, gradient, hessian = autograd_derivatives(net, x)
    jet = sequential_jet(net, x, all_pairs(3))
    torch.testing.assert_close(jet.value, value, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(jet.gradient, gradient, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(jet.hessian(), hessian, rtol=1e-11, atol=1e-12)
    diagonal = sequential_jet(net, x, diagonal_pairs(3, [0, 2]))  # only what a Laplacian over x, z needs
    torch.testing.assert_close(diagonal.second.sum(-1), hessian[..., 0, 0] + hessian[..., 2, 2], rtol=1e-11, atol=1e-12)


def test_a_jet_says_what_it_does_not_carry() -> None:
    net = network(nn.Tanh, 2)
    jet = sequential_jet(net, torch.rand(4, 3, dtype=F64), diagonal_pairs(3))
    with pytest.raises(ValueError, match=r"not \(0, 1\)"):
        jet.second_derivative(1, 0)
    with pytest.raises(ValueError, match="scalar"):
        jet.component(0).component(0)
    with pytest.raises(TypeError, match="ReLU"):
        sequential_jet(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), torch.rand(2, 3))


def test_only_supported_networks_and_jet_methods_have_jets() -> None:
    assert field_jet(network(nn.Tanh, 1)) is not None
    assert field_jet(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))) is None
    assert field_jet(lambda x: x.sum(1)) is None
    task = PoissonPinnacle(dtype="float64")
    assert field_jet(task) == task.jet


def test_operators_use_the_jet_inside_a_transform_only_and_agree() -> None:
    net = network(nn.Tanh, 1)
    x = torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    plain = laplacian(net, x)  # an ordinary batch: autograd's double backward
    inside = vmap(lambda z: laplacian(net, z[None])[0])(x)  # inside vmap: the jet
    torch.testing.assert_close(inside, plain, rtol=1e-12, atol=1e-12)
    u, _, hessian = autograd_derivatives(net, x)
    torch.testing.assert_close(plain, hessian.diagonal(dim1=-2, dim2=-1).sum(-1), rtol=1e-12, atol=1e-12)


def dense_jacobian(residual, x: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """Row by row: torch.autograd.grad of each residual value (N backward passes), outside any transform."""
    values = residual(x).reshape(-1)
    rows = []
    for i in range(values.numel()):
        grads = torch.autograd.grad(values[i], params, retain_graph=True, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)]))
    return torch.stack(rows)


@pytest.mark.parametrize("task_class", [PoissonPinnacle, HeatPinnacle])
def test_the_per_point_jacobian_through_a_jet_is_the_dense_one(task_class) -> None:
    torch.manual_seed(0)
    task = task_class(hidden=20, depth=3, dtype="float64")
    params = list(task.parameters())
    x = torch.rand(11, task.input_dim, dtype=F64, generator=torch.Generator().manual_seed(3))
    J = pointwise_jacobian(task, params, task.pde_residual, x, path="func")
    torch.testing.assert_close(J, dense_jacobian(task.pde_residual, x, params), rtol=1e-10, atol=1e-12)


def test_a_task_jet_is_its_forward_and_derivatives() -> None:
    task = HeatPinnacle(hidden=16, depth=2, dtype="float64")
    x = torch.rand(5, 3, dtype=F64)
    jet = task.jet(x, all_pairs(3))
    assert isinstance(jet, Jet) and jet.value.shape == (5,)
    torch.testing.assert_close(jet.value, task(x), rtol=1e-14, atol=1e-14)
    plain = derivatives(task, x)  # outside a transform: autograd
    torch.testing.assert_close(jet.gradient, plain.gradient, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(jet.hessian(), plain.hessian, rtol=1e-11, atol=1e-12)
