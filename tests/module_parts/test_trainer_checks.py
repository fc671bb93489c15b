"""module_parts.trainer_checks: the precision a CLI run asked for, the module's trainer while it has
none, and which optimizers impose the constraints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.cli import SaveConfigCallback

from lit_constrained.module_parts.trainer_checks import attached_trainer, imposes_constraints, requested_precision
from lit_constrained.optim import MoMo, SQPAdam
from lit_constrained.tasks.curve import CurveFit


@pytest.mark.parametrize("given,full", [("16", "16-mixed"), ("bf16", "bf16-mixed"), ("64", "64-true"), ("16-true", "16-true")])
def test_requested_precision_reads_the_cli_config_in_full_names(given: str, full: str) -> None:
    callback = SaveConfigCallback.__new__(SaveConfigCallback)  # only its config is read
    callback.config = {"trainer": {"precision": given}}
    assert requested_precision(SimpleNamespace(callbacks=[object(), callback])) == full
    assert requested_precision(SimpleNamespace(callbacks=[])) is None  # a Trainer built in Python


def test_attached_trainer_is_none_before_a_fit() -> None:
    task = CurveFit(hidden=4)
    assert attached_trainer(task) is None
    fake = SimpleNamespace()
    task.trainer = fake
    assert attached_trainer(task) is fake


def test_imposes_constraints_by_requires() -> None:
    params = [torch.zeros(2, requires_grad=True)]
    assert imposes_constraints(SQPAdam(params))
    assert not imposes_constraints(MoMo(params)) and not imposes_constraints(torch.optim.Adam(params))
