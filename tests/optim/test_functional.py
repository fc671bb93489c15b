"""The functional core (lit_constrained.optim.functional) without an optimizer object, against
independent dense computations: the KKT system of the projected step, Adam's moments in closed form, and
the inequality subproblem by enumeration of its active sets."""

from __future__ import annotations

import itertools
import math

import torch

from lit_constrained.optim.functional import adam_con, sqp_adam, sqp_heavy_ball
from lit_constrained.optim.workspace import Workspace

F64 = torch.float64


def _problem(m: int = 3, n: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, n, generator=gen, dtype=F64), torch.randn(m, generator=gen, dtype=F64),
            torch.randn(n, generator=gen, dtype=F64))


def _groups(n: int, **hyper: object) -> list[tuple[dict, slice]]:
    group = {"lr": 0.1, "rho": 1.0, "rcond": 1e-7, "max_normal_step": None, **hyper}
    return [(group, slice(0, n))]


def _projector(J: torch.Tensor) -> torch.Tensor:
    """P = I - J^T (J J^T)^{-1} J, dense."""
    return torch.eye(J.shape[1], dtype=F64) - J.T @ torch.linalg.solve(J @ J.T, J)


def test_heavy_ball_with_beta_zero_is_the_kkt_step():
    """beta = 0, rho = h = 1: d solves [[I, J^T], [J, 0]] [d; y] = -[g; c] and the step is lr d."""
    J, c, g = _problem()
    m, n = J.shape
    x = torch.zeros(n, dtype=F64)
    state = {"step": 0, "momentum": torch.zeros(n, dtype=F64)}
    result = sqp_heavy_ball([x], g, c, J, state, groups=_groups(n, momentum=0.0, h=1.0))
    K = torch.zeros(n + m, n + m, dtype=F64)
    K[:n, :n], K[:n, n:], K[n:, :n] = torch.eye(n, dtype=F64), J.T, J
    d = torch.linalg.solve(K, -torch.cat([g, c]))[:n]
    assert torch.allclose(result.delta, 0.1 * d, rtol=1e-12, atol=1e-14)
    assert result.state["step"] == 1 and state["step"] == 0  # a new state dict; the old one keeps k - 1
    assert torch.allclose(J @ result.delta, -0.1 * c, rtol=1e-12, atol=1e-14)


def test_sqp_adam_moments_and_step_in_closed_form():
    """Three steps at a fixed J: r_k = sum_j beta1^(k-j) u_j, s_k = sum_j beta2^(k-j) u_j^2 with
    u_j = -P g_j / h, and Delta x_k = lr (v + eta_k P(r_k / sqrt(s_k + eps))), v = -rho J^+ c."""
    J, _, _ = _problem(seed=1)
    m, n = J.shape
    gen = torch.Generator().manual_seed(2)
    beta1, beta2, eps, h, lr, rho = 0.8, 0.95, 1e-7, 2.0, 0.05, 0.5
    groups = _groups(n, lr=lr, rho=rho, betas=(beta1, beta2), eps=eps, h=h)
    state = {"step": 0, "momentum": torch.zeros(n, dtype=F64), "second_moment": torch.zeros(n, dtype=F64)}
    workspace = Workspace()
    P = _projector(J)
    us = []
    for k in range(1, 4):
        g, c = torch.randn(n, generator=gen, dtype=F64), torch.randn(m, generator=gen, dtype=F64)
        result = sqp_adam([torch.zeros(n, dtype=F64)], g, c, J, state, groups=groups, workspace=workspace)
        state = result.state
        us.append(-(P @ g) / h)
        r = sum(beta1 ** (k - j) * u for j, u in enumerate(us, start=1))
        s = sum(beta2 ** (k - j) * u * u for j, u in enumerate(us, start=1))
        assert torch.allclose(state["momentum"], r, rtol=1e-12, atol=1e-15)
        assert torch.allclose(state["second_moment"], s, rtol=1e-12, atol=1e-15)
        eta = (1 - beta1) * math.sqrt(1 - beta2**k) / math.sqrt(1 - beta2)
        v = -rho * J.T @ torch.linalg.solve(J @ J.T, c)
        expected = lr * (v + eta * P @ (r / torch.sqrt(s + eps)))
        assert torch.allclose(result.delta, expected, rtol=1e-10, atol=1e-14)
        assert state["step"] == k


def test_adam_con_is_the_kkt_step_with_adam_scaling():
    """Adam's moments of the raw gradient with the standard bias correction, H = diag(sqrt(v_hat + eps)),
    [[H, J^T], [J, 0]] [d; y] = -[m_hat; c] (dense), Delta x = lr d (rho = 1)."""
    J, _, _ = _problem(seed=3)
    m, n = J.shape
    gen = torch.Generator().manual_seed(4)
    beta1, beta2, eps, lr = 0.9, 0.99, 1e-7, 0.02
    groups = _groups(n, lr=lr, betas=(beta1, beta2), eps=eps)
    state = {"step": 0, "exp_avg": torch.zeros(n, dtype=F64), "exp_avg_sq": torch.zeros(n, dtype=F64)}
    workspace = Workspace()
    mk = vk = torch.zeros(n, dtype=F64)
    for k in range(1, 4):
        g, c = torch.randn(n, generator=gen, dtype=F64), torch.randn(m, generator=gen, dtype=F64)
        result = adam_con([torch.zeros(n, dtype=F64)], g, c, J, state, groups=groups, workspace=workspace)
        state = result.state
        mk, vk = beta1 * mk + (1 - beta1) * g, beta2 * vk + (1 - beta2) * g * g
        assert torch.allclose(state["exp_avg"], mk, rtol=1e-13) and torch.allclose(state["exp_avg_sq"], vk, rtol=1e-13)
        H = torch.sqrt(vk / (1 - beta2**k) + eps)
        K = torch.zeros(n + m, n + m, dtype=F64)
        K[:n, :n], K[:n, n:], K[n:, :n] = torch.diag(H), J.T, J
        d = torch.linalg.solve(K, -torch.cat([mk / (1 - beta1**k), c]))[:n]
        assert torch.allclose(result.delta, lr * d, rtol=1e-10, atol=1e-14)


def _enumerated_projection(y: torch.Tensor, J: torch.Tensor, c: torch.Tensor, G: torch.Tensor, q: torch.Tensor
                           ) -> tuple[torch.Tensor, list[int]]:
    """argmin ||d - y||^2 s.t. J d = -c, q + G d <= 0, by enumerating the active sets (KKT: feasible,
    multipliers >= 0)."""
    p = G.shape[0]
    for size in range(p + 1):
        for active in itertools.combinations(range(p), size):
            A = torch.cat([J, G[list(active)]])
            b = torch.cat([c, q[list(active)]])
            nu = torch.linalg.solve(A @ A.T, A @ y + b)
            d = y - A.T @ nu
            if bool((q + G @ d <= 1e-12).all()) and bool((nu[J.shape[0]:] >= -1e-12).all()):
                return d, list(active)
    raise AssertionError("no KKT point")


def test_inequality_rows_solve_the_projection_subproblem():
    """Heavy ball, beta = 0, rho = "full": the step is the projection of lr (-P g) onto
    {J d = -c, q + G d <= 0} (one row active here), as the dense enumeration finds it."""
    J, c, g = _problem(m=2, n=6, seed=5)
    n = J.shape[1]
    G = torch.eye(n, dtype=F64)[:3]  # bounds on x_0, x_1, x_2 at the origin: q = x_i - 0 <= 0 with x = 0
    q = torch.tensor([-1e-3, -5e-2, -2e-1], dtype=F64)
    lr = 0.5
    groups = _groups(n, lr=lr, rho="full", momentum=0.0, h=1.0)
    state = {"step": 0, "momentum": torch.zeros(n, dtype=F64)}
    result = sqp_heavy_ball([torch.zeros(n, dtype=F64)], g, c, J, state, groups=groups, inequalities=q,
                            inequality_jacobian=G)
    y = -lr * (_projector(J) @ g)
    expected, active = _enumerated_projection(y, J, c, G, q)
    assert active, "the case must have an active row"
    assert result.active == active
    assert torch.allclose(result.delta, expected, rtol=1e-10, atol=1e-13)
    assert set(result.state["active_set"].tolist()) <= set(active)  # the next working set: active rows only
