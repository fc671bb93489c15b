"""The dual active-set solver (lit_constrained/optim/active_set.py) against a KKT enumeration.

For rows [J; G] (m equalities, p inequalities), the step's subproblem min ||d - v||^2 s.t. J d = -b_E,
G d <= -b_I has one solution d*. The enumeration tries every subset A of the inequality rows, solves the
equality-constrained problem on E + A by a dense least-norm solve (numpy lstsq), and keeps the subset
whose solution is primal feasible with non-negative multipliers: an independent computation of d*.
solve_dual's multipliers give d = v - [J; G]^T lambda, compared to d*."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from lit_constrained.optim.active_set import solve_dual


def kkt_enumeration(A: np.ndarray, b: np.ndarray, v: np.ndarray, m: int) -> tuple[np.ndarray, set[int]]:
    """d* of min ||d - v||^2 s.t. A[:m] d = -b[:m], A[m:] d <= -b[m:], by enumerating active sets."""
    k = A.shape[0]
    for size in range(k - m + 1):
        for subset in itertools.combinations(range(m, k), size):
            rows = list(range(m)) + list(subset)
            # d = v - A_rows^T lam with A_rows d = -b_rows: (A_rows A_rows^T) lam = b_rows + A_rows v
            lam, *_ = np.linalg.lstsq(A[rows] @ A[rows].T, b[rows] + A[rows] @ v, rcond=None)
            d = v - A[rows].T @ lam
            if np.abs(A[rows] @ d + b[rows]).max(initial=0.0) > 1e-9:
                continue  # the rows cannot all hold with equality
            if size and lam[m:].min() < -1e-10:
                continue
            if k > m and (A[m:] @ d + b[m:]).max() > 1e-9:
                continue
            return d, {row - m for row in subset}
    raise AssertionError("no KKT point: infeasible instance")


def dual_step(A: np.ndarray, b: np.ndarray, v: np.ndarray, m: int) -> tuple[np.ndarray, list[int]]:
    H = A @ A.T
    q = b + A @ v
    solution = solve_dual(H, q, m, rcond=1e-10)
    return v - A.T @ solution.multipliers, solution.active


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n, m, p", [(12, 3, 6), (8, 0, 7), (5, 2, 6)])
def test_the_dual_step_is_the_kkt_point(seed: int, n: int, m: int, p: int) -> None:
    """Random rows; (5, 2, 6) has more rows than unknowns (a semidefinite Gram: the free set must stay
    independent). Feasible by construction: b is chosen so that a random point d0 satisfies every row."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m + p, n))
    d0 = rng.standard_normal(n)
    b = -(A @ d0)
    b[m:] -= rng.uniform(0.0, 1.0, p) * (rng.uniform(size=p) < 0.6)  # some rows strictly satisfied at d0
    v = 3.0 * rng.standard_normal(n)
    expected, expected_active = kkt_enumeration(A, b, v, m)
    d, active = dual_step(A, b, v, m)
    np.testing.assert_allclose(d, expected, atol=1e-9, rtol=0)
    assert (A[m:] @ d + b[m:]).max() <= 1e-9
    if m:
        np.testing.assert_allclose(A[:m] @ d, -b[:m], atol=1e-9)
    # the rows the solver calls active hold with equality; the enumeration's active rows are among them
    # (a weakly active row, on its bound with a zero multiplier, may be in either)
    assert np.abs(A[m:][active] @ d + b[m:][active]).max(initial=0.0) <= 1e-9


def test_a_dependent_row_swaps_with_the_row_it_depends_on() -> None:
    """n = 2: one equality and three inequality rows, all four on their bounds at d0 = (-0.3, 0.3)
    (a degenerate vertex: more rows through it than unknowns, so an entering row depends on the free
    ones). The direction v pushes into the rows; the step is the enumeration's KKT point."""
    A = np.array([[1.0, 1.0], [0.0, -1.0], [1.0, 0.0], [1.0, -1.0]])
    d0 = np.array([-0.3, 0.3])
    b = -(A @ d0)
    v = np.array([-2.0, 1.0])
    expected, _ = kkt_enumeration(A, b, v, 1)
    d, _ = dual_step(A, b, v, 1)
    np.testing.assert_allclose(d, expected, atol=1e-12)


def test_a_row_that_conflicts_with_an_equality_is_set_aside() -> None:
    """x1 = 1 (equality) and x1 <= 0: no feasible point; the solver reports the row as conflicting and
    keeps the equality."""
    A = np.array([[1.0, 0.0], [1.0, 0.0]])
    b = np.array([-1.0, 0.0])  # x1 - 1 = 0 at d = 0: A d + b with b = -1 -> d1 = 1; the row d1 <= 0
    v = np.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solution = solve_dual(A @ A.T, b + A @ v, 1, rcond=1e-10)
    assert solution.conflicting == [0]
    assert solution.active == []
    d = v - A.T @ solution.multipliers
    np.testing.assert_allclose(d, [1.0, 0.0], atol=1e-12)


def test_a_row_the_objective_pushes_against_stays_on_its_bound_under_adams_scaling() -> None:
    """min ||x - (2, 2)||^2 s.t. x1 + 2 x2 <= 1: the KKT point is the projection (1, 0) (multiplier 2 > 0).
    The row is slanted, so Adam's diagonal scaling of a direction along it has a component off it; the
    row must still stay on its bound at every step once active, and x reach (1, 0) (before the row was
    held, it left on that component every ~60 steps and SQP-Adam stalled short of x*)."""
    import torch

    from lit_constrained.optim import SQPAdam

    x = torch.nn.Parameter(torch.tensor([-1.0, -1.0], dtype=torch.float64))
    opt = SQPAdam([x], lr=0.1)
    steps = 600
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / steps)
    G = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    first_active, released = None, []
    for k in range(steps):
        opt.zero_grad()
        ((x - 2.0) ** 2).sum().backward()
        with torch.no_grad():
            g = G @ x - 1.0
        opt.step(inequalities=g, inequality_jacobian=G)
        schedule.step()
        if opt.active_set.numel() and first_active is None:
            first_active = k
        elif first_active is not None and not opt.active_set.numel():
            released.append(k)
    assert first_active is not None and not released, (first_active, released[:10])
    assert torch.allclose(x.detach(), torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0), x
    assert float(opt.inequality_multipliers[0]) >= 0.0
