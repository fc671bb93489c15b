"""module_parts.declarations: what a task's class declares, read against ConstrainedModule's defaults."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_constrained import Coupled, Imposed
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.declarations import (
    checked_jacobian_method, declares_imposed, has_constraints, uses_pointwise_jacobian,
)
from lit_constrained.tasks.curve import CurveFit


class Parts(ConstrainedModule):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.w = torch.nn.Parameter(torch.ones(1))

    def objective(self, batch: Any) -> torch.Tensor:
        return self.w.sum()

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"zero": Imposed(lambda x: self.w * x.squeeze(-1), torch.ones(3, 1))}


class PartsAndOwnConstraints(Parts):
    def constraints(self, batch: Any) -> torch.Tensor:
        return self.w - 1


def test_the_declared_hooks_are_read_from_the_class() -> None:
    assert declares_imposed(Parts(), ConstrainedModule) and has_constraints(Parts(), ConstrainedModule)
    assert not declares_imposed(CurveFit(), ConstrainedModule) and has_constraints(CurveFit(), ConstrainedModule)


def test_auto_uses_the_pointwise_jacobian_only_for_the_default_constraints_of_imposed_parts() -> None:
    assert uses_pointwise_jacobian(Parts(), ConstrainedModule)
    assert not uses_pointwise_jacobian(PartsAndOwnConstraints(), ConstrainedModule)
    assert not uses_pointwise_jacobian(Parts(jacobian_method="batched"), ConstrainedModule)
    assert uses_pointwise_jacobian(PartsAndOwnConstraints(jacobian_method="pointwise"), ConstrainedModule)
    with pytest.raises(ValueError, match=r"CurveFit.imposed\(\)"):
        uses_pointwise_jacobian(CurveFit(jacobian_method="pointwise"), ConstrainedModule)


def test_an_unknown_jacobian_method_is_refused() -> None:
    assert checked_jacobian_method("loop") == "loop"
    with pytest.raises(ValueError, match="'auto', 'pointwise', 'batched' or 'loop'"):
        checked_jacobian_method("fast")


class PartsAndCoupledRows(Parts):
    def imposed(self, batch: Any) -> dict[str, Any]:
        return {**super().imposed(batch), "sum": Coupled(lambda: (self.w * torch.arange(3.0)).sum() - 1, sense="<=")}


def test_a_coupled_part_takes_the_general_jacobian_and_refuses_the_pointwise_one() -> None:
    """With a Coupled part c is differentiated as a whole (rows w x_i = w, then sum_i i w - 1 = 3 w - 1)."""
    task = PartsAndCoupledRows()
    c = task.constraints(None)
    assert c.tolist() == [1.0, 1.0, 1.0, 2.0] and [p.sense for p in task.imposed_layout] == ["=", "<="]
    assert task.constraint_jacobian(None, c, [task.w]).tolist() == [[1.0], [1.0], [1.0], [3.0]]
    with pytest.raises(ValueError, match="declares a Coupled part; use jacobian_method='auto'"):
        PartsAndCoupledRows(jacobian_method="pointwise").constraint_jacobian(None, c, [task.w])
