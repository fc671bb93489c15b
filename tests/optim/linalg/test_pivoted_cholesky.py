"""The pivoted-Cholesky factor of a large Gram matrix against dense float64 pseudo-inverses (SVD)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_constrained.optim.linalg.gram_factor import EIGH_MAX_SIZE, GramFactor, PivotedGramFactor
from lit_constrained.optim.linalg.pivoted_cholesky import HostCholesky

F64 = torch.float64


def jacobian(case: str, m: int = 200, n: int = 1_500, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if case == "full":
        return torch.randn(m, n, generator=gen, dtype=F64)
    if case == "ill_conditioned":  # singular values from 1 to 1e-4: cond(G) = 1e8
        U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
        V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
        return (U * torch.logspace(0, -4, m, dtype=F64)) @ V.T
    if case == "dependent":  # the last half of the rows are combinations of the first half: rank m / 2
        top = torch.randn(m // 2, n, generator=gen, dtype=F64)
        return torch.cat([top, torch.randn(m - m // 2, m // 2, generator=gen, dtype=F64) @ top])
    if case == "more_rows_than_columns":  # m > n: rank n
        return torch.randn(m, 40, generator=gen, dtype=F64)
    raise ValueError(case)


@pytest.mark.parametrize("case", ["full", "ill_conditioned", "dependent", "more_rows_than_columns"])
def test_solve_range_and_norm_against_the_dense_pseudo_inverse(case):
    J = jacobian(case)
    G = J @ J.T
    chol = HostCholesky.factor(G.numpy(), rcond=1e-7)
    sigma = torch.linalg.svdvals(J)
    expected_rank = int((sigma > 1e-7 * sigma[0]).sum())
    assert chol.rank == expected_rank
    pinv_G = torch.linalg.pinv(G, hermitian=True, rtol=1e-12).numpy()
    b = np.random.default_rng(1).standard_normal((J.shape[0], 3))
    tol = 1e-6 if case == "ill_conditioned" else 1e-9  # both solves carry ~eps64 cond(G) = 1e-8 there
    np.testing.assert_allclose(chol.solve(b), pinv_G @ b, rtol=0, atol=tol * np.abs(pinv_G @ b).max())
    np.testing.assert_allclose(chol.solve(b[:, 0]), pinv_G @ b[:, 0], rtol=0,
                               atol=tol * np.abs(pinv_G @ b[:, 0]).max())
    range_projector = (J @ torch.linalg.pinv(J, rtol=1e-10)).numpy()
    np.testing.assert_allclose(chol.range_part(b[:, 0]), range_projector @ b[:, 0], atol=1e-9)
    assert chol.pinv_norm_sq(b[:, 0]) == pytest.approx(float(b[:, 0] @ pinv_G @ b[:, 0]), rel=tol)
    kept = sigma[:expected_rank] ** 2
    true_condition = float(kept[0] / kept[-1])
    assert true_condition / 2.5 <= chol.condition <= true_condition * 1.01
    assert float(kept[0]) / 1.1 <= chol.largest <= float(kept[0]) * (1 + 1e-12)  # from below


def test_zero_gram_keeps_nothing():
    chol = HostCholesky.factor(np.zeros((80, 80)), rcond=1e-7)
    assert chol.rank == 0 and chol.condition == 1.0
    assert not chol.solve(np.ones(80)).any() and not chol.range_part(np.ones(80)).any()
    assert chol.pinv_norm_sq(np.ones(80)) == 0.0


def test_large_host_grams_use_it_and_small_ones_eigh():
    """GramFactor.from_gram switches to the pivoted Cholesky factor for a CPU Gram above EIGH_MAX_SIZE; its
    tensor methods agree with the eigh factor (GramFactor.from_eigh, the GPU's)."""
    J = jacobian("dependent", m=2 * EIGH_MAX_SIZE + 2)
    G = J @ J.T
    large, reference = GramFactor.from_gram(G), GramFactor.from_eigh(G)
    assert isinstance(large, PivotedGramFactor) and isinstance(large.cholesky, HostCholesky)
    assert large.basis is None and reference.basis is not None
    assert int(large.rank) == int(reference.rank) == EIGH_MAX_SIZE + 1
    assert large.size == reference.size == G.shape[0]
    b = torch.randn(G.shape[0], dtype=F64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(large.solve(b), reference.solve(b), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(large.range_part(b), reference.range_part(b), rtol=1e-9, atol=1e-10)
    assert float(large.pinv_norm_sq(b)) == pytest.approx(float(reference.pinv_norm_sq(b)), rel=1e-9)
    assert float(large.smallest_singular_value) == pytest.approx(float(reference.smallest_singular_value), rel=0.3)
    small = J[:EIGH_MAX_SIZE]
    assert isinstance(GramFactor.from_gram(small @ small.T).basis, torch.Tensor)


def test_the_kept_part_obeys_the_singular_value_cutoff():
    """Singular values of J from 1 to 1e-9 (cond(G) = 1e18): the pivots' tolerance alone can keep
    directions below rcond = 1e-7; the factor keeps exactly the singular values > rcond sigma_1 (as eigh
    does: 90), with the exact condition of the kept part, and its range projector is J's."""
    m, n = 120, 600
    gen = torch.Generator().manual_seed(5)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    # a gap around the cutoff (1e-5 ... 1e-8.5), so the kept range is well determined in float64
    sigma = torch.cat([torch.logspace(0, -5, 90, dtype=F64), torch.logspace(-8.5, -9, m - 90, dtype=F64)])
    J = (U * sigma) @ V.T
    chol = HostCholesky.factor((J @ J.T).numpy(), rcond=1e-7)
    reference = GramFactor.from_gram(J @ J.T)  # eigh, the same cutoff
    assert chol.rank == int(reference.rank) == 90
    assert chol.condition == pytest.approx(1e10, rel=0.1)  # (the power-iteration estimate)
    b = np.random.default_rng(2).standard_normal(m)
    kept = U[:, :90].numpy()
    np.testing.assert_allclose(chol.range_part(b), kept @ (kept.T @ b), atol=1e-6)


def test_a_continuous_spectrum_is_cut_where_eigh_cuts_it():
    """Singular values decaying from 1 to 1e-9 without a gap: LAPACK's pivots keep 103 directions, 10 of
    them below rcond sigma_1; the SVD truncation keeps eigh's 93 with cond(G) <= 1 / rcond^2."""
    m, n = 120, 600
    gen = torch.Generator().manual_seed(5)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    J = (U * torch.logspace(0, -9, m, dtype=F64)) @ V.T
    chol = HostCholesky.factor((J @ J.T).numpy(), rcond=1e-7)
    assert chol.rank == int(GramFactor.from_gram(J @ J.T).rank) == 93
    assert chol.condition <= 1e14 and chol.q is not None and chol.lower is None
