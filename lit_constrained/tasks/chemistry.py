"""The chemical reaction network task (2601.11795 section 5.2): an ODE-informed surrogate MLP.

The network maps (initial condition, time) to the state, :math:`u_\\theta(u_0, t) \\in \\mathbb{R}^4`
(5 -> 64 x 3 tanh -> 4). With the rate matrix K and the mass-balance weights w (:math:`w^T K = 0`),
the residuals at a row :math:`x = (u_0, t)` are

.. math::

    r_\\theta(x) = \\partial_t u_\\theta(x) - K u_\\theta(x) \\in \\mathbb{R}^4, \\qquad
    b_\\theta(x) = w^T \\partial_t u_\\theta(x) \\in \\mathbb{R}

(:math:`\\partial_t` by carrying the tangent :math:`e_t` through the MLP's layers by hand, the default; by
forward-mode AD, one pass for the 4 outputs; or by 4 reverse passes). Over a
batch B with labeled rows L (a fixed random 20 % of all rows):

.. math::

    f(\\theta) = w_r \\operatorname{mean}_{B} \\|r_\\theta\\|^2 / 4 + w_b \\operatorname{mean}_{B} b_\\theta^2
        + w_d \\operatorname{mean}_{L \\cap B} \\|u_\\theta - u\\|^2 / 4,
    \\qquad w_r = w_b = 10^{-2},\\ w_d = 1,

    c(\\theta) = \\big(b_\\theta(x_1), \\dots, b_\\theta(x_m)\\big) = 0 \\quad (m = 10 \\text{ fixed random rows}).

The constraints are declared point by point (:meth:`Chemistry.imposed`: the mass balance at the rows
``x_con``), so their Jacobian is the per-point one (:mod:`lit_constrained.jacobians.pointwise`, linear in
m); with the default ``derivative="taylor"`` the imposed residual carries the tangent in plain tensor
operations (``mlp_taylor(..., transformable=True)``), which run inside ``torch.func``; the other
modes take the engine's chunked-autograd path.

Optional non-negativity (``nonnegative=True``): every concentration is also imposed non-negative at the
same m rows, :math:`u_\\theta(x_j) \\ge 0` (the ``"nonnegative"`` part, ``Imposed(..., sense=">=")``: 4 m
inequality rows next to the m mass-balance rows; ``Violation/nonnegative/<stage>`` is
:math:`\\max_j \\max(-u_\\theta(x_j), 0)`). It needs an optimizer that takes inequality rows (SQPAdam,
SQPHeavyBall) or one that only monitors them (Adam).

Optional fixed affine normalization (``normalize=True``, off in the faithful reproduction):
:math:`u_\\theta(x) = \\mu_u + \\sigma_u \\odot N_\\theta((x - \\mu_x) / \\sigma_x)` with constants from the
problem itself (nominal trajectory, initial-condition spread, time horizon); the objective and the
constraints stay in physical units, and autograd differentiates through the affine maps, so
:math:`\\partial_t u` carries the factor :math:`\\sigma_u / \\sigma_t` exactly.

Test metrics on held-out initial conditions: ``mse`` and ``rel_l2`` (``||u_theta - u|| / ||u||``).
The data live in :mod:`lit_constrained.tasks.chemistry_data` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from lit_constrained.imposed import Imposed
from lit_constrained.metrics.relative_l2 import relative_l2_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.tasks.chemistry_data import (
    MASS_WEIGHTS,
    RATES,
    U0_NOMINAL,
    ChemistryData,
    ModalSolution,
    chemistry_exact,
    chemistry_odeint,
    generate_chemistry,
    reaction_matrix,
)
from lit_constrained.module_parts.tensorboard import small_figure
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.taylor import mlp_taylor

__all__ = [
    "Chemistry",
    "ChemistryData",
    "DerivativeMode",
    "ModalSolution",
    "chemistry_exact",
    "chemistry_odeint",
    "generate_chemistry",
    "state_and_rate",
]

DerivativeMode = Literal["taylor", "forward", "reverse"]

#: column of the time in the input x = (u0, t)
TIME_COLUMN = 4


def state_and_rate(
    u_fn: Callable[[Tensor], Tensor], x: Tensor, mode: DerivativeMode = "forward"
) -> tuple[Tensor, Tensor]:
    """``(u, du/dt)`` of a row-wise ``u_fn`` at inputs ``x`` (N, 5) whose last column is t.

    ``mode="forward"``: one forward-mode pass (a dual tangent e_t); ``"reverse"``: one
    ``torch.autograd.grad(create_graph=True)`` per output. Both results stay differentiable with
    respect to the parameters of ``u_fn``.
    """
    if x.dim() != 2 or x.shape[1] <= TIME_COLUMN:
        raise ValueError(f"x must have shape (N, 5) = (u0, t) rows, got {tuple(x.shape)}.")
    if mode == "forward":
        tangent = torch.zeros_like(x)
        tangent[:, TIME_COLUMN] = 1.0
        with fwAD.dual_level():
            out = u_fn(fwAD.make_dual(x, tangent))
            u, rate = fwAD.unpack_dual(out)
        if rate is None:  # u_fn does not depend on t
            rate = torch.zeros_like(u)
        return u, rate
    if mode == "reverse":
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            u = u_fn(x)
            columns = [
                torch.autograd.grad(u[:, j], x, torch.ones_like(u[:, j]), create_graph=True)[0][:, TIME_COLUMN]
                for j in range(u.shape[1])
            ]
        return u, torch.stack(columns, dim=1)
    raise ValueError(f"derivative mode must be 'forward' or 'reverse', got {mode!r}.")


class Chemistry(ConstrainedModule):
    """The 1-butene reaction network: data + ODE + mass-balance terms, mass balance = 0 at m rows.

    Pair it with :class:`ChemistryData` (same ``rates``; ``t_max``/``ic_spread`` only set the
    optional normalization).

    Args:
        hidden: width of the hidden layers.
        depth: number of hidden layers.
        rates: the five rate constants c1..c5.
        residual_weight: weight of the mean squared ODE residual.
        mass_weight: weight of the mean squared mass-balance residual.
        data_weight: weight of the mean squared error on the labeled rows.
        normalize: fixed affine normalization of inputs and outputs (off: the paper's setting).
        t_max: time horizon (for the normalization).
        ic_spread: half-width of the initial-condition perturbation (for the normalization).
        derivative: how du/dt is computed: ``"taylor"`` (default: the tangent carried through the
            MLP's layers by hand, :func:`~lit_constrained.tasks.taylor.mlp_taylor`; about 2x
            faster per training step than forward-mode AD), ``"forward"`` (forward-mode AD, any
            network) or ``"reverse"`` (4 reverse passes).
        dtype: ``"float32"`` or ``"float64"`` for the network (batches are cast to it).
        nonnegative: also impose every concentration >= 0 at the constraint rows (4 m inequality rows).
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True  # the data keep their stored dtype; the network runs in float32 or float64

    def __init__(
        self,
        hidden: int = 64,
        depth: int = 3,
        rates: list[float] = list(RATES),  # noqa: B006
        residual_weight: float = 1e-2,
        mass_weight: float = 1e-2,
        data_weight: float = 1.0,
        normalize: bool = False,
        t_max: float = 10.0,
        ic_spread: float = 1.0,
        derivative: DerivativeMode = "taylor",
        dtype: DTypeName = "float32",
        nonnegative: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.nonnegative = bool(nonnegative)
        for name, value in (("residual_weight", residual_weight), ("mass_weight", mass_weight),
                            ("data_weight", data_weight)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
        if derivative not in ("taylor", "forward", "reverse"):
            raise ValueError(f"derivative must be 'taylor', 'forward' or 'reverse', got {derivative!r}.")
        if t_max <= 0 or ic_spread <= 0:
            raise ValueError(f"t_max and ic_spread must be > 0, got {t_max}, {ic_spread}.")
        self.residual_weight = float(residual_weight)
        self.mass_weight = float(mass_weight)
        self.data_weight = float(data_weight)
        self.derivative: DerivativeMode = derivative
        self.net = mlp(5, hidden, depth, 4)
        self.register_buffer("rate_matrix", torch.as_tensor(reaction_matrix(rates)))
        self.register_buffer("mass_weights", torch.as_tensor(MASS_WEIGHTS, dtype=torch.float64))
        shifts = self._normalization(rates, t_max, ic_spread) if normalize else None
        self.register_buffer("in_shift", torch.zeros(5) if shifts is None else shifts[0])
        self.register_buffer("in_scale", torch.ones(5) if shifts is None else shifts[1])
        self.register_buffer("out_shift", torch.zeros(4) if shifts is None else shifts[2])
        self.register_buffer("out_scale", torch.ones(4) if shifts is None else shifts[3])
        self.to(torch_dtype(dtype))

    @staticmethod
    def _normalization(rates: list[float], t_max: float, ic_spread: float) -> tuple[Tensor, ...]:
        """Constants of the problem, not of a dataset: inputs centred on the nominal initial
        condition and t_max / 2 with the uniform distributions' standard deviations; outputs
        centred/scaled by the mean/std over time of the nominal trajectory."""
        times = np.linspace(0.0, t_max, 256)
        trajectory = chemistry_exact(np.asarray([U0_NOMINAL]), times, rates)[0]
        in_shift = torch.tensor([*U0_NOMINAL, t_max / 2.0], dtype=torch.float64)
        in_scale = torch.tensor([ic_spread / math.sqrt(3.0)] * 4 + [t_max / math.sqrt(12.0)], dtype=torch.float64)
        out_shift = torch.as_tensor(trajectory.mean(axis=0))
        out_scale = torch.as_tensor(trajectory.std(axis=0))
        return in_shift, in_scale, out_shift, out_scale

    # -- the model and the physics ------------------------------------------------------------

    def forward(self, x: Tensor) -> Tensor:
        """u(u0, t) for rows x = (u0, t) of shape (N, 5); returns (N, 4)."""
        return self.out_shift + self.out_scale * self.net((x - self.in_shift) / self.in_scale)

    def state_and_rate(self, x: Tensor, transformable: bool = False) -> tuple[Tensor, Tensor]:
        """(u, du/dt) of the network at rows x, both (N, 4); ``transformable``: in plain tensor
        operations (``derivative="taylor"``: valid inside ``torch.func`` transforms too)."""
        if self.derivative != "taylor":
            return state_and_rate(self, x, self.derivative)
        if x.dim() != 2 or x.shape[1] <= TIME_COLUMN:
            raise ValueError(f"x must have shape (N, 5) = (u0, t) rows, got {tuple(x.shape)}.")
        # d/dt of the normalized input is e_t / in_scale[t]; d/dt of the output is out_scale * (net's)
        # (one direction shared by every row)
        direction = x.new_zeros(1, 1, x.shape[1])
        direction[0, 0, TIME_COLUMN] = 1.0 / self.in_scale[TIME_COLUMN]
        out, rate, _ = mlp_taylor(self.net, (x - self.in_shift) / self.in_scale, direction, transformable=transformable)
        return self.out_shift + self.out_scale * out, self.out_scale * rate[0]

    def ode_residual(self, u: Tensor, rate: Tensor) -> Tensor:
        """du/dt - K u, (N, 4)."""
        return rate - u @ self.rate_matrix.T

    def mass_residual(self, rate: Tensor) -> Tensor:
        """w^T du/dt, (N,)."""
        return rate @ self.mass_weights

    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        u, rate = self.state_and_rate(batch["x"])
        f = self.residual_weight * self.ode_residual(u, rate).pow(2).mean()
        f = f + self.mass_weight * self.mass_residual(rate).pow(2).mean()
        # mean squared error over the labeled rows of the batch (none labeled: no data term);
        # a masked mean, so no host sync on an accelerator
        labeled = batch["labeled"].to(u.dtype)
        squared_error = (u - batch["u"]).pow(2).mean(dim=1)
        data_error = (squared_error * labeled).sum() / labeled.sum().clamp(min=1.0)
        return f + self.data_weight * data_error

    def mass_balance(self, x: Tensor) -> Tensor:
        """The mass-balance residual w^T du/dt of the network at rows x (N, 5); returns (N,)."""
        _, rate = self.state_and_rate(x, transformable=True)
        return self.mass_residual(rate)

    def concentrations(self, x: Tensor) -> Tensor:
        """The network's state u at rows x (N, 5); returns (N, 4) (imposed >= 0 with ``nonnegative``)."""
        return self(x)

    def imposed(self, batch: dict[str, Tensor]) -> Mapping[str, Imposed]:
        """The mass balance at the m constraint rows ``x_con`` (and, with ``nonnegative``, u >= 0 there)."""
        parts = {"mass": Imposed(self.mass_balance, batch["x_con"])}
        if self.nonnegative:
            parts["nonnegative"] = Imposed(self.concentrations, batch["x_con"], sense=">=")
        return parts

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor:
        """The mass-balance residual at every row of the (held-out) batch."""
        _, rate = self.state_and_rate(batch["x"])
        return self.mass_residual(rate)

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        """``mse`` and ``rel_l2`` against the exact solution on all rows of the batch."""
        with torch.no_grad():
            prediction = self(batch["x"])
            return {
                "mse": (prediction - batch["u"]).pow(2).mean(),
                "rel_l2": relative_l2_error(prediction, batch["u"]),
            }

    # -- Lightning hooks ----------------------------------------------------------------------

    @torch.no_grad()
    def prediction_figure(self, arrays: dict[str, Any] | None = None, n_curves: int = 2, split: str = "val") -> Any:
        """Exact (lines) and predicted (dashed) trajectories of ``n_curves`` held-out initial conditions
        of ``split``; ``arrays`` default to the trainer's :class:`ChemistryData` (None without one)."""
        if arrays is None:
            datamodule = getattr(attached_trainer(self), "datamodule", None)
            if not isinstance(datamodule, ChemistryData) or not datamodule.arrays:
                return None
            arrays = datamodule.arrays
        n_times = len(arrays["times"])
        n_curves = max(1, min(n_curves, len(arrays[f"x_{split}"]) // n_times))
        fig, axes = small_figure(n_curves, 1, row_height_in=2.4, squeeze=False)
        for i, ax in enumerate(axes[:, 0]):
            rows = slice(i * n_times, (i + 1) * n_times)
            x = torch.as_tensor(arrays[f"x_{split}"][rows], dtype=self.dtype, device=self.device)
            pred = self(x).double().cpu().numpy()
            exact = arrays[f"u_{split}"][rows]
            for j in range(4):
                color = f"C{j}"
                ax.plot(arrays["times"], exact[:, j], color=color, lw=2.5, alpha=0.5, label=f"u{j + 1} exact")
                ax.plot(arrays["times"], pred[:, j], color=color, ls="--", label=f"u{j + 1} network")
            mse = float(((pred - exact) ** 2).mean())
            ax.set(ylabel="concentration", title=f"{split} initial condition {i}: mse {mse:.2e}")
        axes[-1, 0].set_xlabel("t")
        axes[0, 0].legend(fontsize=8, ncol=2)
        return fig
