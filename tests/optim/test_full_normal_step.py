"""rho="full": the full Gauss-Newton normal step (rho_k = 1 / lr_k)."""

from __future__ import annotations

import pytest
import torch

from hock_schittkowski import HS6, HS28
from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall, constraint_jacobian

F64 = torch.float64


def step_once(opt, x, problem):
    opt.zero_grad()
    c = problem.constraints(x)
    J = constraint_jacobian(c, [x])
    problem.objective(x).backward()
    before = x.detach().clone()
    opt.step(constraints=c.detach(), jacobian=J, diagnostics=True)
    return x.detach() - before, c.detach()


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
@pytest.mark.parametrize("lr", [0.3, 0.03, 0.003])
def test_violation_after_one_step_is_the_linearization_error(opt_cls, lr):
    """HS6: c = 10 (x2 - x1^2), so c(x + D) = c + J D - 10 D1^2 and a full step leaves exactly -10 D1^2."""
    x = torch.nn.Parameter(torch.tensor(HS6.x0, dtype=F64))
    opt = opt_cls([x], lr=lr, rho="full", max_normal_step=None)
    delta, c0 = step_once(opt, x, HS6)
    c1 = HS6.constraints(x).detach()
    torch.testing.assert_close(c1, -10 * delta[0:1] ** 2, rtol=1e-9, atol=1e-14)
    assert c1.abs() <= 10 * delta.norm() ** 2 < c0.abs()


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_paper_rho_leaves_a_violation_decaying_like_one_minus_lr(opt_cls):
    """HS28 has a linear constraint: c_{k+1} = (1 - lr rho) c_k exactly with rho = 1; rho="full" zeroes it."""
    lr = 0.05
    x = torch.nn.Parameter(torch.tensor(HS28.x0, dtype=F64))
    opt = opt_cls([x], lr=lr, rho=1.0)
    _, c0 = step_once(opt, x, HS28)
    for k in range(1, 20):
        _, c = step_once(opt, x, HS28)
        torch.testing.assert_close(c, c0 * (1 - lr) ** k, rtol=1e-9, atol=1e-14)

    x = torch.nn.Parameter(torch.tensor(HS28.x0, dtype=F64))
    opt = opt_cls([x], lr=lr, rho="full")
    step_once(opt, x, HS28)
    assert HS28.constraints(x).abs().max() < 1e-14


@pytest.mark.parametrize("problem", [HS6, HS28], ids=lambda p: p.name)
def test_full_normal_step_converges_with_a_constant_lr(problem):
    x = torch.nn.Parameter(torch.tensor(problem.x0, dtype=F64))
    opt = SQPHeavyBall([x], lr=0.05, beta=0.9, rho="full")
    for _ in range(3000):
        step_once(opt, x, problem)
    assert (x.detach() - torch.tensor(problem.solution, dtype=F64)).abs().max() < 1e-6
    assert problem.constraints(x).abs().max() < 1e-8


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_rho_follows_the_scheduler(opt_cls):
    x = torch.nn.Parameter(torch.tensor(HS6.x0, dtype=F64))
    opt = opt_cls([x], lr=0.1, rho="full")
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    for _ in range(6):
        lr = opt.param_groups[0]["lr"]
        step_once(opt, x, HS6)
        assert opt.diagnostics["rho"] == pytest.approx(1.0 / lr, rel=1e-12)
        schedule.step()


def test_normal_step_cap():
    x = torch.nn.Parameter(torch.tensor([0.0, 1.0], dtype=F64))
    opt = SQPHeavyBall([x], lr=0.1, beta=0.0, rho="full", max_normal_step=0.01)
    J = torch.tensor([[1.0, 0.0]], dtype=F64)
    x.grad = torch.zeros(2, dtype=F64)
    opt.step(constraints=torch.tensor([5.0], dtype=F64), jacobian=J, diagnostics=True)
    # uncapped the normal step would be -5 along x1; capped to 0.01 * ||x|| = 0.01
    torch.testing.assert_close(x.detach(), torch.tensor([-0.01, 1.0], dtype=F64))
    assert opt.diagnostics["normal_step_capped"] == 1.0
