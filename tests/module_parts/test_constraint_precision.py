"""constraint_precision: float64 evaluations of c and J at float32 weights, and the float32 floors, against
independent computations (a float64 copy of the network, dense autograd Jacobians, the linearized one-ulp
bound)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lit_constrained.imposed import Coupled, Imposed
from lit_constrained.module_parts.constraint_precision import (
    PromotedResidual,
    check_constraint_dtype,
    constraint_tolerance,
    evaluation_floor,
    feasibility_finding,
    promote_parts,
    weight_floor,
)
from lit_constrained.optim import SQPAdam
from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.jacobians.pointwise import PointwiseJacobian
from lit_constrained.physics import laplacian


class Field(torch.nn.Module):
    """A 2 -> 16 -> 16 -> 1 tanh MLP with a float buffer, a second-order residual and a plain one."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                       torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.register_buffer("shift", torch.tensor(0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0] + self.shift

    def pde(self, x: torch.Tensor) -> torch.Tensor:
        return -laplacian(self, x) - 20.0 * torch.sin(3.0 * x[:, 0])

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def parts(self, points: torch.Tensor, dtype: str = "float64") -> dict[str, Imposed]:
        return promote_parts(self, {"pde": Imposed(self.pde, points), "value": Imposed(self.value, points[:3])}, dtype)

    def constraints(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = self.parts(batch["x"], self.constraint_dtype)
        return torch.cat([part.residual(part.points).reshape(-1) for part in parts.values()])


def _field(seed: int = 0, dtype: str = "float64") -> Field:
    torch.manual_seed(seed)
    model = Field()
    model.constraint_dtype = dtype
    return model


def _points(n: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(seed))


def _float64_reference(model: Field, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """c and J of a float64 copy of the network (same weights, the float32 points widened)."""
    twin = copy.deepcopy(model).double()
    x64 = x.double()
    c = torch.cat([twin.pde(x64), twin.value(x64[:3])])
    return c.detach(), constraint_jacobian(c, list(twin.parameters()), method="loop")


@pytest.mark.parametrize("points", [5, 40])  # 5 + 3 rows: one autograd chunk; 40: the torch.func path
def test_promoted_c_and_j_are_the_float64_networks(points):
    model = _field()
    x = _points(points)
    parts = model.parts(x)
    c = torch.cat([part.residual(part.points).reshape(-1) for part in parts.values()])
    engine = PointwiseJacobian()
    specs = [(part.residual, part.points, 1) for part in parts.values()]
    J = engine(model, list(model.parameters()), specs, dtype=c.dtype)
    c64, J64 = _float64_reference(model, x)
    assert c.dtype == torch.float64 and J.dtype == torch.float64
    assert torch.equal(c.detach(), c64)  # the same float64 operations
    # J: float64 products, each entry rounded once to the float32 parameters' gradient dtype
    assert torch.allclose(J, J64.float().double(), rtol=0, atol=1e-12 * J64.abs().max())
    assert (J - J64).abs().max() <= 2 ** -24 * J64.abs().max() * 1.01
    native = model.parts(x, "native")
    c32 = torch.cat([part.residual(part.points).reshape(-1) for part in native.values()])
    assert c32.dtype == torch.float32 and (c32.double() - c64).abs().max() > 0  # float32 rounding noise


def test_promoted_gradients_reach_the_float32_parameters():
    model = _field()
    parts = model.parts(_points(6))  # (the Laplacian does not see the last bias: the value part does)
    sum(part.residual(part.points).pow(2).sum() for part in parts.values()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the module itself untouched


def test_promote_parts_leaves_native_and_float64_modules_alone_and_is_stable():
    model = _field()
    x = _points(4)
    native = model.parts(x, "native")
    assert native["pde"].residual == model.pde
    twice = [model.parts(x)["pde"].residual for _ in range(2)]
    assert twice[0] == twice[1] and hash(twice[0]) == hash(twice[1])  # the engine's path cache sees one residual
    assert isinstance(twice[0], PromotedResidual)
    wide = copy.deepcopy(model).double()
    assert wide.parts(x.double())["pde"].residual == wide.pde
    assert promote_parts(model, None) is None
    with pytest.raises(ValueError, match="'native' .* or 'float64'"):
        check_constraint_dtype("float32")


def test_evaluation_floor_is_the_float32_rounding_of_c():
    model = _field(dtype="native")
    batch = {"x": _points(30)}
    c64, _ = _float64_reference(model, batch["x"])
    c32 = model.constraints(batch).detach().double()
    assert evaluation_floor(model, batch) == pytest.approx(float((c32 - c64).abs().max()), rel=0, abs=1e-15)
    promoted = _field(dtype="float64")
    assert evaluation_floor(promoted, batch) < 1e-12  # the task's own c is the float64 one


def test_weight_floor_is_one_ulp_through_the_linearization_and_restores_the_weights():
    model = _field(dtype="float64")  # c in float64: only the weights' rounding is seen
    batch = {"x": _points(20)}
    before = [p.detach().clone() for p in model.parameters()]
    floor = weight_floor(model, batch, draws=5)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    _, J64 = _float64_reference(model, batch["x"])
    x = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ulp = (torch.nextafter(x.abs(), torch.tensor(math.inf)) - x.abs()).double()
    bound = float((J64.abs() @ ulp).max())  # |J dx| <= |J| ulp, dx one ulp per weight
    assert 0.05 * bound < floor <= 1.05 * bound


def _stepped(model, batch, constraint_tol):
    params = list(model.parameters())
    optimizer = SQPAdam(params, lr=0.0, constraint_tol=constraint_tol, max_corrections=0)
    assert constraint_tolerance(optimizer) is None  # before its first step
    c = model.constraints(batch)
    J = constraint_jacobian(c, params, method="loop")
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step(constraints=c.detach(), jacobian=J)
    return optimizer, float(c.detach().abs().max())


@pytest.mark.filterwarnings("ignore:SQPAdam. the m = 15 imposed constraints have numerical rank")
def test_tolerance_and_finding():
    model = _field(dtype="native")
    batch = {"x": _points(12)}
    optimizer, start = _stepped(model, batch, 1e-6)
    tol = 1e-6 * max(start, 1.0)
    assert constraint_tolerance(optimizer) == pytest.approx(tol)
    assert constraint_tolerance(torch.optim.Adam(model.parameters())) is None
    assert feasibility_finding(model, batch, 0.5 * tol, optimizer) is None
    floor = evaluation_floor(model, batch)
    finding = feasibility_finding(model, batch, 10.0, optimizer)
    assert f"{floor:.2e}" in finding and "above the float32 floors" in finding
    assert "constraint_dtype='float64'" in finding
    model.constraint_dtype = "float64"
    assert "not a precision floor" in feasibility_finding(model, batch, 10.0, optimizer)
    strict, _ = _stepped(model, batch, 1e-14)  # a tolerance below what float32 weights resolve
    at_weights = 2 * weight_floor(model, batch)
    assert "train the network in float64" in feasibility_finding(model, batch, at_weights, strict)


class _Float32Only(torch.nn.Module):
    """c = p A - 1 with A a plain float32 attribute (no parameter, no buffer: never cast), so c cannot be
    evaluated in float64 (a matmul of float64 and float32 raises), as an FNO's spectral weights."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([0.5, 2.0]))
        self.fixed = torch.tensor([[1.0, 0.0], [0.0, 1.0]])

    def constraints(self, batch) -> torch.Tensor:
        return (self.p[None, :] @ self.fixed)[0] - 1.0


def test_a_network_that_cannot_run_in_float64_gets_a_finding_that_says_so() -> None:
    model = _Float32Only()
    optimizer, _ = _stepped(model, None, 1e-6)
    finding = feasibility_finding(model, None, 10.0, optimizer)
    assert "does not run in float64 as a whole (RuntimeError: " in finding and "so no float64 floor" in finding


def test_the_module_itself_as_a_promoted_residual_keeps_its_parameters() -> None:
    """``Imposed(self, points)`` in float64: the module registered once in the wrapper (twice, functional_call
    restored it to the swapped float64 tensors, and the optimizer's parameters were no longer the module's)."""
    from lit_constrained.module_parts.constraint_precision import PromotedResidual

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)[:, 0]

    module = Net()
    before = list(module.parameters())
    x = torch.linspace(0, 1, 3)[:, None]
    value = PromotedResidual(module, module)(x)
    assert value.dtype == torch.float64
    assert all(a is b for a, b in zip(module.parameters(), before))
    torch.testing.assert_close(value, module.double()(x.double()), rtol=0, atol=0)


def test_a_part_s_data_is_promoted_with_its_points():
    """A residual of (points, data): its float data are cast to float64 with the points (c is the float64
    network's at the widened data), its integer data kept; J by the engine, data mapped with the points."""
    model = _field()
    x = _points(40)
    data = {"scale": torch.linspace(0.5, 1.5, 40), "index": torch.arange(40)}

    def scaled(points: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
        assert d["scale"].dtype == points.dtype and d["index"].dtype == torch.int64
        return d["scale"] * model.value(points) + d["index"].to(points.dtype)

    (part,) = promote_parts(model, {"scaled": Imposed(scaled, x, data=data)}, "float64").values()
    c = part.values()
    twin = copy.deepcopy(model).double()
    assert c.dtype == torch.float64
    assert torch.equal(c.detach(), data["scale"].double() * twin.value(x.double()) + data["index"].double())
    J = PointwiseJacobian(path="func")(model, list(model.parameters()), [(part.residual, x, 1, data)], dtype=c.dtype)
    J64 = constraint_jacobian(data["scale"].double() * twin.value(x.double()), list(twin.parameters()), method="loop")
    assert (J - J64).abs().max() <= 2 ** -24 * J64.abs().max() * 1.01


def test_a_declaration_with_a_coupled_part_is_not_promoted():
    """A Coupled part's rows are one graph of c in the network's dtype: the declaration stays as it is."""
    model = _field()
    x = _points(5)
    parts = promote_parts(model, {"mean": Coupled(lambda: model.value(x).mean()), "value": Imposed(model.value, x)})
    assert parts["value"].residual == model.value and parts["value"].values().dtype == torch.float32
