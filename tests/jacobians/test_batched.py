"""The Jacobian helpers against a dense central finite-difference Jacobian (general autograd) and the
per-sample ``torch.func`` Jacobian against the finite differences and the general one."""

from __future__ import annotations

import pytest
import torch

from torch.func import functional_call

from lit_constrained.optim import constraint_jacobian
from lit_constrained.jacobians import numel_real
from lit_constrained.optim.flat import FlatLayout
from lit_constrained.jacobians import constraint_units, per_sample_jacobian

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
        FlatLayout.of(params).add_(params, e)
        plus = constraints().detach()
        FlatLayout.of(params).add_(params, -2 * e)
        minus = constraints().detach()
        FlatLayout.of(params).add_(params, e)
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


# -- constraints that each depend on one sample: the per-sample torch.func Jacobian ------------------


class NodeField(torch.nn.Module):
    """A per-sample field on 5 nodes: ``u = tanh(W x + b) * |z|^2 + Im(z_0) x`` for each sample x (5,),
    with a complex parameter z (entering through its real and imaginary parts)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 5).double()
        self.z = torch.nn.Parameter(torch.randn(2, dtype=torch.complex128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)) * (self.z * self.z.conj()).real.sum() + self.z.imag[0] * x


def node_residuals(module: torch.nn.Module, params: dict, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The residuals of ONE sample x (5,) at its 5 nodes (a per-sample input ``shift`` (5,) too)."""
    return functional_call(module, params, (x[None],))[0] ** 2 - shift


@pytest.mark.parametrize("mode", ["rows", "samples", "auto"])
def test_per_sample_jacobian_matches_finite_differences_and_the_general_jacobian(mode: str) -> None:
    torch.manual_seed(0)
    module = NodeField()
    params = list(module.parameters())
    x, shift = torch.randn(4, 5, dtype=F64), torch.randn(4, 5, dtype=F64)
    sample = torch.tensor([2, 0, 2, 3, 2])  # sample 1 untouched, sample 2 three times
    node = torch.tensor([4, 1, 0, 3, 4])  # a repeated (sample, node) pair: two equal rows

    def constraints() -> torch.Tensor:
        return (module(x) ** 2 - shift)[sample, node]

    J = per_sample_jacobian(module, params, lambda p, xi, si: node_residuals(module, p, xi, si), (x, shift),
                            sample, node, mode)
    assert J.shape == (5, numel_real(params))
    torch.testing.assert_close(J, finite_difference_jacobian(params, constraints), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(J, constraint_jacobian(constraints(), params), rtol=1e-12, atol=1e-13)
    # only some parameters, in another order: their column blocks, in that order
    reordered = [module.z, module.linear.weight]
    blocks = dict(zip(map(id, params), torch.split(J, [numel_real([p]) for p in params], dim=1)))
    partial = per_sample_jacobian(module, reordered, lambda p, xi, si: node_residuals(module, p, xi, si),
                                  (x, shift), sample, node, mode)
    expected = torch.cat([blocks[id(p)] for p in reordered], dim=1)
    torch.testing.assert_close(partial, expected, rtol=1e-12, atol=1e-13)


def test_per_sample_jacobian_of_no_constraints_and_of_foreign_parameters() -> None:
    module = NodeField()
    params = list(module.parameters())
    residuals = lambda p, xi, si: node_residuals(module, p, xi, si)  # noqa: E731
    inputs = (torch.zeros(2, 5, dtype=F64), torch.zeros(2, 5, dtype=F64))
    empty = torch.zeros(0, dtype=torch.long)
    assert per_sample_jacobian(module, params, residuals, inputs, empty, empty).shape == (0, numel_real(params))
    with pytest.raises(ValueError, match="not parameters of NodeField"):
        per_sample_jacobian(module, [torch.nn.Parameter(torch.zeros(2))], residuals, inputs, empty, empty)


def test_constraint_units_cover_every_constraint_once() -> None:
    sample = torch.tensor([3, 0, 3, 1, 3, 0])
    node = torch.tensor([10, 11, 12, 13, 14, 15])
    for mode in ("rows", "samples"):
        owner, table, unit, slot = constraint_units(sample, node, mode)
        assert torch.equal(owner[unit], sample)
        assert torch.equal(table[unit, slot], node)
    _, table, _, _ = constraint_units(sample, node, "samples")
    assert table.shape == (3, 3)
    with pytest.raises(ValueError, match="same length"):
        constraint_units(torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ValueError, match="grouping mode"):
        constraint_units(sample, node, "columns")  # type: ignore[arg-type]
