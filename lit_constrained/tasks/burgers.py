r"""The 1D Burgers task (2601.11795 section 5.3): an operator-style MLP for periodic viscous Burgers.

The network :math:`u_\theta(x, t, u_0)` (inputs: x, t and the initial condition on the 32 grid
points, :math:`\mathbb{R}^{34}` -> 64 x 3 tanh -> u) is trained on many initial conditions
:math:`u_0(x) = \sin(2\pi x + \xi\pi)` at once. With the PDE residual (input derivatives by
second-order Taylor propagation through the MLP's layers, :func:`taylor_derivatives`; nested
``torch.autograd.grad(create_graph=True)``, :func:`burgers_derivatives`, as an option)

.. math::

    r_\theta = \partial_t u_\theta + u_\theta\,\partial_x u_\theta - \nu\,\partial_{xx} u_\theta,

the objective on a batch B of grid rows is

.. math::

    f(\theta) = w_r \operatorname{mean}_{B} r_\theta^2
        + w_b \Big(\operatorname{mean}_{B \cap \{x = 0\}} (u_\theta(1, t) - u_\theta(0, t))^2
                   + \operatorname{mean}_{B \cap \{t = 0\}} (u_\theta(x, 0) - u_0(x))^2\Big)
        + w_d \operatorname{mean}_{B \cap D} (u_\theta - u)^2,

with :math:`w_r = w_b = 10^{-3}`, :math:`w_d = 1` and D the 200 labelled rows per initial
condition (an empty subset contributes 0). The hard constraints are the residual at m = 10 fixed
training rows, :math:`c(\theta) = (r_\theta(z_1), \dots, r_\theta(z_m)) = 0`, declared point by
point (:meth:`Burgers.imposed`), so their Jacobian is the per-point one
(:mod:`lit_constrained.jacobians.pointwise`, linear in m): the Taylor derivatives of the imposed residual
run in plain tensor operations (``mlp_taylor(..., transformable=True)``), valid inside ``torch.func``;
``derivative="autograd"`` takes the engine's chunked-autograd path.

Test metric: the relative L2 error :math:`\|u_\theta - u\|_2 / \|u\|_2` over all grid rows of the
held-out initial conditions (``val/rel_l2``, ``test/rel_l2``). At every validation a figure of the
true and predicted u(x, t) for an unseen initial condition (the paper's Figure 5) goes to
TensorBoard (``prediction``). The data live in :mod:`lit_constrained.tasks.burgers_data` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from lit_constrained.imposed import Imposed
from lit_constrained.metrics.relative_l2 import RelativeL2Error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.tasks.burgers_data import (
    NU,
    BurgersData,
    cole_hopf,
    cole_hopf_grid,
    generate_burgers,
    grid,
    initial_condition,
    method_of_lines,
)
from lit_constrained.module_parts.tensorboard import small_figure
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.taylor import mlp_taylor

__all__ = [
    "Burgers",
    "BurgersData",
    "Derivatives",
    "RelativeL2Error",
    "burgers_derivatives",
    "burgers_residual",
    "cole_hopf",
    "cole_hopf_grid",
    "generate_burgers",
    "method_of_lines",
    "taylor_derivatives",
]

DerivativeMode = Literal["taylor", "autograd"]


class Derivatives(NamedTuple):
    """u and its input derivatives at N points, each of shape (N,)."""

    u: Tensor
    u_x: Tensor
    u_t: Tensor
    u_xx: Tensor


def _check_inputs(inputs: Tensor) -> None:
    if inputs.dim() != 2 or inputs.shape[1] < 2:
        raise ValueError(f"inputs must be (N, 2 + n_x) with columns [x, t, u0...], got {tuple(inputs.shape)}.")


def burgers_derivatives(u_fn: Callable[[Tensor], Tensor], inputs: Tensor) -> Derivatives:
    """u, u_x, u_t, u_xx of ``u_fn`` at ``inputs`` (N, 2 + n_x) = [x, t, u0 on the grid].

    Nested ``torch.autograd.grad(create_graph=True)``, so the results stay differentiable with
    respect to whatever ``u_fn`` depends on (the weights). ``u_fn`` is any row-wise callable.
    """
    _check_inputs(inputs)
    with torch.enable_grad():
        x = inputs[:, :1].detach().requires_grad_(True)
        t = inputs[:, 1:2].detach().requires_grad_(True)
        u = u_fn(torch.cat([x, t, inputs[:, 2:]], dim=1)).reshape(-1)
        u_x, u_t = torch.autograd.grad(u, (x, t), grad_outputs=torch.ones_like(u), create_graph=True)
        (u_xx,) = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x), create_graph=True)
    return Derivatives(u, u_x.reshape(-1), u_t.reshape(-1), u_xx.reshape(-1))


def taylor_derivatives(net: nn.Sequential, inputs: Tensor, transformable: bool = False) -> Derivatives:
    r"""u, u_x, u_t, u_xx of an :func:`~lit_constrained.tasks.common.mlp` (Linear and Tanh layers,
    one output) at ``inputs`` (N, 2 + n_x) = [x, t, u0 on the grid], in one forward pass.

    :func:`~lit_constrained.tasks.taylor.mlp_taylor` with the directions :math:`e_x` (column 0:
    u_x and, to second order, u_xx) and :math:`e_t` (column 1: u_t), the same for every row. Same
    values as :func:`burgers_derivatives`; a training step (objective forward and backward) costs
    less. Needs no autograd for the input derivatives, so it also runs under ``torch.no_grad()``.
    ``transformable``: in plain tensor operations (valid inside ``torch.func`` transforms).
    """
    _check_inputs(inputs)
    directions = inputs.new_zeros(2, 1, inputs.shape[1])
    directions[0, 0, 0] = 1.0  # e_x
    directions[1, 0, 1] = 1.0  # e_t
    u, first, second = mlp_taylor(net, inputs, directions, n_second=1, transformable=transformable)
    return Derivatives(u.reshape(-1), first[0].reshape(-1), first[1].reshape(-1), second[0].reshape(-1))


def burgers_residual(d: Derivatives, nu: float) -> Tensor:
    """r = u_t + u u_x - nu u_xx, shape (N,)."""
    return d.u_t + d.u * d.u_x - nu * d.u_xx


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values[mask]``; 0 (still attached to the graph) when the mask is empty."""
    count = mask.sum()
    return torch.where(mask, values, torch.zeros_like(values)).sum() / count.clamp(min=1)


class Burgers(ConstrainedModule):
    """Periodic viscous Burgers: data fit + weighted PDE / boundary / initial terms, residual = 0 at m rows.

    Pair it with :class:`BurgersData` (same ``n_x`` and ``nu``).

    Args:
        hidden: width of the hidden layers.
        depth: number of hidden layers.
        n_x: grid points of the initial-condition input (the input size is ``2 + n_x``).
        nu: viscosity.
        residual_weight: weight of the mean squared PDE residual.
        boundary_weight: weight of the periodic-boundary plus initial-condition errors.
        data_weight: weight of the mean squared data error on the labelled rows.
        derivative: how u_x, u_t, u_xx are computed: ``"taylor"`` (default: carried through the MLP's
            layers by hand, :func:`taylor_derivatives`; the objective's forward and backward measured
            1.3-1.8x faster on CPU at the paper's size) or ``"autograd"`` (nested
            ``torch.autograd.grad``, :func:`burgers_derivatives`; any ``net``).
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True  # the data keep their stored dtype; the network runs in float32 or float64

    def __init__(
        self,
        hidden: int = 64,
        depth: int = 3,
        n_x: int = 32,
        nu: float = NU,
        residual_weight: float = 1e-3,
        boundary_weight: float = 1e-3,
        data_weight: float = 1.0,
        derivative: DerivativeMode = "taylor",
        dtype: DTypeName = "float32",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if derivative not in ("taylor", "autograd"):
            raise ValueError(f"derivative must be 'taylor' or 'autograd', got {derivative!r}.")
        if not nu > 0:
            raise ValueError(f"the viscosity nu must be positive, got {nu}.")
        if n_x < 2:
            raise ValueError(f"n_x (grid points of the u0 input) must be >= 2, got {n_x}.")
        for name, value in (("residual_weight", residual_weight), ("boundary_weight", boundary_weight),
                            ("data_weight", data_weight)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
        self.n_x = int(n_x)
        self.nu = float(nu)
        self.residual_weight = float(residual_weight)
        self.boundary_weight = float(boundary_weight)
        self.data_weight = float(data_weight)
        self.derivative: DerivativeMode = derivative
        self.net = mlp(2 + self.n_x, hidden, depth, 1)
        self.to(torch_dtype(dtype))
        self.val_rel_l2 = RelativeL2Error()
        self.test_rel_l2 = RelativeL2Error()

    # -- the model and the physics ------------------------------------------------------------

    def forward(self, inputs: Tensor) -> Tensor:
        """u at ``inputs`` (N, 2 + n_x) = [x, t, u0 on the grid]; returns (N,)."""
        return self.net(inputs).reshape(-1)

    def _check_width(self, inputs: Tensor) -> None:
        if inputs.shape[-1] != 2 + self.n_x:
            raise ValueError(
                f"Burgers(n_x={self.n_x}) expects inputs with {2 + self.n_x} columns, got {inputs.shape[-1]}: "
                "use the same n_x for the task and BurgersData."
            )

    def derivatives(self, inputs: Tensor, transformable: bool = False) -> Derivatives:
        """u, u_x, u_t, u_xx of the network at ``inputs`` (N, 2 + n_x), by the ``derivative`` mode
        (``transformable``: the Taylor mode in plain tensor operations, see :func:`taylor_derivatives`)."""
        self._check_width(inputs)
        if self.derivative == "autograd":
            return burgers_derivatives(self.net, inputs)
        return taylor_derivatives(self.net, inputs, transformable)

    def residual(self, inputs: Tensor) -> Tensor:
        """The PDE residual of the network at ``inputs`` (N, 2 + n_x); returns (N,). In plain tensor
        operations (the imposed residual: it also runs inside the per-point Jacobian's ``torch.func``)."""
        return burgers_residual(self.derivatives(inputs, transformable=True), self.nu)

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        inputs, u = batch["inputs"], batch["u"]
        d = self.derivatives(inputs)
        residual = burgers_residual(d, self.nu).square().mean()
        error_sq = (d.u - u).square()
        initial = _masked_mean(error_sq, batch["it"] == 0)
        left = batch["ix"] == 0
        right_inputs = inputs[left].clone()
        right_inputs[:, 0] = 1.0
        periodic = (self(right_inputs) - d.u[left]).square().sum() / left.sum().clamp(min=1)
        data = _masked_mean(error_sq, batch["labeled"])
        return (self.residual_weight * residual + self.boundary_weight * (periodic + initial)
                + self.data_weight * data)

    def imposed(self, batch: dict[str, Tensor]) -> Mapping[str, Imposed] | None:
        """The PDE residual at the m constraint rows ``x_con`` (None when m = 0)."""
        x_con = batch["x_con"]
        return {"pde": Imposed(self.residual, x_con)} if x_con.shape[0] > 0 else None

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor | None:
        """The residual at every row of the held-out batch (the PDE holds everywhere, not only at
        the m constraint rows)."""
        return self.residual(batch["inputs"])

    # -- Lightning hooks ----------------------------------------------------------------------

    def _log_rel_l2(self, stage: str, batch: dict[str, Tensor]) -> None:
        metric = self.val_rel_l2 if stage == "val" else self.test_rel_l2
        with torch.no_grad():
            metric.update(self(batch["inputs"]), batch["u"])
        self.log(f"{stage}/rel_l2", metric, on_step=False, on_epoch=True, prog_bar=stage == "val")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        out = super().validation_step(batch, batch_idx)
        self._log_rel_l2("val", self.prepare_batch(batch))
        return out

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        out = super().test_step(batch, batch_idx)
        self._log_rel_l2("test", self.prepare_batch(batch))
        return out

    @torch.no_grad()
    def predict_grid(self, xi: float, n_x_plot: int = 128, n_t_plot: int = 101) -> np.ndarray:
        """The network's u on an ``n_t_plot`` x ``n_x_plot`` grid of [0, 1) x [0, 1] for the initial
        condition sin(2 pi x + xi pi) (given to the network on its ``n_x`` input grid)."""
        x_plot, t_plot = grid(n_x_plot, n_t_plot)
        u0 = initial_condition(grid(self.n_x, 2)[0], np.array([xi]))[0]
        tt, xx = np.meshgrid(t_plot, x_plot, indexing="ij")
        inputs = np.concatenate([xx.reshape(-1, 1), tt.reshape(-1, 1), np.broadcast_to(u0, (xx.size, self.n_x))], 1)
        pred = self(torch.as_tensor(inputs, dtype=self.dtype, device=self.device))
        return pred.double().cpu().numpy().reshape(n_t_plot, n_x_plot)

    def prediction_figure(self, xi: float | None = None) -> Any:
        """True, predicted and |error| u(x, t) heatmaps (as the paper's Figure 5) for the initial
        condition ``xi``; default: the first validation initial condition of the trainer's
        :class:`BurgersData` (None without one)."""
        if xi is None:
            datamodule = getattr(attached_trainer(self), "datamodule", None)
            arrays = getattr(datamodule, "arrays", None) or {}
            key = next((k for k in ("val_xi", "test_xi") if k in arrays and len(arrays[k]) > 0), None)
            if key is None:
                return None
            xi = float(arrays[key][0])
        n_x_plot, n_t_plot = 128, 101
        true = cole_hopf_grid(np.array([xi]), n_x_plot, n_t_plot, self.nu)[0]
        pred = self.predict_grid(xi, n_x_plot, n_t_plot)
        rel = float(np.linalg.norm(pred - true) / np.linalg.norm(true))
        fig, axes = small_figure(3, 1, row_height_in=1.9, sharex=True)
        extent = (0.0, 1.0, 0.0, 1.0)
        panels = (("true u(x, t)", true, "RdBu_r", (-1, 1)), ("predicted u(x, t)", pred, "RdBu_r", (-1, 1)),
                  ("|error|", np.abs(pred - true), "magma", (0, None)))
        for ax, (title, values, cmap, (vmin, vmax)) in zip(axes, panels):
            image = ax.imshow(values, origin="lower", extent=extent, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)
            ax.set(ylabel="t")
            ax.set_title(title, fontsize=10)
            fig.colorbar(image, ax=ax)
        axes[-1].set_xlabel("x")
        fig.suptitle(f"xi = {xi:.3f}: rel_l2 {rel:.2e}")
        return fig
