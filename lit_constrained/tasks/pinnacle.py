r"""Four problems of the PINNacle benchmark (Hao et al., arXiv 2306.08827) with its equations, coefficients
and domains, as tasks: Burgers1d-C, Poisson2d-C (a square with four circular holes), Wave1d-C, Heat2d-MS.

Each is a :class:`~lit_constrained.tasks.pinnacle_common.PinnacleTask`: PINNacle's vanilla PINN (100 x 5
tanh, the sum of the conditions' mean squared residuals) with any condition imposed exactly at its
``x_<k>_imposed`` points. The residuals (every derivative from :func:`lit_constrained.physics.derivatives`
or :func:`~lit_constrained.physics.laplacian`, so the per-point Jacobian runs them under torch.func):

* :class:`BurgersPinnacle`: pde :math:`u_t + u u_x - \nu u_{xx}` (:math:`\nu = 0.01/\pi`), boundary
  :math:`u(\pm 1, t)`, initial :math:`u(x, 0) + \sin(\pi x)`;
* :class:`PoissonPinnacle`: pde :math:`-\Delta u`, outer :math:`u - 1` on the square's sides, holes
  :math:`u` on the circles;
* :class:`WavePinnacle`: pde :math:`u_{tt} - 4 u_{xx}`, boundary :math:`u(0, t), u(1, t)`, initial the
  two columns :math:`(u - u_0, u_t)` at t = 0;
* :class:`HeatPinnacle`: pde :math:`u_t - k_x u_{xx} - k_y u_{yy}`, boundary u on the lateral sides,
  initial :math:`u - \sin(20\pi x)\sin(\pi y)` at t = 0.

The data (points, reference solutions: Cole-Hopf, finite differences, closed forms) are generated in
``pinnacle_<problem>_data.py`` and served by one DataModule, :class:`~lit_constrained.tasks.pinnacle_data.
PinnacleData` (``problem="wave"``, ...); ``configs/pinnacle_<problem>/`` holds the runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_constrained.physics import derivatives, laplacian
from lit_constrained.tasks.pinnacle_burgers_data import DOMAIN as BURGERS_BOX
from lit_constrained.tasks.pinnacle_burgers_data import NU, burgers_exact, burgers_initial
from lit_constrained.tasks.pinnacle_common import PinnacleTask
from lit_constrained.tasks.pinnacle_data import PinnacleData
from lit_constrained.tasks.pinnacle_heat_data import DIFFUSIVITY, heat_exact, heat_initial
from lit_constrained.tasks.pinnacle_heat_data import DOMAIN as HEAT_BOX
from lit_constrained.tasks.pinnacle_poisson_data import SQUARE as POISSON_BOX
from lit_constrained.tasks.pinnacle_poisson_data import solve_reference
from lit_constrained.tasks.pinnacle_wave_data import DOMAIN as WAVE_BOX
from lit_constrained.tasks.pinnacle_wave_data import SPEED, wave_exact

__all__ = [
    "BurgersPinnacle", "HeatPinnacle", "PinnacleData", "PinnacleTask",
    "PoissonPinnacle", "WavePinnacle", "burgers_exact", "heat_exact",
    "solve_reference", "wave_exact",
]


class BurgersPinnacle(PinnacleTask):
    r"""Burgers1d-C: :math:`u_t + u u_x = \nu u_{xx}` on [-1, 1] x [0, 1], u(±1, t) = 0, u(x, 0) = -sin(pi x)."""

    input_dim = 2
    box = BURGERS_BOX
    conditions = ("pde", "boundary", "initial")

    def pde_residual(self, x: Tensor) -> Tensor:
        d = derivatives(self, x, names=("x", "t"))
        return d.partial("t") + d.value * d.partial("x") - NU * d.partial("x", order=2)

    def boundary_residual(self, x: Tensor) -> Tensor:
        return self(x)

    def initial_residual(self, x: Tensor) -> Tensor:
        return self(x) - burgers_initial(x[:, 0])


class PoissonPinnacle(PinnacleTask):
    r"""Poisson2d-C: :math:`-\Delta u = 0` on the square minus four disks, u = 1 on its sides, 0 on the circles."""

    input_dim = 2
    box = POISSON_BOX
    conditions = ("pde", "outer", "holes")

    def pde_residual(self, x: Tensor) -> Tensor:
        return -laplacian(self, x)

    def outer_residual(self, x: Tensor) -> Tensor:
        return self(x) - 1.0

    def holes_residual(self, x: Tensor) -> Tensor:
        return self(x)


class WavePinnacle(PinnacleTask):
    r"""Wave1d-C: :math:`u_{tt} = 4 u_{xx}` on [0, 1]^2, u(0, t) = u(1, t) = 0, u and u_t given at t = 0."""

    input_dim = 2
    box = WAVE_BOX
    conditions = ("pde", "boundary", "initial")

    def pde_residual(self, x: Tensor) -> Tensor:
        d = derivatives(self, x, names=("x", "t"))
        return d.partial("t", order=2) - SPEED**2 * d.partial("x", order=2)

    def boundary_residual(self, x: Tensor) -> Tensor:
        return self(x)

    def initial_residual(self, x: Tensor) -> Tensor:
        """Two columns at t = 0: u - u_0(x) and u_t (the initial velocity, 0)."""
        d = derivatives(self, x, order=1, names=("x", "t"))
        return torch.stack([d.value - wave_exact(x), d.partial("t")], dim=1)


class HeatPinnacle(PinnacleTask):
    r"""Heat2d-MS: :math:`u_t = u_{xx}/(500\pi)^2 + u_{yy}/\pi^2` on [0, 1]^2 x [0, 5], u = 0 on the sides,
    :math:`u(x, y, 0) = \sin(20\pi x)\sin(\pi y)`."""

    input_dim = 3
    box = HEAT_BOX
    conditions = ("pde", "boundary", "initial")

    def pde_residual(self, x: Tensor) -> Tensor:
        d = derivatives(self, x, names=("x", "y", "t"))
        return d.partial("t") - DIFFUSIVITY[0] * d.partial("x", order=2) - DIFFUSIVITY[1] * d.partial("y", order=2)

    def boundary_residual(self, x: Tensor) -> Tensor:
        return self(x)

    def initial_residual(self, x: Tensor) -> Tensor:
        return self(x) - heat_initial(x)


#: the PINNacle names of the tasks
PINNACLE_NAMES = {"Burgers1d-C": BurgersPinnacle, "Poisson2d-C": PoissonPinnacle, "Wave1d-C": WavePinnacle,
                  "Heat2d-MS": HeatPinnacle}
