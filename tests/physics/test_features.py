"""Fourier features of a box against their closed form, their jet against nested autograd, and a
PINNacle task built with them (its per-point Jacobian against a dense autograd Jacobian)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lit_constrained.jacobians import pointwise_jacobian
from lit_constrained.physics.features import FourierFeatures
from lit_constrained.physics.jets import all_pairs, sequential_jet
from lit_constrained.tasks.common import mlp
from lit_constrained.tasks.pinnacle import HeatPinnacle, PinnacleTask

F64 = torch.float64


def test_the_features_are_sines_and_cosines_of_the_scaled_coordinates() -> None:
    features = FourierFeatures((-1.0, 0.0), (1.0, 5.0), 3, dtype=F64)
    x = torch.tensor([[0.3, 2.0], [-1.0, 5.0]], dtype=F64)
    expected = []
    for point in x.tolist():
        row = []
        for value, (a, b) in zip(point, ((-1.0, 1.0), (0.0, 5.0))):
            s = (value - a) / (b - a)
            for k in (1, 2, 3):
                row += [math.sin(k * math.pi * s), math.cos(k * math.pi * s)]
        expected.append(row)
    torch.testing.assert_close(features(x), torch.tensor(expected, dtype=F64), rtol=0, atol=1e-14)
    assert features.out_features == 12
    assert not list(features.parameters())  # fixed: buffers, nothing to train


def test_a_jet_through_the_features_is_autograds_derivatives() -> None:
    torch.manual_seed(0)
    net = mlp(3, 10, 2, 1, features=FourierFeatures((0.0, 0.0, 0.0), (1.0, 1.0, 5.0), 4)).to(F64)
    x = torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(1)) * torch.tensor([1.0, 1.0, 5.0], dtype=F64)
    z = x.clone().requires_grad_(True)
    u = net(z)[:, 0]
    (g,) = torch.autograd.grad(u.sum(), z, create_graph=True)
    hessian = torch.stack([torch.autograd.grad(g[:, i].sum(), z, retain_graph=True)[0] for i in range(3)], dim=1)
    jet = sequential_jet(net, x, all_pairs(3)).component(0)
    torch.testing.assert_close(jet.value, u.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(jet.gradient, g.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(jet.hessian(), hessian.detach(), rtol=1e-11, atol=1e-11)


def test_a_pinnacle_task_with_features_has_the_dense_jacobian() -> None:
    torch.manual_seed(0)
    task = HeatPinnacle(hidden=8, depth=2, dtype="float64", fourier_features=3)
    assert isinstance(task.net[0], FourierFeatures) and task.net[1].in_features == 18
    x = torch.rand(5, 3, dtype=F64, generator=torch.Generator().manual_seed(2))
    params = list(task.parameters())
    J = pointwise_jacobian(task, params, task.pde_residual, x)
    r = task.pde_residual(x)
    def row(i: int) -> torch.Tensor:  # (the output bias is not in a derivative: zero, as J has it)
        grads = torch.autograd.grad(r[i], params, retain_graph=True, allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])

    dense = torch.stack([row(i) for i in range(5)])
    torch.testing.assert_close(J, dense, rtol=1e-10, atol=1e-12)


def test_features_need_a_box_and_valid_arguments() -> None:
    class Boxless(PinnacleTask):
        box = None

    with pytest.raises(ValueError, match="no box"):
        Boxless(fourier_features=2)
    with pytest.raises(ValueError, match="upper bound"):
        FourierFeatures((0.0,), (0.0,), 2)
    with pytest.raises(ValueError, match="integer >= 1"):
        FourierFeatures((0.0,), (1.0,), 0)
    with pytest.raises(ValueError, match="same length"):
        FourierFeatures((0.0, 0.0), (1.0,), 1)
    assert isinstance(mlp(2, 4, 1, 1)[0], nn.Linear)  # no features: PINNacle's network
