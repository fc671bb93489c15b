"""lit_constrained.physics.operators against closed-form derivatives, ordinary autograd and finite differences."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, jacrev, vmap

from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.physics import (
    derivatives, divergence, gradient, hessian, laplacian, partial, time_derivative,
)

PI = math.pi
F64 = torch.float64


def points(n: int = 7, d: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def sin_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(PI * x[:, 0]) * torch.sin(PI * x[:, 1])


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-10) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=tol))


# ---------------------------------------------------------------- closed forms
def test_sin_sin_first_and_second_derivatives_by_index_and_name():
    x = points()
    sx, sy, cx, cy = torch.sin(PI * x[:, 0]), torch.sin(PI * x[:, 1]), torch.cos(PI * x[:, 0]), torch.cos(PI * x[:, 1])
    assert close(partial(sin_sin, x, "x"), PI * cx * sy)
    assert close(partial(sin_sin, x, 1), PI * sx * cy)
    assert close(partial(sin_sin, x, -1), PI * sx * cy)
    assert close(partial(sin_sin, x, "x", order=2), -PI**2 * sx * sy)
    assert close(partial(sin_sin, x, ("x", "y")), PI**2 * cx * cy)
    assert close(partial(sin_sin, x, ("y", "x")), PI**2 * cx * cy)
    assert close(gradient(sin_sin, x), torch.stack([PI * cx * sy, PI * sx * cy], 1))
    expected_h = torch.stack([torch.stack([-PI**2 * sx * sy, PI**2 * cx * cy], 1),
                              torch.stack([PI**2 * cx * cy, -PI**2 * sx * sy], 1)], 1)
    assert close(hessian(sin_sin, x), expected_h)
    assert close(laplacian(sin_sin, x), -2 * PI**2 * sx * sy)
    assert close(laplacian(sin_sin, x, dims=("y",)), -PI**2 * sx * sy)


def test_polynomial_third_order_and_named_coordinates():
    x = points(d=3)
    a, b, c = x.unbind(1)

    def u(p: torch.Tensor) -> torch.Tensor:  # u = a^3 b^2 + 2 a c - c^4
        return p[:, 0] ** 3 * p[:, 1] ** 2 + 2 * p[:, 0] * p[:, 2] - p[:, 2] ** 4

    names = ("a", "b", "c")
    assert close(partial(u, x, "a", order=3, names=names), 6 * b**2)
    assert close(partial(u, x, ("a", "a", "b"), names=names), 12 * a * b)
    assert close(partial(u, x, "z", order=2), -12 * c**2)  # default names x, y, z
    assert close(laplacian(u, x), 6 * a * b**2 + 2 * a**3 - 12 * c**2)


def test_time_derivative_of_a_decaying_wave():
    x = points(d=2)  # columns (x, t)

    def u(p: torch.Tensor) -> torch.Tensor:
        return torch.exp(-2 * p[:, 1]) * torch.sin(3 * p[:, 0])

    assert close(time_derivative(u, x), -2 * u(x))
    assert close(time_derivative(u, x, "t", order=2, names=("x", "t")), 4 * u(x))
    assert close(laplacian(u, x, dims=("x",), names=("x", "t")), -9 * u(x))


def test_vector_fields_keep_their_components_and_divergence():
    x = points()
    X, Y = x.unbind(1)

    def v(p: torch.Tensor) -> torch.Tensor:  # v = (x^2 y, x y^3)
        return torch.stack([p[:, 0] ** 2 * p[:, 1], p[:, 0] * p[:, 1] ** 3], 1)

    assert close(divergence(v, x), 2 * X * Y + 3 * X * Y**2)
    assert close(partial(v, x, "y"), torch.stack([X**2, 3 * X * Y**2], 1))
    assert close(laplacian(v, x), torch.stack([2 * Y, 6 * X * Y], 1))
    jac = gradient(v, x)
    assert close(jac, torch.stack([torch.stack([2 * X * Y, X**2], 1), torch.stack([Y**3, 3 * X * Y**2], 1)], 1))
    assert hessian(v, x).shape == (7, 2, 2, 2)
    # a (N, 1) output stays (N, 1)
    assert partial(lambda p: sin_sin(p)[:, None], x, "x").shape == (7, 1)


@pytest.mark.parametrize("order", [1, 2])
def test_derivatives_matches_closed_forms_in_one_pass(order):
    x = points()
    d = derivatives(sin_sin, x, order=order)
    sx, sy, cx, cy = torch.sin(PI * x[:, 0]), torch.sin(PI * x[:, 1]), torch.cos(PI * x[:, 0]), torch.cos(PI * x[:, 1])
    assert close(d.value, sx * sy)
    assert close(d.gradient, torch.stack([PI * cx * sy, PI * sx * cy], 1))
    assert close(d.partial("y"), PI * sx * cy)
    if order == 2:
        assert close(d.laplacian(), -2 * PI**2 * sx * sy)
        assert close(d.partial(("x", "y")), PI**2 * cx * cy)
        assert close(d.partial("x", order=2), -PI**2 * sx * sy)
    else:
        with pytest.raises(ValueError, match="order=2"):
            d.laplacian()


def test_errors_name_the_fix():
    x = points()
    with pytest.raises(ValueError, match=r"shape \(N, d\)"):
        partial(sin_sin, x[0], 0)
    with pytest.raises(ValueError, match="pass names="):
        partial(sin_sin, x, "t")
    with pytest.raises(IndexError, match="d = 2"):
        partial(sin_sin, x, 2)
    with pytest.raises(ValueError, match="3 names for points with d = 2"):
        partial(sin_sin, x, "a", names=("a", "b", "c"))
    with pytest.raises(ValueError, match="components"):
        divergence(lambda p: p[:, :1], x)
    with pytest.raises(ValueError, match="values \\(N,\\) or \\(N, k\\)"):
        partial(lambda p: p.sum(), x, 0)


# ---------------------------------------------------------------- with respect to the weights
class OneLayer(torch.nn.Module):
    """u(x) = sum_h a_h tanh(w_h . x + b_h) + c: its Laplacian has the closed form
    sum_h a_h |w_h|^2 tanh''(z_h), tanh'' = -2 tanh (1 - tanh^2)."""

    def __init__(self, width: int = 5) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(width, 2, generator=g, dtype=F64))
        self.b = torch.nn.Parameter(torch.randn(width, generator=g, dtype=F64))
        self.a = torch.nn.Parameter(torch.randn(width, generator=g, dtype=F64))
        self.c = torch.nn.Parameter(torch.randn((), generator=g, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w.T + self.b) @ self.a + self.c


def closed_form_laplacian(w: torch.Tensor, b: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(x @ w.T + b)
    return (-2 * t * (1 - t**2) * (w**2).sum(1)) @ a


def test_gradient_of_a_laplacian_loss_wrt_weights_matches_hand_derivative_and_finite_differences():
    net, x = OneLayer(), points(9)
    f = torch.cos(x[:, 0])
    lap = laplacian(net, x)
    assert close(lap, closed_form_laplacian(net.w, net.b, net.a, x))
    loss = (lap - f).pow(2).mean()
    g_w, g_b, g_a, g_c = torch.autograd.grad(loss, [net.w, net.b, net.a, net.c], allow_unused=True,
                                             materialize_grads=True)
    # by hand: dL/da_h = mean(2 (lap - f) |w_h|^2 tanh''(z_h)); the constant c does not enter
    t = torch.tanh(x @ net.w.T + net.b).detach()
    hand_a = (2 * (lap.detach() - f)[:, None] * (-2 * t * (1 - t**2)) * (net.w.detach() ** 2).sum(1)).mean(0)
    assert close(g_a, hand_a) and float(g_c) == 0.0
    # central differences of the closed-form loss in float64 for w and b
    def closed_loss(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (closed_form_laplacian(w, b, net.a.detach(), x) - f).pow(2).mean()

    h = 1e-6
    for param, grad, which in ((net.w, g_w, 0), (net.b, g_b, 1)):
        fd = torch.zeros_like(param)
        for idx in range(param.numel()):
            step = torch.zeros(param.numel(), dtype=F64)
            step[idx] = h
            step = step.reshape(param.shape)
            args = [net.w.detach(), net.b.detach()]
            plus, minus = list(args), list(args)
            plus[which], minus[which] = args[which] + step, args[which] - step
            fd.view(-1)[idx] = (closed_loss(*plus) - closed_loss(*minus)) / (2 * h)
        assert torch.allclose(grad, fd, atol=1e-7, rtol=1e-6), which


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 1)).double()


def residual_with_operators(u_fn, x: torch.Tensor) -> torch.Tensor:
    """-Δu + u u_x - f (several operators, and derivatives() once)."""
    d = derivatives(u_fn, x)
    return -laplacian(u_fn, x) + d.value * d.partial("x") + partial(u_fn, x, ("x", "y")) - sin_sin(x)


def residual_by_autograd(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same residual by nested torch.autograd.grad w.r.t. the inputs (the independent reference)."""
    x = x.clone().requires_grad_(True)
    u = net(x)[:, 0]
    (g,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    (gx,) = torch.autograd.grad(g[:, 0].sum(), x, create_graph=True)
    (gy,) = torch.autograd.grad(g[:, 1].sum(), x, create_graph=True)
    return -(gx[:, 0] + gy[:, 1]) + u * g[:, 0] + gx[:, 1] - sin_sin(x.detach())


def autograd_jacobian(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    r = residual_by_autograd(net, x)
    rows = [torch.autograd.grad(r[i], list(net.parameters()), retain_graph=True, allow_unused=True,
                                materialize_grads=True) for i in range(len(r))]
    return torch.stack([torch.cat([g.reshape(-1) for g in row]) for row in rows])


def test_residual_inside_vmap_jacrev_over_points_with_functional_params_equals_autograd_jacobian():
    net, x = mlp(), points(6)
    params = {name: p.detach() for name, p in net.named_parameters()}

    def residual_at(params: dict, point: torch.Tensor) -> torch.Tensor:  # point (d,), as the per-point engine
        field = lambda p: functional_call(net, params, (p,))[:, 0]  # noqa: E731
        return residual_with_operators(field, point[None])[0]

    jac = vmap(jacrev(residual_at), in_dims=(None, 0))(params, x)
    flat = torch.cat([jac[name].reshape(len(x), -1) for name in params], 1)
    assert torch.allclose(flat, autograd_jacobian(net, x), atol=1e-10, rtol=1e-9)
    # and the values themselves
    values = vmap(residual_at, in_dims=(None, 0))(params, x)
    assert torch.allclose(values, residual_by_autograd(net, x).detach(), atol=1e-12)


@pytest.mark.parametrize("method", ["batched", "loop"])
def test_package_constraint_jacobian_of_operator_residuals(method):
    net, x = mlp(), points(5)
    c = residual_with_operators(lambda p: net(p)[:, 0], x)
    jac = constraint_jacobian(c, list(net.parameters()), method=method)
    assert torch.allclose(jac, autograd_jacobian(net, x), atol=1e-10, rtol=1e-9)


def test_float32_network_on_float32_points():
    net64 = OneLayer()
    net32 = OneLayer().float()
    x = points(4)
    lap = laplacian(net32, x.float())
    assert lap.dtype == torch.float32
    reference = closed_form_laplacian(net64.w, net64.b, net64.a, x).detach()
    assert torch.allclose(lap.double(), reference, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- boundary and time operators
def test_normal_derivative_on_a_circle_against_the_closed_form_on_both_paths():
    from lit_constrained.physics import Disk, normal_derivative

    points, normals = Disk((0.3, -0.2), 0.7).boundary_sample(16, "grid")

    def u(p: torch.Tensor) -> torch.Tensor:  # grad u = (2 x y, x^2 + cos y)
        return p[:, 0] ** 2 * p[:, 1] + torch.sin(p[:, 1])

    X, Y = points.unbind(1)
    expected = 2 * X * Y * normals[:, 0] + (X**2 + torch.cos(Y)) * normals[:, 1]
    assert close(normal_derivative(u, points, normals), expected)
    inside = vmap(lambda q: normal_derivative(u, q[None, :2], q[None, 2:])[0])(torch.cat([points, normals], 1))
    assert close(inside, expected)
    # a vector field: each component's normal derivative
    v = lambda p: torch.stack([u(p), 3 * p[:, 0]], 1)  # noqa: E731
    assert close(normal_derivative(v, points, normals), torch.stack([expected, 3 * normals[:, 0]], 1))
    assert close(derivatives(u, points, order=1).normal_derivative(normals), expected)


def test_normal_derivative_of_a_space_time_field_along_spatial_normals():
    from lit_constrained.physics import Box, Disk, SpaceTime, normal_derivative

    side = SpaceTime(Box((0.0, 0.0), (1.0, 2.0)) - Disk((0.5, 1.0), 0.25), (0.0, 1.0)).boundary_sample(32, seed=0)
    x, n = side.points, side.normals[:, :2]

    def u(p: torch.Tensor) -> torch.Tensor:  # u = exp(-t) (x^2 + y), grad_x u = exp(-t) (2 x, 1)
        return torch.exp(-p[:, 2]) * (p[:, 0] ** 2 + p[:, 1])

    expected = torch.exp(-x[:, 2]) * (2 * x[:, 0] * n[:, 0] + n[:, 1])
    assert close(normal_derivative(u, x, n, dims=("x", "y")), expected)
    assert close(normal_derivative(u, x, side.normals), expected)  # the full normals' time entry is 0
    with pytest.raises(ValueError, match=r"shape \(N, 2\)"):
        normal_derivative(u, x, side.normals, dims=("x", "y"))


def test_periodic_difference_of_values_and_of_a_derivative():
    from lit_constrained.physics import Box, periodic_difference

    slab = Box((0.0, 0.0), (2.0, 1.0), names=("x", "t"))
    pairs = slab.periodic_pairs("x", 8, "lhs", seed=0)
    assert pairs.shape == (8, 4) and bool((pairs[:, 0] == 0).all() and (pairs[:, 2] == 2).all())
    periodic = lambda p: torch.sin(PI * p[:, 0]) * (1 + p[:, 1])  # noqa: E731 (period 2 in x)
    assert periodic_difference(periodic, pairs).abs().max() < 1e-15
    square = lambda p: p[:, 0] ** 2 * p[:, 1]  # noqa: E731
    assert close(periodic_difference(square, pairs), -4 * pairs[:, 1])
    ux = lambda u, p: partial(u, p, "x")  # noqa: E731  (u_x = 2 x t: 0 on the left, 4 t on the right)
    assert close(periodic_difference(square, pairs, ux), -4 * pairs[:, 1])


def test_second_time_derivative_from_derivatives_and_partial():
    x = points(d=2)  # (x, t); u = cos(2 t) x^3: u_tt = -4 u
    u = lambda p: torch.cos(2 * p[:, 1]) * p[:, 0] ** 3  # noqa: E731
    assert close(time_derivative(u, x, order=2), -4 * u(x))
    assert close(derivatives(u, x).time_derivative(order=2), -4 * u(x))


class SmallField(torch.nn.Module):
    """A small tanh MLP on (N, d) points, float64."""

    def __init__(self, d: int) -> None:
        super().__init__()
        torch.manual_seed(d)
        self.net = torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1)).double()

    def u(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0]


def _input_derivatives(u: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First and second derivatives of u w.r.t. the (requires-grad) inputs x by plain nested autograd."""
    (g,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    h = torch.stack([torch.autograd.grad(g[:, i].sum(), x, create_graph=True)[0] for i in range(x.shape[1])], 1)
    return g, h


def _dense_rows(values: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    rows = [torch.autograd.grad(values[i], params, retain_graph=True, allow_unused=True, materialize_grads=True)
            for i in range(len(values))]
    return torch.stack([torch.cat([g.reshape(-1) for g in row]) for row in rows])


def test_per_point_jacobian_of_boundary_and_time_residuals_equals_the_dense_autograd_jacobian():
    """Robin (u + 2 du/dn at boundary points, the normals as the part's data), the wave equation u_tt - 4 u_xx, the heat equation
    u_t - (u_xx + u_yy) with a Neumann condition on a space-time cylinder's side, and a periodic pair
    (u and u_x): the per-point engine's torch.func path against rows of plain autograd."""
    from lit_constrained.jacobians.pointwise import pointwise_jacobian
    from lit_constrained.physics import Box, Disk, SpaceTime, normal_derivative, periodic_difference

    plate = Box((0.0, 0.0), (1.0, 1.0)) - Disk((0.5, 0.5), 0.2)
    cylinder = SpaceTime(plate, (0.0, 1.0))
    slab = Box((0.0, 0.0), (2.0, 1.0), names=("x", "t"))
    cases = []

    m2 = SmallField(2)
    edge = plate.boundary_sample(40, seed=0)

    def robin(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return m2.u(x) + 2 * normal_derivative(m2.u, x, n)

    def robin_reference(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        u = m2.u(x)
        g, _ = _input_derivatives(u, x)
        return u + 2 * (g * n).sum(1)

    cases.append((m2, robin, robin_reference, edge.points, edge.normals))

    def wave(p: torch.Tensor) -> torch.Tensor:
        d = derivatives(m2.u, p, names=("x", "t"))
        return time_derivative(m2.u, p, order=2) - 4 * d.partial("x", order=2)

    def wave_reference(p: torch.Tensor) -> torch.Tensor:
        x = p.clone().requires_grad_(True)
        _, h = _input_derivatives(m2.u(x), x)
        return h[:, 1, 1] - 4 * h[:, 0, 0]

    cases.append((m2, wave, wave_reference, slab.interior(40, "lhs", seed=1), None))

    m3 = SmallField(3)

    def heat(p: torch.Tensor) -> torch.Tensor:
        return time_derivative(m3.u, p) - laplacian(m3.u, p, dims=("x", "y"), names=("x", "y", "t"))

    def heat_reference(p: torch.Tensor) -> torch.Tensor:
        x = p.clone().requires_grad_(True)
        g, h = _input_derivatives(m3.u(x), x)
        return g[:, 2] - h[:, 0, 0] - h[:, 1, 1]

    cases.append((m3, heat, heat_reference, cylinder.interior(40, seed=2), None))
    side = cylinder.boundary_sample(40, seed=3)

    def neumann(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return normal_derivative(m3.u, x, n, dims=("x", "y"))

    def neumann_reference(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        g, _ = _input_derivatives(m3.u(x), x)
        return (g[:, :2] * n).sum(1)

    cases.append((m3, neumann, neumann_reference, side.points, side.normals[:, :2]))

    def periodic(p: torch.Tensor) -> torch.Tensor:
        values = periodic_difference(m2.u, p)
        slopes = periodic_difference(m2.u, p, lambda u, x: partial(u, x, "x"))
        return torch.stack([values, slopes], 1)

    def periodic_reference(p: torch.Tensor) -> torch.Tensor:
        left, right = p[:, :2].clone().requires_grad_(True), p[:, 2:].clone().requires_grad_(True)
        ul, ur = m2.u(left), m2.u(right)
        gl, _ = _input_derivatives(ul, left)
        gr, _ = _input_derivatives(ur, right)
        return torch.stack([ul - ur, gl[:, 0] - gr[:, 0]], 1)

    cases.append((m2, periodic, periodic_reference, slab.periodic_pairs("x", 20, seed=4), None))

    for module, residual, reference, pts, data in cases:
        params = list(module.parameters())
        args = (pts,) if data is None else (pts, data)
        jac = pointwise_jacobian(module, params, residual, pts, path="func", data=data)
        dense = _dense_rows(reference(*args).reshape(-1), params)
        assert jac.shape == dense.shape and float(dense.abs().max()) > 1e-3, residual.__name__
        torch.testing.assert_close(jac, dense, rtol=1e-10, atol=1e-12, msg=residual.__name__)
        torch.testing.assert_close(residual(*args).detach(), reference(*args).detach(), rtol=1e-12, atol=1e-12)
