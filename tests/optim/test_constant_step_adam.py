"""ConstantStepAdam against the paper's Algorithm 1 written independently (numpy, float64).

The torch.optim conventions (state_dict round trip and exact resume, param groups, None grads, complex
parameters, repr, schedulers, dtypes, diagnostics, sync budget) are in tests/optim/test_contract.py."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

import lit_constrained.optim.constant_step_adam as csa_module
from lit_constrained.optim.constant_step_adam import ConstantStepAdam


def _algorithm1(w0, grads, lr, beta1, beta2, eps):
    """2309.08339 Algorithm 1: m, v from 0; w <- w - lr * m / (sqrt(v) + eps). numpy reference."""
    w = np.array(w0, dtype=np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for g in grads:
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        w = w - lr * m / (np.sqrt(v) + eps)
    return w


def _grad_quadratic(a, b, w):
    """Gradient of 0.5 ||A w - b||^2: A^T (A w - b)."""
    return a.T @ (a @ w - b)


def test_steps_match_algorithm1_on_a_quadratic():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(7, 5))
    b = rng.normal(size=7)
    w0 = rng.normal(size=5)
    lr, betas, eps = 0.03, (0.8, 0.99), 1e-6

    # reference: gradients evaluated along the reference's own trajectory
    w_ref = w0.copy()
    m = np.zeros(5)
    v = np.zeros(5)
    for _ in range(25):
        g = _grad_quadratic(a, b, w_ref)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        w_ref = w_ref - lr * m / (np.sqrt(v) + eps)

    # the optimizer, with the weights split over two tensors (checks the foreach bookkeeping)
    p1 = torch.nn.Parameter(torch.tensor(w0[:2], dtype=torch.float64))
    p2 = torch.nn.Parameter(torch.tensor(w0[2:], dtype=torch.float64))
    at, bt = torch.tensor(a), torch.tensor(b)
    opt = ConstantStepAdam([p1, p2], lr=lr, betas=betas, eps=eps)
    for _ in range(25):
        opt.zero_grad()
        loss = 0.5 * ((at @ torch.cat([p1, p2]) - bt) ** 2).sum()
        loss.backward()
        opt.step()
    np.testing.assert_allclose(torch.cat([p1, p2]).detach().numpy(), w_ref, rtol=1e-12, atol=1e-12)
    assert int(opt.state[p1]["step"]) == int(opt.state[p2]["step"]) == 25


def test_given_gradients_match_algorithm1_per_group_lr():
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=4) for _ in range(6)]
    w0 = rng.normal(size=4)
    p = torch.nn.Parameter(torch.tensor(w0[:3]))
    q = torch.nn.Parameter(torch.tensor(w0[3:]))
    opt = ConstantStepAdam([{"params": [p]}, {"params": [q], "lr": 0.5}], lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    for g in grads:
        p.grad = torch.tensor(g[:3])
        q.grad = torch.tensor(g[3:])
        opt.step()
    ref_p = _algorithm1(w0[:3], [g[:3] for g in grads], 0.1, 0.9, 0.999, 1e-8)
    ref_q = _algorithm1(w0[3:], [g[3:] for g in grads], 0.5, 0.9, 0.999, 1e-8)
    np.testing.assert_allclose(p.detach().numpy(), ref_p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(q.detach().numpy(), ref_q, rtol=1e-12, atol=1e-14)


def test_bias_correction_equals_torch_adam():
    torch.manual_seed(0)
    w0 = torch.randn(6, dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone())
    r = torch.nn.Parameter(w0.clone())
    ours = ConstantStepAdam([p], lr=0.01, betas=(0.9, 0.99), eps=1e-8, bias_correction=True)
    ref = torch.optim.Adam([r], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for _ in range(10):
        g = torch.randn(6, dtype=torch.float64)
        p.grad, r.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, r, rtol=1e-12, atol=1e-14)


def test_first_step_is_lr_times_sign_scaled():
    # m_1 = (1 - b1) g, sqrt(v_1) = sqrt(1 - b2) |g|: step = lr (1 - b1) / sqrt(1 - b2) sign(g) (eps -> 0)
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = ConstantStepAdam([p], lr=0.2, betas=(0.9, 0.99), eps=1e-300)
    p.grad = torch.tensor([3.0, -1e-3, 7.0], dtype=torch.float64)
    opt.step()
    expected = -0.2 * 0.1 / np.sqrt(0.01) * np.sign([3.0, -1e-3, 7.0])
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12)


def test_lr_none_means_set_by_the_callback():
    p = torch.nn.Parameter(torch.ones(2))
    opt = ConstantStepAdam([p])
    p.grad = torch.ones(2)
    with pytest.raises(ValueError, match="LipschitzEstimator"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(2))  # nothing moved
    opt.param_groups[0]["lr"] = 0.1
    opt.step()
    assert not torch.equal(p.detach(), torch.ones(2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": -1.0}, "learning rate"),
        ({"lr": float("nan")}, "learning rate"),
        ({"lr": 0.1, "betas": (1.0, 0.9)}, "betas"),
        ({"lr": 0.1, "betas": (0.9, -0.1)}, "betas"),
        ({"lr": 0.1, "eps": 0.0}, "eps"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConstantStepAdam([torch.nn.Parameter(torch.ones(1))], **kwargs)


@pytest.mark.parametrize("bias_correction", [False, True])
def test_step_norm_diagnostic_is_the_length_of_the_update(bias_correction):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    q = torch.nn.Parameter(torch.randn(3, 2, dtype=torch.float64))
    opt = ConstantStepAdam([{"params": [p]}, {"params": [q], "lr": 0.3}], lr=0.1, bias_correction=bias_correction)
    for k in range(3):
        before = torch.cat([p.detach().reshape(-1), q.detach().reshape(-1)])
        p.grad, q.grad = torch.randn(5, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
        opt.step(diagnostics=(k != 1))
        after = torch.cat([p.detach().reshape(-1), q.detach().reshape(-1)])
        if k == 1:
            assert opt.diagnostics == {}
        else:
            assert opt.diagnostics["step_norm"].shape == ()
            torch.testing.assert_close(opt.diagnostics["step_norm"], (after - before).norm(), rtol=1e-12, atol=0)


def test_docstring_example():
    result = doctest.testmod(csa_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
