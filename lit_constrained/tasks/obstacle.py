r"""The 1D obstacle problem (a Deep Ritz energy with a hard inequality): u >= psi imposed at m points.

A network :math:`u_\theta(x)` (1 -> 32 x 2 tanh -> 1) minimizes the Dirichlet energy by Gauss-Legendre
quadrature (nodes :math:`x_q`, weights :math:`w_q`, :math:`\sum_q w_q = 2`; a mini-batch rescales its
share of the weights to the same total):

.. math::

    f(\theta) = \tfrac12 \sum_q w_q\, u_\theta'(x_q)^2 \approx \tfrac12 \int_{-1}^{1} u_\theta'^2\,dx,
    \qquad c(\theta) = u_\theta(\pm 1) = 0, \qquad
    u_\theta(x_j) - \psi(x_j) \ge 0 \quad (j = 1..m),

with the concave obstacle :math:`\psi(x) = h - k x^2` (defaults h = 0.5, k = 1). The boundary values
are the ``"boundary"`` part (equalities), the obstacle the ``"obstacle"`` part
(``Imposed(..., sense=">=")``): the step hands the optimizer :math:`g = \psi - u_\theta \le 0` there,
and ``Violation/obstacle/<stage>`` is :math:`\max_j \max(\psi - u_\theta, 0)(x_j)`.

The exact solution (:mod:`lit_constrained.tasks.obstacle_data`) follows :math:`\psi` on the contact
interval :math:`[-a, a]`, :math:`a = 1 - \sqrt{1 - h/k}`, and is the tangent line through
:math:`(\pm 1, 0)` outside. Evaluation metrics: ``rel_l2`` (on the test grid), ``energy_gap``
(:math:`f - E(u)`), ``below_obstacle`` (:math:`\max \max(\psi - u_\theta, 0)` on the test grid: between
the imposed points), and the contact interval read off the imposed points: ``contact_left`` /
``contact_right`` (the outermost imposed points whose gap :math:`u_\theta - \psi` is at most
:math:`k (\delta/2)^2`, the exact gap half a spacing :math:`\delta` outside the free boundary) and
``contact_error`` = :math:`\max(|{\rm left} + a|, |{\rm right} - a|)` (within one spacing :math:`\delta`:
``contact_error / spacing <= 1``, logged as ``contact_spacings``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_constrained.imposed import Imposed
from lit_constrained.metrics.relative_l2 import relative_l2_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.physics import partial
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.obstacle_data import (
    ObstacleData, check_obstacle, contact_half_width, exact_energy, obstacle, obstacle_exact, obstacle_points,
)

__all__ = ["Obstacle", "ObstacleData", "contact_interval", "obstacle_exact", "obstacle_points"]


def contact_interval(x: Tensor, gap: Tensor, tol: float) -> tuple[float, float]:
    """The outermost points of ``x`` (N,) whose ``gap`` (N,) is at most ``tol``; (nan, nan) if none."""
    touching = x[gap <= tol]
    if touching.numel() == 0:
        return float("nan"), float("nan")
    return float(touching.min()), float(touching.max())


class Obstacle(ConstrainedModule):
    """Minimize the Dirichlet energy with u(+-1) = 0 and u >= psi = height - curvature x^2 at points.

    Pair it with :class:`ObstacleData` (the same ``height`` and ``curvature``).

    Args:
        hidden: width of the hidden layers. depth: number of hidden layers.
        height, curvature: the obstacle psi(x) = height - curvature x^2 (0 < height < curvature).
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True

    def __init__(self, hidden: int = 32, depth: int = 2, height: float = 0.5, curvature: float = 1.0,
                 dtype: DTypeName = "float32", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_obstacle(height, curvature)
        self.height, self.curvature = float(height), float(curvature)
        self.net = mlp(1, hidden, depth, 1)
        self.to(torch_dtype(dtype))

    def forward(self, x: Tensor) -> Tensor:
        """u at the points x (N, 1); returns (N,)."""
        return self.net(x)[:, 0]

    def psi(self, x: Tensor) -> Tensor:
        """The obstacle at the points x (N, 1); returns (N,)."""
        return obstacle(x[:, 0], self.height, self.curvature)

    def gap(self, x: Tensor) -> Tensor:
        """u - psi at the points x (N, 1): imposed >= 0."""
        return self(x) - self.psi(x)

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        """The energy (1/2) sum_q w_q u'(x_q)^2, the weights rescaled to the interval's length 2."""
        du = partial(self, batch["x_quad"], "x")
        w = batch["w_quad"]
        return (w * du.pow(2)).sum() / w.sum()  # = (1/2) * 2 * sum(w du^2) / sum(w)

    def imposed(self, batch: dict[str, Tensor]) -> dict[str, Imposed]:
        return {"boundary": Imposed(self, batch["x_bc"]),
                "obstacle": Imposed(self.gap, batch["x_obstacle"], sense=">=")}

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        a = contact_half_width(self.height, self.curvature)
        x_obstacle = batch["x_obstacle"]
        spacing = float(x_obstacle[1, 0] - x_obstacle[0, 0]) if len(x_obstacle) > 1 else 2.0
        with torch.no_grad():
            x_test = batch["x_test"]
            u = self(x_test)
            left, right = contact_interval(x_obstacle[:, 0], self.gap(x_obstacle), self.curvature * (spacing / 2) ** 2)
            error = max(abs(left + a), abs(right - a))
            as_tensor = lambda v: torch.tensor(v, dtype=u.dtype, device=u.device)  # noqa: E731
            return {
                "rel_l2": relative_l2_error(u, batch["u_test"]),
                "below_obstacle": (self.psi(x_test) - u).clamp_min(0).max(),
                "contact_left": as_tensor(left),
                "contact_right": as_tensor(right),
                "contact_error": as_tensor(error),
                "contact_spacings": as_tensor(error / spacing),
            } | self._energy_gap(batch)

    def _energy_gap(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """f - E(u*) on the full quadrature of the batch (the evaluation batch holds every node)."""
        with torch.enable_grad():
            f = self.objective(batch).detach()
        return {"energy_gap": f - exact_energy(self.height, self.curvature)}

    @torch.no_grad()
    def prediction_figure(self) -> Any:
        """u, the exact solution and the obstacle (None without an :class:`ObstacleData`)."""
        data = getattr(attached_trainer(self), "datamodule", None)
        if not isinstance(data, ObstacleData) or not data.arrays:
            return None
        from lit_constrained.module_parts.tensorboard import small_figure

        arrays = data.arrays
        x = torch.as_tensor(arrays["x_test"], dtype=self.dtype, device=self.device)
        u = self(x).double().cpu().numpy()
        xs, exact = arrays["x_test"][:, 0], arrays["u_test"]
        fig, ax = small_figure(row_height_in=3.0)
        ax.plot(xs, obstacle(xs, self.height, self.curvature), color="0.5", lw=1, label="obstacle psi")
        ax.plot(xs, exact, color="C0", lw=2.5, alpha=0.5, label="exact")
        ax.plot(xs, u, color="C1", ls="--", label="network")
        xo = arrays["x_obstacle"][:, 0]
        ax.scatter(xo, obstacle(xo, self.height, self.curvature), marker="+", s=20, color="C2", label="u >= psi imposed")
        rel = float(((u - exact) ** 2).sum() ** 0.5 / (exact**2).sum() ** 0.5)
        ax.set(xlabel="x", ylabel="u", ylim=(-0.1, 1.1 * self.height), title=f"val/rel_l2 {rel:.2e}")
        ax.legend(fontsize=8)
        return fig
