"""physics/conditions.py: a geometry's dirichlet, neumann and periodic conditions as imposed parts: their
points, their per-point data (normals, values, facing points), their residuals against hand-written ones
by plain autograd, their per-point Jacobian against the dense one, and a module that imposes them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_constrained import ConstrainedModule, Imposed
from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.physics import Box, Disk, SpaceTime, laplacian, partial
from lit_constrained.physics.conditions import DirichletResidual, NeumannResidual, PeriodicResidual
from tests.helpers.lightning import quiet_trainer

F64 = torch.float64
PLATE = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.2)


class Field(torch.nn.Module):
    """u: R^d -> R, a small tanh MLP in float64."""

    def __init__(self, dim: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(F64)

    def u(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0]


def _gradient(field: Field, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(field.u(x).sum(), x, create_graph=True)
    return g


def _jacobians(field: Field, part: Imposed) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-point engine's J of the part and the dense autograd J of its values."""
    from lit_constrained.jacobians.pointwise import pointwise_jacobian

    params = list(field.parameters())
    J = pointwise_jacobian(field, params, part.residual, part.points, path="func", data=part.data)
    return J, constraint_jacobian(part.values().reshape(-1), params, method="loop")


def test_dirichlet_imposes_the_values_at_the_boundary_points() -> None:
    field = Field()
    part = PLATE.dirichlet(field.u, 40, value=lambda x: x[:, 0] * x[:, 1], seed=3, dtype=F64)
    x = PLATE.boundary(40, seed=3)
    assert isinstance(part.residual, DirichletResidual) and torch.equal(part.points, x)
    torch.testing.assert_close(part.data["value"], x[:, 0] * x[:, 1])
    torch.testing.assert_close(part.values(), field.u(x) - x[:, 0] * x[:, 1])
    J, dense = _jacobians(field, part)
    torch.testing.assert_close(J, dense)
    bound = PLATE.dirichlet(field.u, 5, value=1.0, sense="<=", count=2, dtype=F64)  # u <= 1, 2 of 5 points chosen
    assert bound.sense == "<=" and bound.count == 2 and bound.data["value"].tolist() == [1.0] * 5


def test_neumann_takes_the_derivative_along_each_point_s_own_normal() -> None:
    field = Field()
    part = PLATE.neumann(field.u, 40, value=0.5, seed=1, dtype=F64)
    sample = PLATE.boundary_sample(40, seed=1)
    assert isinstance(part.residual, NeumannResidual)
    assert torch.equal(part.points, sample.points) and torch.equal(part.data["normals"], sample.normals)
    torch.testing.assert_close(part.values(), (_gradient(field, sample.points) * sample.normals).sum(1) - 0.5)
    J, dense = _jacobians(field, part)
    torch.testing.assert_close(J, dense)


def test_on_a_piece_keeps_its_points_with_the_domain_s_normals() -> None:
    """The hole of the plate: its points at distance 0.2 from the center, the plate's outward normal there
    pointing into the hole, -(x - c) / r."""
    hole = Disk((0.5, 0.5), 0.2)
    part = PLATE.neumann(Field().u, 16, on=hole, dtype=F64)
    offset = part.points - 0.5
    assert part.points.shape == (16, 2)
    torch.testing.assert_close(offset.norm(dim=1), torch.full((16,), 0.2, dtype=F64))
    torch.testing.assert_close(part.data["normals"], -offset / 0.2)
    with pytest.raises(ValueError, match="no boundary point of Disk lies on the boundary of Box"):
        Box((0.0, 0.0), (1.0, 1.0)).dirichlet(Field().u, 8, on=hole)


def test_periodic_sets_each_point_against_the_one_facing_it() -> None:
    field = Field()
    slab = Box((0.0, 0.0), (2.0, 1.0), names=("x", "t"))
    part = slab.periodic(field.u, "x", 12, seed=4, dtype=F64)
    left, right = part.points, part.data["partner"]
    assert isinstance(part.residual, PeriodicResidual)
    assert left[:, 0].eq(0.0).all() and right[:, 0].eq(2.0).all() and torch.equal(left[:, 1], right[:, 1])
    torch.testing.assert_close(part.values(), field.u(left) - field.u(right))
    slopes = slab.periodic(field.u, "x", 12, seed=4, dtype=F64, operator=lambda u, x: partial(u, x, "x"))
    torch.testing.assert_close(slopes.values(), _gradient(field, left)[:, 0] - _gradient(field, right)[:, 0])
    for p in (part, slopes):
        J, dense = _jacobians(field, p)
        torch.testing.assert_close(J, dense)
    with pytest.raises(TypeError, match="periodic\\(\\) needs a Box"):
        PLATE.periodic(field.u, "x", 4)


def test_a_space_time_side_takes_the_spatial_normals() -> None:
    """A cylinder's lateral side: normals (n_x, n_y) of the space-time points (x, y, t) with dims=("x", "y")."""
    from lit_constrained.physics.conditions import Conditions

    cylinder = SpaceTime(Disk((0.0, 0.0), 1.0), (0.0, 1.0))
    field = Field(3)
    part = Conditions.neumann(cylinder, field.u, 10, dims=("x", "y"), dtype=F64)  # SpaceTime as a geometry
    assert part.data["normals"].shape == (10, 2)
    torch.testing.assert_close(part.values(), (_gradient(field, part.points)[:, :2] * part.data["normals"]).sum(1))


class Plate(ConstrainedModule):
    """-Laplacian(u) = 1 on the plate (the objective), u = 0 on its outer edge and du/dn = 0 on the hole
    imposed (both parts built by the plate's conditions; a float64 network)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.field = Field()
        self.wall = PLATE.dirichlet(self.field.u, 12, on=Box((0.0, 0.0), (1.0, 1.0)), dtype=F64)
        self.hole = PLATE.neumann(self.field.u, 6, on=Disk((0.5, 0.5), 0.2), dtype=F64)
        self.register_buffer("x", PLATE.interior(64, seed=0))

    def pde(self, x: torch.Tensor) -> torch.Tensor:
        return -laplacian(self.field.u, x) - 1.0

    def objective(self, batch: Any) -> torch.Tensor:
        return self.pde(self.x).pow(2).mean()

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"wall": self.wall.to(self.device), "hole": self.hole.to(self.device)}


def test_a_module_imposes_the_conditions_and_holds_them() -> None:
    task = Plate(lr_decay="none")
    c = task.constraints(None)
    assert [(p.name, p.size) for p in task.imposed_layout] == [("wall", 12), ("hole", 6)]
    J = task.constraint_jacobian(None, c, list(task.parameters()))
    torch.testing.assert_close(J, constraint_jacobian(c, list(task.parameters()), method="loop"))
    start = float(c.abs().max())
    quiet_trainer(max_steps=10, limit_val_batches=0).fit(
        task, train_dataloaders=torch.utils.data.DataLoader([0], batch_size=None))
    assert start > 1e-2 and float(task.constraints(None).abs().max()) < 1e-6 * start
