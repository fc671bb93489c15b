"""The flat layout (flat.py): parameter groups as one real vector, complex parameters as view_as_real."""

from __future__ import annotations

import torch

from lit_constrained.optim.flat import add_flat_, block_sizes, gather, group_params, numel_real, real_view

F64 = torch.float64


def test_flat_layout_with_complex_and_missing_grads():
    a = torch.nn.Parameter(torch.randn(2, 3))
    z = torch.nn.Parameter(torch.randn(2, dtype=torch.complex64))
    groups = [{"params": [a]}, {"params": [z]}]
    params = group_params(groups)
    assert params == [a, z]
    assert numel_real(params) == 6 + 4 and block_sizes(params) == [6, 4]
    assert torch.equal(real_view(z), torch.view_as_real(z))
    flat = gather([None, torch.ones(2, dtype=torch.complex64)], params, F64)
    assert torch.equal(flat, torch.tensor([0.0] * 6 + [1.0, 0.0, 1.0, 0.0], dtype=F64))
    before = torch.cat([a.detach().flatten(), torch.view_as_real(z.detach()).flatten()])
    step = torch.arange(10, dtype=F64)
    add_flat_(params, step)
    after = torch.cat([a.detach().flatten(), torch.view_as_real(z.detach()).flatten()])
    torch.testing.assert_close(after - before, step.float())
