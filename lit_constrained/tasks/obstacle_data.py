r"""Data of the 1D obstacle problem: its closed-form solution, quadrature nodes and imposed points.

The problem: minimize the Dirichlet energy over :math:`H^1_0(-1, 1)` above a concave obstacle,

.. math::

    \min_u E(u) = \tfrac12 \int_{-1}^{1} u'(x)^2\,dx \quad\text{s.t.}\quad u(\pm 1) = 0,\quad
    u \ge \psi, \qquad \psi(x) = h - k x^2 \quad (0 < h < k: \ \psi(0) > 0 > \psi(\pm 1)).

**The exact solution.** u is concave-free (:math:`u'' = 0`) where it does not touch :math:`\psi`, so it
is linear there; it follows :math:`\psi` on a contact interval :math:`[-a, a]`, and the energy's
minimizer is :math:`C^1` (the free boundary condition), so each linear piece is the tangent to
:math:`\psi` through :math:`(\pm 1, 0)`. Tangency at :math:`a` from :math:`(1, 0)`:
:math:`\psi(a) + \psi'(a)(1 - a) = 0`, i.e. :math:`h - k a^2 - 2 k a (1 - a) = 0`, i.e.
:math:`k a^2 - 2 k a + h = 0`, whose root in (0, 1) is

.. math::

    a = 1 - \sqrt{1 - h / k}, \qquad
    u(x) = \begin{cases} h - k x^2 & |x| \le a \\ 2 k a (1 - |x|) & |x| > a, \end{cases}
    \qquad E(u) = \tfrac43 k^2 a^3 + 4 k^2 a^2 (1 - a).

(Off the contact, :math:`u - \psi = k (|x| - a)^2`: the gap opens quadratically.)

The points (float64 numpy arrays; nothing random, nothing downloaded):

* ``x_quad``, ``w_quad`` (rows): the ``n_quad`` Gauss-Legendre nodes and weights of [-1, 1] (the
  objective's quadrature of the energy; a mini-batch takes a share of them);
* ``x_bc``: the two end points (u = 0 imposed there);
* ``x_obstacle``: ``n_obstacle`` equispaced interior points, spacing :math:`\delta = 2 / (n + 1)`, where
  :math:`u \ge \psi` is imposed;
* ``x_test``, ``u_test``: ``n_test`` equispaced nodes of [-1, 1] and the exact solution there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode

__all__ = [
    "ObstacleData", "check_obstacle", "contact_half_width", "exact_energy", "obstacle", "obstacle_exact",
    "obstacle_points",
]


def check_obstacle(height: float, curvature: float) -> None:
    """``0 < height < curvature``: the obstacle is above 0 at the centre and below 0 at the ends."""
    if not (0.0 < height < curvature):
        raise ValueError(
            f"the obstacle psi(x) = height - curvature * x^2 needs 0 < height < curvature (psi(0) > 0 > psi(+-1)), "
            f"got height={height}, curvature={curvature}."
        )


def contact_half_width(height: float = 0.5, curvature: float = 1.0) -> float:
    """:math:`a = 1 - \\sqrt{1 - h/k}`: the exact solution touches the obstacle on [-a, a]."""
    check_obstacle(height, curvature)
    return 1.0 - math.sqrt(1.0 - height / curvature)


def obstacle(x: Any, height: float = 0.5, curvature: float = 1.0) -> Any:
    """:math:`\\psi(x) = h - k x^2` (numpy or torch, any shape)."""
    return height - curvature * x * x


def obstacle_exact(x: Any, height: float = 0.5, curvature: float = 1.0) -> Any:
    """The exact solution at ``x`` (numpy array or tensor of any shape; the same type back)."""
    a = contact_half_width(height, curvature)
    if isinstance(x, Tensor):
        return torch.where(x.abs() <= a, obstacle(x, height, curvature), 2 * curvature * a * (1 - x.abs()))
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.abs(x) <= a, obstacle(x, height, curvature), 2 * curvature * a * (1 - np.abs(x)))


def exact_energy(height: float = 0.5, curvature: float = 1.0) -> float:
    """:math:`E(u) = \\tfrac43 k^2 a^3 + 4 k^2 a^2 (1 - a)` of the exact solution."""
    a, k = contact_half_width(height, curvature), curvature
    return 4.0 / 3.0 * k * k * a**3 + 4.0 * k * k * a * a * (1.0 - a)


def obstacle_points(
    n_quad: int = 256, n_obstacle: int = 63, n_test: int = 2001, height: float = 0.5, curvature: float = 1.0
) -> dict[str, np.ndarray]:
    """Every point set of the problem (see the module docstring), as (N, 1) / (N,) float64 arrays."""
    for name, value, low in (("n_quad", n_quad, 2), ("n_obstacle", n_obstacle, 1), ("n_test", n_test, 3)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    check_obstacle(height, curvature)
    nodes, weights = np.polynomial.legendre.leggauss(n_quad)
    x_test = np.linspace(-1.0, 1.0, n_test)
    arrays = {
        "x_quad": nodes[:, None],
        "w_quad": weights,
        "x_bc": np.array([[-1.0], [1.0]]),
        "x_obstacle": np.linspace(-1.0, 1.0, n_obstacle + 2)[1:-1, None],
        "x_test": x_test[:, None],
        "u_test": obstacle_exact(x_test, height, curvature),
    }
    return {key: np.asarray(value, dtype=np.float64) for key, value in arrays.items()}


class ObstacleData(RowDataModule):
    """The obstacle problem's points as dict batches (float64; the task casts them to its dtype).

    A training batch: ``x_quad``, ``w_quad`` (all quadrature nodes in full batch, ``batch_fraction`` of
    them per mini-batch step) and, whole in every batch, ``x_bc`` and ``x_obstacle``; the validation/test
    batch adds ``x_test`` and ``u_test``. ``height`` and ``curvature`` must be the task's.

    Args:
        batch_mode: ``"full"`` or ``"minibatch"``.
        batch_fraction: fraction of the quadrature nodes per mini-batch step.
        n_quad: Gauss-Legendre nodes of the energy's quadrature.
        n_obstacle: equispaced interior points where u >= psi is imposed.
        n_test: equispaced test nodes of [-1, 1] (``val/rel_l2``).
        height, curvature: the obstacle psi(x) = height - curvature x^2 (0 < height < curvature).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_quad: int = 256,
        n_obstacle: int = 63,
        n_test: int = 2001,
        height: float = 0.5,
        curvature: float = 1.0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()  # a bad argument fails here, before the trainer starts

    def generation_args(self) -> dict[str, Any]:
        keys = ("n_quad", "n_obstacle", "n_test", "height", "curvature")
        return {key: self.hparams[key] for key in keys}

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return obstacle_points(**args)

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {"x_quad": self.tensors["x_quad"], "w_quad": self.tensors["w_quad"]}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        keys = ["x_bc", "x_obstacle"] + (["x_test", "u_test"] if split != "train" else [])
        return {key: self.tensors[key] for key in keys}
