"""neuraloperator's FNO as the package uses it: a state dict of tensors only, ``vmap``-safe layers, and
a cast that keeps complex spectral weights complex.

:func:`build_fno` is the Darcy task's network (3 input channels: the permeability mask and the
coordinates x, y; 1 output channel); its spectral and 1x1 convolutions are the ``vmap``-safe layers of
:mod:`lit_constrained.tasks.spectral`, so the per-sample constraint Jacobian
(:func:`lit_constrained.optim.jacobian.per_sample_jacobian`) batches over samples without a loop.
:func:`fno_per_sample` evaluates that network with its own parameters for every sample (no ``vmap``:
the same operations as the layers, on batched weights), for the Jacobian of the Darcy constraints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from neuralop.layers.channel_mlp import ChannelMLP
from neuralop.layers.skip_connections import Flattened1dConv, SoftGating
from neuralop.models import FNO
from torch import Tensor, nn
from torch.nn import functional as F

from lit_constrained.tasks.spectral import PointwiseConv1d, VmapSpectralConv, pointwise_convs_

__all__ = ["PlainStateFNO", "build_fno", "cast_module_", "fno_per_sample"]


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


def _unsupported(net: nn.Module) -> list[str]:
    """What :func:`fno_per_sample` does not implement in ``net`` (empty: the network of :func:`build_fno`)."""
    if not isinstance(net, FNO):
        return [f"a {type(net).__name__}, not an FNO"]
    blocks = net.fno_blocks
    problems = [name for name, bad in (
        ("a positional embedding", net.positional_embedding is not None),
        ("domain padding", net.domain_padding is not None),
        ("pre-activation", blocks.preactivation),
        ("normalization", blocks.norm is not None),
        ("a stabilizer", blocks.stabilizer is not None),
        ("complex data", blocks.complex_data),
        ("no channel MLP", not blocks.use_channel_mlp),
        ("a non-linearity other than GELU", blocks.non_linearity is not F.gelu),
    ) if bad]
    for conv in blocks.convs:
        if type(conv) is not VmapSpectralConv or conv.separable or conv.order != 2 or conv.resolution_scaling_factor:
            problems.append("a spectral convolution other than a dense 2D VmapSpectralConv at the input resolution")
    mlps = [net.lifting, net.projection, *blocks.channel_mlp]
    if any(type(m) is not ChannelMLP or m.dropout is not None or m.non_linearity is not F.gelu for m in mlps):
        problems.append("a channel MLP with dropout or another non-linearity")
    skips = [*blocks.fno_skips, *blocks.channel_mlp_skips]
    if any(type(m) not in (Flattened1dConv, SoftGating) for m in skips) or any(
        m.bias is not None for m in blocks.channel_mlp_skips
    ) or any(type(m.conv) is not PointwiseConv1d for m in blocks.fno_skips):
        problems.append("skips other than 1x1 convolutions (FNO) and soft gating without bias (channel MLP)")
    return problems


def fno_per_sample(net: nn.Module, params: dict[str, Tensor], x: Tensor) -> Tensor:
    r"""The FNO of :func:`build_fno` on ``x`` (B, C, n1, n2), sample b with its own parameters.

    ``params[name]`` has shape ``(B, *shape)`` (every parameter of ``net`` by its name in ``net``;
    complex spectral weights complex): sample b uses ``params[name][b]``. The result equals
    ``net(x[b:b+1], with params[.][b])`` for every b, by the same operations as neuraloperator's
    ``FNO.forward`` (lifting, ``n_layers`` Fourier blocks with post-activation, projection) and
    :class:`~lit_constrained.tasks.spectral.VmapSpectralConv` (``rfft2``, ``fftshift``, the centred
    block of modes, zero padding, ``irfft2``), on weights with a batch dimension. With broadcast views
    of the parameters (``expand``), the gradient w.r.t. ``params[name][b]`` is sample b's own:
    per-sample gradients in one reverse pass, without ``vmap``.

    Raises ``ValueError`` for a network that is not the configuration :func:`build_fno` makes, or
    for more Fourier modes than the grid holds.
    """
    problems = _unsupported(net)
    if problems:
        raise ValueError(f"fno_per_sample implements the FNO of build_fno only; this network has {', '.join(problems)}.")
    batch, _, n1, n2 = x.shape

    def pointwise(name: str, h: Tensor) -> Tensor:  # h (B, i, L) -> (B, o, L)
        y = torch.bmm(params[f"{name}.weight"][..., 0], h)
        bias = params.get(f"{name}.bias")
        return y if bias is None else y + bias[:, :, None]

    def channel_mlp(name: str, module: ChannelMLP, h: Tensor) -> Tensor:
        for i in range(module.n_layers):
            h = pointwise(f"{name}.fcs.{i}", h)
            if i < module.n_layers - 1:
                h = F.gelu(h)
        return h

    def spectral(index: int, conv: VmapSpectralConv, h: Tensor) -> Tensor:
        weight = params[f"fno_blocks.convs.{index}.weight.tensor"]
        k1, k2 = weight.shape[-2:]
        f1, f2 = n1, n2 // 2 + 1
        if k1 > f1 or k2 > f2:
            raise ValueError(f"fno_per_sample: {k1} x {k2} Fourier modes exceed the grid's {f1} x {f2}.")
        spectrum = torch.fft.fftshift(torch.fft.rfftn(h, norm=conv.fft_norm, dim=(-2, -1)), dim=-2)
        lo = f1 // 2 - k1 // 2  # the centred block along the shifted axis, the first modes along the last
        block = (spectrum[:, :, lo:lo + k1, :k2].unsqueeze(2) * weight).sum(1)
        out = torch.fft.fftshift(F.pad(block, (0, f2 - k2, lo, f1 - lo - k1)), dim=-2)
        y = torch.fft.irfftn(out, s=(n1, n2), dim=(-2, -1), norm=conv.fft_norm)
        bias = params.get(f"fno_blocks.convs.{index}.bias")
        return y if bias is None else y + bias

    blocks = net.fno_blocks
    h = channel_mlp("lifting", net.lifting, x.reshape(batch, x.shape[1], -1)).reshape(batch, -1, n1, n2)
    for i in range(net.n_layers):
        skip_fno = pointwise(f"fno_blocks.fno_skips.{i}.conv", h.flatten(2)).reshape(h.shape)
        skip_mlp = params[f"fno_blocks.channel_mlp_skips.{i}.weight"][:, 0] * h
        h = spectral(i, blocks.convs[i], h) + skip_fno
        if i < net.n_layers - 1:
            h = F.gelu(h)
        h = channel_mlp(f"fno_blocks.channel_mlp.{i}", blocks.channel_mlp[i], h.flatten(2)).reshape(h.shape) + skip_mlp
        if i < net.n_layers - 1:
            h = F.gelu(h)
    return channel_mlp("projection", net.projection, h.flatten(2)).reshape(batch, -1, n1, n2)
