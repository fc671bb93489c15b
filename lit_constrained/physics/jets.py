r"""Input derivatives of a feed-forward network in ONE forward pass of stacked streams (a second-order jet).

A network :math:`u = L_K \circ \sigma \circ L_{K-1} \circ \dots \circ L_1` of affine layers
:math:`L(z) = W z + b` and elementwise activations :math:`\sigma` carries, beside its value, the
directional derivatives along the unit vectors :math:`e_i` and the second derivatives along chosen
pairs :math:`(i, j)` (Taylor-mode forward propagation; the "forward Laplacian" of Li et al. 2023 when
the pairs are the diagonal). With :math:`\dot z_i = \partial_i z` and :math:`\ddot z_{ij} = \partial_{ij} z`:

.. math::

    L:\quad z \mapsto W z + b, \qquad \dot z_i \mapsto W \dot z_i, \qquad \ddot z_{ij} \mapsto W \ddot z_{ij};

    \sigma:\quad z \mapsto \sigma(z), \qquad \dot z_i \mapsto \sigma'(z)\, \dot z_i, \qquad
    \ddot z_{ij} \mapsto \sigma'(z)\, \ddot z_{ij} + \sigma''(z)\, \dot z_i \dot z_j,

starting from :math:`z = x`, :math:`\dot z_i = e_i`, :math:`\ddot z_{ij} = 0`. All streams of a layer go
through ONE matrix product (the streams stacked along a leading axis), which is why it is fast where it
matters: the per-point Jacobian w.r.t. the weights (``vmap`` over points of ``jacrev``) then forms each
weight's per-point gradient as one product summed over the streams, instead of one outer product per
use of the weight (nested ``jvp`` uses every weight once per tangent). Measured on one Intel Xeon core,
the PINNacle tasks' 2 -> 100 x 5 -> 1 tanh MLP in float64, the PDE residual's per-point Jacobian at 96
points: Poisson2d-C's Laplacian 31 ms against 124 ms by nested ``jvp``; Burgers1d-C, Wave1d-C and
Heat2d-MS (``derivatives``: the full Hessian) 1.5-1.9x faster (``benchmarks/bench_jets.py``).

Inside torch.func transforms the operators of :mod:`lit_constrained.physics.operators` use a jet whenever
the field has one (:func:`field_jet`): an ``nn.Sequential`` of :data:`ACTIVATIONS`, ``nn.Identity``,
:class:`~lit_constrained.physics.features.FourierFeatures` (a fixed affine map and a sine) and
``nn.Linear`` layers, or any object with a ``jet(x, pairs)`` method returning a :class:`Jet` in the field's
own shape (a module whose ``forward`` is ``self.net(x)[:, 0]`` returns
``sequential_jet(self.net, x, pairs).component(0)``). A jet is plain tensor operations, differentiable
w.r.t. the weights, on ordinary batches too; there the operators keep autograd's double backward, the
faster on a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .features import FourierFeatures

__all__ = ["ACTIVATIONS", "Jet", "Pair", "all_pairs", "diagonal_pairs", "field_jet", "sequential_jet"]

Pair = tuple[int, int]
"""A second derivative's coordinates ``(i, j)``, ``i <= j``."""

Derivatives = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
"""An activation's ``z -> (sigma(z), sigma'(z), sigma''(z))``."""


def _tanh(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s = torch.tanh(z)
    slope = 1 - s * s
    return s, slope, -2 * s * slope


def _sigmoid(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s = torch.sigmoid(z)
    slope = s * (1 - s)
    return s, slope, slope * (1 - 2 * s)


def _silu(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s = torch.sigmoid(z)
    slope = s * (1 + z * (1 - s))
    return z * s, slope, s * (1 - s) * (2 + z * (1 - 2 * s))


def _sine(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s = torch.sin(z)
    return s, torch.cos(z), -s


ACTIVATIONS: dict[type[nn.Module], Derivatives] = {nn.Tanh: _tanh, nn.Sigmoid: _sigmoid, nn.SiLU: _silu}
"""The elementwise activations a jet passes through, with their first and second derivatives."""


@dataclass(frozen=True)
class Jet:
    """A field's value and derivatives at N points, in the field's shape: (N,) for a scalar field, (N, k)
    for k components.

    Attributes:
        value: (N,) or (N, k).
        gradient: (N, d) or (N, k, d): ``gradient[..., i]`` = :math:`\\partial_i u`.
        second: (N, P) or (N, k, P): ``second[..., p]`` = :math:`\\partial_{ij} u` for ``pairs[p] = (i, j)``.
        pairs: the P second derivatives carried.
    """

    value: Tensor
    gradient: Tensor
    second: Tensor
    pairs: tuple[Pair, ...]

    def component(self, index: int) -> Jet:
        """The jet of component ``index`` of a k-component field, as a scalar field's ((N,), (N, d), (N, P))."""
        if self.value.dim() != 2:
            raise ValueError("component() picks a component of a k-component jet; this jet is a scalar field's.")
        return Jet(self.value[:, index], self.gradient[:, index], self.second[:, index], self.pairs)

    def second_derivative(self, i: int, j: int) -> Tensor:
        """(N,) or (N, k): :math:`\\partial_{ij} u`; a ValueError if the pair was not carried."""
        pair = (min(i, j), max(i, j))
        if pair not in self.pairs:
            raise ValueError(f"the jet carries the second derivatives {self.pairs}, not {pair}.")
        return self.second[..., self.pairs.index(pair)]

    def hessian(self) -> Tensor:
        """(N, d, d) or (N, k, d, d), symmetric; needs every pair ``i <= j`` (:func:`all_pairs`)."""
        d = self.gradient.shape[-1]
        rows = [torch.stack([self.second_derivative(i, j) for j in range(d)], dim=-1) for i in range(d)]
        return torch.stack(rows, dim=-2)


def all_pairs(dim: int) -> tuple[Pair, ...]:
    """Every pair ``(i, j)``, ``i <= j < dim``: the full Hessian."""
    return tuple((i, j) for i in range(dim) for j in range(i, dim))


def diagonal_pairs(dim: int, axes: Sequence[int] | None = None) -> tuple[Pair, ...]:
    """The pairs ``(i, i)`` of ``axes`` (default: every coordinate): a Laplacian."""
    return tuple((i, i) for i in (range(dim) if axes is None else axes))


def _supported(net: nn.Module) -> bool:
    return isinstance(net, nn.Sequential) and len(net) > 0 and all(
        isinstance(layer, (nn.Linear, nn.Identity, FourierFeatures)) or type(layer) in ACTIVATIONS for layer in net)


def _affine(streams: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    r""":math:`z \mapsto W z + b` on the value stream, :math:`W` on the others: ONE product for all."""
    out = streams @ weight.transpose(0, 1)
    value = out[:1] if bias is None else out[:1] + bias
    return torch.cat([value, out[1:]])


def _activated(streams: Tensor, derivatives: Derivatives, d: int, pairs: tuple[Pair, ...]) -> Tensor:
    """The elementwise activation with ``derivatives`` on every stream (the chain rule of the module docstring)."""
    s, slope, curvature = derivatives(streams[0])
    tangents = streams[1:1 + d]
    seconds = [slope * streams[1 + d + p] + curvature * tangents[i] * tangents[j] for p, (i, j) in enumerate(pairs)]
    return torch.cat([s[None], slope * tangents, *([torch.stack(seconds)] if seconds else [])])


def sequential_jet(net: nn.Sequential, x: Tensor, pairs: Sequence[Pair] = ()) -> Jet:
    """The value, gradient and second derivatives ``pairs`` of ``net`` (``nn.Linear``, ``FourierFeatures``
    and :data:`ACTIVATIONS` layers) at the points ``x`` (N, d), in one forward pass of
    ``1 + d + len(pairs)`` stacked streams."""
    if not _supported(net):
        kinds = sorted({type(layer).__name__ for layer in net} if isinstance(net, nn.Sequential) else {type(net).__name__})
        activations = sorted(t.__name__ for t in ACTIVATIONS)
        raise TypeError(f"a jet passes through nn.Sequential of nn.Linear, nn.Identity, FourierFeatures and "
                        f"{activations} layers; got {kinds}.")
    n, d = x.shape
    pairs = tuple((min(i, j), max(i, j)) for i, j in pairs)
    # streams: 0 the value, 1..d the first derivatives, then the pairs' second derivatives; shape (S, N, width)
    unit = torch.eye(d, dtype=x.dtype, device=x.device)[:, None, :].expand(d, n, d)
    streams = torch.cat([x[None], unit, x.new_zeros(len(pairs), n, d)])
    for layer in net:
        if isinstance(layer, nn.Linear):
            streams = _affine(streams, layer.weight, layer.bias)
        elif isinstance(layer, FourierFeatures):  # a fixed affine map, then a sine
            streams = _activated(_affine(streams, layer.weight, layer.bias), _sine, d, pairs)
        elif not isinstance(layer, nn.Identity):
            streams = _activated(streams, ACTIVATIONS[type(layer)], d, pairs)
    return Jet(streams[0], streams[1:1 + d].permute(1, 2, 0), streams[1 + d:].permute(1, 2, 0), pairs)


def field_jet(u_fn: object) -> Callable[[Tensor, Sequence[Pair]], Jet] | None:
    """How to take ``u_fn``'s jet, or None: its own ``jet(x, pairs)`` method, or :func:`sequential_jet` for an
    ``nn.Sequential`` of supported layers."""
    own = getattr(u_fn, "jet", None)
    if callable(own):
        return own
    if isinstance(u_fn, nn.Module) and _supported(u_fn):
        return lambda x, pairs: sequential_jet(u_fn, x, pairs)  # type: ignore[arg-type]
    return None
