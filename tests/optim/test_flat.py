"""The flat layout (flat.py): parameter groups as one real vector, complex parameters as view_as_real."""

from __future__ import annotations

import torch

from lit_constrained.jacobians import block_sizes, numel_real, real_view
from lit_constrained.optim.flat import FlatLayout, gather, group_blocks, group_params

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
    FlatLayout.of(params).add_(params, step)
    after = torch.cat([a.detach().flatten(), torch.view_as_real(z.detach()).flatten()])
    torch.testing.assert_close(after - before, step.float())


def test_layout_gathers_into_a_buffer_and_reports_group_blocks():
    a = torch.nn.Parameter(torch.randn(3))
    b = torch.nn.Parameter(torch.randn(2, 2, dtype=F64))
    layout = FlatLayout.of([a, b])
    assert layout.n == 7 and layout.dtype == F64 and layout.real
    assert layout.working_dtype("native") == F64 and layout.working_dtype("float64") == F64
    out = torch.empty(7, dtype=F64)
    assert layout.gather([a, b], out) is out
    torch.testing.assert_close(out, torch.cat([a.detach().double(), b.detach().flatten()]))
    blocks = group_blocks([{"params": [a]}, {"params": [b]}])
    assert [block for _, block in blocks] == [slice(0, 3), slice(3, 7)]
    cache: dict = {}
    assert FlatLayout.cached(cache, [a, b]) is FlatLayout.cached(cache, [a, b])
    assert FlatLayout.cached(cache, [a]).n == 3


def test_layout_refuses_sparse_gradients():
    a = torch.nn.Parameter(torch.randn(3))
    try:
        FlatLayout.of([a]).gather([torch.zeros(3).to_sparse()], torch.empty(3))
    except ValueError as error:
        assert "sparse" in str(error)
    else:
        raise AssertionError("a sparse gradient was gathered")
