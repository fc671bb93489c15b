"""module_parts.evaluation: which tasks measure a residual beyond the imposed constraints, and one
evaluation batch's values against the task's own functions."""

from __future__ import annotations

from typing import Any

import torch

from lit_constrained.module_parts.evaluation import evaluate, measures_residual
from lit_constrained.tasks.curve import CurveFit


class _WithResidual(CurveFit):
    def validation_constraints(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        return self.net(x).squeeze(-1)


class _Mixin:
    def validation_constraints(self, batch: Any) -> torch.Tensor:
        return torch.zeros(1)


class _MixedIn(_Mixin, CurveFit):
    pass


class _Below(_WithResidual):
    pass


def test_measures_residual_when_a_class_redefines_the_hook() -> None:
    assert not measures_residual(CurveFit(hidden=4))
    assert measures_residual(_WithResidual(hidden=4))
    assert measures_residual(_MixedIn(hidden=4))
    assert measures_residual(_Below(hidden=4))


def test_evaluate_returns_the_tasks_values_detached() -> None:
    torch.manual_seed(0)
    task = _WithResidual(hidden=4)
    x = torch.linspace(0, 1, 5).unsqueeze(-1)
    batch = (x, x.sin())
    f, c, r, metrics = evaluate(task, batch, "val")
    with torch.no_grad():
        assert torch.equal(f, task.objective(batch))
        assert torch.equal(c, task.constraints(batch))
        assert torch.equal(r, task.net(x).squeeze(-1))
    assert not f.requires_grad and not c.requires_grad and not r.requires_grad
    assert set(metrics) == set(task.evaluation_metrics(batch, "val"))


def test_under_bf16_mixed_the_reported_violation_is_the_float32_one(capsys) -> None:
    """bf16-mixed runs the evaluation under autocast: c must still be evaluated in the parameters' dtype
    (it reported 5.97e-03 where the constraints are 9.1e-07: the network's bfloat16 rounding)."""
    import copy
    import functools

    from lit_constrained.optim import SQPAdam
    from lit_constrained.tasks.curve import CurveData, target
    from tests.helpers.lightning import MemoryLogger, quiet_trainer

    torch.manual_seed(0)
    model = CurveFit(hidden=16, optimizer=functools.partial(SQPAdam, lr=1e-2, rho="full"))
    logger = MemoryLogger()
    quiet_trainer(max_steps=10, precision="bf16-mixed", logger=logger, log_every_n_steps=1).fit(
        model, CurveData(num_samples=8, batch_size=8))
    # independently: the constraints u(x_a) - sin(2 pi x_a) at the final weights, in float64
    net64 = copy.deepcopy(model.net).double()
    with torch.no_grad():
        x = model.anchor_x.double()
        c64 = float((net64(x) - target(x)).abs().max())
    val = logger.series("Violation/val")[-1]  # the last validation: at the final weights (step 10)
    assert abs(val - c64) <= 1e-6, (val, c64)  # float32's rounding of u ~ 1 (bfloat16's: ~4e-3)
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    end = float(summary.split(" at the end")[0].rsplit("-> ", 1)[1])
    assert abs(end - c64) <= 1e-6, (end, c64)
