"""The 1D spring task (2601.11795 section 5.1): an ODE-informed MLP for a damped oscillator.

The network :math:`u_\\theta(t)` (1 -> 32 x 3 tanh -> 1) is fitted to 10 observations in [0, 0.4]
and the ODE residual

.. math::

    r_\\theta(t) = u_\\theta''(t) + \\mu u_\\theta'(t) + k u_\\theta(t)

(input derivatives carried through the MLP's layers, :func:`~lit_constrained.tasks.taylor.mlp_taylor`
in plain tensor operations; :func:`spring_residual` for any other ``u``, by nested ``torch.func.jvp``):

.. math::

    f(\\theta) = \\frac{1}{n_d} \\sum_i (u_\\theta(t_i) - u_i)^2
        + w_r \\frac{1}{n_r} \\sum_j r_\\theta(\\tau_j)^2, \\qquad w_r = 10^{-4},

    c(\\theta) = \\big(r_\\theta(4/29),\\ r_\\theta(12/29),\\ r_\\theta(21/29)\\big) = 0 \\quad (m = 3).

The constraints are declared point by point (:meth:`Spring.imposed`: the residual at ``t_con``), so
their Jacobian is the per-point one (:mod:`lit_constrained.jacobians.pointwise`: at m = 3 one small
ordinary graph, at many points ``torch.func`` per point).

Test metric: the MSE against the exact solution on 500 points of [0, 1] (``val/mse``, ``test/mse``).
The data live in :mod:`lit_constrained.tasks.spring_data` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.func import jvp

from lit_constrained.imposed import Imposed
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.module_parts.tensorboard import small_figure
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.taylor import mlp_taylor
from lit_constrained.tasks.spring_data import SpringData, spring_constants, spring_exact, spring_points

__all__ = ["Spring", "SpringData", "spring_residual", "spring_exact", "spring_points"]


def oscillator_residual(u: Tensor, du: Tensor, ddu: Tensor, mu: float, k: float) -> Tensor:
    """:math:`u'' + \\mu u' + k u` from the values and derivatives at N points; returns (N,)."""
    return (ddu + mu * du + k * u).reshape(-1)


def is_mlp(net: torch.nn.Module) -> bool:
    """Whether ``net`` is an ``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh`` layers (what
    :func:`~lit_constrained.tasks.taylor.mlp_taylor` differentiates)."""
    return isinstance(net, torch.nn.Sequential) and all(isinstance(x, (torch.nn.Linear, torch.nn.Tanh)) for x in net)


def spring_residual(u_fn: Callable[[Tensor], Tensor], t: Tensor, mu: float, k: float) -> Tensor:
    """:math:`u'' + \\mu u' + k u` of ``u_fn`` at the points ``t`` (N, 1); returns (N,).

    ``u_fn`` must act row-wise (row i of its output depends only on row i of its input), so the
    directional derivative along the all-ones tangent is :math:`u'(t_i)` in every row. One nested
    forward-mode pass gives u, u' and u'' (``torch.func.jvp`` of a ``jvp``): differentiable by
    ordinary autograd w.r.t. whatever ``u_fn`` depends on (the objective's backward), and valid
    inside ``torch.func`` transforms (the per-point constraint Jacobian).
    """
    ones = torch.ones_like(t)

    def value_and_slope(s: Tensor) -> tuple[Tensor, Tensor]:
        return jvp(u_fn, (s,), (ones,))

    (u, du), (_, ddu) = jvp(value_and_slope, (t,), (ones,))
    return oscillator_residual(u, du, ddu, mu, k)


class Spring(ConstrainedModule):
    """The damped spring: data fit + weighted ODE residual, residual = 0 at 3 points.

    Pair it with :class:`SpringData` (same ``mu`` and ``k``).

    Args:
        hidden: width of the hidden layers.
        depth: number of hidden layers.
        mu: friction coefficient (mass 1).
        k: stiffness.
        residual_weight: weight of the mean squared ODE residual in the objective.
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True  # the data keep their stored dtype; the network runs in float32 or float64

    def __init__(
        self,
        hidden: int = 32,
        depth: int = 3,
        mu: float = 4.0,
        k: float = 400.0,
        residual_weight: float = 1e-4,
        dtype: DTypeName = "float32",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        spring_constants(mu, k)  # validates the parameters (under-damped)
        if residual_weight < 0:
            raise ValueError(f"residual_weight must be >= 0, got {residual_weight}.")
        self.mu = float(mu)
        self.k = float(k)
        self.residual_weight = float(residual_weight)
        self.net = mlp(1, hidden, depth, 1)
        self.to(torch_dtype(dtype))

    # -- the model and the physics ------------------------------------------------------------

    def forward(self, t: Tensor) -> Tensor:
        """u(t) for t of shape (N, 1); returns (N, 1)."""
        return self.net(t)

    def residual(self, t: Tensor) -> Tensor:
        """The ODE residual of the network at the points ``t`` (N, 1); returns (N,).

        For an :func:`~lit_constrained.tasks.common.mlp` (the default network) u, u' and u'' in one
        pass through its layers (the direction e_t, to second order;
        :func:`~lit_constrained.tasks.taylor.mlp_taylor` in plain tensor operations, so it runs
        both under the objective's backward and inside the per-point Jacobian's ``torch.func``);
        any other row-wise network by :func:`spring_residual` (nested ``torch.func.jvp``)."""
        if not is_mlp(self.net):
            return spring_residual(self.net, t, self.mu, self.k)
        u, first, second = mlp_taylor(self.net, t, t.new_ones(1, 1, 1), n_second=1, transformable=True)
        return oscillator_residual(u, first[0], second[0], self.mu, self.k)

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        data_error = (self(batch["t_data"]) - batch["u_data"]).pow(2).mean()
        residual = self.residual(batch["t_res"]).pow(2).mean()
        return data_error + self.residual_weight * residual

    def imposed(self, batch: dict[str, Tensor]) -> Mapping[str, Imposed]:
        """The ODE residual at the constraint points ``t_con``."""
        return {"ode": Imposed(self.residual, batch["t_con"])}

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor:
        """The residual at every collocation point of the batch (the constraint points included)."""
        return self.residual(torch.cat([batch["t_con"], batch["t_res"]]))

    # -- Lightning hooks ----------------------------------------------------------------------

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        """``mse``: mean squared error against the exact solution at the test points."""
        with torch.no_grad():
            return {"mse": (self(batch["t_test"]) - batch["u_test"]).pow(2).mean()}

    @torch.no_grad()
    def prediction_figure(self, arrays: dict[str, Any] | None = None) -> Any:
        """The exact and predicted u(t) with the data, collocation and constraint points (as the
        paper's Figure 2); ``arrays`` default to the trainer's :class:`SpringData` (None without one)."""
        if arrays is None:
            datamodule = getattr(attached_trainer(self), "datamodule", None)
            if not isinstance(datamodule, SpringData) or not datamodule.arrays:
                return None
            arrays = datamodule.arrays

        def predict(t: Any) -> Any:
            tt = torch.as_tensor(t, dtype=self.dtype, device=self.device)[:, None]
            return self(tt)[:, 0].double().cpu().numpy()

        fig, ax = small_figure(row_height_in=3.6)
        ax.plot(arrays["t_test"], arrays["u_test"], color="0.6", lw=3, label="exact")
        ax.plot(arrays["t_test"], predict(arrays["t_test"]), color="tab:blue", label="network")
        ax.scatter(arrays["t_data"], arrays["u_data"], color="tab:orange", s=16, zorder=3, label="data")
        ax.scatter(arrays["t_res"], predict(arrays["t_res"]), color="tab:green", s=8, zorder=3,
                   label="ODE residual points")
        ax.scatter(arrays["t_con"], predict(arrays["t_con"]), color="tab:red", marker="x", s=60, zorder=4,
                   label="constraints (imposed)")
        mse = float(((predict(arrays["t_test"]) - arrays["u_test"]) ** 2).mean())
        ax.set(xlabel="t", ylabel="u(t)", title=f"val/mse {mse:.2e}")
        fig.legend(fontsize=8, loc="outside lower center", ncol=2, frameon=False)
        return fig
