"""module_parts.declarations: what a task's class declares, read against ConstrainedModule's defaults."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lit_constrained import Imposed
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
