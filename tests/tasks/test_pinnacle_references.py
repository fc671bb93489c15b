"""The PINNacle tasks' reference solutions, each against an independent computation: the Cole-Hopf
quadrature refined and against Basdevant et al.'s published slope, the finite-difference Poisson solve
refined (second order) and against the maximum principle, the closed forms against their PDEs by autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.tasks.pinnacle_burgers_data import NU, burgers_exact
from lit_constrained.tasks.pinnacle_heat_data import DIFFUSIVITY, heat_exact, heat_initial
from lit_constrained.tasks.pinnacle_poisson_data import CENTERS, RADIUS, in_domain, solve_reference
from lit_constrained.tasks.pinnacle_wave_data import SPEED, wave_exact


def test_cole_hopf_quadrature_is_converged_and_meets_the_boundary_and_initial_values():
    x = np.linspace(-1, 1, 41)
    t = np.array([0.05, 0.3, 1 / math.pi, 0.6, 1.0])
    X, T = np.meshgrid(x, t, indexing="ij")
    coarse, fine = burgers_exact(X, T, n_quadrature=1001), burgers_exact(X, T, n_quadrature=8001)
    assert np.abs(coarse - fine).max() < 1e-12  # the trapezoidal rule converges spectrally
    assert np.abs(burgers_exact(np.array([-1.0, 1.0]), np.array([0.7, 0.7]))).max() < 1e-12
    assert np.allclose(burgers_exact(x, np.zeros_like(x)), -np.sin(np.pi * x), atol=1e-15)
    with pytest.raises(ValueError, match="t must be >= 0"):
        burgers_exact(np.array([0.0]), np.array([-0.1]))


def test_cole_hopf_gives_basdevants_steepest_slope():
    """Basdevant et al. (Comput. Fluids 14, 1986): max |u_x(0, t)| = 152.00516, at t = 0.5105 (nu = 0.01 / pi)."""
    h = 1e-7
    slope = (burgers_exact(np.array([h]), 0.5105) - burgers_exact(np.array([-h]), 0.5105))[0] / (2 * h)
    assert slope == pytest.approx(-152.00516, abs=2e-4)
    neighbours = [(burgers_exact(np.array([h]), t) - burgers_exact(np.array([-h]), t))[0] / (2 * h) for t in (0.50, 0.52)]
    assert all(abs(s) < abs(slope) for s in neighbours)


def test_cole_hopf_solves_burgers_by_finite_differences():
    """u_t + u u_x - nu u_xx by centred differences of the quadrature, small against its terms (away from the shock)."""
    x, t, h, k = np.array([-0.6, 0.4, 0.7]), 0.3, 1e-3, 1e-4
    u = lambda dx, dt: burgers_exact(x + dx, np.full_like(x, t + dt))  # noqa: E731
    u_t = (u(0, k) - u(0, -k)) / (2 * k)
    u_x = (u(h, 0) - u(-h, 0)) / (2 * h)
    u_xx = (u(h, 0) - 2 * u(0, 0) + u(-h, 0)) / h**2
    residual = u_t + u(0, 0) * u_x - NU * u_xx
    assert np.abs(residual).max() < 1e-5 * np.abs(u_t).max()


def test_poisson_reference_converges_at_second_order_and_obeys_the_maximum_principle():
    solutions = {n: solve_reference(n) for n in (40, 80, 160)}
    diffs = []
    for coarse, fine in ((40, 80), (80, 160)):
        u_coarse, u_fine = solutions[coarse][1], solutions[fine][1][::2, ::2]
        diffs.append(np.nanmax(np.abs(u_coarse - u_fine)))
    assert 3.5 < diffs[0] / diffs[1] < 4.6  # h^2: the difference shrinks 4x per halving
    assert diffs[1] < 5e-4
    nodes, u, inside = solutions[160]
    assert np.isnan(u[~inside]).all() and np.isfinite(u[inside]).all()
    assert (u[inside] >= 0).all() and (u[inside] <= 1).all()  # harmonic: between its boundary values
    assert np.allclose(u[0, :], 1) and np.allclose(u[:, -1], 1)
    assert not in_domain(CENTERS).any() and in_domain(CENTERS + [RADIUS * 1.01, 0]).all()
    with pytest.raises(ValueError, match="multiple of 10"):
        solve_reference(45)


def test_poisson_reference_is_symmetric():
    """The domain and data are symmetric under x -> -x, y -> -y and x <-> y: so is the discrete solution."""
    _, u, inside = solve_reference(80)
    for mirrored in (u[::-1, :], u[:, ::-1], u.T):
        both = inside & np.isfinite(mirrored)  # a node within rounding of a circle may fall on either side
        assert both.sum() > 0.99 * inside.sum()
        assert np.abs(u[both] - mirrored[both]).max() < 1e-9  # the nodes' coordinates round asymmetrically


def _derivative(f, x: torch.Tensor, i: int, j: int | None = None) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    if j is None:
        return g[:, i]
    return torch.autograd.grad(g[:, i].sum(), x)[0][:, j]


def test_wave_closed_form_solves_its_problem():
    x = torch.rand(64, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    residual = _derivative(wave_exact, x, 1, 1) - SPEED**2 * _derivative(wave_exact, x, 0, 0)
    assert residual.abs().max() < 1e-9
    start = x * torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert _derivative(wave_exact, start, 1).abs().max() < 1e-12
    sides = torch.tensor([[0.0, 0.3], [1.0, 0.8]], dtype=torch.float64)
    assert wave_exact(sides).abs().max() < 1e-14


def test_heat_closed_form_solves_its_problem():
    x = torch.rand(64, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * torch.tensor([1, 1, 5.0])
    residual = (_derivative(heat_exact, x, 2) - DIFFUSIVITY[0] * _derivative(heat_exact, x, 0, 0)
                - DIFFUSIVITY[1] * _derivative(heat_exact, x, 1, 1))
    assert residual.abs().max() < 1e-10
    start = x * torch.tensor([1, 1, 0.0], dtype=torch.float64)
    assert torch.allclose(heat_exact(start), torch.sin(20 * math.pi * start[:, 0]) * torch.sin(math.pi * start[:, 1]))
    assert torch.allclose(heat_initial(x), heat_exact(start))
    sides = torch.tensor([[0.0, 0.4, 1.0], [1.0, 0.4, 2.0], [0.3, 0.0, 3.0], [0.3, 1.0, 4.0]], dtype=torch.float64)
    assert heat_exact(sides).abs().max() < 1e-14
