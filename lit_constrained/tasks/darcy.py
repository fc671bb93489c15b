r"""2D Darcy flow with neuraloperator's FNO (2601.11795, section 5.4).

.. math::
    -\nabla\cdot(\nu(x)\nabla u(x)) = 1 \ \text{on } (0, 1)^2, \qquad u = 0 \ \text{on the boundary}.

An FNO maps the permeability (3 input channels on the 16 x 16 node grid: the mask
:math:`\nu = \nu_+`, and the coordinates x, y) to the solution, scaled by a fixed output scale
(the training data's standard deviation; u is ~0.01): :math:`u_\theta = s\,\mathrm{FNO}_\theta(\nu)`.
With :math:`r_\theta` the 5-point finite-difference residual (harmonic-mean faces, the stencil the
data was solved with, :func:`darcy_residual`), the objective on a
batch of samples is

.. math::
    f(\theta) = w_r\,\overline{r_\theta^2}\big|_{\text{interior}}
              + w_b\,\overline{u_\theta^2}\big|_{\text{boundary}}
              + w_d\,\overline{\big((u_\theta - u)/s\big)^2}\big|_{\text{data nodes}}

(the paper's weights :math:`w_r = w_b = 10^{-3}`, :math:`w_d = 1`; the data error is measured in
units of the output scale s, like the network's output), and the hard constraints are
:math:`c_i(\theta) = r_\theta(\text{sample}_i, \text{node}_i) = 0` at m = 50 fixed random
(training sample, interior node) pairs.

The constraint Jacobian (m x n; n = 18 733 at the paper's size, complex spectral weights entering as
``view_as_real``) is the cost of a step. :meth:`Darcy.constraint_jacobian` computes it per sample
(residual i depends on one sample only;
:func:`lit_constrained.jacobians.per_sample_jacobian`): one ``vmap``-ed forward pass over the
samples the constraints touch, each with its own broadcast copy of the parameters (one unit per
constraint or per distinct sample, whichever is cheaper), then one reverse pass, through the network of :func:`~lit_constrained.tasks.fno.build_fno`:
a ``vmap``-safe spectral convolution (:class:`~lit_constrained.tasks.spectral.VmapSpectralConv`) and
1x1 convolutions written as contractions (:class:`~lit_constrained.tasks.spectral.PointwiseConv1d`).
The general autograd helper (:func:`lit_constrained.jacobians.constraint_jacobian`, the base
class's default) remains available (``vmap_jacobian=False``, then the base's ``jacobian_method``)
and is the fallback.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from lit_constrained.batch import cast_floats
from lit_constrained.module_parts.tensorboard import small_figure
from lit_constrained.metrics.relative_l2 import relative_l2_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.trainer_checks import attached_trainer
from lit_constrained.jacobians import GroupingMode, per_sample_jacobian
from lit_constrained.tasks.common import DTypeName, torch_dtype
from lit_constrained.tasks.darcy_data import DarcyData, boundary_mask

__all__ = ["Darcy", "DarcyData", "darcy_residual"]


def darcy_residual(u: Tensor, nu: Tensor, forcing: float = 1.0) -> Tensor:
    """The finite-difference PDE residual at the interior nodes, in torch (same stencil as the solver).

    ``u`` and ``nu`` are ``(..., n, n)`` node values (boundary included); returns ``(..., n-2, n-2)``
    with ``r = -div(nu grad u) - forcing``. Differentiable, ``vmap``-safe (no in-place writes).
    """
    if u.shape[-2:] != nu.shape[-2:] or u.shape[-1] != u.shape[-2]:
        raise ValueError(f"u and nu must be (..., n, n) grids of the same size, got {tuple(u.shape)} and {tuple(nu.shape)}.")
    n = u.shape[-1]
    h2 = (1.0 / (n - 1)) ** 2
    c_nu = nu[..., 1:-1, 1:-1]
    c_u = u[..., 1:-1, 1:-1]

    def flux(nb_nu: Tensor, nb_u: Tensor) -> Tensor:
        return 2.0 * c_nu * nb_nu / (c_nu + nb_nu) * (nb_u - c_u)

    div = (
        flux(nu[..., 2:, 1:-1], u[..., 2:, 1:-1])
        + flux(nu[..., :-2, 1:-1], u[..., :-2, 1:-1])
        + flux(nu[..., 1:-1, 2:], u[..., 1:-1, 2:])
        + flux(nu[..., 1:-1, :-2], u[..., 1:-1, :-2])
    )
    return -div / h2 - forcing


class Darcy(ConstrainedModule):
    r"""2D Darcy flow: an FNO from the permeability to the solution, with hard residual constraints.

    See the module docstring for the objective and the constraints. Batches come from
    :class:`~lit_constrained.tasks.darcy_data.DarcyData`. Validation / test log the relative L2
    error on held-out permeabilities (``val/rel_l2``, ``test/rel_l2``: the mean over samples of
    :math:`\|u_\theta - u\|_2 / \|u\|_2`); the validation constraints are the residuals at all
    interior nodes of the held-out samples. At every validation a figure (nu, true u, predicted u,
    error; the paper's Figure 6) goes to TensorBoard (``prediction``).

    Args:
        hidden_channels: FNO width (the paper: 4).
        n_layers: Fourier layers (the paper: 4).
        n_modes: Fourier modes kept along x and y. Default (8, 8): the small embedded size (5 421 real
            parameters); the paper: (16, 16), all modes of the 16-grid (18 733 real parameters).
        lifting_channel_ratio: lifting MLP width / hidden_channels (neuraloperator's default 2).
        projection_channel_ratio: projection MLP width / hidden_channels (default 2).
        residual_weight: weight of the mean squared PDE residual (the paper: 1e-3).
        boundary_weight: weight of the mean squared boundary value (the paper: 1e-3).
        data_weight: weight of the data error (the paper: 1).
        output_scale: the fixed scale s of the output; ``None`` takes the training data's standard
            deviation from the DataModule at setup (then saved with the weights).
        vmap_jacobian: the per-sample ``vmap`` Jacobian (fast); ``False``: the base class's
            general autograd Jacobian (``jacobian_method``: ``"auto"``, ``"batched"`` or ``"loop"``).
        jacobian_grouping: how the per-sample Jacobian batches the constraints (one unit per
            constraint, ``"rows"``, or per distinct sample, ``"samples"``; ``"auto"``: the cheaper; see
            :func:`~lit_constrained.jacobians.constraint_units`).
        dtype: ``"float32"`` or ``"float64"`` (spectral weights become complex64 / complex128).
        **kwargs: :class:`~lit_constrained.module.ConstrainedModule` arguments (optimizer, ...).
    """

    def __init__(
        self,
        hidden_channels: int = 4,
        n_layers: int = 4,
        n_modes: tuple[int, int] = (8, 8),
        lifting_channel_ratio: float = 2,
        projection_channel_ratio: float = 2,
        residual_weight: float = 1e-3,
        boundary_weight: float = 1e-3,
        data_weight: float = 1.0,
        output_scale: float | None = None,
        vmap_jacobian: bool = True,
        jacobian_grouping: GroupingMode = "auto",
        dtype: DTypeName = "float32",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (("residual_weight", residual_weight), ("boundary_weight", boundary_weight),
                            ("data_weight", data_weight)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}.")
        if output_scale is not None and not output_scale > 0:
            raise ValueError(f"output_scale must be > 0 (or None: the data std), got {output_scale!r}.")
        self.compute_dtype = torch_dtype(dtype)
        # imported here: neuraloperator is the optional [fno] extra (and slow to import)
        from lit_constrained.tasks.fno import build_fno, cast_module_

        self.net = cast_module_(
            build_fno(hidden_channels, n_layers, n_modes, lifting_channel_ratio, projection_channel_ratio),
            self.compute_dtype,
        )
        self.residual_weight = float(residual_weight)
        self.boundary_weight = float(boundary_weight)
        self.data_weight = float(data_weight)
        self.vmap_jacobian = bool(vmap_jacobian)
        if jacobian_grouping not in ("auto", "rows", "samples"):
            raise ValueError(f"jacobian_grouping must be 'auto', 'rows' or 'samples', got {jacobian_grouping!r}.")
        self.jacobian_grouping = jacobian_grouping
        self.scale_from_data = output_scale is None
        self.register_buffer("output_scale", torch.tensor(1.0 if output_scale is None else float(output_scale),
                                                          dtype=torch.float64))

    # ------------------------------------------------------------------ model
    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(attached_trainer(self), "datamodule", None)
        if self.scale_from_data and datamodule is not None and hasattr(datamodule, "u_std"):
            self.output_scale.fill_(float(datamodule.u_std))

    def forward(self, x: Tensor) -> Tensor:
        """u of shape (B, n, n) from the input channels (B, 3, n, n)."""
        out = self.net(x.to(self.compute_dtype))
        return out[:, 0] * self.output_scale.to(out.dtype)

    def _batch(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return cast_floats(batch, self.compute_dtype)

    # ------------------------------------------------------------------ objective and constraints
    def objective(self, batch: dict[str, Tensor]) -> Tensor:
        b = self._batch(batch)
        u = self(b["x"])
        residual = darcy_residual(u, b["nu"])
        n = u.shape[-1]
        boundary = torch.as_tensor(boundary_mask(n), device=u.device)
        scale = self.output_scale.to(u.dtype)
        mask = b["data_mask"]
        data_error = (mask * ((u - b["u"]) / scale) ** 2).sum() / mask.sum().clamp_min(1.0)
        return (
            self.residual_weight * residual.pow(2).mean()
            + self.boundary_weight * u[:, boundary].pow(2).mean()
            + self.data_weight * data_error
        )

    def constraints(self, batch: dict[str, Tensor]) -> Tensor | None:
        if "con_node" not in batch or batch["con_node"].numel() == 0:
            return None
        b = self._batch(batch)
        residual = darcy_residual(self(b["con_x"]), b["con_nu"])
        return residual.flatten(1)[b["con_sample"], b["con_node"]]

    def validation_constraints(self, batch: dict[str, Tensor]) -> Tensor | None:
        """The residual at every interior node of the held-out samples."""
        b = self._batch(batch)
        return darcy_residual(self(b["x"]), b["nu"]).reshape(-1)

    def constraint_jacobian(
        self, batch: dict[str, Tensor], constraints: Tensor, params: Sequence[Tensor], rows: slice | None = None
    ) -> Tensor:
        """J (m, n) w.r.t. ``params`` in their order, or its rows ``rows`` (a rank's share under DDP):
        per-sample ``vmap`` (see module docstring) over the constraints of those rows only (sliced by
        constraint, not by sample: a rank's rows may touch any of the samples)."""
        if not self.vmap_jacobian:
            return super().constraint_jacobian(batch, constraints, params, rows=rows)
        b = self._batch(batch)
        selected = slice(None) if rows is None else rows
        try:
            return per_sample_jacobian(
                self, params, self._sample_residuals, (b["con_x"], b["con_nu"]), b["con_sample"][selected],
                b["con_node"][selected], self.jacobian_grouping,
            ).to(constraints.dtype)
        except RuntimeError as error:  # an operation without a batching rule: fall back, loudly
            warnings.warn(
                f"Per-sample vmap Jacobian failed ({str(error).splitlines()[0][:120]}); "
                "using the autograd Jacobian (slower).",
                RuntimeWarning,
                stacklevel=2,
            )
            self.vmap_jacobian = False
            return super().constraint_jacobian(batch, constraints, params, rows=rows)

    def _sample_residuals(self, params: dict[str, Tensor], x: Tensor, nu: Tensor) -> Tensor:
        u = functional_call(self, params, (x[None],))[0]
        return darcy_residual(u, nu).reshape(-1)

    # ------------------------------------------------------------------ metrics and figure
    def relative_l2(self, batch: dict[str, Tensor]) -> Tensor:
        """Mean over samples of ||u_pred - u||_2 / ||u||_2
        (:func:`~lit_constrained.metrics.relative_l2.relative_l2_error` with ``per_sample=True``)."""
        b = self._batch(batch)
        return relative_l2_error(self(b["x"]), b["u"], per_sample=True)

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        """``<stage>/rel_l2``: the relative L2 error on the held-out permeabilities."""
        return {"rel_l2": self.relative_l2(batch)}

    def prediction_figure(self, sample: dict[str, Tensor] | None = None) -> Any:
        """nu, true u, predicted u and the error of one sample (a batch of size 1); default: the first
        validation sample of the trainer's :class:`DarcyData` (None without one)."""
        if sample is None:
            datamodule = getattr(attached_trainer(self), "datamodule", None)
            if datamodule is None or not hasattr(datamodule, "example") or not getattr(datamodule, "tensors", None):
                return None
            split = next((s for s in ("val", "test", "train") if datamodule.tensors[f"{s}_u"].shape[0]), None)
            if split is None:
                return None
            sample = datamodule.example(split)
        with torch.no_grad():
            pred = self(sample["x"].to(self.device))[0].double().cpu().numpy()
        nu = sample["nu"][0].cpu().numpy()
        true = sample["u"][0].double().cpu().numpy()
        fig, axes = small_figure(2, 2, row_height_in=1.9, squeeze=False)
        panels = [(nu, "permeability nu"), (true, "true u"), (pred, "predicted u"), (abs(pred - true), "|error|")]
        vmin, vmax = min(true.min(), pred.min()), max(true.max(), pred.max())
        for i, (ax, (img, title)) in enumerate(zip(axes.flat, panels)):
            kw = {"vmin": vmin, "vmax": vmax} if i in (1, 2) else {}
            im = ax.imshow(img.T, origin="lower", extent=(0, 1, 0, 1), cmap="viridis", **kw)
            ax.set_title(title, fontsize=10)
            ax.set(xticks=[], yticks=[])
            fig.colorbar(im, ax=ax, fraction=0.046)
        rel = float(((pred - true) ** 2).sum() ** 0.5 / (true**2).sum() ** 0.5)
        fig.suptitle(f"one held-out nu: rel_l2 {rel:.3g}")
        return fig
