"""rho="full": the full Gauss-Newton normal step (rho_k = 1 / lr_k)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.helpers.hock_schittkowski import HS6, HS28
from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall, constraint_jacobian
from lit_constrained.optim.constrained import ADAPTIVE_NORMAL_STEP, DEFAULT_MAX_NORMAL_STEP

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
    for _ in range(1000):  # x* to round-off from step ~800 (measured: 2.8e-12 and 1.6e-11 at step 500)
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


# ---------------------------------------------------------------------------- the default safeguard
RULE = ADAPTIVE_NORMAL_STEP


def linear_problem(opt_cls, **kwargs):
    """x in R^2 at (0, 3), one linear constraint x1 = 5 (c = x1 - 5, J = [1, 0]), no objective."""
    x = torch.nn.Parameter(torch.tensor([0.0, 3.0], dtype=F64))
    return x, opt_cls([x], lr=0.1, **kwargs)


def constrained_step(opt, x, c):
    x.grad = torch.zeros(2, dtype=F64)
    opt.step(constraints=torch.tensor([c], dtype=F64), jacobian=torch.tensor([[1.0, 0.0]], dtype=F64),
             diagnostics=True)


@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_default_is_the_full_step_with_the_adaptive_radius(opt_cls):
    x, opt = linear_problem(opt_cls)
    assert opt.param_groups[0]["rho"] == "full" and opt.param_groups[0]["max_normal_step"] == DEFAULT_MAX_NORMAL_STEP
    constrained_step(opt, x, -5.0)
    # ||x|| = 3: the full normal step (5) is capped to 0.02 * 3
    torch.testing.assert_close(x.detach(), torch.tensor([RULE.initial * 3.0, 3.0], dtype=F64))
    assert opt.diagnostics["normal_step_capped"] == 1.0


def test_the_radius_doubles_when_the_capped_step_achieves_the_predicted_decrease():
    x, opt = linear_problem(SQPHeavyBall, momentum=0.0)
    reference = max(math.hypot(float(x.detach()[0]), 3.0), 1.0)  # ||x_1||: the radius' fixed scale
    for k in range(1, 40):
        before = float(x.detach()[0])
        constrained_step(opt, x, float(x.detach()[0]) - 5.0)  # the true (linear) constraint: ratio 1
        if float(x.detach()[0]) == pytest.approx(5.0, abs=1e-12):
            break
        radius = min(RULE.initial * 2 ** (k - 1), RULE.largest)
        assert float(x.detach()[0]) - before == pytest.approx(radius * reference, rel=1e-12)
    assert k <= 8  # from 0.02 ||x|| to the full step of 5 in a handful of steps
    assert float(x.detach()[0]) == pytest.approx(5.0, abs=1e-12)


def test_the_radius_halves_when_the_violation_does_not_decrease_as_predicted():
    x, opt = linear_problem(SQPHeavyBall, momentum=0.0)
    constrained_step(opt, x, -5.0)  # capped
    radius = float(opt.state["global"]["normal_radius"])
    constrained_step(opt, x, -6.0)  # the violation grew: ratio < 0
    assert float(opt.state["global"]["normal_radius"]) == pytest.approx(radius * RULE.shrink, rel=1e-12)
    assert float(opt.diagnostics["normal_radius"]) == pytest.approx(radius * RULE.shrink, rel=1e-12)
    for _ in range(20):  # never below the smallest radius
        constrained_step(opt, x, -6.0 - float(x.detach()[0]))
    assert float(opt.state["global"]["normal_radius"]) == pytest.approx(RULE.smallest, rel=1e-12)


def test_uncapped_steps_leave_the_radius_alone():
    x, opt = linear_problem(SQPHeavyBall, momentum=0.0)
    constrained_step(opt, x, -1e-3)  # tiny normal step: not capped
    assert opt.diagnostics["normal_step_capped"] == 0.0
    constrained_step(opt, x, 1.0)  # an "increase" of the violation after an uncapped step
    assert float(opt.state["global"]["normal_radius"]) == RULE.initial


@pytest.mark.parametrize("kwargs", [{"max_normal_step": None}, {"rho": 1.0}])
def test_no_cap_with_none_or_with_the_papers_numeric_rho(kwargs):
    x, opt = linear_problem(SQPHeavyBall, momentum=0.0, **kwargs)
    constrained_step(opt, x, -5.0)
    expected = 5.0 if kwargs.get("rho") is None else 0.1 * 5.0
    torch.testing.assert_close(x.detach(), torch.tensor([expected, 3.0], dtype=F64))


def test_the_radius_is_resumed_from_a_checkpoint():
    x, opt = linear_problem(SQPHeavyBall, momentum=0.0)
    constrained_step(opt, x, -5.0)
    constrained_step(opt, x, -6.0)
    x2, opt2 = linear_problem(SQPHeavyBall, momentum=0.0)
    x2.data.copy_(x.detach())
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as through a checkpoint file
    constrained_step(opt, x, float(x.detach()[0]) - 5.0)
    constrained_step(opt2, x2, float(x2.detach()[0]) - 5.0)
    assert torch.equal(x.detach(), x2.detach())
