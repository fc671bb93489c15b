"""The null-space algebra (optim/linalg/) against dense float64 references (torch.linalg in float64;
NumPy only where a test needs the block products of the CPU path's BLAS)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_constrained.optim.linalg.gram import exact_gram, gram, gram_error, scaled_chunk_columns, scaled_gram
from lit_constrained.optim.linalg.gram_factor import GramFactor
from lit_constrained.optim.linalg.merged_step import merged_step
from lit_constrained.optim.linalg.nullspace import NullSpace
from lit_constrained.optim.linalg.products import RESIDUAL_BLOCK, blocked_matvec, exact_matvec
from lit_constrained.optim.linalg.refinement import (
    MAX_REFINEMENTS,
    REFINE_ABOVE_CONDITION,
    TARGET_ERROR,
    RefinementPlan,
    exact_residual_needed,
    refinement_counts,
)

F64 = torch.float64


def svd_jacobian(m: int, n: int, cond: float, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """J = U diag(sigma) V^T with sigma log-spaced from 1 to 1 / cond, random orthonormal U, V."""
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    sigma = torch.logspace(0, -math.log10(cond), m, dtype=F64)
    return ((U * sigma) @ V.T).to(dtype)


def dense_projector(J: torch.Tensor) -> torch.Tensor:
    J = J.to(F64)
    return torch.eye(J.shape[1], dtype=F64) - torch.linalg.pinv(J) @ J


# ---------------------------------------------------------------------------- products with J
@pytest.mark.parametrize("n", [300, 20_000])
def test_blocked_gram_is_within_its_error_estimate(n):
    J = torch.randn(7, n, generator=torch.Generator().manual_seed(n))
    exact = J.to(F64) @ J.to(F64).T
    error = (gram(J) - exact).norm() / exact.norm()
    assert error <= 10 * gram_error(n, torch.float32, 7)
    # one float32 GEMM over all n is what the blocks avoid
    assert (gram(J.to(F64)) - exact).norm() / exact.norm() < 1e-15


@pytest.mark.parametrize("m,dtype", [(10, torch.float32), (24, torch.float32), (10, F64)])
def test_scaled_gram_against_dense_float64(m, dtype):
    """scaled_gram(J, d) = J D^2 J^T (D = diag(d)) without forming J D in full, and J D v from the same
    pass: against dense float64 products; n spans three chunks and a partial block. Float32: within the
    blocked Gram's error estimate, the same products and sums as the Gram of the formed J D, and J D v
    from chunk products summed in float64 (error ~eps32 sqrt(chunk) ||J_i D|| ||v||)."""
    n = 3 * scaled_chunk_columns(m, 10**9, dtype) + 700
    gen = torch.Generator().manual_seed(m)
    J = torch.randn(m, n, generator=gen, dtype=dtype)
    d = (torch.rand(n, generator=gen, dtype=dtype) + 0.1) ** 2  # a spread of column scales, as H^{-1/2}'s
    J64 = J.to(F64) * d.to(F64)
    exact = J64 @ J64.T
    v = torch.randn(n, generator=gen, dtype=dtype)
    G, Jv = scaled_gram(J, d, v=v)
    error = (G - exact).norm() / exact.norm()
    # (float64: chunked sums of ~8e5 products, ~eps64 sqrt(chunks) relative: 3.5e-15 seen on AMD EPYC's BLAS)
    assert error <= (1e-14 if dtype == F64 else 10 * gram_error(n, dtype, m))
    if dtype == torch.float32:
        assert torch.equal(G, gram(J * d))
    assert torch.equal(scaled_gram(J, d)[0], G) and scaled_gram(J, d)[1] is None
    scale = J64.abs() @ v.to(F64).abs()  # the size of each row's sum before cancellation
    eps = torch.finfo(dtype).eps * math.sqrt(scaled_chunk_columns(m, n, dtype))
    assert ((Jv - J64 @ v.to(F64)).abs() / scale).max() <= eps
    assert (exact_gram(J, d=d) - exact).norm() / exact.norm() < 1e-14


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_scaled_gram_without_scaling_gives_the_gemv_product_unchanged(dtype):
    """Without d, J v comes with the Gram from scaled_gram as the SQP methods formed it before (one GEMV
    in J's dtype, then float64): the same bits, and the Gram is gram(J)'s; the step's order of the two
    products changed, not their values. (Against float64 products too.)"""
    gen = torch.Generator().manual_seed(3)
    J, v = torch.randn(10, 5000, generator=gen, dtype=dtype), torch.randn(5000, generator=gen, dtype=dtype)
    G, Jv = scaled_gram(J, None, v=v)
    assert torch.equal(Jv, (J @ v).to(F64)) and torch.equal(G, gram(J))
    exact = J.to(F64) @ v.to(F64)
    assert ((Jv - exact).abs() / (J.to(F64).abs() @ v.to(F64).abs())).max() <= 10 * torch.finfo(dtype).eps


@pytest.mark.parametrize("n", [300, 20_000, 100_003])
def test_blocked_matvec_is_within_its_error_estimate(n):
    """Float32 products over RESIDUAL_BLOCK columns summed in float64: each row's error is ~eps32
    sqrt(B / n) ||J_i|| ||v||, far below one float32 GEMV's (the residual of the refinement)."""
    gen = torch.Generator().manual_seed(n)
    J, v = torch.randn(6, n, generator=gen), torch.randn(n, generator=gen)
    exact = J.to(F64) @ v.to(F64)
    scale = J.to(F64).norm(dim=1) * v.to(F64).norm()
    bound = torch.finfo(torch.float32).eps * math.sqrt(min(RESIDUAL_BLOCK, n) / n)
    assert ((blocked_matvec(J, v) - exact).abs() / scale).max() <= 3 * bound
    assert torch.equal(blocked_matvec(J.to(F64), v.to(F64)), exact)


def test_exact_residual_only_where_the_blocked_one_cannot_reach_the_target():
    def factor(cond_gram: float) -> GramFactor:
        return GramFactor.from_gram(torch.diag(torch.tensor([1.0, 1.0 / cond_gram], dtype=F64)))

    # eps32 sqrt(256 / n) kappa(J) against TARGET_ERROR = 1e-6
    assert not bool(exact_residual_needed(factor(3.3e4), 1_000_000, torch.float32))
    assert bool(exact_residual_needed(factor(1e6), 100_000, torch.float32))
    assert not bool(exact_residual_needed(factor(1e12), 100_000, F64))


def planned(factor: GramFactor, n: int, dtype: torch.dtype) -> RefinementPlan:
    return RefinementPlan.decode(tuple(refinement_counts(factor, n, dtype).tolist()), factor.size)


def model_plan(cond_gram: float, n: int, dtype: torch.dtype, m: int, most: int) -> tuple[int, bool, bool]:
    """(steps, exact residual, exact Gram) from the error models themselves: the fewest k with
    rate^(k+1) <= TARGET_ERROR, rate = max(kappa eps_G, eps sqrt(kappa)); the exact residual where
    eps sqrt(B / n) sqrt(kappa) > TARGET_ERROR."""
    if dtype == F64:
        return int(cond_gram > REFINE_ABOVE_CONDITION), False, False
    eps = torch.finfo(dtype).eps
    rate = max(cond_gram * gram_error(n, dtype, m), eps * math.sqrt(cond_gram))
    k = next((k for k in range(most + 1) if rate ** (k + 1) <= TARGET_ERROR), None)
    if k is None:
        return 0, True, True
    residual = eps * math.sqrt(min(RESIDUAL_BLOCK, n) / n) * math.sqrt(cond_gram) > TARGET_ERROR
    return k, residual, False


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("n", [1_000, 100_000, 1_000_000])
def test_refinement_plan_follows_the_error_models(dtype, n):
    """The thresholds precomputed on the host give the error models' decisions over a sweep of cond(G)
    (one comparison and one product on the device instead of evaluating the models there)."""
    for cond_gram in torch.logspace(0, 14, 57, dtype=F64).tolist():
        factor = GramFactor.from_gram(torch.diag(torch.tensor([1.0, 0.3, 1.0 / cond_gram], dtype=F64)))
        plan = planned(factor, n, dtype)
        kappa = float(factor.condition)
        assert (plan.steps, plan.exact_residual, plan.exact_gram) == model_plan(kappa, n, dtype, 3, MAX_REFINEMENTS), cond_gram
        if not plan.exact_gram:
            assert plan.exact_residual == bool(exact_residual_needed(factor, n, dtype))


@pytest.mark.parametrize("m,n", [(5, 50_000), (200, 3_000)])
def test_exact_gram_and_exact_matvec_are_float64_accurate_for_float32_data(m, n):
    """Small m (column chunks, torch's products) and m > EIGH_MAX_SIZE (SciPy's dsyrk, whole rows
    converted for J v; the row chunks hold fewer rows than m)."""
    gen = torch.Generator().manual_seed(1)
    J = torch.randn(m, n, generator=gen)
    v = torch.randn(n, generator=gen)
    J64, v64 = J.to(F64), v.to(F64)
    G = J64 @ J64.T
    assert (exact_gram(J) - G).norm() / G.norm() < 1e-14
    Jv = J64 @ v64
    assert (exact_matvec(J, v) - Jv).norm() / (J64.abs() @ v64.abs()).norm() < 1e-15
    assert (exact_matvec(J64, v64) - Jv).norm() / Jv.norm() < 1e-14


# ---------------------------------------------------------------------------- the m x m algebra
def test_gram_factor_pseudo_inverse_rank_and_singular_values_against_dense():
    J = svd_jacobian(4, 30, 1e3, dtype=F64)
    J[2] = 0.5 * J[0] + J[1]  # rank 3
    factor = GramFactor.from_gram(J @ J.T)
    G = J @ J.T
    b = torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(factor.solve(b), torch.linalg.pinv(G, hermitian=True, rtol=1e-10) @ b,
                               rtol=1e-8, atol=1e-10)
    assert int(factor.rank) == 3
    sigma = torch.linalg.svdvals(J)
    assert float(factor.smallest_singular_value) == pytest.approx(float(sigma[2]), rel=1e-8)
    assert float(factor.condition) == pytest.approx(float(sigma[0] / sigma[2]) ** 2, rel=1e-6)
    # the range projector U_r U_r^T against the dense one
    R = J @ torch.linalg.pinv(J)
    torch.testing.assert_close(factor.range_part(b), R @ b, rtol=1e-10, atol=1e-10)
    assert float(factor.pinv_norm_sq(b)) == pytest.approx(float((torch.linalg.pinv(J) @ b).norm() ** 2), rel=1e-8)


@pytest.mark.parametrize("case", ["rank_deficient", "full_rank", "zero", "negative"])
def test_factor_against_a_dense_pseudo_inverse(case):
    """GramFactor's rank, G^+ b (vector and matrix), U_r U_r^T b and b^T G^+ b against a dense
    pseudo-inverse, including a zero and a negative "Gram" (nothing kept)."""
    J = svd_jacobian(4, 30, 1e3, dtype=F64)
    if case == "rank_deficient":
        J[2] = 0.5 * J[0] + J[1]
    G = {"zero": torch.zeros(4, 4, dtype=F64), "negative": -torch.eye(4, dtype=F64)}.get(case, J @ J.T)
    factor = GramFactor.from_gram(G)
    assert int(factor.rank) == {"rank_deficient": 3, "full_rank": 4}.get(case, 0)
    b = torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(2))
    # (a Gram matrix is PSD: a non-positive largest eigenvalue keeps nothing, G^+ = 0)
    pinv_G = torch.zeros_like(G) if case == "negative" else torch.linalg.pinv(G, hermitian=True, rtol=1e-10)
    range_projector = G @ pinv_G
    torch.testing.assert_close(factor.solve(b), pinv_G @ b, rtol=1e-8, atol=1e-10)
    B = torch.stack([b, 2.0 * b], dim=1)
    torch.testing.assert_close(factor.solve(B), pinv_G @ B, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(factor.range_part(b), range_projector @ b, rtol=1e-10, atol=1e-10)
    assert float(factor.pinv_norm_sq(b)) == pytest.approx(float(b @ pinv_G @ b), rel=1e-8, abs=1e-12)


def test_zero_jacobian_has_rank_zero_and_a_zero_pseudo_inverse():
    factor = GramFactor.from_gram(torch.zeros(3, 3, dtype=F64))
    assert int(factor.rank) == 0 and float(factor.smallest_singular_value) == 0.0
    assert torch.equal(factor.solve(torch.ones(3, dtype=F64)), torch.zeros(3, dtype=F64))


def test_refinement_plan():
    # float64: one step above cond(G) = 1e3, as the reference path always did
    well = GramFactor.from_gram(torch.diag(torch.tensor([1.0, 0.5], dtype=F64)))
    ill = GramFactor.from_gram(torch.diag(torch.tensor([1.0, 1e-4], dtype=F64)))
    assert planned(well, 10, F64).steps == 0 and planned(ill, 10, F64).steps == 1
    # float32: more steps as cond grows, the exact Gram when the blocked one cannot resolve J
    plans = [planned(GramFactor.from_gram(torch.diag(torch.tensor([1.0, 1.0 / k], dtype=F64))), 100_000,
                     torch.float32) for k in (1.0, 1e4, 1e8)]
    assert plans[0].steps == 0 and plans[1].steps >= 1 and plans[2].exact_gram


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_merged_step_is_a_projected_w_plus_the_minimum_norm_normal_step(dtype):
    """out = a P w - J^+ (s c), against a dense pseudo-inverse."""
    gen = torch.Generator().manual_seed(3)
    J = svd_jacobian(5, 400, 100.0, dtype=dtype)
    w = torch.randn(400, generator=gen, dtype=dtype)
    sc = torch.randn(5, generator=gen, dtype=F64)
    factor = GramFactor.from_gram(gram(J))
    out = merged_step(J, factor, w, 0.3, sc, 2, torch.empty_like(w))
    J64 = J.to(F64)
    expected = 0.3 * dense_projector(J64) @ w.to(F64) - torch.linalg.pinv(J64) @ sc
    tol = 1e-12 if dtype == F64 else 1e-5
    torch.testing.assert_close(out.to(F64), expected, rtol=tol, atol=tol * expected.abs().max().item())
    torch.testing.assert_close(J64 @ out.to(F64), -sc, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("exact", [True, False])
def test_refined_merged_step_against_dense(dtype, exact):
    """merged_step with refinements (either residual) is a P w - J^+ (s c), against a dense
    pseudo-inverse; w = None gives -J^+ (s c)."""
    gen = torch.Generator().manual_seed(3)
    J = svd_jacobian(5, 400, 100.0, dtype=dtype)
    w = torch.randn(400, generator=gen, dtype=dtype)
    sc = torch.randn(5, generator=gen, dtype=F64)
    factor = GramFactor.from_gram(gram(J))
    J64 = J.to(F64)
    tol = 1e-12 if dtype == F64 else 1e-5
    out = merged_step(J, factor, w, 0.3, sc, 2, torch.empty_like(w), exact=exact)
    expected = 0.3 * dense_projector(J64) @ w.to(F64) - torch.linalg.pinv(J64) @ sc
    torch.testing.assert_close(out.to(F64), expected, rtol=tol, atol=tol * expected.abs().max().item())
    normal = merged_step(J, factor, None, 0.0, sc, 1, torch.empty_like(w), exact=exact)
    torch.testing.assert_close(J64 @ normal.to(F64), -sc, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_scaled_merged_step_against_dense(dtype):
    """merged_step with ``scaling = (d, scratch)`` is a P~ w - J~^+ (s c) for J~ = J diag(d), never formed,
    against a dense pseudo-inverse of the formed float64 J~; w = None gives -J~^+ (s c)."""
    gen = torch.Generator().manual_seed(5)
    J = svd_jacobian(5, 400, 100.0, dtype=dtype)
    d = torch.rand(400, generator=gen, dtype=dtype) + 0.2
    w = torch.randn(400, generator=gen, dtype=dtype)
    sc = torch.randn(5, generator=gen, dtype=F64)
    scaling = (d, torch.empty_like(d))
    factor = GramFactor.from_gram(scaled_gram(J, d)[0])
    rhs = sc
    Js = J.to(F64) * d.to(F64)
    tol = 1e-12 if dtype == F64 else 1e-5
    out = merged_step(J, factor, w, 0.3, rhs, 2, torch.empty_like(w), scaling=scaling)
    expected = 0.3 * dense_projector(Js) @ w.to(F64) - torch.linalg.pinv(Js) @ sc
    torch.testing.assert_close(out.to(F64), expected, rtol=tol, atol=tol * expected.abs().max().item())
    normal = merged_step(J, factor, None, 0.0, rhs, 1, torch.empty_like(w), scaling=scaling)
    torch.testing.assert_close(Js @ normal.to(F64), -sc, rtol=tol, atol=tol)


@pytest.mark.parametrize("cond,exact_gram_path", [(1e3, False), (1e5, True)])
def test_float32_refinement_reaches_the_rounding_of_the_exact_step(cond, exact_gram_path):
    """The float32 normal step -J^+ c after refinement with exact residuals is as accurate as the dense
    float64 solution rounded to float32 (within 10x at cond(J) = 1e3, 20x at 1e5; seed 5, n = 1e5: the
    instance where corrections accumulated inside the product stalled at 100x / 50x that rounding)."""
    n = 100_000
    J = svd_jacobian(10, n, cond, seed=5)
    sc = torch.randn(10, generator=torch.Generator().manual_seed(6), dtype=F64)
    J64 = J.to(F64)
    rounded = (torch.linalg.pinv(J64) @ -sc).float().to(F64)  # the exact step, rounded to float32
    floor = ((J64 @ rounded + sc).norm() / sc.norm()).item()
    factor = GramFactor.from_gram(exact_gram(J) if exact_gram_path else gram(J))
    rhs = sc
    out = merged_step(J, factor, None, 0.0, rhs, 3, torch.empty(n), exact=True)
    error = ((J64 @ out.to(F64) + sc).norm() / sc.norm()).item()
    assert error <= (10 if cond <= 1e3 else 20) * max(floor, 1e-9), (error, floor)


@pytest.mark.parametrize("cond,bound", [(1e3, 1e-6), (1e5, 1e-6)])
def test_float32_projection_keeps_w_in_the_null_space(cond, bound):
    """||J P w|| / ||w|| <= 1e-6 (sigma_max = 1) for float32 J at n = 1e5 (issue 13)."""
    J = svd_jacobian(10, 100_000, cond)
    w = torch.randn(100_000, generator=torch.Generator().manual_seed(4))
    p = NullSpace.from_jacobian(J).project(w)
    assert p.dtype == torch.float32
    assert ((J.to(F64) @ p.to(F64)).norm() / w.norm()).item() <= bound


def test_nullspace_pseudo_solve_against_dense():
    J = svd_jacobian(4, 60, 1e2, dtype=F64)
    c = torch.randn(4, dtype=F64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(NullSpace.from_jacobian(J).pseudo_solve(c), torch.linalg.pinv(J) @ c,
                               rtol=1e-12, atol=1e-13)


def test_large_m_refines_with_the_blocked_gram_before_forming_the_exact_one():
    """m > EIGH_MAX_SIZE: up to LARGE_MAX_REFINEMENTS steps with the blocked Gram (its float64 products
    cost m^2 n: 3.3 s at m = 1 000); the exact Gram only where even that many cannot reach TARGET_ERROR.
    Checked against the contraction model: the fewest k with rate^(k+1) <= TARGET_ERROR."""
    from lit_constrained.optim.linalg.gram import gram_error
    from lit_constrained.optim.linalg.refinement import LARGE_MAX_REFINEMENTS, TARGET_ERROR, max_refinements

    m, n = 300, 9_000
    assert max_refinements(m) == LARGE_MAX_REFINEMENTS and max_refinements(10) == 2
    eps = torch.finfo(torch.float32).eps
    for cond_gram in (1e3, 1e5, 1.7e6, 1e7, 1e9):
        eigenvalues = torch.ones(m, dtype=F64)
        eigenvalues[-1] = 1.0 / cond_gram
        factor = GramFactor.from_gram(torch.diag(eigenvalues))
        rate = max(cond_gram * gram_error(n, torch.float32, m), eps * math.sqrt(cond_gram))
        k = next((k for k in range(LARGE_MAX_REFINEMENTS + 1) if rate ** (k + 1) <= TARGET_ERROR), -1)
        plan = planned(factor, n, torch.float32)
        assert (-1 if plan.exact_gram else plan.steps) == k, cond_gram


@pytest.mark.parametrize("scaled", [False, True])
def test_a_large_gram_is_accumulated_block_by_block_with_the_same_products(scaled):
    """m > EIGH_MAX_SIZE: the Gram adds one block's float32 m x m product at a time to a float64 G
    (no (blocks, m, m) partials): bit-identical to summing all blocks' products in float64 at once, and
    within gram_error of the float64 Gram; with d (Adam(con)'s J D) the same as the Gram of J * d."""
    from lit_constrained.optim.linalg.gram_factor import EIGH_MAX_SIZE
    from lit_constrained.optim.linalg.gram import _symmetrized_sum, gram_block, gram_partials_shape

    gen = torch.Generator().manual_seed(4)
    m, n = EIGH_MAX_SIZE + 16, 3 * gram_block(EIGH_MAX_SIZE + 16) + 37
    assert gram_partials_shape((m, n))[0] == 1
    J = torch.randn(m, n, generator=gen)
    d = torch.rand(n, generator=gen) + 0.5
    A = J * d if scaled else J
    block = gram_block(m)
    blocks = n // block
    # each block's float32 product by the BLAS that the CPU Gram of this m uses (SciPy's: optim/linalg/host_gram.py)
    pieces = [A[:, i * block:(i + 1) * block].numpy() for i in range(blocks)]
    stacked = torch.stack([torch.from_numpy(np.matmul(piece, piece.T)) for piece in pieces])
    expected = _symmetrized_sum(stacked.sum(0, dtype=F64), A[:, blocks * block:] @ A[:, blocks * block:].T)
    G = scaled_gram(J, d)[0] if scaled else gram(J)
    assert torch.equal(G, expected)
    reference = A.to(F64) @ A.to(F64).T
    assert float((G - reference).norm() / reference.norm()) <= 3 * gram_error(n, torch.float32, m)


@pytest.mark.parametrize("scaled", [False, True])
def test_the_exact_gram_of_many_rows_from_its_lower_triangle(scaled):
    """m >= 256: exact_gram takes the float64 products of the lower triangle only (SciPy's dsyrk on the CPU; on
    another device the band blocks on and below the diagonal) and mirrors them: exactly symmetric and equal to the float64 Gram to float64 round-off."""
    from lit_constrained.optim.linalg.gram import BandAccumulator, _row_bands

    gen = torch.Generator().manual_seed(6)
    m, n = 300, 3000
    assert len(_row_bands(m)) == 2 and len(_row_bands(100)) == 1
    J = torch.randn(m, n, generator=gen)
    d = torch.rand(n, generator=gen) + 0.5 if scaled else None
    A = J.to(F64) if d is None else J.to(F64) * d.to(F64)
    reference = A @ A.T
    bands = BandAccumulator(m, J.device)  # the torch path (a GPU's), against the CPU's dsyrk one
    for start in range(0, n, 1000):
        bands.add_(A[:, start:start + 1000].contiguous())
    for G in (exact_gram(J, d=d), bands.result()):
        assert torch.equal(G, G.T)
        assert float((G - reference).abs().max()) <= 1e-13 * float(reference.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_large_gram_of_half_precision_rows_stays_on_torch(dtype):
    """m > EIGH_MAX_SIZE with a 16-bit J (NumPy has no bfloat16): torch's block products, within the
    16-bit rounding of the float64 Gram of the same entries."""
    from lit_constrained.optim.linalg.gram_factor import EIGH_MAX_SIZE
    from lit_constrained.optim.linalg.gram import gram_block

    gen = torch.Generator().manual_seed(8)
    m = EIGH_MAX_SIZE + 16
    J = torch.randn(m, 2 * gram_block(m) + 5, generator=gen).to(dtype)
    reference = J.to(F64) @ J.to(F64).T
    G = gram(J)
    assert G.dtype == F64
    assert float((G - reference).abs().max()) <= 50 * torch.finfo(dtype).eps * float(reference.abs().max())


def test_a_nullspace_of_many_rows_from_a_jacobian_that_requires_grad():
    """m > EIGH_MAX_SIZE (SciPy's products; torch.mm(out=) refused a graph too): J is detached, and the
    projector is the dense one."""
    gen = torch.Generator().manual_seed(9)
    J = torch.randn(80, 1_500, generator=gen, dtype=F64).requires_grad_()
    ns = NullSpace.from_jacobian(J)
    w = torch.randn(1_500, generator=gen, dtype=F64)
    expected = w - torch.linalg.pinv(J.detach()) @ (J.detach() @ w)
    projected = ns.project(w)
    assert not projected.requires_grad
    torch.testing.assert_close(projected, expected, rtol=1e-9, atol=1e-11)
    assert ns.rank == 80 and not NullSpace.from_jacobian(J.float()).jacobian.requires_grad
