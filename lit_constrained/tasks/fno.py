"""neuraloperator's FNO as the package uses it: a state dict of tensors only, ``vmap``-safe layers, and
a cast that keeps complex spectral weights complex.

:func:`build_fno` is the Darcy task's network (3 input channels: the permeability mask and the
coordinates x, y; 1 output channel); its spectral and 1x1 convolutions are the ``vmap``-safe layers of
:mod:`lit_constrained.tasks.spectral`, so the per-sample constraint Jacobian
(:func:`lit_constrained.jacobians.per_sample_jacobian`) batches over samples without a loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lit_constrained.tasks.spectral import VmapSpectralConv, import_neuralop, pointwise_convs_

FNO = import_neuralop("neuralop.models").FNO  # the [fno] extra; a one-line error without it

__all__ = ["PlainStateFNO", "build_fno", "cast_module_"]


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
