r"""A ``vmap``-safe drop-in for neuraloperator's ``SpectralConv`` (dense weights).

The Fourier layer of an FNO (Li et al. 2021) on real data:

.. math::
    (K v)(x) = \mathcal F^{-1}_{\text{real}}\Big( \mathbb 1_{\text{kept}}(k)\,
               \textstyle\sum_i W_{i o}(k)\, (\mathcal F v_i)(k) \Big)(x) + b_o,

with ``rfftn`` over the spatial axes (``fft_norm="forward"``), the kept modes centred on the zero
frequency after an ``fftshift`` of all but the last axis, and the last (half-spectrum) axis
truncated to its first ``n_modes[-1] // 2 + 1`` entries.

neuraloperator 2.0 writes the contracted modes into a zero tensor in place
(``out_fft[slices] = ...``), which ``torch.func.vmap`` cannot batch, and always allocates that
tensor as ``complex64`` (so a ``float64`` model is silently truncated to single precision there).
:class:`VmapSpectralConv` inherits the constructor, weights and parameter names of ``SpectralConv``
and only replaces ``forward``: it builds the output spectrum by zero-padding the contracted block
(``torch.nn.functional.pad``), in the input's complex dtype. For ``float32`` it computes the same
numbers as neuraloperator's layer with the same weights. Pass it to the FNO as
``FNO(..., conv_module=VmapSpectralConv)``.

Supported: dense weights (``factorization=None``), separable or not, real or complex data,
``max_n_modes``, ``output_shape`` / ``resolution_scaling_factor``, full precision. Anything else
raises a ``ValueError`` at construction.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

NEURALOP_MISSING = (
    "The Darcy task's FNO needs neuraloperator, an optional extra: pip install -e '.[fno]' "
    "(or pip install 'lit-constrained[fno]', or pip install neuraloperator)."
)


def import_neuralop(module: str) -> ModuleType:
    """Import a ``neuralop`` module, or fail with one line naming the ``[fno]`` extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "neuralop":
            raise
        raise ModuleNotFoundError(NEURALOP_MISSING, name="neuralop") from None


SpectralConv = import_neuralop("neuralop.layers.spectral_convolution").SpectralConv

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: up to this many input channels the spectral contraction is a broadcast product and a sum
_SMALL_CHANNELS = 8


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return dtype
    return {torch.float64: torch.complex128, torch.float32: torch.complex64}.get(dtype, torch.complex64)


class VmapSpectralConv(SpectralConv):
    """``SpectralConv`` whose forward builds the output spectrum by padding (``vmap``-safe).

    Same constructor as :class:`neuralop.layers.spectral_convolution.SpectralConv`; the weight
    lives at ``<name>.weight.tensor`` (a complex parameter), the bias at ``<name>.bias``.

    Example:
        >>> import torch
        >>> conv = VmapSpectralConv(2, 3, n_modes=(4, 4))
        >>> conv(torch.randn(5, 2, 8, 8)).shape
        torch.Size([5, 3, 8, 8])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        factorization = kwargs.get("factorization")
        precision = kwargs.get("fno_block_precision", "full")
        if factorization is not None:
            raise ValueError(
                f"VmapSpectralConv supports dense spectral weights only (factorization=None), got "
                f"factorization={factorization!r}; use neuraloperator's SpectralConv for factorized weights."
            )
        if precision != "full":
            raise ValueError(
                f"VmapSpectralConv supports fno_block_precision='full' only, got {precision!r}."
            )
        super().__init__(*args, **kwargs)

    def _dense_weight(self) -> Tensor:
        weight = self.weight
        return weight if isinstance(weight, Tensor) else weight.to_tensor()

    def _contract_block(self, x: Tensor, weight: Tensor) -> Tensor:
        """Sum over input channels: ``out[b, o, k] = sum_i x[b, i, k] w[i, o, k]`` (or ``x * w``)."""
        if self.separable:
            return x * weight
        if self.in_channels <= _SMALL_CHANNELS:
            # few channels: broadcast-multiply and sum (no transposed copies; ~15 % faster under vmap)
            return (x.unsqueeze(2) * weight).sum(1)
        spatial = _LETTERS[3:3 + x.ndim - 2]
        return torch.einsum(f"bi{spatial},io{spatial}->bo{spatial}", x, weight)

    def forward(self, x: Tensor, output_shape: tuple[int, ...] | None = None) -> Tensor:
        """Spectral convolution of ``x`` of shape ``(batch, channels, d1, ..., dN)``."""
        mode_sizes = list(x.shape[2:])
        fft_dims = list(range(-self.order, 0))
        fft_size = list(mode_sizes)
        if self.complex_data:
            x = torch.fft.fftn(x, norm=self.fft_norm, dim=fft_dims)
            shift_dims = fft_dims
        else:
            fft_size[-1] = fft_size[-1] // 2 + 1
            x = torch.fft.rfftn(x, norm=self.fft_norm, dim=fft_dims)
            shift_dims = fft_dims[:-1]
        if self.order > 1:
            x = torch.fft.fftshift(x, dim=shift_dims)

        # the weight block in use (centred slices when fewer modes than max_n_modes are used)
        starts = [
            max_modes - min(size, n_mode)
            for size, n_mode, max_modes in zip(fft_size, self.n_modes, self.max_n_modes)
        ]
        slices_w: list[slice] = [slice(None)] if self.separable else [slice(None), slice(None)]
        centred = starts if self.complex_data else starts[:-1]
        slices_w += [slice(s // 2, -s // 2) if s else slice(s, None) for s in centred]
        if not self.complex_data:
            slices_w.append(slice(None, -starts[-1]) if starts[-1] else slice(None))
        weight = self._dense_weight()[tuple(slices_w)]
        kept = list(weight.shape[1 if self.separable else 2:])

        # the matching block of the input spectrum, and the zero padding that puts it back in place
        slices_x: list[slice] = [slice(None), slice(None)]
        pads: list[tuple[int, int]] = []
        for all_modes, n_kept in zip(fft_size, kept):
            centre = all_modes // 2
            lo = centre - n_kept // 2
            hi = centre + n_kept // 2 + n_kept % 2
            slices_x.append(slice(lo, hi))
            pads.append((lo, all_modes - hi))
        # as neuraloperator: the last axis keeps its first modes (not centred ones)
        if kept[-1] < fft_size[-1]:
            slices_x[-1] = slice(None, kept[-1])
            pads[-1] = (0, fft_size[-1] - kept[-1])
        else:
            slices_x[-1] = slice(None)
            pads[-1] = (0, 0)

        block = self._contract_block(x[tuple(slices_x)], weight)
        block = block.to(_complex_dtype(block.dtype))
        flat_pad: list[int] = []
        for before, after in reversed(pads):  # F.pad takes the last dimension first
            flat_pad += [before, after]
        out_fft = F.pad(block, flat_pad) if any(flat_pad) else block

        if self.resolution_scaling_factor is not None and output_shape is None:
            mode_sizes = [round(s * r) for s, r in zip(mode_sizes, self.resolution_scaling_factor)]
        if output_shape is not None:
            mode_sizes = list(output_shape)
        if self.order > 1:
            out_fft = torch.fft.fftshift(out_fft, dim=fft_dims[:-1])
        if self.complex_data:
            x = torch.fft.ifftn(out_fft, s=mode_sizes, dim=fft_dims, norm=self.fft_norm)
        else:
            x = torch.fft.irfftn(out_fft, s=mode_sizes, dim=fft_dims, norm=self.fft_norm)
        if self.bias is not None:
            x = x + self.bias
        return x


class PointwiseConv1d(nn.Conv1d):
    r"""A kernel-size-1 ``Conv1d`` computed as a channel contraction: :math:`y_{o\ell} = \sum_i W_{oi} x_{i\ell} + b_o`.

    Same parameters (``weight`` of shape ``(out, in, 1)``, ``bias``) and the same values as the
    convolution, but its per-sample weight gradients under ``torch.func.vmap`` are one batched
    contraction, where the convolution's backward falls back to a loop over the samples (the FNO's
    lifting, projection, channel MLPs and skips are all 1x1 convolutions).
    """

    def forward(self, x: Tensor) -> Tensor:
        y = torch.einsum("oi,...il->...ol", self.weight[:, :, 0], x)
        return y if self.bias is None else y + self.bias[:, None]


def pointwise_convs_(module: nn.Module) -> nn.Module:
    """Replace, in place, every 1x1 ``Conv1d`` (stride 1, no padding/dilation/groups) by a
    :class:`PointwiseConv1d` holding the same parameter tensors; returns ``module``."""
    for name, child in list(module.named_children()):
        if (
            type(child) is nn.Conv1d
            and child.kernel_size == (1,)
            and child.stride == (1,)
            and child.padding in ((0,), "valid")
            and child.dilation == (1,)
            and child.groups == 1
            and child.padding_mode == "zeros"
        ):
            new = PointwiseConv1d(child.in_channels, child.out_channels, 1, bias=child.bias is not None)
            new.weight = child.weight
            if child.bias is not None:
                new.bias = child.bias
            setattr(module, name, new)
        else:
            pointwise_convs_(child)
    return module
