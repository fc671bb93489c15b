"""In-place symmetrization by blocks (optim/linalg/symmetric.py) against the whole-matrix formulas."""

from __future__ import annotations

import pytest
import torch

from lit_constrained.optim.linalg.symmetric import BLOCK, mirror_lower_, symmetrize_


@pytest.mark.parametrize("m", [1, 7, BLOCK, BLOCK + 45, 3 * BLOCK + 1])
def test_symmetrize_and_mirror_equal_the_whole_matrix_formulas_in_place(m):
    S = torch.randn(m, m, dtype=torch.float64, generator=torch.Generator().manual_seed(m))
    for function, expected in ((symmetrize_, 0.5 * (S + S.T)), (mirror_lower_, S.tril() + S.tril(-1).T)):
        work = S.clone()
        assert function(work) is work
        assert torch.equal(work, expected)


def test_mirror_of_a_fortran_ordered_matrix():
    """The host Gram's accumulator is Fortran-ordered (SciPy's dsyrk): a column-major tensor."""
    S = torch.randn(300, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fortran = torch.from_numpy(S.numpy().copy(order="F"))
    assert not fortran.is_contiguous()
    assert torch.equal(mirror_lower_(fortran), S.tril() + S.tril(-1).T)
