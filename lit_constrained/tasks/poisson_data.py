r"""Data of the 2D Poisson problem on the unit square (PINA's problem zoo ``Poisson2DSquareProblem``).

.. math::

    -\Delta u = f \ \text{in } \Omega = (0, 1)^2, \qquad u = 0 \ \text{on } \partial\Omega, \qquad
    f(x, y) = 2 \pi^2 \sin(\pi x) \sin(\pi y),

with the exact solution :math:`u(x, y) = \sin(\pi x) \sin(\pi y)`. (PINA writes the same problem as
:math:`\Delta u = f` with :math:`u = -\sin(\pi x)\sin(\pi y)`: the solution up to its sign.)

The points, all from :class:`~lit_constrained.physics.Box` (seeded; nothing is downloaded):

* ``x_pde`` (rows) and ``x_bc``: the objective's interior and boundary collocation points;
* ``x_pde_imposed``, ``x_bc_imposed``: where the PDE and the boundary value are imposed exactly
  (other samples of the same methods, seed + 1);
* ``x_pde_check``, ``x_bc_check``: held-out points where the residuals are measured at validation
  (the interior and boundary nodes of a grid);
* ``x_test``, ``u_test``: a grid of the closed square and the exact solution there (``val/rel_l2``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_constrained.physics import Box, SamplingMethod
from lit_constrained.tasks.datamodule import RowDataModule, Split
from lit_constrained.tasks.sampling import BatchMode

__all__ = ["PoissonData", "poisson_exact", "poisson_forcing", "poisson_points", "poisson_figure"]

SQUARE = Box((0.0, 0.0), (1.0, 1.0))


def poisson_exact(x: Tensor) -> Tensor:
    r""":math:`u(x, y) = \sin(\pi x) \sin(\pi y)` at the points ``x`` (N, 2); returns (N,)."""
    return torch.sin(math.pi * x[:, 0]) * torch.sin(math.pi * x[:, 1])


def poisson_forcing(x: Tensor) -> Tensor:
    r""":math:`f = -\Delta u = 2 \pi^2 \sin(\pi x) \sin(\pi y)` at the points ``x`` (N, 2); returns (N,)."""
    return 2 * math.pi**2 * poisson_exact(x)


def poisson_points(
    n_pde: int = 400,
    n_boundary: int = 100,
    n_pde_imposed: int = 25,
    n_boundary_imposed: int = 25,
    n_check: int = 21,
    n_test: int = 51,
    method: SamplingMethod = "lhs",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Every point set of the problem as float64 numpy arrays (see the module docstring).

    The held-out check points are the ``n_check``^2 interior and ``4 n_check - 4`` boundary nodes of
    grids; the test grid has ``n_test`` nodes per axis, ends included.
    """
    for name, value in (("n_pde", n_pde), ("n_boundary", n_boundary), ("n_check", n_check), ("n_test", n_test)):
        if not isinstance(value, int) or value < (3 if name in ("n_check", "n_test") else 1):
            raise ValueError(f"{name} must be an integer >= {3 if name in ('n_check', 'n_test') else 1}, got {value!r}.")
    for name, value in (("n_pde_imposed", n_pde_imposed), ("n_boundary_imposed", n_boundary_imposed)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0 (0: that part is not imposed), got {value!r}.")
    empty = np.zeros((0, 2))
    x_test = SQUARE.grid(n_test)
    arrays = {
        "x_pde": SQUARE.interior(n_pde, method, seed),
        "x_bc": SQUARE.boundary(n_boundary, method, seed),
        "x_pde_imposed": SQUARE.interior(n_pde_imposed, method, seed + 1) if n_pde_imposed else empty,
        "x_bc_imposed": SQUARE.boundary(n_boundary_imposed, method, seed + 1) if n_boundary_imposed else empty,
        "x_pde_check": SQUARE.interior(n_check**2, "grid"),
        "x_bc_check": SQUARE.boundary(4 * n_check - 4, "grid"),
        "x_test": x_test,
        "u_test": poisson_exact(x_test),
    }
    return {key: np.asarray(value, dtype=np.float64) for key, value in arrays.items()}


class PoissonData(RowDataModule):
    """The Poisson problem's points as dict batches (float64; the task casts them to its dtype).

    A training batch: ``x_pde`` (the interior collocation points: all of them in full batch,
    ``batch_fraction`` of them per mini-batch step, sharded under DDP) and, whole in every batch,
    ``x_bc``, ``x_pde_imposed``, ``x_bc_imposed`` (the same on every rank). The validation/test batch
    adds the held-out check points and the test grid with the exact solution.

    Args:
        batch_mode: ``"full"`` or ``"minibatch"``.
        batch_fraction: fraction of the interior points per mini-batch step.
        n_pde: interior collocation points of the objective.
        n_boundary: boundary collocation points of the objective (shared equally by the 4 sides).
        n_pde_imposed: interior points where -Δu = f is imposed (0: none).
        n_boundary_imposed: boundary points where u = 0 is imposed (0: none).
        n_check: nodes per axis of the held-out check grid (residuals at validation).
        n_test: nodes per axis of the test grid (``val/rel_l2``).
        method: ``"lhs"``, ``"sobol"``, ``"uniform"`` or ``"grid"`` (:class:`~lit_constrained.physics.Box`).
        seed: the sampling seed (the imposed points use seed + 1).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        batch_mode: BatchMode = "full",
        batch_fraction: float = 0.5,
        n_pde: int = 400,
        n_boundary: int = 100,
        n_pde_imposed: int = 25,
        n_boundary_imposed: int = 25,
        n_check: int = 21,
        n_test: int = 51,
        method: SamplingMethod = "lhs",
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__(batch_mode, batch_fraction, num_workers)
        self.setup()  # a bad argument fails here, before the trainer starts

    def generation_args(self) -> dict[str, Any]:
        keys = ("n_pde", "n_boundary", "n_pde_imposed", "n_boundary_imposed", "n_check", "n_test", "method", "seed")
        return {key: self.hparams[key] for key in keys}

    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        return poisson_points(**args)

    def rows(self, split: Split) -> dict[str, Tensor]:
        return {"x_pde": self.tensors["x_pde"]}

    def fixed(self, split: Split) -> dict[str, Tensor]:
        keys = ["x_bc", "x_pde_imposed", "x_bc_imposed"]
        if split != "train":
            keys += ["x_pde_check", "x_bc_check", "x_test", "u_test"]
        return {key: self.tensors[key] for key in keys}


def poisson_figure(arrays: dict[str, np.ndarray], prediction: np.ndarray) -> Any:
    """The error |u_net - u| on the test grid, with the imposed points marked (titled ``val/rel_l2``)."""
    from lit_constrained.module_parts.tensorboard import small_figure

    x, exact = arrays["x_test"], arrays["u_test"]
    k = int(round(math.sqrt(len(x))))
    error = np.abs(prediction - exact).reshape(k, k)
    fig, ax = small_figure(row_height_in=3.6)
    image = ax.imshow(error.T, origin="lower", extent=(0, 1, 0, 1), cmap="magma")
    fig.colorbar(image, ax=ax, label="|u_net - u|")
    for key, marker, label in (("x_pde_imposed", "x", "PDE imposed"), ("x_bc_imposed", "+", "u = 0 imposed")):
        if len(arrays[key]):
            ax.scatter(arrays[key][:, 0], arrays[key][:, 1], marker=marker, s=30, color="tab:cyan", label=label)
    rel_l2 = float(np.linalg.norm(prediction - exact) / np.linalg.norm(exact))
    ax.set(xlabel="x", ylabel="y", title=f"val/rel_l2 {rel_l2:.2e}")
    fig.legend(fontsize=8, loc="outside lower center", ncol=2, frameon=False)
    return fig
