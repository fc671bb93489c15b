"""benchmarks/new_problem.py's Helmholtz problem: the manufactured source, the boundary parts and the pools,
checked against computations of their own (autograd's Laplacian and gradient, the circle's normals by hand)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import new_problem as problem  # noqa: E402


def by_autograd(x: Tensor) -> tuple[Tensor, Tensor]:
    """grad u* (N, 2) and Laplacian u* (N,) by nested autograd (not the package's operators)."""
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(problem.exact(x).sum(), x, create_graph=True)
    lap = sum(torch.autograd.grad(grad[:, i].sum(), x, retain_graph=True)[0][:, i] for i in range(2))
    return grad.detach(), lap.detach()


class ExactField(problem.HelmholtzHole):
    """The task with u = u* in place of the network (its residuals and parts built on this u)."""

    def u(self, x: Tensor) -> Tensor:
        return problem.exact(x)


def test_the_source_is_the_exact_solutions_helmholtz_operator() -> None:
    x = problem.DOMAIN.interior(500, "sobol", 3, torch.float64)
    grad, lap = by_autograd(x)
    assert torch.allclose(problem.source(x), lap + problem.WAVENUMBER**2 * problem.exact(x), rtol=1e-12, atol=1e-10)
    assert torch.allclose(problem.exact_gradient(x), grad, rtol=1e-12, atol=1e-12)


def test_the_residuals_and_the_boundary_parts_vanish_at_the_exact_solution() -> None:
    task = ExactField(hidden=4, depth=1, n_pde=64, n_boundary=256, n_check=64)
    assert task.pde_residual(task.x_pde.double()).abs().max() < 1e-9
    sides, circle = (part.to(dtype=torch.float64) for part in (task.sides, task.circle))
    # float32 points: the prescribed values were computed at them in float32
    assert sides.values().abs().max() < 1e-5 and circle.values().abs().max() < 1e-4
    parts = task.imposed(None)
    assert list(parts) == ["pde", "sides", "circle"] and all(p.count == "auto" for p in parts.values())
    assert parts["pde"].points is task.x_pde  # the pool is the objective's own points


def test_the_boundary_points_split_by_arc_length_with_the_circles_normals() -> None:
    task = ExactField(hidden=4, depth=1, n_pde=16, n_boundary=256, n_check=16)
    on_sides, on_circle = task.sides.points.double(), task.circle.points.double()
    assert (len(on_sides), len(on_circle)) == (201, 55)  # 256 * 8 / (8 + 0.7 pi) = 200.8
    assert torch.allclose(on_sides.abs().max(1).values, torch.ones(len(on_sides), dtype=torch.float64))
    offset = on_circle - torch.tensor(problem.HOLE_CENTER, dtype=torch.float64)
    assert torch.allclose(offset.norm(dim=1), torch.full((55,), problem.HOLE_RADIUS, dtype=torch.float64), atol=1e-6)
    normals = -offset / problem.HOLE_RADIUS  # the domain's outward normal points into the hole
    assert torch.allclose(task.circle.data["normals"].double(), normals, atol=1e-5)
    grad, _ = by_autograd(on_circle)
    assert torch.allclose(task.circle.data["value"].double(), (grad * normals).sum(1), atol=1e-4)
    assert ExactField(hidden=4, depth=1, n_pde=16, impose=False).imposed(None) is None  # plain Adam's task


def test_the_test_set_is_the_grid_inside_the_domain_with_the_exact_values() -> None:
    batch = problem.HelmholtzHoleData(21).test_batch
    x = batch["x_test"].double()
    nodes = [(-1 + 0.1 * i, -1 + 0.1 * j) for i in range(21) for j in range(21)]  # the square's grid, its sides too
    outside = [(a, b) for a, b in nodes if math.hypot(a - 0.3, b - 0.2) > problem.HOLE_RADIUS]
    assert torch.allclose(x, torch.tensor(outside, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(batch["u_test"].double(), problem.exact(x), atol=1e-6)
