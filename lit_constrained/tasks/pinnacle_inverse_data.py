r"""PINNacle's two inverse problems (``src/pde/inverse.py``: ``PoissonInv``, ``HeatInv``): their closed-form
solutions, sources, points and seeded noisy observations.

**PInv** (Poisson inverse) on :math:`\Omega = [0, 1]^2`: recover u and the coefficient a from noisy
observations of u,

.. math::

    -\nabla\cdot(a \nabla u) = f, \qquad u = \sin(\pi x)\sin(\pi y), \qquad
    a = \frac{1}{D}, \ D = 1 + x^2 + y^2 + (x - 1)^2 + (y - 1)^2,

    f = -a\,\Delta u - \nabla a \cdot \nabla u
      = 2\pi^2 a u + \pi a^2 \big((4x - 2)\cos(\pi x)\sin(\pi y) + (4y - 2)\sin(\pi x)\cos(\pi y)\big)

(:math:`\nabla a = -a^2 (4x - 2, 4y - 2)`), a known on :math:`\partial\Omega`, no condition on u; the
observations at PINNacle's 50 x 50 grid (``linspace(0, 1, 50)`` per axis, the boundary included).

*PINNacle's source is not this f.* Its ``f_src`` has ``(2x + 1)`` and ``(2y + 1)`` where the gradient of its
own ``a_ref`` gives ``(2x - 1)`` and ``(2y - 1)``: it differs from :math:`-\nabla\cdot(a_{ref}\nabla u_{ref})`
by :math:`4\pi\sin(\pi(x + y))\,a^2` (39 % of f in L2 on a 101 x 101 grid), so PINNacle's
:math:`(u_{ref}, a_{ref})` does not solve its own PDE. Here f is the source of the stated pair (tested
against autograd in tests/tasks/test_pinnacle_inverse.py), which makes the pair the exact solution of
the problem as posed; :func:`pinnacle_pinv_source` keeps PINNacle's expression for that comparison.

**HInv** (heat inverse) on :math:`[-1, 1]^2 \times [0, 1]`:

.. math::

    u_t - \nabla\cdot(a \nabla u) = f, \qquad u = e^{-t}\sin(\pi x)\sin(\pi y), \qquad
    a(x, y) = 2 + \sin(\pi x)\sin(\pi y),

    f = e^{-t}\Big((4\pi^2 - 1)\, s_x s_y + \pi^2\big(2 s_x^2 s_y^2 - c_x^2 s_y^2 - s_x^2 c_y^2\big)\Big)

(:math:`s_x = \sin\pi x`, :math:`c_x = \cos\pi x`, ...; PINNacle's f, which is consistent), a independent
of t and known on the square's sides; no initial or boundary condition on u. PINNacle reads 2 500
observation points from ``ref/heatinv_points.dat`` (uniform in the box by their statistics: means 0, 0,
0.49, standard deviations 0.58, 0.57, 0.29); here 2 500 seeded uniform points of the same box.

**Observations** (both): :math:`d_i = u(x_i) + \varepsilon_i`, :math:`\varepsilon_i \sim N(0, \sigma^2)`,
:math:`\sigma = 0.1` (PINNacle's), drawn from ``numpy.random.default_rng(seed + 3)``. ``x_band_imposed``
is a seeded subset of them (``seed + 4``, without replacement) packed with their values, rows
:math:`(x_i, d_i)`: where the band :math:`|u(x_i) - d_i| \le k\sigma` is imposed.

**Points** (:class:`~lit_constrained.physics.Box`, seeded): ``x_pde`` (objective), ``x_pde_imposed``
(seed + 1), ``x_pde_check`` (seed + 2) inside; ``x_coef`` / ``x_coef_imposed`` / ``x_coef_check`` on the
boundary of the coefficient's domain (the square) where a is known; ``x_test`` a tensor grid with
``u_test`` and ``a_test``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics import Box, SamplingMethod
from lit_constrained.tasks.cache import DEFAULT_CACHE_DIR
from lit_constrained.tasks.datamodule import Split
from lit_constrained.tasks.pinnacle_common import PinnaclePoints, as_float64, check_counts
from lit_constrained.tasks.sampling import BatchMode

__all__ = [
    "HINV_COEF_DOMAIN", "HINV_DOMAIN", "NOISE", "PINV_DOMAIN", "HeatInverseData", "InverseData", "PoissonInverseData",
    "hinv_a", "hinv_points", "hinv_source", "hinv_u", "pinnacle_pinv_source", "pinv_a", "pinv_points", "pinv_source",
    "pinv_u",
]

#: PINNacle's observation noise (standard deviation)
NOISE = 0.1
PINV_DOMAIN = Box((0.0, 0.0), (1.0, 1.0), names=("x", "y"))
HINV_DOMAIN = Box((-1.0, -1.0, 0.0), (1.0, 1.0, 1.0), names=("x", "y", "t"))
HINV_COEF_DOMAIN = Box((-1.0, -1.0), (1.0, 1.0), names=("x", "y"))
PI = math.pi


# ------------------------------------------------------------------------------------------ PInv
def pinv_u(xy: Tensor) -> Tensor:
    r""":math:`u = \sin(\pi x)\sin(\pi y)` at the points (N, 2)."""
    return torch.sin(PI * xy[:, 0]) * torch.sin(PI * xy[:, 1])


def pinv_a(xy: Tensor) -> Tensor:
    r""":math:`a = 1 / (1 + x^2 + y^2 + (x - 1)^2 + (y - 1)^2)` at the points (N, 2)."""
    x, y = xy[:, 0], xy[:, 1]
    return 1.0 / (1.0 + x**2 + y**2 + (x - 1.0) ** 2 + (y - 1.0) ** 2)


def pinv_source(xy: Tensor) -> Tensor:
    r""":math:`f = -\nabla\cdot(a\nabla u)` of :func:`pinv_u`, :func:`pinv_a` (the module docstring's formula)."""
    x, y = xy[:, 0], xy[:, 1]
    a = pinv_a(xy)
    sx, cx, sy, cy = torch.sin(PI * x), torch.cos(PI * x), torch.sin(PI * y), torch.cos(PI * y)
    return 2 * PI**2 * a * sx * sy + PI * a**2 * ((4 * x - 2) * cx * sy + (4 * y - 2) * sx * cy)


def pinnacle_pinv_source(xy: Tensor) -> Tensor:
    r"""PINNacle's ``PoissonInv.f_src`` as written (``(2x + 1)``, ``(2y + 1)``): not the source of its own
    :math:`(u_{ref}, a_{ref})` (see the module docstring); kept to measure the difference, not used."""
    x, y = xy[:, 0], xy[:, 1]
    a = pinv_a(xy)
    sx, cx, sy, cy = torch.sin(PI * x), torch.cos(PI * x), torch.sin(PI * y), torch.cos(PI * y)
    return 2 * PI**2 * sx * sy * a + 2 * PI * ((2 * x + 1) * cx * sy + (2 * y + 1) * sx * cy) * a**2


# ------------------------------------------------------------------------------------------ HInv
def hinv_u(xyt: Tensor) -> Tensor:
    r""":math:`u = e^{-t}\sin(\pi x)\sin(\pi y)` at the points (N, 3)."""
    return torch.exp(-xyt[:, 2]) * torch.sin(PI * xyt[:, 0]) * torch.sin(PI * xyt[:, 1])


def hinv_a(xy: Tensor) -> Tensor:
    r""":math:`a = 2 + \sin(\pi x)\sin(\pi y)` at the points (N, >= 2) (later columns, t, ignored)."""
    return 2.0 + torch.sin(PI * xy[:, 0]) * torch.sin(PI * xy[:, 1])


def hinv_source(xyt: Tensor) -> Tensor:
    r""":math:`f = u_t - \nabla\cdot(a\nabla u)` of :func:`hinv_u`, :func:`hinv_a` (PINNacle's f)."""
    x, y, t = xyt[:, 0], xyt[:, 1], xyt[:, 2]
    sx, cx, sy, cy = torch.sin(PI * x), torch.cos(PI * x), torch.sin(PI * y), torch.cos(PI * y)
    return torch.exp(-t) * ((4 * PI**2 - 1) * sx * sy + PI**2 * (2 * sx**2 * sy**2 - cx**2 * sy**2 - sx**2 * cy**2))


# ------------------------------------------------------------------------------------------ points
def _observations(x_obs: Tensor, u: Tensor, n_band_imposed: int, seed: int) -> dict[str, Any]:
    """The noisy values ``d_obs`` (seed + 3) and the packed band points ``x_band_imposed`` (seed + 4)."""
    d = u.numpy() + np.random.default_rng(seed + 3).normal(0.0, NOISE, size=len(u))
    if n_band_imposed > len(d):
        raise ValueError(f"n_band_imposed ({n_band_imposed}) exceeds the {len(d)} observations.")
    pick = np.sort(np.random.default_rng(seed + 4).choice(len(d), size=n_band_imposed, replace=False))
    packed = np.concatenate([x_obs.numpy()[pick], d[pick, None]], axis=1)
    return {"x_obs": x_obs, "d_obs": d, "x_band_imposed": packed}


def _interior_and_coef(domain: Box, coef_domain: Box, counts: dict[str, int], method: SamplingMethod,
                       seed: int) -> dict[str, Any]:
    """``x_pde*`` inside ``domain`` and ``x_coef*`` on ``coef_domain``'s boundary (objective: seed, imposed:
    seed + 1, check: seed + 2; a count of 0 imposed: an empty set)."""
    arrays: dict[str, Any] = {}
    for name, sample, dim in (("pde", domain.interior, domain.dim), ("coef", coef_domain.boundary, coef_domain.dim)):
        for suffix, n, s in (("", counts[f"n_{name}"], seed), ("_imposed", counts[f"n_{name}_imposed"], seed + 1),
                             ("_check", counts["n_check"], seed + 2)):
            arrays[f"x_{name}{suffix}"] = sample(n, method, s) if n else torch.zeros(0, dim, dtype=torch.float64)
    return arrays


def pinv_points(
    n_pde: int = 1024,
    n_coef: int = 256,
    n_pde_imposed: int = 50,
    n_coef_imposed: int = 20,
    n_band_imposed: int = 0,
    n_check: int = 256,
    n_obs_per_axis: int = 50,
    n_test: int = 101,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of PInv, its observations and the exact u, a on the n_test x n_test grid (float64)."""
    check_counts(n_pde=n_pde, n_coef=n_coef, n_pde_imposed=n_pde_imposed, n_coef_imposed=n_coef_imposed,
                 n_band_imposed=n_band_imposed, n_check=n_check, n_obs_per_axis=n_obs_per_axis, n_test=n_test)
    counts = {"n_pde": n_pde, "n_coef": n_coef, "n_pde_imposed": n_pde_imposed, "n_coef_imposed": n_coef_imposed,
              "n_check": n_check}
    arrays = _interior_and_coef(PINV_DOMAIN, PINV_DOMAIN, counts, method, seed)
    x_obs = PINV_DOMAIN.grid(n_obs_per_axis)  # PINNacle's 50 x 50 linspace grid, ends included
    arrays |= _observations(x_obs, pinv_u(x_obs), n_band_imposed, seed)
    x_test = PINV_DOMAIN.grid(n_test)
    arrays |= {"x_test": x_test, "u_test": pinv_u(x_test), "a_test": pinv_a(x_test)}
    return as_float64(arrays)


def hinv_points(
    n_pde: int = 2048,
    n_coef: int = 256,
    n_pde_imposed: int = 50,
    n_coef_imposed: int = 20,
    n_band_imposed: int = 0,
    n_check: int = 256,
    n_obs: int = 2500,
    n_test_xy: int = 41,
    n_test_t: int = 11,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of HInv, its observations and the exact u, a on the test grid (float64)."""
    check_counts(n_pde=n_pde, n_coef=n_coef, n_pde_imposed=n_pde_imposed, n_coef_imposed=n_coef_imposed,
                 n_band_imposed=n_band_imposed, n_check=n_check, n_obs=n_obs, n_test_xy=n_test_xy, n_test_t=n_test_t)
    counts = {"n_pde": n_pde, "n_coef": n_coef, "n_pde_imposed": n_pde_imposed, "n_coef_imposed": n_coef_imposed,
              "n_check": n_check}
    arrays = _interior_and_coef(HINV_DOMAIN, HINV_COEF_DOMAIN, counts, method, seed)
    x_obs = HINV_DOMAIN.interior(n_obs, "uniform", seed + 3)
    arrays |= _observations(x_obs, hinv_u(x_obs), n_band_imposed, seed)
    x_test = HINV_DOMAIN.grid((n_test_xy, n_test_xy, n_test_t))
    arrays |= {"x_test": x_test, "u_test": hinv_u(x_test), "a_test": hinv_a(x_test)}
    return as_float64(arrays)


class InverseData(PinnaclePoints):
    """An inverse problem's point sets, observations and exact solution as dict batches (float64; the task
    casts). The PDE points are the rows (all of them in full batch, :class:`~lit_constrained.tasks.pinnacle_common.PinnaclePoints`'s); the
    observations, the coefficient's boundary points and the imposed sets are whole in every batch, the
    check and test sets in the validation and test batches."""

    def fixed(self, split: Split) -> dict[str, Tensor]:
        keys = ["x_coef", "x_obs", "d_obs", "x_pde_imposed", "x_coef_imposed", "x_band_imposed"]
        if split != "train":
            keys += ["x_pde_check", "x_coef_check", "x_test", "u_test", "a_test"]
        return {key: self.tensors[key] for key in keys}


class PoissonInverseData(InverseData):
    """PInv's points, observations and exact solution (:func:`pinv_points`), cached under ``cache_dir``.

    Args:
        batch_mode, batch_fraction, num_workers: as every task's data (the PDE points are the rows).
        n_pde: the objective's interior points. n_coef: its points on the boundary, where a is known.
        n_pde_imposed, n_coef_imposed: where the PDE / a's boundary value are imposed (0: none).
        n_band_imposed: the observations where the band |u - d| <= k sigma is imposed (0: none).
        n_check: held-out points (interior and boundary). n_obs_per_axis: the observation grid (PINNacle: 50).
        n_test: the test grid's nodes per axis. method: ``"lhs"``, ``"uniform"``, ``"sobol"``.
        seed: the objective's points (imposed + 1, check + 2, noise + 3, band subset + 4).
        cache_dir: where the arrays are cached (None: always regenerate).
    """

    cache_name = "pinnacle_pinv"

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_pde: int = 1024,
        n_coef: int = 256,
        n_pde_imposed: int = 50,
        n_coef_imposed: int = 20,
        n_band_imposed: int = 0,
        n_check: int = 256,
        n_obs_per_axis: int = 50,
        n_test: int = 101,
        method: SamplingMethod = "lhs",
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return pinv_points(**args)


class HeatInverseData(InverseData):
    """HInv's points, observations and exact solution (:func:`hinv_points`), cached under ``cache_dir``.

    Args:
        batch_mode, batch_fraction, num_workers: as every task's data (the PDE points are the rows).
        n_pde: the objective's points in the space-time box. n_coef: points on the square's sides, where a is
            known (a depends on x, y only).
        n_pde_imposed, n_coef_imposed, n_band_imposed: where the PDE, a's boundary value and the band are
            imposed (0: none).
        n_check: held-out points. n_obs: the observations (PINNacle: 2 500). n_test_xy, n_test_t: the test grid.
        method: ``"lhs"``, ``"uniform"``, ``"sobol"``. seed: as :class:`PoissonInverseData`'s (observation
            points: seed + 3 too).
        cache_dir: where the arrays are cached (None: always regenerate).
    """

    cache_name = "pinnacle_hinv"

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_pde: int = 2048,
        n_coef: int = 256,
        n_pde_imposed: int = 50,
        n_coef_imposed: int = 20,
        n_band_imposed: int = 0,
        n_check: int = 256,
        n_obs: int = 2500,
        n_test_xy: int = 41,
        n_test_t: int = 11,
        method: SamplingMethod = "lhs",
        seed: int = 0,
        cache_dir: str | None = str(DEFAULT_CACHE_DIR),
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return hinv_points(**args)
