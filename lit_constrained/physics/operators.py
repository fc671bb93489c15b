r"""Differential operators of a pointwise field with respect to its input coordinates.

A *field* is a function ``u_fn`` of a batch of points ``x`` of shape (N, d) whose row i depends only
on ``x[i]``: an MLP, ``lambda x: net(x)[:, 0]``, an exact solution. Its output is (N,) (a scalar
field) or (N, k) (k components); every operator keeps that trailing shape:

.. math::

    \partial_i u(x_n) = \frac{\partial u}{\partial x_i}(x_n), \qquad
    \partial_{ij} u = \frac{\partial^2 u}{\partial x_i \partial x_j}, \qquad
    \nabla u = (\partial_1 u, \dots, \partial_d u), \qquad
    \Delta u = \sum_{i \in D} \partial_{ii} u, \qquad
    \nabla \cdot v = \sum_{i \in D} \partial_i v_i .

Everything is built on :mod:`torch.func`: the field is evaluated one point at a time (a batch of ONE
point, shape (1, d)) under ``vmap`` over the N points, and differentiated by ``jvp`` (directional
derivatives along the unit vectors :math:`e_i`, nested for higher orders), ``jacrev`` (gradients) and
``jacfwd(jacrev)`` (Hessians). Hence the operators

* are differentiable by ordinary autograd with respect to whatever the field depends on (the network's
  weights: the objective's backward, the constraint Jacobian, second derivatives w.r.t. the weights),
  with no ``requires_grad`` / ``create_graph`` to remember; and
* work INSIDE torch.func transforms (``vmap`` / ``jacrev`` over points with functional parameters),
  where ``torch.autograd.grad`` with respect to the inputs does not.

**Two paths, one meaning.** Outside any torch.func transform (an ordinary batch: the objective, the
constraints, a fallback Jacobian) the same derivatives are taken by ordinary autograd,
``torch.autograd.grad(..., create_graph=True)`` on the batch, which relies on the field being
row-wise: measured on one AMD EPYC core, a 2 -> 20 x 2 -> 1 MLP's Laplacian at 400 points costs 2.0
ms this way against 24 ms through torch.func (a fixed per-call overhead of the transforms: 22 ms at
25 points). Inside a transform (:func:`_inside_transform`) the torch.func path runs. Both are tested
against each other and against closed forms.

Coordinates are named by index (negative counts from the last) or by name: ``names`` defaults to
``("x",)``, ``("x", "y")`` or ``("x", "y", "z")`` for d = 1, 2, 3; a space-time problem passes its own,
e.g. ``names=("x", "t")``.

:func:`derivatives` evaluates the value, gradient and (optionally) Hessian in ONE composed transform
and answers every operator from them, so a residual that needs several terms runs the network once.

**Jets inside transforms.** Inside a transform, a field that has a jet
(:func:`~lit_constrained.physics.jets.field_jet`: an ``nn.Sequential`` of linear layers and tanh / sigmoid /
SiLU, or an object with a ``jet`` method) gets its derivatives up to order two from ONE forward pass of
stacked derivative streams instead of nested ``jvp``: the same values to round-off, and the per-point
Jacobian w.r.t. the weights 1.5-4x cheaper (:mod:`~lit_constrained.physics.jets`). ``divergence`` and
orders above two keep the torch.func path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import jacfwd, jacrev, jvp, vmap

from lit_constrained.physics.jets import Jet, Pair, all_pairs, diagonal_pairs, field_jet

__all__ = [
    "Coordinate",
    "FieldDerivatives",
    "coordinate_index",
    "default_names",
    "derivatives",
    "divergence",
    "gradient",
    "hessian",
    "laplacian",
    "normal_derivative",
    "partial",
    "periodic_difference",
    "time_derivative",
]

Field = Callable[[Tensor], Tensor]
"""A pointwise field: points (N, d) -> values (N,) or (N, k); row i depends only on point i."""

Coordinate = int | str
"""A coordinate: its index in the points' last dimension (negative counts from the end) or its name."""

_DEFAULT_NAMES = ("x", "y", "z")


def default_names(dim: int) -> tuple[str, ...]:
    """``("x",)``, ``("x", "y")``, ``("x", "y", "z")`` for d = 1, 2, 3 (``()`` beyond: pass names)."""
    return _DEFAULT_NAMES[:dim] if dim <= len(_DEFAULT_NAMES) else ()


def coordinate_index(wrt: Coordinate, dim: int, names: Sequence[str] | None = None) -> int:
    """The index in ``[0, dim)`` of the coordinate ``wrt`` (an index or a name of ``names``)."""
    if isinstance(wrt, bool):
        raise TypeError(f"A coordinate is an index or a name, got the bool {wrt!r}.")
    if isinstance(wrt, int):
        if not -dim <= wrt < dim:
            raise IndexError(f"Coordinate index {wrt} is out of range for points with d = {dim} coordinates.")
        return wrt % dim
    if isinstance(wrt, str):
        known = tuple(names) if names is not None else default_names(dim)
        if names is not None and len(known) != dim:
            raise ValueError(f"names={known} has {len(known)} names for points with d = {dim} coordinates.")
        if wrt not in known:
            hint = f"one of {known}" if known else "an index (no default names for d > 3)"
            raise ValueError(f"Unknown coordinate {wrt!r}: use {hint}, or pass names=(...) naming all {dim}.")
        return known.index(wrt)
    raise TypeError(f"A coordinate is an index or a name, got {type(wrt).__name__} {wrt!r}.")


def _inside_transform() -> bool:
    """Whether a torch.func transform (vmap, grad, jacrev, jvp, ...) is active here.

    Private API, unavoidable: torch.func exposes no public query, and ``torch.autograd.grad`` w.r.t.
    inputs fails inside a transform while torch.func's own path costs ~10x more outside one."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _jet(u_fn: Field, x: Tensor, pairs: Sequence[Pair] = ()) -> Jet | None:
    """Inside a torch.func transform (the per-point Jacobian), the field's jet at ``x`` carrying ``pairs``
    (:mod:`~lit_constrained.physics.jets`); None elsewhere (on an ordinary batch autograd's double backward
    is the faster: a 100 x 5 MLP's Laplacian objective at 1 024 points, float32, 31 ms against the jet's
    41 ms on one Intel Xeon core) or when the field has none."""
    take = field_jet(u_fn) if _inside_transform() else None
    return None if take is None else take(x, tuple(pairs))


def _tracked(x: Tensor) -> Tensor:
    """x as a tensor that autograd differentiates w.r.t. (x itself if it already requires grad, so an
    operator applied inside another operator's field stays differentiable for the outer one)."""
    return x if x.requires_grad else x.detach().requires_grad_(True)


def _d(y: Tensor, z: Tensor) -> Tensor:
    """d(sum y)/dz (rows independent: row n of the result is dy_n/dz_n), with the graph kept; zeros when
    y does not depend on z."""
    (grad,) = torch.autograd.grad(y.sum(), z, create_graph=True, allow_unused=True)
    return torch.zeros_like(z) if grad is None else grad


def _components(u: Tensor) -> list[Tensor]:
    """A field's values as its components: [u] for (N,), the k columns for (N, k)."""
    return [u] if u.dim() == 1 else [u[:, j] for j in range(u.shape[1])]


def _stacked(parts: list[Tensor], u: Tensor, axis: int = 1) -> Tensor:
    """Per-component results back in the field's shape ((N, ...) or (N, k, ...))."""
    return parts[0] if u.dim() == 1 else torch.stack(parts, dim=axis)


def _by_autograd(u_fn: Field, x: Tensor, rule: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """The autograd path's scaffold: ``rule(component, z)`` for each component (N,) of the field at the
    tracked points z, stacked back in the field's shape."""
    with torch.enable_grad():
        z = _tracked(x)
        u = _field_values(u_fn, z)
        return _stacked([rule(component, z) for component in _components(u)], u)


def _second_derivatives(grad: Tensor, z: Tensor) -> Tensor:
    """(N, d, d): the derivatives of a component's gradient (N, d) w.r.t. the tracked points z."""
    return torch.stack([_d(grad[:, i], z) for i in range(z.shape[1])], dim=1)


def _hessian_of(component: Tensor, z: Tensor) -> Tensor:
    """(N, d, d): the second derivatives of one component (N,) w.r.t. the tracked points z."""
    return _second_derivatives(_d(component, z), z)


def _field_values(u_fn: Field, z: Tensor) -> Tensor:
    u = u_fn(z)
    if not isinstance(u, Tensor) or u.dim() not in (1, 2) or u.shape[0] != z.shape[0]:
        got = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
        raise ValueError(f"A field maps points (N, d) to values (N,) or (N, k); for N = {z.shape[0]} it returned {got}.")
    return u


def _check_points(x: Tensor) -> int:
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"Points must be a tensor of shape (N, d), got {shape}; a single point is x[None].")
    if not x.is_floating_point():
        raise TypeError(f"Points must be floating point (derivatives are taken w.r.t. them), got {x.dtype}.")
    return int(x.shape[1])


def _at_one_point(u_fn: Field) -> Callable[[Tensor], Tensor]:
    """``z (d,) -> u_fn(z[None])[0]``: the field at one point (shape () or (k,))."""

    def value(z: Tensor) -> Tensor:
        out = u_fn(z.unsqueeze(0))
        if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != 1:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"A field maps points (N, d) to values (N,) or (N, k); for N = 1 it returned {got}.")
        return out[0]

    return value


def _directional(fn: Callable[[Tensor], Tensor], direction: Tensor) -> Callable[[Tensor], Tensor]:
    """``z -> d/ds fn(z + s e)|_{s=0}``, a forward-mode (``jvp``) directional derivative."""
    return lambda z: jvp(fn, (z,), (direction,))[1]


def _unit(index: int, like: Tensor) -> Tensor:
    return torch.eye(like.shape[-1], dtype=like.dtype, device=like.device)[index]


def _wrt_indices(wrt: Coordinate | Sequence[Coordinate], order: int, dim: int, names: Sequence[str] | None) -> list[int]:
    """The coordinate of every derivative: ``("x", "y")`` (mixed) or ``wrt`` repeated ``order`` times."""
    if isinstance(wrt, (int, str)):
        if not isinstance(order, int) or isinstance(order, bool) or order < 1:
            raise ValueError(f"order must be an integer >= 1, got {order!r}.")
        return [coordinate_index(wrt, dim, names)] * order
    coordinates = list(wrt)
    if not coordinates:
        raise ValueError("wrt is empty: name at least one coordinate.")
    if order != 1:
        raise ValueError(f"Give either a sequence wrt={tuple(coordinates)} (one entry per derivative) or order, not both.")
    return [coordinate_index(c, dim, names) for c in coordinates]


def partial(
    u_fn: Field,
    x: Tensor,
    wrt: Coordinate | Sequence[Coordinate],
    order: int = 1,
    names: Sequence[str] | None = None,
) -> Tensor:
    r"""A partial derivative of ``u_fn`` at the points ``x`` (N, d); shape (N,) or (N, k) as ``u_fn``.

    ``partial(u, x, "x")`` is :math:`\partial u / \partial x`, ``partial(u, x, 0, order=2)``
    :math:`\partial^2 u / \partial x_0^2`, ``partial(u, x, ("x", "y"))`` the mixed
    :math:`\partial^2 u / \partial x \partial y` (one forward-mode ``jvp`` per derivative).
    """
    dim = _check_points(x)
    indices = _wrt_indices(wrt, order, dim, names)
    if len(indices) <= 2 and (jet := _jet(u_fn, x, [tuple(indices)] if len(indices) == 2 else ())) is not None:
        return jet.gradient[..., indices[0]] if len(indices) == 1 else jet.second_derivative(*indices)
    if not _inside_transform():
        def successive(derivative: Tensor, z: Tensor) -> Tensor:
            for index in indices:
                derivative = _d(derivative, z)[:, index]
            return derivative

        return _by_autograd(u_fn, x, successive)
    fn = _at_one_point(u_fn)
    for index in indices:
        fn = _directional(fn, _unit(index, x))
    return vmap(fn)(x)


def time_derivative(
    u_fn: Field, x: Tensor, time: Coordinate = -1, order: int = 1, names: Sequence[str] | None = None
) -> Tensor:
    r""":math:`\partial^{order} u / \partial t^{order}`, t being the coordinate ``time`` (default: the last):
    ``order=1`` :math:`u_t` (heat, Burgers), ``order=2`` :math:`u_{tt}` (the wave equation)."""
    return partial(u_fn, x, time, order, names)


def _normals_for(x: Tensor, normals: Tensor, axes: list[int]) -> Tensor:
    """The normals (N, |D|) as vectors of all d coordinates (zero off ``axes``), in x's dtype."""
    if not isinstance(normals, Tensor) or normals.dim() != 2 or normals.shape[0] != x.shape[0] \
            or normals.shape[1] != len(axes):
        got = tuple(normals.shape) if isinstance(normals, Tensor) else type(normals).__name__
        raise ValueError(f"normals must have shape (N, {len(axes)}) (one per point, one entry per coordinate of "
                         f"dims) for points {tuple(x.shape)}, got {got}.")
    normals = normals.to(dtype=x.dtype, device=x.device)
    if axes == list(range(x.shape[1])):
        return normals
    embed = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)[axes]  # (|D|, d)
    return normals @ embed


def normal_derivative(
    u_fn: Field, x: Tensor, normals: Tensor, dims: Sequence[Coordinate] | None = None,
    names: Sequence[str] | None = None,
) -> Tensor:
    r"""The normal derivative :math:`\partial u / \partial n = \sum_{i \in D} n_i\, \partial_i u` at the
    points ``x`` (N, d) along ``normals`` (N, |D|); shape (N,) or (N, k) as ``u_fn``'s.

    ``dims`` (default: every coordinate) names the coordinates the normals span, e.g. ``dims=("x", "y")``
    for the spatial normals of a space-time point (x, y, t). A Neumann condition is
    ``normal_derivative(u, x, n) - g``, a Robin one ``alpha * u(x) + beta * normal_derivative(u, x, n) - g``.
    Inside a transform: one forward-mode ``jvp`` along each point's normal (under ``vmap`` over the
    points and their normals), so it runs in the per-point Jacobian (the normals travel with the
    points as the part's data: ``Imposed(..., data=normals)``, or a geometry's ``neumann``).
    """
    dim = _check_points(x)
    axes = _dims(dims, dim, names)
    direction = _normals_for(x, normals, axes)
    if (jet := _jet(u_fn, x)) is not None:
        return (jet.gradient * (direction if jet.gradient.dim() == 2 else direction[:, None, :])).sum(dim=-1)
    if not _inside_transform():
        return _by_autograd(u_fn, x, lambda component, z: (_d(component, z) * direction).sum(dim=1))
    fn = _at_one_point(u_fn)
    return vmap(lambda z, n: jvp(fn, (z,), (n,))[1])(x, direction)


def periodic_difference(
    u_fn: Field, pairs: Tensor, operator: Callable[[Field, Tensor], Tensor] | None = None
) -> Tensor:
    r""":math:`u(x_{left}) - u(x_{right})` (or :math:`L u(x_{left}) - L u(x_{right})` for ``operator`` L)
    at pairs of points side by side, ``pairs`` = ``[x_left, x_right]`` (N, 2 d)
    (:meth:`~lit_constrained.physics.collocation.Box.periodic_pairs`): a periodic condition imposed as
    an equality. ``operator(u_fn, x)`` is e.g. ``lambda u, x: partial(u, x, "x")`` for :math:`u_x` (a
    second-order equation's periodicity of the derivative). Shape (N,) or (N, k) as ``u_fn``'s.
    """
    if not isinstance(pairs, Tensor) or pairs.dim() != 2 or pairs.shape[1] % 2:
        got = tuple(pairs.shape) if isinstance(pairs, Tensor) else type(pairs).__name__
        raise ValueError(f"pairs must have shape (N, 2 d): [x_left, x_right] side by side, got {got}.")
    d = pairs.shape[1] // 2
    left, right = pairs[:, :d], pairs[:, d:]
    if operator is None:
        return u_fn(left) - u_fn(right)
    return operator(u_fn, left) - operator(u_fn, right)


def gradient(u_fn: Field, x: Tensor) -> Tensor:
    r""":math:`\nabla u` at the points ``x`` (N, d): shape (N, d), or (N, k, d) for k components."""
    _check_points(x)
    if (jet := _jet(u_fn, x)) is not None:
        return jet.gradient
    if not _inside_transform():
        return _by_autograd(u_fn, x, _d)
    return vmap(jacrev(_at_one_point(u_fn)))(x)


def hessian(u_fn: Field, x: Tensor) -> Tensor:
    r"""The Hessian :math:`\partial_{ij} u` at the points ``x`` (N, d): shape (N, d, d) or (N, k, d, d)."""
    dim = _check_points(x)
    if (jet := _jet(u_fn, x, all_pairs(dim))) is not None:
        return jet.hessian()
    if not _inside_transform():
        return _by_autograd(u_fn, x, _hessian_of)
    return vmap(jacfwd(jacrev(_at_one_point(u_fn))))(x)


def _dims(dims: Sequence[Coordinate] | None, dim: int, names: Sequence[str] | None) -> list[int]:
    if dims is None:
        return list(range(dim))
    indices = [coordinate_index(c, dim, names) for c in dims]
    if not indices or len(set(indices)) != len(indices):
        raise ValueError(f"dims must name distinct coordinates, got {tuple(dims)}.")
    return indices


def laplacian(
    u_fn: Field, x: Tensor, dims: Sequence[Coordinate] | None = None, names: Sequence[str] | None = None
) -> Tensor:
    r""":math:`\Delta u = \sum_{i \in D} \partial_{ii} u` at the points ``x`` (N, d); shape as ``u_fn``'s.

    ``dims`` (default: every coordinate) restricts the sum, e.g. ``dims=("x",)`` for the spatial
    Laplacian of a space-time field. Componentwise for k components.
    """
    dim = _check_points(x)
    axes = _dims(dims, dim, names)
    if (jet := _jet(u_fn, x, diagonal_pairs(dim, axes))) is not None:
        return jet.second.sum(dim=-1)
    if not _inside_transform():
        def trace(component: Tensor, z: Tensor) -> Tensor:
            grad = _d(component, z)
            return sum(_d(grad[:, i], z)[:, i] for i in axes)

        return _by_autograd(u_fn, x, trace)
    fn = _at_one_point(u_fn)
    terms = [_directional(_directional(fn, _unit(i, x)), _unit(i, x)) for i in axes]
    return vmap(lambda z: sum(term(z) for term in terms))(x)


def divergence(
    v_fn: Field, x: Tensor, dims: Sequence[Coordinate] | None = None, names: Sequence[str] | None = None
) -> Tensor:
    r""":math:`\nabla \cdot v = \sum_{i \in D} \partial v_i / \partial x_i` of a vector field; shape (N,).

    ``v_fn`` maps (N, d) to (N, |D|): component j is differentiated along the j-th coordinate of
    ``dims`` (default: every coordinate, so v has d components).
    """
    dim = _check_points(x)
    axes = _dims(dims, dim, names)
    if not _inside_transform():
        with torch.enable_grad():
            z = _tracked(x)
            v = _field_values(v_fn, z)
            if v.dim() != 2 or v.shape[1] != len(axes):
                raise ValueError(
                    f"divergence: the vector field must have {len(axes)} components (one per coordinate of "
                    f"dims), got values of shape {tuple(v.shape[1:])} per point."
                )
            return sum(_d(v[:, j], z)[:, i] for j, i in enumerate(axes))
    fn = _at_one_point(v_fn)

    def div(z: Tensor) -> Tensor:
        total = z.new_zeros(())
        for component, i in enumerate(axes):
            dv = _directional(fn, _unit(i, z))(z)
            if dv.shape != (len(axes),):
                raise ValueError(
                    f"divergence: the vector field must have {len(axes)} components (one per coordinate of "
                    f"dims), got values of shape {tuple(dv.shape)} per point."
                )
            total = total + dv[component]
        return total

    return vmap(div)(x)


@dataclass(frozen=True)
class FieldDerivatives:
    """A field's value, gradient and Hessian at N points, from one composed transform (:func:`derivatives`).

    Attributes:
        value: (N,) or (N, k).
        gradient: (N, d) or (N, k, d).
        hessian: (N, d, d) or (N, k, d, d); ``None`` when computed with ``order=1``.
        names: the coordinate names (for :meth:`partial` by name).
    """

    value: Tensor
    gradient: Tensor
    hessian: Tensor | None
    names: tuple[str, ...]

    @property
    def dim(self) -> int:
        return int(self.gradient.shape[-1])

    def _second(self) -> Tensor:
        if self.hessian is None:
            raise ValueError("Second derivatives need derivatives(..., order=2).")
        return self.hessian

    def partial(self, wrt: Coordinate | Sequence[Coordinate], order: int = 1) -> Tensor:
        """As :func:`partial` (first or second order), read from the stored derivatives."""
        indices = _wrt_indices(wrt, order, self.dim, self.names or None)
        if len(indices) == 1:
            return self.gradient[..., indices[0]]
        if len(indices) == 2:
            return self._second()[..., indices[0], indices[1]]
        raise ValueError(f"FieldDerivatives holds derivatives up to order 2; use partial() for order {len(indices)}.")

    def time_derivative(self, time: Coordinate = -1, order: int = 1) -> Tensor:
        """:math:`u_t` (``order=1``) or :math:`u_{tt}` (``order=2``, from the Hessian)."""
        return self.partial(time, order)

    def normal_derivative(self, normals: Tensor, dims: Sequence[Coordinate] | None = None) -> Tensor:
        r"""As :func:`normal_derivative`: :math:`\sum_{i \in D} n_i \partial_i u` from the stored gradient."""
        axes = _dims(dims, self.dim, self.names or None)
        if normals.dim() != 2 or normals.shape[1] != len(axes):
            raise ValueError(f"normals must have shape (N, {len(axes)}), got {tuple(normals.shape)}.")
        grad = self.gradient[..., axes]
        n = normals.to(grad.dtype)
        return (grad * (n if grad.dim() == 2 else n[:, None, :])).sum(dim=-1)

    def laplacian(self, dims: Sequence[Coordinate] | None = None) -> Tensor:
        """As :func:`laplacian`: the trace of the Hessian over ``dims``."""
        second = self._second()
        axes = _dims(dims, self.dim, self.names or None)
        return sum(second[..., i, i] for i in axes)


def derivatives(u_fn: Field, x: Tensor, order: int = 2, names: Sequence[str] | None = None) -> FieldDerivatives:
    r"""Value, gradient and (``order=2``) Hessian of ``u_fn`` at the points ``x`` (N, d), in one transform.

    ``jacrev`` of the field carries its value as auxiliary output and ``jacfwd`` of that gradient
    carries both, so the network runs once (forward-over-reverse) for all of them::

        d = derivatives(u, x)
        residual = -d.laplacian() + d.partial("x") * d.value - f(x)
    """
    dim = _check_points(x)
    if order not in (1, 2):
        raise ValueError(f"derivatives() computes order 1 or 2, got {order!r}; use partial() for higher orders.")
    known = tuple(names) if names is not None else default_names(dim)
    if names is not None and len(known) != dim:
        raise ValueError(f"names={known} has {len(known)} names for points with d = {dim} coordinates.")
    if (jet := _jet(u_fn, x, all_pairs(dim) if order == 2 else ())) is not None:
        return FieldDerivatives(jet.value, jet.gradient, jet.hessian() if order == 2 else None, known)
    if not _inside_transform():
        with torch.enable_grad():
            z = _tracked(x)
            u = _field_values(u_fn, z)
            grads = [_d(component, z) for component in _components(u)]
            grad = _stacked(grads, u)
            if order == 1:
                return FieldDerivatives(u, grad, None, known)
            seconds = [_second_derivatives(g, z) for g in grads]
            return FieldDerivatives(u, grad, _stacked(seconds, u), known)
    fn = _at_one_point(u_fn)

    def value_as_aux(z: Tensor) -> tuple[Tensor, Tensor]:
        u = fn(z)
        return u, u

    grad_and_value = jacrev(value_as_aux, has_aux=True)  # z -> (grad, value)
    if order == 1:
        grad, value = vmap(grad_and_value)(x)
        return FieldDerivatives(value, grad, None, known)

    def grad_with_aux(z: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        grad, value = grad_and_value(z)
        return grad, (grad, value)

    second, (grad, value) = vmap(jacfwd(grad_with_aux, has_aux=True))(x)
    return FieldDerivatives(value, grad, second, known)
