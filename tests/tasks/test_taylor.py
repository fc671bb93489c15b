"""Hand-carried input derivatives of an MLP (tasks/taylor.py) against autograd: forward-mode AD,
nested reverse mode, finite differences."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor, nn

from lit_constrained.tasks.common import mlp
from lit_constrained.tasks.taylor import mlp_taylor


def test_mlp_taylor_first_order_matches_forward_mode_ad_and_its_weight_gradients() -> None:
    """The hand-carried tangent against torch's forward-mode AD: values, and d/dweights of both."""
    torch.manual_seed(0)
    net = mlp(5, 12, 3, 4).double()
    x = torch.randn(9, 5, dtype=torch.float64)
    tangent = torch.randn(9, 5, dtype=torch.float64)
    with fwAD.dual_level():
        out, direction = fwAD.unpack_dual(net(fwAD.make_dual(x, tangent)))
    mine, first, _ = mlp_taylor(net, x, tangent.unsqueeze(0))
    my_direction = first[0]
    torch.testing.assert_close(mine, out, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(my_direction, direction, rtol=1e-13, atol=1e-13)
    weights = list(net.parameters())
    reference = torch.autograd.grad((direction.pow(2).sum() + out.sum()), weights)
    gradients = torch.autograd.grad((my_direction.pow(2).sum() + mine.sum()), weights)
    for g, r in zip(gradients, reference):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_mlp_taylor_rejects_other_layers() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with pytest.raises(TypeError, match="ReLU.*forward_ad"):
        mlp_taylor(net, torch.zeros(1, 2), torch.ones(1, 1, 2))


def nested_autograd_derivatives(net: nn.Module, x: Tensor, directions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The reference for mlp_taylor: per output j and direction v_k (rows of ``directions``, (K, N, d)),
    grad_x f_j . v_k and grad_x (grad_x f_j . v_k) . v_k by nested reverse-mode autograd."""
    x = x.clone().requires_grad_(True)
    out = net(x)
    first, second = [], []
    for v in directions:
        first_k, second_k = [], []
        for j in range(out.shape[1]):
            (g,) = torch.autograd.grad(out[:, j].sum(), x, create_graph=True)
            d1 = (g * v).sum(dim=1)
            (h,) = torch.autograd.grad(d1.sum(), x, create_graph=True)
            first_k.append(d1)
            second_k.append((h * v).sum(dim=1))
        first.append(torch.stack(first_k, dim=1))
        second.append(torch.stack(second_k, dim=1))
    return out, torch.stack(first), torch.stack(second)


@pytest.mark.parametrize("shared", [False, True], ids=["per-row directions", "shared directions"])
def test_mlp_taylor_matches_nested_autograd_and_its_weight_gradients(shared: bool) -> None:
    """Values of f, J v_k, d^2/de^2 f(x + e v_k), and the weight gradients of losses built from them
    (all terms; derivatives only; f only), against nested torch.autograd.grad."""
    torch.manual_seed(0)
    net = mlp(5, 12, 3, 2).double()
    x = torch.randn(9, 5, dtype=torch.float64)
    directions = torch.randn(3, 1 if shared else 9, 5, dtype=torch.float64)
    out, first, second = mlp_taylor(net, x, directions, n_second=2)
    assert out.shape == (9, 2) and first.shape == (3, 9, 2) and second.shape == (2, 9, 2)
    ref_out, ref_first, ref_second = nested_autograd_derivatives(net, x, directions.expand(-1, 9, -1))
    torch.testing.assert_close(out, ref_out, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(first, ref_first, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(second, ref_second[:2], rtol=1e-12, atol=1e-12)
    weights = list(net.parameters())

    def losses(o: Tensor, f: Tensor, s: Tensor) -> list[Tensor]:
        everything = (o * f[0] * f[2]).sum() + f[1].pow(2).sum() + (s[0] * o).sum() + s[1].pow(3).sum()
        return [everything, f.sin().sum() + s.pow(2).sum(), o.pow(2).sum()]

    kwargs = dict(retain_graph=True, materialize_grads=True)  # the output bias is unused by derivatives
    for mine, reference in zip(losses(out, first, second), losses(ref_out, ref_first, ref_second[:2])):
        for g, r in zip(torch.autograd.grad(mine, weights, **kwargs),
                        torch.autograd.grad(reference, weights, **kwargs)):
            torch.testing.assert_close(g, r, rtol=1e-11, atol=1e-12)


def test_mlp_taylor_backward_matches_finite_differences() -> None:
    """torch.autograd.gradcheck (central differences) of the hand-written backward, through x and
    the shared directions."""
    torch.manual_seed(1)
    net = mlp(3, 4, 2, 1).double()
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    directions = torch.randn(2, 1, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, v: mlp_taylor(net, a, v, n_second=1), (x, directions))


def test_mlp_taylor_float32_and_shapes() -> None:
    torch.manual_seed(2)
    net = mlp(4, 16, 3, 1)
    x = torch.randn(50, 4)
    directions = torch.eye(4)[:2, None, :]
    out, first, second = mlp_taylor(net, x, directions, n_second=1)
    assert out.dtype == first.dtype == second.dtype == torch.float32
    _, ref_first, ref_second = nested_autograd_derivatives(copy.deepcopy(net).double(), x.double(),
                                                           directions.double().expand(-1, 50, -1))
    torch.testing.assert_close(first.double(), ref_first, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(second.double(), ref_second[:1], rtol=1e-4, atol=1e-5)
    # without hidden layers the derivatives are those of the affine map: W v, and 0
    linear = nn.Sequential(nn.Linear(4, 3))
    out, first, second = mlp_taylor(linear, x, directions, n_second=2)
    assert first.shape == second.shape == (2, 50, 3)
    torch.testing.assert_close(first, linear[0].weight[:, :2].T[:, None, :].expand(-1, 50, -1))
    assert not second.any()
    with pytest.raises(ValueError, match="n_second"):
        mlp_taylor(net, x, directions, n_second=3)
    with pytest.raises(ValueError, match="tangents"):
        mlp_taylor(net, x, torch.ones(2, 7, 4))


def test_mlp_taylor_rejects_other_networks() -> None:
    with pytest.raises(TypeError, match="GELU.*autograd"):
        mlp_taylor(nn.Sequential(nn.Linear(2, 3), nn.GELU(), nn.Linear(3, 1)), torch.zeros(1, 2), torch.ones(1, 1, 2))
    with pytest.raises(TypeError, match="nn.Sequential.*Linear"):
        mlp_taylor(nn.Linear(2, 1), torch.zeros(1, 2), torch.ones(1, 1, 2))  # type: ignore[arg-type]
