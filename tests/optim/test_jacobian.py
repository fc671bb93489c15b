"""The Jacobian helper against a dense central finite-difference Jacobian."""

from __future__ import annotations

import pytest
import torch

from lit_constrained.optim import constraint_jacobian
from lit_constrained.optim.flat import add_flat_, numel_real

F64 = torch.float64


def model_and_constraints():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()
    z = torch.nn.Parameter(torch.randn(3, dtype=torch.complex128))
    points = torch.randn(4, 2, dtype=F64, requires_grad=True)

    def constraints():
        u = net(points).squeeze(-1)
        du = torch.autograd.grad(u.sum(), points, create_graph=True)[0][:, 0]  # an input derivative
        return u + du**2 + (z * z.conj()).real.sum() + z.imag[0] * u

    return [*net.parameters(), z], constraints


def finite_difference_jacobian(params, constraints, h=1e-6):
    n = numel_real(params)
    columns = []
    for j in range(n):
        e = torch.zeros(n, dtype=F64)
        e[j] = h
        add_flat_(params, e)
        plus = constraints().detach()
        add_flat_(params, -2 * e)
        minus = constraints().detach()
        add_flat_(params, e)
        columns.append((plus - minus) / (2 * h))
    return torch.stack(columns, dim=1)


@pytest.mark.parametrize("method", ["batched", "loop", "auto"])
def test_matches_finite_differences(method):
    params, constraints = model_and_constraints()
    J = constraint_jacobian(constraints(), params, method=method)
    assert J.shape == (4, numel_real(params))
    torch.testing.assert_close(J, finite_difference_jacobian(params, constraints), rtol=1e-6, atol=1e-7)


def test_unused_parameter_gives_zero_columns_and_graph_is_kept():
    a = torch.nn.Parameter(torch.randn(3))
    b = torch.nn.Parameter(torch.randn(2))
    c = torch.stack([a.sum(), (a**2).sum()])
    J = constraint_jacobian(c, [a, b])
    assert (J[:, 3:] == 0).all()
    c.sum().backward()  # the graph survives
    assert a.grad is not None


def test_errors():
    a = torch.nn.Parameter(torch.randn(3))
    with pytest.raises(ValueError, match="1-D"):
        constraint_jacobian(a.reshape(3, 1), [a])
    with pytest.raises(ValueError, match="require grad"):
        constraint_jacobian(a.detach(), [a])
