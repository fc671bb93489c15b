"""The per-point Jacobian engine against the dense autograd Jacobian of the same constraint vector.

The reference, :func:`lit_constrained.optim.constraint_jacobian`, differentiates the whole graph of c
(one backward per row, nested ``torch.autograd.grad`` for the input derivatives): an independent
computation of J. The engine evaluates the residual one point at a time under ``torch.func`` (or, for
``torch.autograd.grad`` residuals, chunk by chunk).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor
from torch.func import hessian, jvp, vmap

from lit_constrained.optim import constraint_jacobian
from lit_constrained.jacobians import numel_real
from lit_constrained.jacobians.pointwise import PointwiseJacobian, chunk_points, pointwise_jacobian

F64 = torch.float64


class Field(torch.nn.Module):
    """u(x) for x in R^2: an MLP (tanh) plus a complex parameter entering through |z|^2 and Im z."""

    def __init__(self, dtype: torch.dtype = F64, outputs: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6),
                                       torch.nn.Tanh(), torch.nn.Linear(6, outputs)).to(dtype)
        complex_dtype = torch.complex128 if dtype == F64 else torch.complex64
        self.z = torch.nn.Parameter(torch.randn(2, dtype=complex_dtype))

    def forward(self, x: Tensor) -> Tensor:
        scale = 1.0 + (self.z * self.z.conj()).real.sum() + self.z.imag[0]
        return self.net(x) * scale

    # -- residuals written with torch.func input derivatives -----------------------------------
    def first_order(self, x: Tensor) -> Tensor:
        """u_x + u^2 - 1 (N,): u_x by jvp along e_x."""
        tangent = torch.zeros_like(x)
        tangent[:, 0] = 1.0
        u, u_x = jvp(self, (x,), (tangent,))
        return (u_x + u**2 - 1.0)[:, 0]

    def second_order(self, x: Tensor) -> Tensor:
        """-Laplacian(u) + u (N,): the Hessian of one point's u, under vmap over the points."""
        def u_at(p: Tensor) -> Tensor:
            return self(p[None])[0, 0]

        laplacian = vmap(lambda p: torch.diagonal(hessian(u_at)(p)).sum())(x)
        return -laplacian + self(x)[:, 0]

    def vector(self, x: Tensor) -> Tensor:
        """(u, u_y * x_0, u u_x) per point: (N, 3)."""
        e_x, e_y = torch.zeros_like(x), torch.zeros_like(x)
        e_x[:, 0], e_y[:, 1] = 1.0, 1.0
        u, u_x = jvp(self, (x,), (e_x,))
        _, u_y = jvp(self, (x,), (e_y,))
        return torch.cat([u, u_y * x[:, :1], u * u_x], dim=1)

    # -- the same residuals by nested torch.autograd.grad (the fallback's kind) -----------------
    def second_order_autograd(self, x: Tensor) -> Tensor:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            u = self(x)[:, 0]
            (grad,) = torch.autograd.grad(u.sum(), x, create_graph=True)
            laplacian = sum(torch.autograd.grad(grad[:, i].sum(), x, create_graph=True)[0][:, i] for i in range(2))
        return -laplacian + u


def dense(residual, points: Tensor, params) -> Tensor:
    """The reference: the general autograd Jacobian of c = vec(residual(points))."""
    return constraint_jacobian(residual(points).reshape(-1), params, method="loop")


def points(n: int = 7, dtype: torch.dtype = F64) -> Tensor:
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(1), dtype=dtype)


@pytest.mark.parametrize("name", ["first_order", "second_order", "vector"])
def test_func_path_equals_the_dense_jacobian(name: str) -> None:
    field = Field(outputs=1)
    params = list(field.parameters())
    residual = getattr(field, name)
    engine = PointwiseJacobian(small_part_rows=0)  # no small-part shortcut: the torch.func path itself
    J = engine(field, params, [(residual, points(), 3 if name == "vector" else 1)])
    reference = dense(residual, points(), params)
    assert J.shape == reference.shape == (reference.shape[0], numel_real(params))
    torch.testing.assert_close(J, reference, rtol=1e-12, atol=1e-12)
    assert engine.paths == {residual: "func"}


def test_fallback_for_autograd_residuals_equals_the_dense_jacobian_and_says_so_once() -> None:
    field = Field()
    params = list(field.parameters())
    engine = PointwiseJacobian(chunk_size=3, small_part_rows=0)  # chunks of 3, 3 and 1 points
    with pytest.warns(RuntimeWarning, match="cannot run inside torch.func transforms.*chunked autograd"):
        J = engine(field, params, [(field.second_order_autograd, points(), 1)])
    torch.testing.assert_close(J, dense(field.second_order, points(), params), rtol=1e-12, atol=1e-12)
    assert engine.paths == {field.second_order_autograd: "autograd"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second attempt, no second warning
        again = engine(field, params, [(field.second_order_autograd, points(), 1)])
    torch.testing.assert_close(again, J, rtol=0, atol=0)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("path", ["func", "autograd"])
def test_chunk_boundaries_do_not_change_j(chunk: int, path: str) -> None:
    field = Field(outputs=1)
    params = list(field.parameters())
    J = PointwiseJacobian(path=path, chunk_size=chunk)(field, params, [(field.vector, points(), 3)])
    torch.testing.assert_close(J, dense(field.vector, points(), params), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [slice(0, 5), slice(4, 11), slice(20, 26), slice(13, 27), slice(9, 9), slice(0, 28)])
@pytest.mark.parametrize("path", ["func", "autograd"])
def test_rows_of_several_parts(rows: slice, path: str) -> None:
    """Two parts (7 points x 3 components, then 7 points x 1): slices cutting points, parts, or nothing."""
    field = Field()
    params = list(field.parameters())
    parts = [(field.vector, points(), 3), (field.first_order, points(), 1)]
    c = torch.cat([field.vector(points()).reshape(-1), field.first_order(points())])
    reference = constraint_jacobian(c, params, method="loop")
    J = PointwiseJacobian(path=path, chunk_size=2)(field, params, parts, rows=rows)
    assert J.shape == (rows.stop - rows.start, numel_real(params))
    torch.testing.assert_close(J, reference[rows], rtol=1e-12, atol=1e-12)


def test_float32_and_a_subset_of_parameters_in_another_order() -> None:
    field = Field(dtype=torch.float32)
    params = [field.z, field.net[2].weight, field.net[0].bias]  # the rest held at its values
    x = points(dtype=torch.float32)
    J = pointwise_jacobian(field, params, field.second_order, x)
    assert J.dtype == torch.float32 and J.shape == (7, numel_real(params))
    reference = dense(field.second_order, x, params)
    torch.testing.assert_close(J, reference, rtol=1e-5, atol=1e-5 * float(reference.abs().max()))


def test_chunk_size_follows_the_memory_budget() -> None:
    # 3 blocks of k n numbers per point: 1 MiB / (3 * 2 * 1000 * 4 bytes) = 43 points
    assert chunk_points(width=2, n=1000, itemsize=4, memory_budget=2**20) == 43
    assert chunk_points(width=2, n=10**9, itemsize=8, memory_budget=2**20) == 1  # at least one point
    assert chunk_points(width=1, n=10, itemsize=4, memory_budget=2**30, path="autograd") == 32  # capped


def test_the_default_budget_is_a_share_of_the_jacobian_within_bounds() -> None:
    """2x J's bytes, at least 16 MiB and at most 64 MiB; an engine without a budget chunks by it."""
    from lit_constrained.jacobians.pointwise import PointwiseJacobian, default_memory_budget

    MiB = 2**20
    assert default_memory_budget(1 * MiB) == 16 * MiB
    assert default_memory_budget(20 * MiB) == 40 * MiB
    assert default_memory_budget(100 * MiB) == 64 * MiB
    engine = PointwiseJacobian()
    # J of 300 rows x 8 964 float32 (10.26 MiB): a 20.5 MiB budget, / (3 * 8 964 * 4 bytes a point) = 200 points
    assert engine._chunk(1, 8964, 4, "func", 300 * 8964 * 4) == 2 * 300 * 8964 * 4 // (3 * 8964 * 4) == 200
    assert PointwiseJacobian(memory_budget=MiB)._chunk(1, 8964, 4, "func", 300 * 8964 * 4) == 9


def test_errors_name_the_fix() -> None:
    field = Field()
    params = list(field.parameters())
    with pytest.raises(ValueError, match="not parameters of Field"):
        pointwise_jacobian(field, [torch.nn.Parameter(torch.zeros(2))], field.first_order, points())
    with pytest.raises(ValueError, match="path must be"):
        PointwiseJacobian(path="copies")  # type: ignore[arg-type]

    def broken(x: Tensor) -> Tensor:  # a genuine bug fails on both paths: the error surfaces
        return field(x)[:, 0] @ torch.ones(3, dtype=F64)

    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError):
        PointwiseJacobian(small_part_rows=0)(field, params, [(broken, points(), 1)])


def test_small_parts_take_one_ordinary_graph_without_trying_torch_func() -> None:
    field = Field()
    params = list(field.parameters())
    engine = PointwiseJacobian(small_part_rows=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch.func attempt, hence no fallback warning
        J = engine(field, params, [(field.second_order_autograd, points(7), 1)])
    torch.testing.assert_close(J, dense(field.second_order, points(7), params), rtol=1e-12, atol=1e-12)
    assert engine.paths == {}  # nothing learnt: a larger part still tries torch.func
    engine(field, params, [(field.second_order, points(8), 1)])
    assert engine.paths == {field.second_order: "func"}


# ------------------------------------------------------------------------------ per-point data
class Flux(Field):
    """Residuals of a point and its data: n . grad u - w (data: normals n and values w), and a tensor's."""

    def flux(self, x: Tensor, data: dict[str, Tensor]) -> Tensor:
        """n . grad u - w (N,): u's directional derivative along each point's own n, by jvp."""
        u, along = jvp(self, (x,), (data["n"],))
        return along[:, 0] - data["w"]

    def weighted(self, x: Tensor, w: Tensor) -> Tensor:
        """w_0 u, w_1 u^2 (N, 2): a (N, 2) tensor as the data."""
        u = self(x)
        return torch.cat([w[:, :1] * u, w[:, 1:] * u**2], dim=1)


def flux_data(n: int = 7) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(2)
    return {"n": torch.nn.functional.normalize(torch.randn(n, 2, generator=g, dtype=F64), dim=1),
            "w": torch.randn(n, generator=g, dtype=F64)}


@pytest.mark.parametrize("path", ["func", "autograd"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_data_travels_with_the_points_on_both_paths(path: str, chunk: int | None) -> None:
    """A residual of (points, data), data a dict and a tensor, on each path and in chunks of 3 (3, 3, 1
    points): J equals the dense Jacobian of residual(points, data) (each point with its own data row)."""
    field = Flux()
    params = list(field.parameters())
    data, weights = flux_data(), torch.rand(7, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    engine = PointwiseJacobian(path=path, chunk_size=chunk, small_part_rows=0)
    J = engine(field, params, [(field.flux, points(), 1, data), (field.weighted, points(), 2, weights)])
    reference = torch.cat([dense(lambda x: field.flux(x, data), points(), params),
                           dense(lambda x: field.weighted(x, weights), points(), params)])
    torch.testing.assert_close(J, reference)
    assert engine.paths == {field.flux: path, field.weighted: path}


@pytest.mark.parametrize("rows", [slice(2, 5), slice(4, 13), slice(0, 21)])
def test_a_share_of_rows_takes_the_data_of_its_points(rows: slice) -> None:
    """A rank's rows (slices that start and end inside a point's k = 2 rows) cut the data with the points."""
    field = Flux()
    params = list(field.parameters())
    weights = torch.rand(7, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    parts = [(field.flux, points(), 1, flux_data()), (field.weighted, points(), 2, weights)]
    full = PointwiseJacobian(path="func")(field, params, parts)
    torch.testing.assert_close(PointwiseJacobian(path="func")(field, params, parts, rows=rows), full[rows])
    one = pointwise_jacobian(field, params, field.weighted, points(), data=weights)
    torch.testing.assert_close(one, full[7:])
