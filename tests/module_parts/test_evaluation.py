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
