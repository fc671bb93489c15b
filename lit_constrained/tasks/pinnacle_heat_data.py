r"""PINNacle's Heat2d-MS (multi-scale): its closed-form solution and its points.

.. math::

    u_t = k_x u_{xx} + k_y u_{yy}, \quad (x, y, t) \in [0, 1]^2 \times [0, 5], \qquad
    k_x = \frac{1}{(500\pi)^2}, \ k_y = \frac{1}{\pi^2},

    u(x, y, 0) = \sin(20\pi x)\sin(\pi y), \qquad u = 0 \ \text{on the square's sides},

solved by :math:`u = \sin(20\pi x)\sin(\pi y)\,e^{-(400\pi^2 k_x + \pi^2 k_y) t}` (PINNacle's
``Heat2D_Multiscale``: pde_coef = (1/(500 pi)^2, 1/pi^2), init_coef = (20 pi, pi)): ten periods in x
against half of one in y, and diffusivities 2.5e5 apart.

Points (:class:`~lit_constrained.physics.Box` over (x, y, t), seeded): ``x_pde`` inside, ``x_boundary`` on
the lateral sides (x or y = 0, 1), ``x_initial`` at t = 0; ``_imposed`` seed + 1, ``_check`` seed + 2;
``x_test`` the n_test_x x n_test_y x n_test_t grid with the exact ``u_test``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics import Box, SamplingMethod
from lit_constrained.tasks.pinnacle_common import as_float64, check_counts

__all__ = ["DIFFUSIVITY", "FREQUENCY", "DOMAIN", "heat_exact", "heat_initial", "heat_points"]

#: (k_x, k_y)
DIFFUSIVITY = (1.0 / (500.0 * math.pi) ** 2, 1.0 / math.pi**2)
#: the initial condition's angular frequencies in x and y
FREQUENCY = (20.0 * math.pi, math.pi)
DOMAIN = Box((0.0, 0.0, 0.0), (1.0, 1.0, 5.0), names=("x", "y", "t"))
DECAY = DIFFUSIVITY[0] * FREQUENCY[0] ** 2 + DIFFUSIVITY[1] * FREQUENCY[1] ** 2


def heat_initial(xyt: Tensor) -> Tensor:
    r""":math:`u(x, y, 0) = \sin(20\pi x)\sin(\pi y)` at the points (N, 3) (t ignored)."""
    return torch.sin(FREQUENCY[0] * xyt[:, 0]) * torch.sin(FREQUENCY[1] * xyt[:, 1])


def heat_exact(xyt: Tensor) -> Tensor:
    r""":math:`u = \sin(20\pi x)\sin(\pi y)\,e^{-(400\pi^2 k_x + \pi^2 k_y) t}` at the points (N, 3)."""
    return heat_initial(xyt) * torch.exp(-DECAY * xyt[:, 2])


def heat_points(
    n_pde: int = 1024,
    n_boundary: int = 256,
    n_initial: int = 256,
    n_pde_imposed: int = 25,
    n_boundary_imposed: int = 12,
    n_initial_imposed: int = 13,
    n_check: int = 256,
    n_test_x: int = 101,
    n_test_y: int = 21,
    n_test_t: int = 11,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of Heat2d-MS and the exact solution on the test grid (float64 arrays)."""
    check_counts(n_pde=n_pde, n_boundary=n_boundary, n_initial=n_initial, n_pde_imposed=n_pde_imposed,
                 n_boundary_imposed=n_boundary_imposed, n_initial_imposed=n_initial_imposed, n_check=n_check)
    empty = torch.zeros(0, 3, dtype=torch.float64)
    samplers = {
        "pde": (lambda n, s: DOMAIN.interior(n, method, s), n_pde, n_pde_imposed),
        "boundary": (lambda n, s: DOMAIN.boundary(n, method, s, dims=("x", "y")), n_boundary, n_boundary_imposed),
        "initial": (lambda n, s: DOMAIN.initial(n, method, s, time="t"), n_initial, n_initial_imposed),
    }
    arrays: dict[str, Any] = {}
    for name, (sample, n, n_imposed) in samplers.items():
        arrays[f"x_{name}"] = sample(n, seed)
        arrays[f"x_{name}_imposed"] = sample(n_imposed, seed + 1) if n_imposed else empty
        arrays[f"x_{name}_check"] = sample(n_check, seed + 2)
    x_test = DOMAIN.grid((n_test_x, n_test_y, n_test_t))
    arrays["x_test"], arrays["u_test"] = x_test, heat_exact(x_test)
    return as_float64(arrays)
