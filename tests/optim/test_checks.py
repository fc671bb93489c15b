"""The one validators module (checks.py): hyperparameters, objective, constraint values and optimizer
inputs, each error naming what to fix."""

from __future__ import annotations

import math

import pytest
import torch

from lit_constrained.optim.checks import (
    all_finite,
    check_betas,
    check_constraint_inputs,
    check_constraints,
    check_finite,
    check_lr,
    check_objective,
    check_residual_tensor,
    count_nonfinite,
    prepared_constraint_inputs,
)

F64 = torch.float64


def test_checks_name_what_to_fix():
    with pytest.raises(ValueError, match="learning rate"):
        check_lr(-1.0)
    with pytest.raises(ValueError, match="betas"):
        check_betas((0.9,))
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        check_betas((0.9, 1.0))
    assert all_finite(torch.tensor([1e38, 1e38]))  # an overflowing sum of finite values is finite
    assert not all_finite(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="The thing contains 1 non-finite"):
        check_finite("The thing", torch.tensor([0.0, math.inf]))


def test_task_constraint_values_are_checked_with_what_to_fix():
    """The step owner's and the evaluation's checks of what a task returned (one copy, optim/checks)."""
    where = "Task.constraints()"
    c = torch.ones(3, requires_grad=True) * 2.0
    assert check_constraints(c, where, expected_m=3, need_grad=True) is c
    assert check_constraints(None, where) is None and check_constraints(None, where, expected_m=0) is None
    with pytest.raises(ValueError, match=r"Task.constraints\(\) returned None after returning 3 constraints"):
        check_constraints(None, where, expected_m=3)
    with pytest.raises(ValueError, match=r"must return a 1-D tensor of m residuals \(or None\), got shape \(3, 1\); flatten"):
        check_constraints(torch.ones(3, 1), where)
    with pytest.raises(ValueError, match=r"got shape list"):
        check_constraints([1.0], where)
    with pytest.raises(ValueError, match=r"returned 2 constraints, but 3 at the previous step"):
        check_constraints(torch.ones(2), where, expected_m=3)
    with pytest.raises(ValueError, match=r"without grad \(shape \(3,\)\)"):
        check_constraints(torch.ones(3), where, need_grad=True)
    with pytest.raises(ValueError, match=r"Task.constraints\(\) returned complex residuals .*torch\.cat\(\[c\.real, c\.imag\]\)"):
        check_constraints(torch.ones(3, dtype=torch.complex64), where)
    assert check_objective(torch.ones(1, 1), "Task.objective()").shape == ()
    with pytest.raises(ValueError, match=r"Task.objective\(\) must return a scalar tensor, got \(2,\)"):
        check_objective(torch.ones(2), "Task.objective()")
    with pytest.raises(ValueError, match="must be a torch.Tensor of residuals, got list"):
        check_residual_tensor([0.1])


def test_optimizer_constraint_inputs_are_checked_and_prepared():
    n = 4
    with pytest.raises(ValueError, match="jacobian was given without constraints"):
        check_constraint_inputs("Opt", None, torch.ones(2, n), n)
    with pytest.raises(ValueError, match=r"constraints must be a 1-D tensor of m residuals, got shape \(2, 1\)"):
        check_constraint_inputs("Opt", torch.ones(2, 1), torch.ones(2, n), n)
    with pytest.raises(ValueError, match=r"Opt was given complex residuals"):
        check_constraint_inputs("Opt", torch.ones(2, dtype=torch.complex64), torch.ones(2, n), n)
    with pytest.raises(ValueError, match=r"Opt requires jacobian= \(shape \(2, 4\)\)"):
        check_constraint_inputs("Opt", torch.ones(2), None, n)
    with pytest.raises(ValueError, match=r"expected \(m, n\) = \(2, 4\)"):
        check_constraint_inputs("Opt", torch.ones(2), torch.ones(2, n + 1), n)

    buffers: list[torch.Tensor] = []

    def buffer(m: int) -> torch.Tensor:
        buffers.append(torch.empty(m, n))
        return buffers[-1]

    cpu = torch.device("cpu")
    c, J = prepared_constraint_inputs("Opt", None, None, n, torch.float32, cpu, buffer)
    assert c.shape == (0,) and c.dtype == F64 and J.shape == (0, n) and J.dtype == torch.float32
    J_in = torch.arange(8.0).reshape(2, n)
    c, J = prepared_constraint_inputs("Opt", torch.tensor([1.0, 2.0]), J_in, n, torch.float32, cpu, buffer)
    assert c.dtype == F64 and torch.equal(c, torch.tensor([1.0, 2.0], dtype=F64))
    assert J.data_ptr() == J_in.data_ptr() and not buffers  # already contiguous float32 on the device: no copy
    c, J = prepared_constraint_inputs("Opt", torch.tensor([1.0, 2.0]), J_in.double().T.contiguous().T, n,
                                      torch.float32, cpu, buffer)
    assert len(buffers) == 1 and J is buffers[0] and torch.equal(J, J_in)  # copied into the reusable buffer


def test_an_optimizer_step_rejects_complex_constraints():
    from lit_constrained.optim import SQPAdam

    x = torch.nn.Parameter(torch.ones(3))
    x.grad = torch.ones(3)
    opt = SQPAdam([x], lr=0.1)
    with pytest.raises(ValueError, match=r"SQPAdam was given complex residuals"):
        opt.step(constraints=torch.ones(1, dtype=torch.complex64), jacobian=torch.ones(1, 3))
    assert count_nonfinite(torch.tensor([0.0, math.nan, math.inf, -math.inf])) == 3
