r"""A probability density estimated by a network, non-negative and of mass one, held at every step.

The network :math:`p_\theta(x)` (1 -> 32 x 2 tanh -> 1) minimizes the least-squares density criterion on
samples :math:`x_i \sim p^*` (:mod:`lit_constrained.tasks.density_data`: Epanechnikov's density, which
reaches 0 with a kink at :math:`\pm 1`):

.. math::

    f(\theta) = \int_{-L}^{L} p_\theta^2\,dx - \frac{2}{N} \sum_i p_\theta(x_i)
    \quad \big(= \|p_\theta - p^*\|_{L^2}^2 - \|p^*\|^2 \text{ in expectation}\big),

    c(\theta) = \int_{-L}^{L} p_\theta\,dx - 1 = 0, \qquad p_\theta(x_j) \ge 0 \ (j = 1..m).

The bound is what makes :math:`p_\theta` a density: a smooth network's least-squares fit of the kink
dips below 0 next to :math:`\pm 1` (where :math:`p^* = 0`), and nothing else keeps it out. The mass is
ONE row that couples every quadrature node: the task declares it as a
:class:`~lit_constrained.imposed.Coupled` part (``"mass"``, an equality) beside the m values
(``"nonnegative"``, ``Imposed(..., sense=">=")``), so c is differentiated as a whole by the general
autograd Jacobian. Evaluation metrics: ``l2`` (:math:`\|p_\theta - p^*\|_{L^2}`, trapezoid on the test
grid), ``mass`` (:math:`\int p_\theta`), ``negative_part`` (:math:`\max \max(-p_\theta, 0)` on the test
grid, between the imposed points too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_constrained.imposed import Coupled, Imposed, Part
from lit_constrained.module import ConstrainedModule
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.density_data import DensityData, density_exact, density_points

__all__ = ["Density", "DensityData", "density_exact", "density_points"]


class Density(ConstrainedModule):
    """A density p >= 0 with mass 1, fitted to samples by the least-squares criterion.

    Args:
        hidden: width of the hidden layers. depth: number of hidden layers.
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True

    def __init__(self, hidden: int = 32, depth: int = 2, dtype: DTypeName = "float32", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = mlp(1, hidden, depth, 1)
        self.to(torch_dtype(dtype))

    def forward(self, x: Tensor) -> Tensor:
        """p at the points x (N, 1); returns (N,)."""
        return self.net(x)[:, 0]

    def mass(self, batch: dict[str, Tensor]) -> Tensor:
        """:math:`\\int p` by the batch's quadrature (0-dim)."""
        return (batch["w_quad"] * self(batch["x_quad"])).sum()

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        return (batch["w_quad"] * self(batch["x_quad"]).pow(2)).sum() - 2 * self(batch["x_samples"]).mean()

    def imposed(self, batch: dict[str, Tensor]) -> dict[str, Part]:
        """(mass - 1, p(x_1), ..., p(x_m)): the mass row = 0, the values of p >= 0."""
        return {"mass": Coupled(lambda: self.mass(batch) - 1),
                "nonnegative": Imposed(self, batch["x_nonnegative"], sense=">=")}

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        with torch.no_grad():
            x, exact = batch["x_test"][:, 0], batch["p_test"]
            p = self(batch["x_test"])
            return {"l2": torch.trapezoid((p - exact).pow(2), x).sqrt(), "mass": self.mass(batch),
                    "negative_part": (-p).clamp_min(0).max()}
