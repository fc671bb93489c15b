"""The FNO builder against neuraloperator's FNO with the same weights; the dtype cast of complex weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_constrained.tasks.fno import build_fno, cast_module_
from lit_constrained.tasks.spectral import PointwiseConv1d


def test_fno_equals_neuraloperators_fno_with_the_same_weights() -> None:
    from neuralop.models import FNO

    torch.manual_seed(0)
    reference = FNO(n_modes=(16, 16), in_channels=3, out_channels=1, hidden_channels=4, positional_embedding=None)
    ours = build_fno()
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    ours.load_state_dict({k: v for k, v in reference.state_dict().items() if k != "_metadata"})
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-6)
    convs = [m for m in ours.modules() if isinstance(m, nn.Conv1d)]
    assert convs and all(isinstance(m, PointwiseConv1d) for m in convs)
    conv = nn.Conv1d(3, 5, 1)
    pointwise = PointwiseConv1d(3, 5, 1)
    pointwise.load_state_dict(conv.state_dict())
    z = torch.randn(2, 3, 7)
    torch.testing.assert_close(pointwise(z), conv(z))


def test_cast_keeps_complex_weights_complex_and_the_state_dict_plain() -> None:
    torch.manual_seed(0)
    fno = build_fno(hidden_channels=2, n_layers=1, n_modes=(4, 4))
    before = {name: p.detach().clone() for name, p in fno.named_parameters()}
    cast_module_(fno, torch.float64)
    for name, p in fno.named_parameters():
        assert p.dtype == (torch.complex128 if before[name].is_complex() else torch.float64), name
        torch.testing.assert_close(p.detach(), before[name].to(p.dtype), rtol=0, atol=0)  # values kept exactly
    assert any(p.is_complex() for p in fno.parameters())
    assert all(isinstance(v, torch.Tensor) for v in fno.state_dict().values())  # no "_metadata" entry
    with pytest.raises(ValueError, match="n_modes"):
        build_fno(n_modes=(4,))
