r"""2D Darcy flow with neuraloperator's FNO (2601.11795, section 5.4).

.. math::
    -\nabla\cdot(\nu(x)\nabla u(x)) = 1 \ \text{on } (0, 1)^2, \qquad u = 0 \ \text{on the boundary}.

An FNO maps the permeability (3 input channels on the 16 x 16 node grid: the mask
:math:`\nu = \nu_+`, and the coordinates x, y) to the solution, scaled by a fixed output scale
(the training data's standard deviation; u is ~0.01): :math:`u_\theta = s\,\mathrm{FNO}_\theta(\nu)`.
With :math:`r_\theta` the 5-point finite-difference residual (harmonic-mean faces, the stencil the
data was solved with, :func:`~lit_constrained.tasks.darcy_data.darcy_residual`), the objective on a
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
``view_as_real``) is the cost of a step. :meth:`Darcy.constraint_jacobian` computes it per sample with ``torch.func``
(residual i depends on one sample only): ``jacrev`` of the residuals of one sample, ``vmap``-ed over
the samples the constraints touch (one unit per constraint or per distinct sample, whichever is
cheaper), through a ``vmap``-safe spectral convolution
(:class:`~lit_constrained.tasks.spectral.VmapSpectralConv`) and 1x1 convolutions written as
contractions (:class:`~lit_constrained.tasks.spectral.PointwiseConv1d`). The general autograd helper
(:func:`lit_constrained.optim.jacobian.constraint_jacobian`, the base class's default) remains
available (``vmap_jacobian=False``, then the base's ``jacobian_method``) and is the fallback.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from neuralop.models import FNO
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from lit_constrained.module import ConstrainedModule
from lit_constrained.optim.flat import real_view
from lit_constrained.callbacks.monitoring import small_figure
from lit_constrained.batch import cast_floats
from lit_constrained.tasks.common import DTypeName, torch_dtype
from lit_constrained.tasks.darcy_data import DarcyData, boundary_mask, darcy_residual
from lit_constrained.tasks.spectral import VmapSpectralConv, pointwise_convs_

__all__ = ["Darcy", "DarcyData", "PlainStateFNO", "build_fno", "cast_module_", "constraint_units", "per_sample_jacobian"]


class PlainStateFNO(FNO, name="PlainStateFNO"):
    """neuraloperator's FNO with ``torch.nn.Module``'s own ``state_dict`` / ``load_state_dict``.

    neuraloperator's ``BaseModel.state_dict`` adds an un-prefixed ``"_metadata"`` entry (its init
    arguments: functions and classes) to the dict it is given, i.e. to the TOP-LEVEL state dict of
    any module that contains it: ``Darcy.load_state_dict`` then fails on an unexpected key, and a
    Lightning checkpoint would carry pickled functions. Here the state dict holds tensors only.
    """

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return nn.Module.state_dict(self, *args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        return nn.Module.load_state_dict(self, state_dict, strict=strict, assign=assign)


def build_fno(
    hidden_channels: int = 4,
    n_layers: int = 4,
    n_modes: Sequence[int] = (16, 16),
    lifting_channel_ratio: float = 2,
    projection_channel_ratio: float = 2,
) -> PlainStateFNO:
    """neuraloperator's 2D FNO, 3 input channels (mask, x, y) -> 1, made fast under ``vmap``.

    ``positional_embedding=None`` (the grid channels are part of the input). The spectral
    convolutions are :class:`~lit_constrained.tasks.spectral.VmapSpectralConv` and the 1x1
    convolutions :class:`~lit_constrained.tasks.spectral.PointwiseConv1d` (same parameters and
    outputs as neuraloperator's layers; per-sample gradients without a loop over samples).
    """
    if not isinstance(hidden_channels, int) or hidden_channels < 1:
        raise ValueError(f"hidden_channels must be a positive integer, got {hidden_channels!r}.")
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}.")
    modes = tuple(int(k) for k in n_modes)
    if len(modes) != 2 or min(modes) < 1:
        raise ValueError(f"n_modes must be two positive integers (modes along x and y), got {n_modes!r}.")
    fno = PlainStateFNO(
        n_modes=modes,
        in_channels=3,
        out_channels=1,
        hidden_channels=hidden_channels,
        n_layers=n_layers,
        lifting_channel_ratio=lifting_channel_ratio,
        projection_channel_ratio=projection_channel_ratio,
        positional_embedding=None,
        conv_module=VmapSpectralConv,
    )
    return pointwise_convs_(fno)


def cast_module_(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast parameters and buffers to ``dtype``, complex ones to the matching complex dtype.

    (``nn.Module.to(torch.float64)`` would drop the imaginary part of complex parameters and
    ``.double()`` leaves them in single precision.)
    """
    complex_dtype = {torch.float32: torch.complex64, torch.float64: torch.complex128}[dtype]
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_complex():
                tensor.data = tensor.data.to(complex_dtype)
            elif tensor.is_floating_point():
                tensor.data = tensor.data.to(dtype)
    return module


GroupingMode = Literal["auto", "rows", "samples"]


def constraint_units(sample: Tensor, node: Tensor, mode: GroupingMode = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """How the per-sample Jacobian batches the constraints: ``(owner, table, unit, slot)``.

    A *unit* is one functional evaluation on one sample followed by the backward passes of its rows:
    ``owner[u]`` is the sample of unit u, ``table[u]`` the (padded) residual nodes it differentiates,
    and constraint i is row ``slot[i]`` of unit ``unit[i]``.

    * ``"rows"``: one unit per constraint (m forward and m backward passes);
    * ``"samples"``: one unit per distinct sample, padded to the largest number of constraints on one
      sample G (S forward and S G backward passes);
    * ``"auto"``: the cheaper of the two, counting a backward pass as two forward passes
      (:func:`per_sample_jacobian` takes ``"rows"`` on an accelerator: the cost model needs the
      group sizes on the host, a sync per step).

    One ``vmap`` call covers all units: on small networks each call has a fixed cost of the order of
    a whole batched pass, so one padded call beats one call per group size.
    """
    if sample.dim() != 1 or sample.shape != node.shape:
        raise ValueError(
            f"sample and node must be 1-D index tensors of the same length, got {tuple(sample.shape)} and {tuple(node.shape)}."
        )
    if mode not in ("auto", "rows", "samples"):
        raise ValueError(f"grouping mode must be 'auto', 'rows' or 'samples', got {mode!r}.")
    m = sample.numel()
    if mode == "rows":  # no data-dependent shape: no host sync on an accelerator
        index = torch.arange(m, device=sample.device)
        return sample, node[:, None], index, torch.zeros_like(index)
    distinct, inverse, counts = torch.unique(sample, return_inverse=True, return_counts=True)
    width = int(counts.max()) if m else 0
    if mode == "auto":
        mode = "rows" if 3 * m <= distinct.numel() * (1 + 2 * width) else "samples"
    if mode == "rows":
        index = torch.arange(m, device=sample.device)
        return sample, node[:, None], index, torch.zeros_like(index)
    order = torch.argsort(inverse, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(inverse)
    slot[order] = torch.arange(m, device=sample.device) - starts[inverse[order]]
    table = torch.zeros(distinct.numel(), width, dtype=node.dtype, device=node.device)  # padding: node 0
    table[inverse, slot] = node
    return distinct, table, inverse, slot


def per_sample_jacobian(
    module: nn.Module,
    params: Sequence[Tensor],
    sample_residuals: Callable[..., Tensor],
    sample_inputs: Sequence[Tensor],
    sample: Tensor,
    node: Tensor,
    mode: GroupingMode = "auto",
) -> Tensor:
    r"""The Jacobian of ``c_i = sample_residuals(theta, *inputs[sample_i])[node_i]`` w.r.t. ``params``.

    ``sample_residuals(param_dict, *per_sample_inputs)`` evaluates ``module`` functionally on ONE
    sample (``functional_call``) and returns a 1-D tensor of that sample's residuals. Constraint i
    depends only on its own sample, so J is assembled per sample: ``jacrev`` of a sample's residuals,
    ``vmap``-ed over the samples (grouped as :func:`constraint_units` says). That is one backward
    pass per row through ONE sample's graph, instead of m backward passes through the graph of the
    whole constraint batch (the general autograd Jacobian).

    Returns ``(m, n)`` in the flat layout of ``params`` (in the given order; complex parameters as
    ``view_as_real``: the derivative w.r.t. the real part, then the imaginary part, per entry). The
    differentiation variable IS the real view, so no conjugation convention enters.
    Parameters of ``module`` not in ``params`` are held at their current values.
    """
    names = {id(p): name for name, p in module.named_parameters()}
    params = list(params)
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(
            f"params {missing} are not parameters of {type(module).__name__}; the per-sample Jacobian "
            "needs the module's own parameters (or set vmap_jacobian=False)."
        )
    keys = [names[id(p)] for p in params]
    is_complex = [p.is_complex() for p in params]
    real = tuple(real_view(p).detach() for p in params)
    n = sum(r.numel() for r in real)
    m = sample.numel()
    if m == 0:
        return torch.zeros(0, n, dtype=real[0].dtype if real else torch.get_default_dtype(), device=sample.device)
    if mode == "auto" and sample.device.type != "cpu":
        mode = "rows"  # the cost model reads counts on the host: on an accelerator, no host sync instead
    owner, table, unit, slot = constraint_units(sample, node, mode)

    def residuals_at(real_params: tuple[Tensor, ...], nodes: Tensor, *inputs: Tensor) -> Tensor:
        values = {
            key: torch.view_as_complex(r) if cplx else r
            for key, r, cplx in zip(keys, real_params, is_complex)
        }
        return sample_residuals(values, *inputs)[nodes]

    in_dims = (None, 0) + (0,) * len(sample_inputs)
    inputs = [t[owner] for t in sample_inputs]
    jac = vmap(jacrev(residuals_at), in_dims=in_dims)(real, table, *inputs)
    flat = torch.cat([j.reshape(table.shape[0], table.shape[1], -1) for j in jac], dim=2)
    if mode == "rows" or (table.shape == (m, 1) and torch.equal(unit, torch.arange(m, device=unit.device))):
        return flat[:, 0]  # one unit per constraint, in order: no gather needed
    return flat[unit, slot]


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
        vmap_jacobian: the per-sample ``torch.func`` Jacobian (fast); ``False``: the base class's
            general autograd Jacobian (``jacobian_method``: ``"auto"``, ``"batched"`` or ``"loop"``).
        jacobian_grouping: how the per-sample Jacobian batches the constraints (one unit per
            constraint, ``"rows"``, or per distinct sample, ``"samples"``; ``"auto"``: the cheaper; see
            :func:`constraint_units`).
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
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
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
        """Mean over samples of ||u_pred - u||_2 / ||u||_2."""
        b = self._batch(batch)
        u = self(b["x"])
        return ((u - b["u"]).flatten(1).norm(dim=1) / b["u"].flatten(1).norm(dim=1)).mean()

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        """``<stage>/rel_l2``: the relative L2 error on the held-out permeabilities."""
        return {"rel_l2": self.relative_l2(batch)}

    def prediction_figure(self, sample: dict[str, Tensor] | None = None) -> Any:
        """nu, true u, predicted u and the error of one sample (a batch of size 1); default: the first
        validation sample of the trainer's :class:`DarcyData` (None without one)."""
        if sample is None:
            datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
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
