r"""PINNacle's Burgers1d-C: its exact solution by the Cole-Hopf transform, and its points.

.. math::

    u_t + u\,u_x = \nu\,u_{xx}, \quad (x, t) \in [-1, 1] \times [0, 1], \qquad
    u(x, 0) = -\sin(\pi x), \qquad u(\pm 1, t) = 0, \qquad \nu = 0.01 / \pi

(PINNacle's ``Burgers1D``; its reference is a COMSOL solve, ours the exact solution). With
:math:`u = -2\nu\,\varphi_x / \varphi` the problem becomes the heat equation
:math:`\varphi_t = \nu\varphi_{xx}`, :math:`\varphi(x, 0) \propto F(x) = \exp(-\cos(\pi x) / (2\pi\nu))`, so

.. math::

    u(x, t) = -\frac{\int_{\mathbb{R}} \sin(\pi(x - \eta))\, F(x - \eta)\, e^{-\eta^2 / (4\nu t)}\, d\eta}
                   {\int_{\mathbb{R}} F(x - \eta)\, e^{-\eta^2 / (4\nu t)}\, d\eta}

(Basdevant et al., Comput. Fluids 14, 1986; the odd, 2-periodic data make u(±1, t) = 0). With
:math:`\eta = \sqrt{4\nu t}\, z` both integrals are over :math:`e^{-z^2 - \cos(\pi(x - \sqrt{4\nu t} z))/(2\pi\nu)}`,
evaluated by the trapezoidal rule on :math:`z \in [-Z, Z]` (``n_quadrature`` nodes) with the largest
exponent factored out (it reaches :math:`1/(2\pi\nu) = 50`); the rule converges spectrally for this
smooth, rapidly decaying integrand. tests/tasks/test_pinnacle_references.py checks it by refining the
rule and against the published slope :math:`u_x(0, 1/\pi) = -152.00516` (Basdevant et al.).

Points (:class:`~lit_constrained.physics.Box` over (x, t), seeded): ``x_pde`` inside; ``x_boundary`` on
x = ±1; ``x_initial`` at t = 0; their ``_imposed`` (seed + 1) and ``_check`` (seed + 2) sets; ``x_test``
the n_test_x x n_test_t grid with the exact ``u_test``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics import Box, SamplingMethod
from lit_constrained.tasks.pinnacle_common import as_float64, check_counts

__all__ = ["NU", "DOMAIN", "burgers_exact", "burgers_initial", "burgers_points"]

#: PINNacle's viscosity 0.01 / pi
NU = 0.01 / math.pi
#: (x, t) in [-1, 1] x [0, 1]
DOMAIN = Box((-1.0, 0.0), (1.0, 1.0), names=("x", "t"))
#: the quadrature's half-width in z (exponents below e^{-90} of the largest are left out)
Z_MAX = 14.0


def burgers_initial(x: Tensor) -> Tensor:
    r""":math:`u(x, 0) = -\sin(\pi x)`."""
    return -torch.sin(math.pi * x)


def burgers_exact(x: np.ndarray, t: np.ndarray, nu: float = NU, n_quadrature: int = 4001,
                  chunk: int = 4096) -> np.ndarray:
    """The Cole-Hopf solution u(x, t) at paired points (``x``, ``t`` broadcast to one shape), float64.

    ``n_quadrature``: trapezoidal nodes on z in [-Z_MAX, Z_MAX]; t = 0 returns the initial condition.
    """
    if not nu > 0:
        raise ValueError(f"the viscosity nu must be positive, got {nu!r}.")
    if n_quadrature < 3:
        raise ValueError(f"n_quadrature must be >= 3, got {n_quadrature}.")
    x, t = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(t, dtype=np.float64))
    shape = x.shape
    x, t = x.reshape(-1), t.reshape(-1)
    if (t < 0).any():
        raise ValueError("burgers_exact: t must be >= 0.")
    z = np.linspace(-Z_MAX, Z_MAX, n_quadrature)
    weights = np.full(n_quadrature, z[1] - z[0])
    weights[[0, -1]] *= 0.5
    u = -np.sin(np.pi * x)
    for start in range(0, len(x), chunk):
        xs, ts = x[start:start + chunk], t[start:start + chunk]
        live = ts > 0
        if not live.any():
            continue
        y = xs[live, None] - np.sqrt(4.0 * nu * ts[live, None]) * z[None, :]  # x - eta
        exponent = -z[None, :] ** 2 - np.cos(np.pi * y) / (2.0 * np.pi * nu)
        kernel = weights * np.exp(exponent - exponent.max(axis=1, keepdims=True))
        block = u[start:start + chunk]
        block[live] = -(kernel * np.sin(np.pi * y)).sum(1) / kernel.sum(1)
        u[start:start + chunk] = block
    return u.reshape(shape)


def burgers_points(
    n_pde: int = 1024,
    n_boundary: int = 256,
    n_initial: int = 256,
    n_pde_imposed: int = 25,
    n_boundary_imposed: int = 12,
    n_initial_imposed: int = 13,
    n_check: int = 256,
    n_test_x: int = 201,
    n_test_t: int = 101,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of Burgers1d-C and the exact solution on the test grid (float64 arrays)."""
    check_counts(n_pde=n_pde, n_boundary=n_boundary, n_initial=n_initial, n_pde_imposed=n_pde_imposed,
                 n_boundary_imposed=n_boundary_imposed, n_initial_imposed=n_initial_imposed, n_check=n_check)
    if n_test_x < 2 or n_test_t < 2:
        raise ValueError(f"the test grid needs n_test_x, n_test_t >= 2, got {n_test_x}, {n_test_t}.")

    def sets(name: str, sample: Any, n: int, n_imposed: int) -> dict[str, Tensor]:
        return {f"x_{name}": sample(n, seed), f"x_{name}_imposed": sample(n_imposed, seed + 1) if n_imposed
                else torch.zeros(0, 2, dtype=torch.float64), f"x_{name}_check": sample(n_check, seed + 2)}

    arrays: dict[str, Any] = {}
    arrays |= sets("pde", lambda n, s: DOMAIN.interior(n, method, s), n_pde, n_pde_imposed)
    arrays |= sets("boundary", lambda n, s: DOMAIN.boundary(n, method, s, dims=("x",)), n_boundary, n_boundary_imposed)
    arrays |= sets("initial", lambda n, s: DOMAIN.initial(n, method, s, time="t"), n_initial, n_initial_imposed)
    x_test = DOMAIN.grid((n_test_x, n_test_t)).numpy()
    arrays["x_test"] = x_test
    arrays["u_test"] = burgers_exact(x_test[:, 0], x_test[:, 1])
    return as_float64(arrays)
