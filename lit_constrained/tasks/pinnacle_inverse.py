r"""Inverse problems as a task kind: u and an unknown coefficient field a learned together, the PDE held
exactly at chosen points with a inside its residual, the noisy observations as a band of inequality rows.
PINNacle's two (Hao et al., arXiv 2306.08827, ``src/pde/inverse.py``): PInv and HInv
(:mod:`lit_constrained.tasks.pinnacle_inverse_data`: equations, closed forms, points, noise).

The unknowns are two networks (PINNacle's ``recommend_net`` for these problems, a parallel pair of
5 x 50 tanh MLPs): :math:`u_\theta` of every coordinate and :math:`a_\phi` of the coefficient's own
(HInv: x, y only, a does not depend on t). With the observations :math:`(x_i, d_i)`, noise
:math:`\sigma`, the PDE residual :math:`r(\theta, \phi; x)` and a's known boundary values :math:`a^*`:

.. math::

    f(\theta, \phi) = \frac{1}{N_r}\sum_j r(x_j)^2 + \frac{1}{N_d}\sum_i \big(u_\theta(x_i) - d_i\big)^2
        + \frac{1}{N_b}\sum_l \big(a_\phi(x_l) - a^*(x_l)\big)^2

(PINNacle's vanilla loss, each term weight 1: what plain Adam minimizes, and the objective here), and
imposed exactly

.. math::

    r(\theta, \phi; X_{pde}) = 0, \qquad a_\phi(X_{coef}) - a^*(X_{coef}) = 0, \qquad
    u_\theta(x_i) - d_i - k\sigma \le 0, \quad u_\theta(x_i) - d_i + k\sigma \ge 0 \ \ (i \in B),

the parts ``pde``, ``coef`` and the band's two one-sided parts ``band_upper`` (sense ``"<="``) and
``band_lower`` (``">="``) at the observations B (``x_band_imposed``, rows :math:`(x_i, d_i)`: the points
:math:`x_i` are the parts' points and the values :math:`d_i` their data, so each row depends on its own
point only). The PDE rows depend on both
networks, so J has columns for :math:`\theta` and :math:`\phi`; the band rows' :math:`\phi` columns
are 0, the coef rows' :math:`\theta` columns 0.

**k** (``band_k``, default 5): the band must not cut off the truth, or the hard rows bias u. With
:math:`N` imposed observations the true u leaves the band somewhere with probability at most
:math:`2N\Phi(-k)`: for all 2 500 observations and k = 5, 1.4e-3 (k = 4: 0.16; k = 3: one point in 370
outside, 6.8 expected). So the band is wide (:math:`\pm 0.5` at :math:`\sigma = 0.1`) and holds the fit
to the data hard only where it is far off (early on, and against a PDE row pulling u away); the
estimate itself comes from the misfit in f, which averages the noise (the band cannot: every u inside
it is equally feasible). Measured, the band costs accuracy (PInv, 2 000 steps: u 0.50 with it at 50
observations, 0.094 without; docs/inverse.md), so the recommended configs leave it out
(``n_band_imposed: 0``) and ``sqp_adam_band.yaml`` keeps it. The noise bounds what any estimate can
reach: a least-squares fit of :math:`N_d` observations on p functions has an rms error
:math:`\sigma\sqrt{p / N_d}` (docs/inverse.md).

Metrics (``val/`` and ``test/``): ``rel_l2_u``, ``rel_l2_a`` (each on the test grid against the closed
form) and ``rel_l2`` (PINNacle's, over u and a stacked).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from lit_constrained.imposed import Imposed, check_count
from lit_constrained.metrics.relative_l2 import relative_l2_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.physics import derivatives
from lit_constrained.tasks.common import DTypeName, mlp, torch_dtype
from lit_constrained.tasks.pinnacle_inverse_data import (
    NOISE, HeatInverseData, PoissonInverseData, hinv_a, hinv_source, pinv_a, pinv_source,
)

__all__ = ["HeatInverse", "HeatInverseData", "InverseTask", "PoissonInverse", "PoissonInverseData"]


class InverseTask(ConstrainedModule):
    """Base of the inverse tasks: the two networks, PINNacle's loss, the imposed PDE, coef and band parts.

    A subclass sets :attr:`input_dim` (u's coordinates), :attr:`coef_dim` (a's: the first ``coef_dim``
    coordinates), :meth:`pde_residual` and :meth:`coef_exact` (a's known values, used on the boundary).

    Args:
        hidden: width of each network's hidden layers (PINNacle: 50). depth: their number (PINNacle: 5).
        band_k: the band's half-width in noise standard deviations, :math:`|u - d| \\le k\\sigma`.
        noise: :math:`\\sigma` (PINNacle: 0.1).
        dtype: ``"float32"`` or ``"float64"`` for the networks; batches are cast to it.
        imposed_count: None (default): the PDE and a's boundary values imposed at the data's
            ``x_pde_imposed`` / ``x_coef_imposed``; an integer or ``"auto"``: the module chooses them from
            the objective's own points ``x_pde`` / ``x_coef`` (``Imposed(..., count=imposed_count)``,
            :mod:`lit_constrained.module_parts.row_choice`). The band is at ``x_band_imposed`` either way.
        **kwargs: the :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    cast_batch_to_dtype = True
    input_dim: int = 2
    coef_dim: int = 2
    coordinates: tuple[str, ...] = ("x", "y")

    def __init__(self, hidden: int = 50, depth: int = 5, band_k: float = 5.0, noise: float = NOISE,
                 dtype: DTypeName = "float32", imposed_count: int | Literal["auto"] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_count(imposed_count)
        self.imposed_count = imposed_count
        if not band_k > 0 or not noise > 0:
            raise ValueError(f"band_k and noise must be > 0, got band_k={band_k!r}, noise={noise!r}.")
        self.band_k, self.noise = float(band_k), float(noise)
        self.u_net = mlp(self.input_dim, hidden, depth, 1)
        self.a_net = mlp(self.coef_dim, hidden, depth, 1)
        self.to(torch_dtype(dtype))

    # ---------------------------------------------------------------------------- the fields
    def u(self, x: Tensor) -> Tensor:
        """u at the points (N, input_dim); (N,)."""
        return self.u_net(x)[:, 0]

    def a(self, x: Tensor) -> Tensor:
        """a at the points (N, >= coef_dim): of their first ``coef_dim`` coordinates; (N,)."""
        return self.a_net(x[:, :self.coef_dim])[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        """(u, a) at the points (N, input_dim); (N, 2), PINNacle's two outputs."""
        return torch.stack([self.u(x), self.a(x)], dim=1)

    def flux_divergence(self, x: Tensor) -> tuple[Tensor, Any]:
        r""":math:`\nabla\cdot(a\nabla u) = a\,\Delta u + \nabla a\cdot\nabla u` over a's coordinates, and
        u's derivatives (value, gradient, Hessian: for a time derivative)."""
        du = derivatives(self.u, x, names=self.coordinates)
        space = self.coordinates[:self.coef_dim]
        da = derivatives(self.a, x[:, :self.coef_dim], order=1, names=space)
        flux = da.value * du.laplacian(space)
        for name in space:
            flux = flux + da.partial(name) * du.partial(name)
        return flux, du

    @abstractmethod
    def pde_residual(self, x: Tensor) -> Tensor:
        """The PDE's residual at the points (N, input_dim), the coefficient inside it; (N,)."""

    @abstractmethod
    def coef_exact(self, x: Tensor) -> Tensor:
        """The true coefficient a* at the points (N, coef_dim): its known boundary values; (N,)."""

    def coef_residual(self, x: Tensor) -> Tensor:
        """:math:`a - a^*` at the coefficient's boundary points (N, coef_dim)."""
        return self.a(x) - self.coef_exact(x)

    def band_upper_residual(self, x: Tensor, d: Tensor) -> Tensor:
        r""":math:`u(x_i) - d_i - k\sigma` (imposed ``<= 0``) at the observations :math:`x_i`, values :math:`d_i`."""
        return self.u(x) - d - self.band_k * self.noise

    def band_lower_residual(self, x: Tensor, d: Tensor) -> Tensor:
        r""":math:`u(x_i) - d_i + k\sigma` (imposed ``>= 0``) at the observations :math:`x_i`, values :math:`d_i`."""
        return self.u(x) - d + self.band_k * self.noise

    # ---------------------------------------------------------------------------- what the module asks
    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        """PINNacle's loss: the PDE's, the data's and a's boundary mean squared residuals, summed."""
        pde = self.pde_residual(batch["x_pde"]).pow(2).mean()
        data = (self.u(batch["x_obs"]) - batch["d_obs"]).pow(2).mean()
        return pde + data + self.coef_residual(batch["x_coef"]).pow(2).mean()

    def imposed(self, batch: dict[str, Tensor]) -> dict[str, Imposed] | None:
        band = batch["x_band_imposed"]
        x_band, d_band = band[:, :-1], band[:, -1]
        pool = "" if self.imposed_count is not None else "_imposed"  # the objective's points, or the data's
        parts = {
            "pde": Imposed(self.pde_residual, batch[f"x_pde{pool}"], count=self.imposed_count),
            "coef": Imposed(self.coef_residual, batch[f"x_coef{pool}"], count=self.imposed_count),
            "band_upper": Imposed(self.band_upper_residual, x_band, data=d_band, sense="<="),
            "band_lower": Imposed(self.band_lower_residual, x_band, data=d_band, sense=">="),
        }
        return {name: part for name, part in parts.items() if len(part.points)} or None

    def residual(self, name: str) -> Callable[[Tensor], Tensor]:
        """The residual of the part ``name`` (``pde``, ``coef``, ``band_upper``, ``band_lower``)."""
        return getattr(self, f"{name}_residual")

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor:
        """The PDE residual at the held-out interior points and a - a* at the held-out boundary points."""
        return torch.cat([self.pde_residual(batch["x_pde_check"]), self.coef_residual(batch["x_coef_check"])])

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        with torch.no_grad():
            x = batch["x_test"]
            u, a = self.u(x), self.a(x)
            both = relative_l2_error(torch.stack([u, a], 1), torch.stack([batch["u_test"], batch["a_test"]], 1))
            return {"rel_l2_u": relative_l2_error(u, batch["u_test"]), "rel_l2_a": relative_l2_error(a, batch["a_test"]),
                    "rel_l2": both}


class PoissonInverse(InverseTask):
    r"""PInv: :math:`-\nabla\cdot(a\nabla u) = f` on [0, 1]^2, a known on the boundary, u observed with noise."""

    input_dim = 2
    coef_dim = 2
    coordinates = ("x", "y")

    def pde_residual(self, x: Tensor) -> Tensor:
        flux, _ = self.flux_divergence(x)
        return -flux - pinv_source(x)

    def coef_exact(self, x: Tensor) -> Tensor:
        return pinv_a(x)


class HeatInverse(InverseTask):
    r"""HInv: :math:`u_t - \nabla\cdot(a\nabla u) = f` on [-1, 1]^2 x [0, 1], a(x, y) known on the sides,
    u observed with noise."""

    input_dim = 3
    coef_dim = 2
    coordinates = ("x", "y", "t")

    def pde_residual(self, x: Tensor) -> Tensor:
        flux, du = self.flux_divergence(x)
        return du.partial("t") - flux - hinv_source(x)

    def coef_exact(self, x: Tensor) -> Tensor:
        return hinv_a(x)


#: the PINNacle names of the tasks
PINNACLE_INVERSE_NAMES = {"PInv": PoissonInverse, "HInv": HeatInverse}
