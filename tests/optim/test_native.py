"""The opt-in native kernels (optim/native.py) against dense float64 products, their fallbacks, and the
optimizers' step with them."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from lit_constrained.optim import native as ng
from lit_constrained.optim.nullspace import _rmatvec_into, exact_matvec, gram_error, scaled_gram
from tests.optim.test_sqp import ACCURACY, float32_linearized_feasibility_error

F64 = torch.float64

def _available() -> bool:
    with ng.native(True):
        return ng.available()


requires_kernel = pytest.mark.skipif(not _available(), reason="no C compiler: the native kernel cannot be built")


@requires_kernel
@pytest.mark.parametrize("m", [1, 3, 5, 7, 10, 13])
@pytest.mark.parametrize("n", [5, 16, 3 * ng.SPAN + 37])
@pytest.mark.parametrize("scaled", [False, True])
def test_gram_and_product_against_dense_float64(m, n, scaled):
    """G = J D^2 J^T (both triangles, exactly symmetric) within the blocked Gram's error estimate, and
    J D v within a float32 lane sum's error, for tiles that fit m exactly and ones with rows left over."""
    gen = torch.Generator().manual_seed(100 * m + n)
    J = torch.randn(m, n, generator=gen)
    d = (torch.rand(n, generator=gen) + 0.1) ** 2 if scaled else None
    v = torch.randn(n, generator=gen)
    with ng.native(True):
        assert ng.takes_gram(J, d, v)
        G, Jv = ng.gram(J, d, v)
        G_alone, none = ng.gram(J, d)
    Js = J.to(F64) * (d.to(F64) if scaled else 1.0)
    exact = Js @ Js.T
    assert torch.equal(G, G.T) and torch.equal(G, G_alone) and none is None
    assert (G - exact).norm() / exact.norm() <= 10 * gram_error(n, torch.float32, m) + 1e-15
    scale = Js.abs() @ v.to(F64).abs()
    eps = torch.finfo(torch.float32).eps * math.sqrt(ng.SPAN / 16)
    assert ((Jv - Js @ v.to(F64)).abs() / scale).max() <= eps


@requires_kernel
def test_strided_rows_and_scaled_gram_dispatch():
    """A J whose rows are a slice of a wider matrix (row stride > n) is read in place; scaled_gram hands
    float32 CPU operands to the kernel only when it is switched on."""
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 3000, generator=gen)
    J = wide[:, 100:2600]
    d, v = torch.rand(2500, generator=gen) + 0.5, torch.randn(2500, generator=gen)
    exact = (J.to(F64) * d.to(F64)) @ (J.to(F64) * d.to(F64)).T
    with ng.native(True):
        G, Jv = scaled_gram(J, d, v=v)
    with ng.native(False):
        eager, eager_Jv = scaled_gram(J.contiguous(), d, v=v)
    for candidate in (G, eager):
        assert (candidate - exact).norm() / exact.norm() <= 10 * gram_error(2500, torch.float32, 6)
    torch.testing.assert_close(Jv, eager_Jv, rtol=1e-5, atol=1e-5)
    assert not torch.equal(G, eager)  # the kernel ran (another order of the sums), not the eager path


@requires_kernel
@pytest.mark.parametrize("m", [1, 4, 6, 7, 13])
@pytest.mark.parametrize("n", [9, 16, 3 * 1024 + 21])
def test_exact_products_against_dense_float64(m, n):
    """J v from float64 products and sums (float64 round-off); J^T z summed in float64 and rounded to
    float32 once (within half an ulp of float32, relative to the largest entry, plus float64 round-off);
    through the nullspace functions that dispatch to them."""
    gen = torch.Generator().manual_seed(10 * m + n)
    J, v = torch.randn(m, n, generator=gen), torch.randn(n, generator=gen)
    z = torch.randn(m, generator=gen, dtype=F64) * 10.0 ** torch.arange(m, dtype=F64)  # multipliers spanning decades
    Jv_exact, JTz_exact = J.to(F64) @ v.to(F64), J.to(F64).T @ z
    out = torch.empty(n)
    with ng.native(True):
        assert ng.takes_matvec(J, v) and ng.takes_rmatvec(J, z, out)
        Jv, JTz = exact_matvec(J, v), _rmatvec_into(out, J, z)
    assert JTz is out
    before = torch.randn(n, generator=gen)
    with ng.native(True):
        added = ng.exact_rmatvec(J, z, before.clone(), accumulate=True)
    assert ((added.to(F64) - (before.to(F64) + JTz_exact)).abs() <= torch.finfo(torch.float32).eps * (
        before.to(F64) + JTz_exact).abs() + 1e-12 * (J.to(F64).abs().T @ z.abs() + before.to(F64).abs())).all()
    scale = J.to(F64).abs() @ v.to(F64).abs()
    assert ((Jv - Jv_exact).abs() / scale).max() <= 1e-14
    rounding = JTz_exact.to(torch.float32).to(F64)  # the correctly rounded J^T z
    assert ((JTz.to(F64) - rounding).abs() <= torch.finfo(torch.float32).eps * JTz_exact.abs() + 1e-12 * (
        J.to(F64).abs().T @ z.abs())).all()


@requires_kernel
def test_only_float32_cpu_operands_it_takes():
    J = torch.randn(4, 100)
    with ng.native(True):
        assert ng.takes_gram(J)
        assert not ng.takes_gram(J.to(F64))
        assert not ng.takes_gram(J.T.contiguous().T)  # column stride != 1
        assert not ng.takes_gram(torch.randn(ng.NATIVE_MAX_ROWS + 1, 100))
        assert not ng.takes_gram(J, d=torch.randn(100, dtype=F64))
        assert not ng.takes_gram(J, v=torch.randn(200)[::2])
        assert not ng.takes_gram(torch.randn(0, 100))
        assert ng.takes_matvec(torch.randn(ng.NATIVE_MAX_ROWS + 1, 100), torch.randn(100))
        assert not ng.takes_matvec(J, torch.randn(100, dtype=F64))
        assert not ng.takes_rmatvec(J, torch.randn(4), torch.empty(100))  # z must be float64
        assert not ng.takes_rmatvec(J, torch.randn(4, dtype=F64), torch.empty(200)[::2])
    with ng.native(False):
        assert not ng.takes_gram(J)


def test_without_a_compiler_the_eager_path_is_used(monkeypatch, tmp_path):
    """A machine without a C compiler warns once and keeps the eager Gram."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(ng.CACHE_ENV, str(tmp_path / "cache"))
    ng._library.cache_clear()
    try:
        J = torch.randn(3, 50)
        with ng.native(True), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not ng.takes_gram(J)
            G, _ = scaled_gram(J, None)
        assert any("native kernels are unavailable" in str(w.message) for w in caught)
        torch.testing.assert_close(G, J.to(F64) @ J.to(F64).T, rtol=1e-5, atol=1e-5)
    finally:
        ng._library.cache_clear()


# The eager path's bounds (ACCURACY of tests/optim/test_sqp.py) hold natively too.
# Measured natively over J seeds 0-11 (n = 1e5, m = 10): SQP-HeavyBall / SQP-Adam / Adam(con) at most
# 2.4e-8 / 9.8e-9 / 1.5e-7 (cond(J) = 1e2), 6.9e-8 / 3.8e-8 / 9.6e-7 (1e3), 5.3e-6 / 4.4e-6 / 5.5e-5 (1e5);
# the eager path 2.0e-7 / 3.6e-8 / 2.7e-7, 8.0e-8 / 4.6e-8 / 7.4e-7, 8.1e-5 / 5.7e-5 / 2.8e-5.


@requires_kernel
@pytest.mark.filterwarnings("ignore:.*numerical rank")
@pytest.mark.parametrize("opt_cls", [SQPHeavyBall, SQPAdam, AdamCon])
@pytest.mark.parametrize("cond", [1e2, 1e3, 1e5])
@pytest.mark.parametrize("seed", [0, 5])
def test_float32_step_with_the_kernels_restores_the_linearized_constraints(opt_cls, cond, seed):
    """||J d + rho c|| / (rho ||c||) under the native kernels within the eager path's bounds (float32,
    n = 1e5, m = 10, J from an SVD; every refinement's residual from float64 products)."""
    with ng.native(True):
        error, _, _ = float32_linearized_feasibility_error(opt_cls, cond, seed)
    assert error <= ACCURACY[opt_cls][cond > 1e3], error
