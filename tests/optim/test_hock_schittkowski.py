"""Hock-Schittkowski problems with inequalities and bounds through the optimizer's inequality rows.

The problems (``tests/helpers/hs_inequality.py``) are first checked against an independent solver (SciPy's
SLSQP from the collection's start point: the published x*, f* and active rows are what it finds), then
solved by SQP-Adam and SQP-HeavyBall through ``step(constraints=c, jacobian=J, inequalities=g,
inequality_jacobian=G)`` with J, G from ``torch.func.jacrev``, float64, a linearly decaying lr
(``benchmarks/hock_schittkowski.py`` runs all of them for 4 000 steps; here 400, to keep the test short):
the published solution to 1e-6 in x and every inequality row violated by at most 1e-8 at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from tests.helpers.hs_inequality import BY_NAME, PROBLEMS, refined_hs71

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from hock_schittkowski import TARGET_VIOLATION, TARGET_X, solve  # noqa: E402

F64 = torch.float64
FAST = [(problem.name, optimizer, 400) for problem in PROBLEMS for optimizer in ("SQPAdam", "SQPHeavyBall")]
"""(problem, optimizer, steps) run here: all ten at 400 steps (each meets the target from step 227-267;
the benchmark's table in docs/inequalities.md has them at 4 000)."""


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_problem_data_against_slsqp(problem):
    """The published x*, f* and active rows are those of an independent solve (SLSQP from x0), and the
    active rows have positive multipliers (KKT: grad f + J^T y + G_A^T mu = 0 by least squares)."""
    def f(z):
        return float(problem.objective(torch.tensor(z, dtype=F64)))

    constraints = [{"type": "ineq", "fun": lambda z: -problem.inequalities(torch.tensor(z, dtype=F64)).numpy()}]
    if problem.equalities is not None:
        constraints.append({"type": "eq", "fun": lambda z: problem.equalities(torch.tensor(z, dtype=F64)).numpy()})
    result = minimize(f, np.array(problem.x0), method="SLSQP", constraints=constraints,
                      options={"ftol": 1e-15, "maxiter": 500})
    # (SLSQP may stop with "positive directional derivative" at this ftol once at x*: its x is checked)
    x_star = torch.tensor(problem.solution, dtype=F64)
    assert np.abs(result.x - x_star.numpy()).max() < 5e-7
    assert result.fun == pytest.approx(problem.value, abs=1e-6)
    g = problem.inequalities(x_star)
    assert [i for i, v in enumerate(g.tolist()) if v > -1e-6] == list(problem.active)
    grad = torch.func.grad(problem.objective)(x_star)
    rows = [torch.func.jacrev(problem.inequalities)(x_star)[list(problem.active)]]
    if problem.equalities is not None:
        rows.insert(0, torch.func.jacrev(problem.equalities)(x_star))
    A = torch.cat(rows)
    multipliers = torch.linalg.lstsq(A.T, -grad[:, None]).solution[:, 0]
    assert (A.T @ multipliers + grad).abs().max() < 1e-5
    assert (multipliers[-len(problem.active):] > 1e-3).all()


def test_hs71_published_digits_against_the_refined_solution():
    assert (refined_hs71() - torch.tensor(BY_NAME["HS71"].solution, dtype=F64)).abs().max() < 5e-7


@pytest.mark.parametrize("name,optimizer,steps", FAST)
def test_reaches_the_published_solution(name, optimizer, steps):
    run = solve(BY_NAME[name], optimizer, steps)
    assert run.error <= TARGET_X, run
    assert run.inequality_violation <= TARGET_VIOLATION and run.violation <= TARGET_VIOLATION, run
    assert run.active == list(BY_NAME[name].active), run
