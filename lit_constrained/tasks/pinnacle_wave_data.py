r"""PINNacle's Wave1d-C: its closed-form solution and its points.

.. math::

    u_{tt} = C^2 u_{xx}, \quad (x, t) \in [0, 1]^2, \ C = 2, \qquad
    u(0, t) = u(1, t) = 0, \qquad u(x, 0) = \sin(\pi x) + \tfrac12 \sin(a\pi x), \qquad u_t(x, 0) = 0,

solved by :math:`u = \sin(\pi x)\cos(2\pi t) + \tfrac12 \sin(a\pi x)\cos(2a\pi t)`, a = 4 (PINNacle's
``Wave1D``: C = 2, a = 4; its initial velocity condition is a Neumann condition on t = 0, written here as
:math:`u_t = 0`, the outward normal derivative there being :math:`-u_t`).

Points (:class:`~lit_constrained.physics.Box` over (x, t), seeded): ``x_pde`` inside, ``x_boundary`` on
x = 0, 1, ``x_initial`` at t = 0 (where the value and the velocity are both imposed: a two-column
residual); ``_imposed`` seed + 1, ``_check`` seed + 2; ``x_test`` an n_test x n_test grid with the exact
``u_test``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics import Box, SamplingMethod
from lit_constrained.tasks.pinnacle_common import as_float64, check_counts

__all__ = ["SPEED", "MODE", "DOMAIN", "wave_exact", "wave_points"]

#: the wave speed C
SPEED = 2.0
#: the second mode's wavenumber a (PINNacle: 4)
MODE = 4
DOMAIN = Box((0.0, 0.0), (1.0, 1.0), names=("x", "t"))


def wave_exact(xt: Tensor) -> Tensor:
    r""":math:`u = \sin(\pi x)\cos(2\pi t) + \tfrac12\sin(a\pi x)\cos(2a\pi t)` at the points (N, 2) = (x, t)."""
    x, t = xt[:, 0], xt[:, 1]
    return (torch.sin(math.pi * x) * torch.cos(SPEED * math.pi * t)
            + 0.5 * torch.sin(MODE * math.pi * x) * torch.cos(SPEED * MODE * math.pi * t))


def wave_points(
    n_pde: int = 1024,
    n_boundary: int = 256,
    n_initial: int = 256,
    n_pde_imposed: int = 25,
    n_boundary_imposed: int = 12,
    n_initial_imposed: int = 13,
    n_check: int = 256,
    n_test: int = 101,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of Wave1d-C and the exact solution on the test grid (float64 arrays)."""
    check_counts(n_pde=n_pde, n_boundary=n_boundary, n_initial=n_initial, n_pde_imposed=n_pde_imposed,
                 n_boundary_imposed=n_boundary_imposed, n_initial_imposed=n_initial_imposed, n_check=n_check)
    empty = torch.zeros(0, 2, dtype=torch.float64)
    samplers = {
        "pde": (lambda n, s: DOMAIN.interior(n, method, s), n_pde, n_pde_imposed),
        "boundary": (lambda n, s: DOMAIN.boundary(n, method, s, dims=("x",)), n_boundary, n_boundary_imposed),
        "initial": (lambda n, s: DOMAIN.initial(n, method, s, time="t"), n_initial, n_initial_imposed),
    }
    arrays: dict[str, Any] = {}
    for name, (sample, n, n_imposed) in samplers.items():
        arrays[f"x_{name}"] = sample(n, seed)
        arrays[f"x_{name}_imposed"] = sample(n_imposed, seed + 1) if n_imposed else empty
        arrays[f"x_{name}_check"] = sample(n_check, seed + 2)
    x_test = DOMAIN.grid(n_test)
    arrays["x_test"], arrays["u_test"] = x_test, wave_exact(x_test)
    return as_float64(arrays)
