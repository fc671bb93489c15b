"""Input derivatives of an MLP carried through its layers by hand (Taylor-mode propagation).

The physics tasks need derivatives of the network's output with respect to its inputs (du/dt,
u_x, u_xx) inside a loss that is then differentiated with respect to the weights. For a
:func:`~lit_constrained.tasks.common.mlp` (``nn.Linear`` and ``nn.Tanh`` layers) the first and
second directional derivatives are propagated alongside the state in one forward pass
(:func:`mlp_taylor`); autograd differentiates that pass once. This is
cheaper than nested ``torch.autograd.grad(create_graph=True)`` or forward-mode AD under a backward
pass; other networks keep those (the tasks' ``derivative`` option).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

__all__ = ["mlp_taylor"]


class _TanhTaylor(torch.autograd.Function):
    r"""One ``nn.Tanh`` layer on a state z (N, H) and its derivative streams (K + n, N, H): the K
    directional derivatives :math:`\dot z_k`, then the n second derivatives :math:`\ddot z_j` of the
    first n directions (:func:`mlp_taylor`). With :math:`s = \tanh z`, :math:`\sigma = 1 - s^2`:

    .. math::

        \dot h_k = \sigma \dot z_k, \qquad \ddot h_j = \sigma \ddot z_j - 2 s \sigma \dot z_j^2.

    The backward is written out (fewer passes over the streams than autograd's rules for the same
    elementwise operations, the measured bottleneck on CPU). With incoming gradients :math:`g_s`,
    :math:`\dot g_k`, :math:`\ddot g_j` and :math:`d\sigma/dz = -2 s \sigma`,
    :math:`d(s\sigma)/dz = \sigma (3\sigma - 2)`:

    .. math::

        \bar{\ddot z}_j = \sigma \ddot g_j, \qquad
        \bar{\dot z}_k = \sigma \dot g_k - [k < n]\, 4 s \sigma \dot z_k \ddot g_k, \\
        \bar z = \sigma \Big(g_s - 2 s \big(\textstyle\sum_k \dot z_k \dot g_k + \sum_j \ddot z_j \ddot g_j\big)
                 + (4 - 6 \sigma) \sum_j \dot z_j^2 \ddot g_j\Big).

    The streams may be broadcast against the state (shape (K + n, 1, H): the same input directions
    for every row); their gradient is summed back to that shape. The backward accumulates in place,
    which autograd's batched backward (``is_grads_batched``, the constraint Jacobian) supports and
    ``torch.func`` transforms (``vmap``, ``jacrev``) do not: they are not enabled. It is
    differentiable once only (no Hessians through it; ``once_differentiable``).
    """

    @staticmethod
    def forward(z: Tensor, streams: Tensor, n_second: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        s = torch.tanh(z)
        slope = torch.addcmul(s.new_ones(()), s, s, value=-1.0)  # 1 - s^2 in one pass
        curvature = s * slope
        out = streams * slope
        if n_second:
            out[streams.shape[0] - n_second:].addcmul_(curvature, streams[:n_second].square(), value=-2.0)
        return s, out, slope, curvature

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, int], output: tuple[Tensor, ...]) -> None:
        _, streams, n_second = inputs
        s, _, slope, curvature = output
        ctx.save_for_backward(s, slope, curvature, streams)
        ctx.n_second = n_second
        ctx.mark_non_differentiable(slope, curvature)
        ctx.set_materialize_grads(False)  # an unused output (u, or the streams) costs no zero tensor

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_s: Tensor | None, g_out: Tensor | None, *_: Any) -> tuple[Tensor | None, ...]:
        s, slope, curvature, streams = ctx.saved_tensors
        n = ctx.n_second
        if g_out is None:
            return (None if g_s is None else slope * g_s), None, None
        g_streams = g_out * slope
        products = streams[0] * g_out[0]  # sum_k zdot_k gdot_k + sum_j zddot_j gddot_j
        for k in range(1, streams.shape[0]):
            products.addcmul_(streams[k], g_out[k])
        inner = (s * products).mul_(-2.0) if g_s is None else torch.addcmul(g_s, s, products, value=-2.0)
        if n:
            first_times_g = streams[:n] * g_out[streams.shape[0] - n:]  # zdot_j gddot_j
            g_streams[:n].addcmul_(curvature, first_times_g, value=-4.0)
            squares = streams[0] * first_times_g[0]  # sum_j zdot_j^2 gddot_j
            for j in range(1, n):
                squares.addcmul_(streams[j], first_times_g[j])
            inner.add_(squares, alpha=4.0).addcmul_(slope, squares, value=-6.0)
        return inner.mul_(slope), g_streams.sum_to_size(streams.shape), None


def _tanh_taylor(z: Tensor, streams: Tensor, n_second: int) -> tuple[Tensor, Tensor]:
    """:class:`_TanhTaylor`'s forward (the same formulas) in out-of-place tensor operations only, so
    autograd's own rules differentiate it and it runs inside ``torch.func`` transforms."""
    s = torch.tanh(z)
    slope = 1.0 - s * s
    out = streams * slope
    if n_second:
        first = streams.shape[0] - n_second
        out = torch.cat([out[:first], out[first:] - 2.0 * (s * slope) * streams[:n_second].square()])
    return s, out


def mlp_taylor(
    net: nn.Sequential, x: Tensor, tangents: Tensor, n_second: int = 0, transformable: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    r"""``net(x)`` with its first and second directional derivatives, row by row, in one forward pass.

    For the K directions :math:`v_k` = ``tangents[k]`` returns

    - ``out`` (N, out_dim): :math:`f(x)`,
    - ``first`` (K, N, out_dim): :math:`J_f(x) v_k`,
    - ``second`` (n_second, N, out_dim): :math:`\frac{d^2}{d\epsilon^2} f(x + \epsilon v_j)|_{\epsilon=0}`
      for the first ``n_second`` directions (e.g. :math:`u_{xx}` for :math:`v_j = e_x`).

    The derivatives are carried through the layers by hand (second-order Taylor propagation), and
    autograd differentiates them with respect to the weights -- cheaper than nested
    ``torch.autograd.grad(create_graph=True)`` or forward-mode AD under a backward pass:

    .. math::

        \text{Linear:}\ z = W h + b,\ \dot z = W \dot h,\ \ddot z = W \ddot h; \qquad
        \text{Tanh:}\ h = \tanh z,\ \dot h = (1 - h^2) \dot z,\ \ddot h = (1 - h^2)(\ddot z - 2 h \dot z^2),

    starting from :math:`\dot h = v_k`, :math:`\ddot h = 0` (x moves on a line).

    Args:
        net: a :func:`mlp` (an ``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh`` layers); any other
            layer raises a ``TypeError``.
        x: the inputs, (N, in_dim).
        tangents: the directions, (K, N, in_dim), or (K, 1, in_dim) for the same directions in
            every row (cheaper: the first layer then maps K vectors, not K x N rows).
        n_second: how many of the directions (the first ones) get second derivatives, 0..K.
        transformable: the Tanh layers in plain tensor operations (autograd's rules for the
            backward) instead of the written-out backward: the pass then also runs inside
            ``torch.func`` transforms (``vmap`` / ``jacrev`` over points: the per-point constraint
            Jacobian of :mod:`lit_constrained.jacobians.pointwise`). Same values.
    """
    if not isinstance(net, nn.Sequential):
        raise TypeError(
            f"mlp_taylor expects an nn.Sequential of nn.Linear and nn.Tanh layers (see mlp), got "
            f"{type(net).__name__}: {_OTHER_NETWORKS}"
        )
    if (x.dim() != 2 or tangents.dim() != 3 or tangents.shape[2] != x.shape[1]
            or tangents.shape[1] not in (1, x.shape[0])):
        raise ValueError(
            f"mlp_taylor: x must be (N, in_dim) and tangents (K, N, in_dim) or (K, 1, in_dim), got "
            f"{tuple(x.shape)} and {tuple(tangents.shape)}."
        )
    n_directions = tangents.shape[0]
    if not 0 <= n_second <= n_directions:
        raise ValueError(f"mlp_taylor: n_second must be in 0..{n_directions} (the directions' count), got {n_second}.")
    streams = torch.cat([tangents, tangents.new_zeros(n_second, *tangents.shape[1:])]) if n_second else tangents
    state = x
    for layer in net:
        if isinstance(layer, nn.Linear):
            state, streams = layer(state), F.linear(streams, layer.weight)
        elif isinstance(layer, nn.Tanh) and transformable:
            state, streams = _tanh_taylor(state, streams, n_second)
        elif isinstance(layer, nn.Tanh):
            state, streams, _, _ = _TanhTaylor.apply(state, streams, n_second)
        else:
            raise TypeError(
                f"mlp_taylor supports nn.Linear and nn.Tanh layers, got {type(layer).__name__}: {_OTHER_NETWORKS}"
            )
    streams = streams.expand(-1, state.shape[0], -1)  # a network without Tanh keeps shared directions
    return state, streams[:n_directions], streams[n_directions:]


_OTHER_NETWORKS = (
    "differentiate other networks with autograd (torch.autograd.forward_ad or nested torch.autograd.grad; "
    "the tasks' `derivative` option)."
)
