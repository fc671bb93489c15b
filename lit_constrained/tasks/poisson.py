r"""2D Poisson on the unit square, -Δu = f with u = 0 on the boundary (PINA's ``Poisson2DSquareProblem``).

A PINN :math:`u_\theta(x, y)` (2 -> 20 x 2 tanh -> 1, as PINA's ``FeedForward`` default) with

.. math::

    f(\theta) = \frac{1}{N} \sum_i \big(\Delta u_\theta + f\big)(x_i)^2
        + \frac{w_b}{N_b} \sum_j u_\theta(x^b_j)^2,
    \qquad c(\theta) = \Big(\big(-\Delta u_\theta - f\big)(X_{pde}),\ u_\theta(X_{bc})\Big) = 0,

the PDE imposed exactly at ``n_pde_imposed`` interior points and the boundary value at
``n_boundary_imposed`` boundary points (``Violation/pde/<stage>``, ``Violation/boundary/<stage>``).
The imposed c and its Jacobian are evaluated in float64 at the float32 weights by default
(``constraint_dtype="float64"``, :mod:`lit_constrained.module_parts.constraint_precision`: the PDE is of
second order, and its float32 evaluation noise, ~6e-6, amplified by the ill-conditioned J J^T, kept max |c|
near 1e-4; docs/float32.md); the objective and everything else stay float32.
The Laplacian is :func:`lit_constrained.physics.laplacian` (torch.func, so the per-point Jacobian
engine differentiates it point by point). ``residual/val``: max |r| over the held-out check points (a
grid: the PDE inside, u = 0 on the boundary). Test metric: ``val/rel_l2`` against the exact solution
:math:`\sin(\pi x)\sin(\pi y)` on the test grid. The data live in :mod:`lit_constrained.tasks.poisson_data`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_constrained.imposed import Imposed
from lit_constrained.metrics.relative_l2 import relative_l2_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.physics import laplacian
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.poisson_data import PoissonData, poisson_exact, poisson_figure, poisson_forcing

__all__ = ["Poisson", "PoissonData", "poisson_exact", "poisson_forcing"]


class Poisson(ConstrainedModule):
    """-Δu = f on the unit square, u = 0 on its boundary; the PDE and the boundary value imposed at points.

    Args:
        hidden: width of the hidden layers. depth: number of hidden layers.
        boundary_weight: weight w_b of the boundary term in the objective.
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True

    def __init__(self, hidden: int = 20, depth: int = 2, boundary_weight: float = 1.0,
                 dtype: DTypeName = "float32", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.boundary_weight = float(boundary_weight)
        self.net = mlp(2, hidden, depth, 1)
        self.to(torch_dtype(dtype))

    def forward(self, x: Tensor) -> Tensor:
        """u at the points x (N, 2); returns (N,)."""
        return self.net(x)[:, 0]

    def pde_residual(self, x: Tensor) -> Tensor:
        return -laplacian(self, x) - poisson_forcing(x)

    def boundary_residual(self, x: Tensor) -> Tensor:
        return self(x)  # u = 0 on the boundary

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        pde, boundary = self.pde_residual(batch["x_pde"]), self.boundary_residual(batch["x_bc"])
        return pde.pow(2).mean() + self.boundary_weight * boundary.pow(2).mean()

    def imposed(self, batch: dict[str, Tensor]) -> dict[str, Imposed] | None:
        parts = {"pde": Imposed(self.pde_residual, batch["x_pde_imposed"]),
                 "boundary": Imposed(self.boundary_residual, batch["x_bc_imposed"])}
        return {name: part for name, part in parts.items() if len(part.points)} or None

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor:
        """The residuals at the held-out check points (the PDE inside, u = 0 on the boundary)."""
        return torch.cat([self.pde_residual(batch["x_pde_check"]), self.boundary_residual(batch["x_bc_check"])])

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        with torch.no_grad():
            return {"rel_l2": relative_l2_error(self(batch["x_test"]), batch["u_test"])}

    @torch.no_grad()
    def prediction_figure(self) -> Any:
        """The error on the test grid with the imposed points (None without a :class:`PoissonData`)."""
        data = getattr(attached_trainer(self), "datamodule", None)
        if not isinstance(data, PoissonData) or not data.arrays:
            return None
        x_test = torch.as_tensor(data.arrays["x_test"], dtype=self.dtype, device=self.device)
        return poisson_figure(data.arrays, self(x_test).double().cpu().numpy())
