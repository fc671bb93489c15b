"""Post-step corrections (algorithms.md section 8): x+ <- x+ - J_k^T (J_k J_k^T)^+ c(x+) with the step's J_k,
checked against a hand-written dense float64 computation, the tolerance and stall rules, and that
``max_corrections = 0`` (or no closure) is the papers' step bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall

F64 = torch.float64


def circle_constraints(x: torch.Tensor) -> torch.Tensor:
    """Two curved constraints in R^4: a sphere and a product (nonlinear, so the linearized step leaves
    a second-order violation that the corrections remove)."""
    return torch.stack([x.pow(2).sum() - 2.0, x[0] * x[1] + x[2] - 0.3])


def objective(x: torch.Tensor) -> torch.Tensor:
    return (x - torch.tensor([1.0, -0.5, 0.25, 2.0], dtype=x.dtype)).pow(2).sum()


def prepared(x: torch.nn.Parameter) -> tuple[torch.Tensor, torch.Tensor]:
    """g into x.grad; returns (c, J) at x."""
    x.grad = None
    objective(x).backward()
    J = torch.autograd.functional.jacobian(circle_constraints, x.detach())
    return circle_constraints(x.detach()), J


def closure_of(x: torch.nn.Parameter, calls: list[int]):
    def constraints_now() -> torch.Tensor:
        calls.append(1)
        return circle_constraints(x.detach())
    return constraints_now


@pytest.mark.parametrize("kind", [SQPAdam, SQPHeavyBall])
def test_corrections_equal_dense_gauss_newton_steps_with_the_step_jacobian(kind):
    torch.manual_seed(0)
    x0 = torch.tensor([1.3, 0.2, -0.4, 0.6], dtype=F64)
    tol = 1e-12
    # reference: the plain step (no corrections), then the corrections by hand with J at x_k
    plain = torch.nn.Parameter(x0.clone())
    reference = kind([plain], lr=0.1, max_corrections=0, max_normal_step=None)
    c, J = prepared(plain)
    reference.step(constraints=c, jacobian=J)
    x = plain.detach().clone()
    expected_corrections = 0
    for _ in range(3):
        cx = circle_constraints(x)
        if float(cx.abs().max()) <= tol * max(float(c.abs().max()), 1.0):
            break
        x = x - J.T @ torch.linalg.solve(J @ J.T, cx)
        expected_corrections += 1
    # the optimizer with corrections
    p = torch.nn.Parameter(x0.clone())
    optimizer = kind([p], lr=0.1, constraint_tol=tol, max_corrections=3, max_normal_step=None)
    c, J = prepared(p)
    calls: list[int] = []
    optimizer.step(constraints=c, jacobian=J, diagnostics=True, constraint_closure=closure_of(p, calls))
    assert expected_corrections >= 2  # the problem needs more than one
    torch.testing.assert_close(p.detach(), x, rtol=0, atol=1e-13)
    assert int(optimizer.diagnostics["corrections"]) == expected_corrections
    assert float(optimizer.diagnostics["corrected_violation"]) == pytest.approx(
        float(circle_constraints(x).abs().max()), abs=1e-15)
    assert len(calls) == expected_corrections + 1  # one evaluation per correction + the final check
    # the violation after the corrections is far below the plain step's
    assert float(circle_constraints(p.detach()).abs().max()) < 1e-2 * float(circle_constraints(plain.detach()).abs().max())


def test_adam_con_correction_solves_the_linearized_constraints_in_its_metric():
    """Adam(con)'s corrections use its scaled factorization (J H^{-1/2}): each one Delta = -H^{-1} J^T
    (J H^{-1} J^T)^{-1} c(x+), so J_k Delta = -c(x+) exactly."""
    x0 = torch.tensor([1.3, 0.2, -0.4, 0.6], dtype=F64)
    p = torch.nn.Parameter(x0.clone())
    optimizer = AdamCon([p], lr=0.1, max_corrections=1, constraint_tol=1e-14, max_normal_step=None)
    c, J = prepared(p)
    before: dict[str, torch.Tensor] = {}

    def constraints_now() -> torch.Tensor:
        before.setdefault("x", p.detach().clone())  # (later calls: the acceptance check)
        return circle_constraints(p.detach())

    optimizer.step(constraints=c, jacobian=J, constraint_closure=constraints_now)
    delta = p.detach() - before["x"]
    torch.testing.assert_close(J @ delta, -circle_constraints(before["x"]), rtol=1e-10, atol=1e-13)
    h = (optimizer.state[p]["exp_avg_sq"] / (1 - 0.999) + 1e-7).sqrt()  # k = 1: v_hat = v / (1 - beta2)
    expected = -(J.T / h[:, None]) @ torch.linalg.solve((J / h) @ J.T, circle_constraints(before["x"]))
    torch.testing.assert_close(delta, expected, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("kind", [SQPAdam, AdamCon])
def test_no_closure_or_zero_corrections_is_the_papers_step_bit_for_bit(kind):
    x0 = torch.tensor([1.3, 0.2, -0.4, 0.6], dtype=F64)
    results = []
    for setting in ("no closure", "zero"):
        p = torch.nn.Parameter(x0.clone())
        optimizer = kind([p], lr=0.05, max_corrections=0 if setting == "zero" else 3)
        for _ in range(3):
            c, J = prepared(p)
            calls: list[int] = []
            closure = closure_of(p, calls) if setting == "zero" else None
            optimizer.step(constraints=c, jacobian=J, constraint_closure=closure)
            assert not calls
        results.append(p.detach().clone())
    assert torch.equal(results[0], results[1])


def test_stops_when_a_correction_makes_no_progress():
    """An infeasible constant c: the first correction cannot reduce it; the loop stops at the next check
    instead of spending every correction."""
    p = torch.nn.Parameter(torch.tensor([0.5, -0.2], dtype=F64))
    optimizer = SQPAdam([p], lr=0.1, max_corrections=5, max_normal_step=None)
    p.grad = torch.ones(2, dtype=F64)
    J = torch.tensor([[1.0, 0.0]], dtype=F64)
    calls: list[int] = []

    def constant() -> torch.Tensor:
        calls.append(1)
        return torch.ones(1, dtype=F64)

    optimizer.step(constraints=torch.ones(1, dtype=F64), jacobian=J, diagnostics=True, constraint_closure=constant)
    assert int(optimizer.diagnostics["corrections"]) == 1 and len(calls) == 2
    assert float(optimizer.diagnostics["corrected_violation"]) == 1.0


def test_a_closure_of_the_wrong_shape_is_named():
    p = torch.nn.Parameter(torch.zeros(2, dtype=F64))
    optimizer = SQPAdam([p], lr=0.1, max_normal_step=None)
    p.grad = torch.ones(2, dtype=F64)
    with pytest.raises(ValueError, match=r"constraint_closure returned \(3,\), expected a tensor of shape \(1,\)"):
        optimizer.step(constraints=torch.ones(1, dtype=F64), jacobian=torch.tensor([[1.0, 0.0]], dtype=F64),
                       constraint_closure=lambda: torch.ones(3, dtype=F64))


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_invalid_max_corrections(value):
    with pytest.raises(ValueError, match="max_corrections"):
        SQPAdam([torch.nn.Parameter(torch.zeros(1))], max_corrections=value)


def test_old_state_dicts_resume_with_the_default_corrections():
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer = SQPAdam([p])
    saved = optimizer.state_dict()
    for group in saved["param_groups"]:
        del group["constraint_tol"], group["max_corrections"]
    fresh = SQPAdam([p])
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["max_corrections"] == 3 and math.isclose(fresh.param_groups[0]["constraint_tol"], 1e-6)


def test_no_corrections_after_a_capped_normal_step():
    """Far from feasibility the safeguard caps the normal step; the corrections then leave it alone (an
    uncapped Gauss-Newton correction would take the step the cap refused)."""
    p = torch.nn.Parameter(torch.tensor([1.3, 0.2, -0.4, 0.6], dtype=F64))
    optimizer = SQPAdam([p], lr=0.1, max_normal_step=1e-3)  # a fixed cap far below the full normal step
    c, J = prepared(p)
    calls: list[int] = []
    optimizer.step(constraints=c, jacobian=J, diagnostics=True, constraint_closure=closure_of(p, calls))
    assert bool(optimizer.state["global"]["normal_step_capped"])
    assert int(optimizer.diagnostics["corrections"]) == 0 and len(calls) == 1  # (the diagnostic's evaluation)


@pytest.mark.parametrize("max_corrections", [3, 1])
def test_a_correction_that_increases_the_violation_is_undone(max_corrections):
    """Also the last one allowed (max_corrections = 1): it was kept unchecked before (Burgers with 8
    allowed: the eighth raised max |c| from 1.5e-6 to 7.7e-6 and stayed)."""
    p = torch.nn.Parameter(torch.tensor([0.5, -0.2], dtype=F64))
    optimizer = SQPAdam([p], lr=0.1, max_corrections=max_corrections, max_normal_step=None)
    p.grad = torch.zeros(2, dtype=F64)
    J = torch.tensor([[1.0, 0.0]], dtype=F64)
    values = iter([1.0, 3.0])  # the correction "made it worse"
    after_step: dict[str, torch.Tensor] = {}

    def worse() -> torch.Tensor:
        after_step.setdefault("x", p.detach().clone())
        return torch.tensor([next(values)], dtype=F64)

    optimizer.step(constraints=torch.ones(1, dtype=F64), jacobian=J, diagnostics=True, constraint_closure=worse)
    assert torch.equal(p.detach(), after_step["x"])
    assert int(optimizer.diagnostics["corrections"]) == 0 and float(optimizer.diagnostics["corrected_violation"]) == 1.0


def test_dependent_constraints_and_more_constraints_than_parameters_warn_once_with_the_rank():
    """m > n (5 constraints on 3 parameters): one warning that names the rank, m and n; the step still
    takes the least-squares normal step."""
    p = torch.nn.Parameter(torch.tensor([0.3, -0.2, 0.1], dtype=F64))
    optimizer = SQPAdam([p], lr=0.1, max_normal_step=None)
    J = torch.randn(5, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    with pytest.warns(RuntimeWarning, match=r"m = 5 imposed constraints have numerical rank 3.*m = 5 > n = 3"):
        for _ in range(3):
            p.grad = torch.zeros(3, dtype=F64)
            optimizer.step(constraints=torch.ones(5, dtype=F64), jacobian=J)
    import warnings as _warnings
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        p.grad = torch.zeros(3, dtype=F64)
        optimizer.step(constraints=torch.ones(5, dtype=F64), jacobian=J)  # once per optimizer


def test_a_step_the_corrections_cannot_restore_is_halved():
    """c(x) = x1 - 1 + x0^2 x1 with J taken at the feasible x_k = (0, 1): after a long tangential step along
    x0 the correction with J_k overshoots (it is undone), so the step is halved until the corrected
    violation is small or three halvings; the accepted point is the dense computation's."""
    x0 = torch.tensor([0.0, 1.0], dtype=F64)
    p = torch.nn.Parameter(x0.clone())
    optimizer = SQPHeavyBall([p], lr=1.0, momentum=0.0, max_corrections=1, max_normal_step=None)

    def c_of(x: torch.Tensor) -> torch.Tensor:
        return (x[1] - 1.0 + x[0] ** 2 * x[1]).reshape(1)

    J = torch.tensor([[0.0, 1.0]], dtype=F64)  # the exact J at x0
    p.grad = torch.tensor([-3.0, 0.0], dtype=F64)  # a long tangential step along x0
    optimizer.step(constraints=c_of(x0), jacobian=J, diagnostics=True, constraint_closure=lambda: c_of(p.detach()))
    # independent: tau = 1, 1/2, 1/4, 1/8: x = x_k + tau (3, 0), one correction with J_k (undone if it made
    # c worse); accepted once max |c| <= max(10 tol, 2 max |c_k|) = 1e-5, or at tau = 1/8
    for tau in (1.0, 0.5, 0.25, 0.125):
        x = x0 + tau * torch.tensor([3.0, 0.0], dtype=F64)
        corrected = x - J.T @ torch.linalg.solve(J @ J.T, c_of(x))
        if float(c_of(corrected).abs()) <= float(c_of(x).abs()):
            x = corrected
        if float(c_of(x).abs()) <= 1e-5:
            break
    assert float(optimizer.diagnostics["step_fraction"]) == tau == 0.125
    torch.testing.assert_close(p.detach(), x, rtol=0, atol=1e-14)
    assert float(optimizer.diagnostics["corrected_violation"]) == pytest.approx(float(c_of(x).abs()), rel=1e-12)
