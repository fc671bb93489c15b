"""The vmap-safe spectral convolution against neuraloperator's ``SpectralConv`` with the same weights."""

from __future__ import annotations

import pytest
import torch
from neuralop.layers.spectral_convolution import SpectralConv

from lit_constrained.tasks.spectral import VmapSpectralConv


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_modes=(16, 16)),
        dict(n_modes=(6, 10)),
        dict(n_modes=(5, 7)),
        dict(n_modes=(8, 8), max_n_modes=(12, 12)),
        dict(n_modes=(8, 8), separable=True),
        dict(n_modes=(8, 8), complex_data=True),
    ],
)
def test_vmap_spectral_conv_equals_neuraloperator(kwargs: dict) -> None:
    torch.manual_seed(0)
    reference = SpectralConv(4, 4, **kwargs)
    ours = VmapSpectralConv(4, 4, **kwargs)
    ours.load_state_dict(reference.state_dict())
    dtype = torch.cfloat if kwargs.get("complex_data") else torch.float32
    x = torch.randn(3, 4, 16, 16, dtype=dtype)
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours(x, output_shape=(20, 20)), reference(x, output_shape=(20, 20)), rtol=1e-6, atol=1e-6)
    # vmap over single samples gives the batched result
    per_sample = torch.func.vmap(lambda xi: ours(xi[None])[0])(x)
    torch.testing.assert_close(per_sample, ours(x), rtol=1e-6, atol=1e-6)
