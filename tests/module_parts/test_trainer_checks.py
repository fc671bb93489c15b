"""module_parts.trainer_checks: the precision a CLI run asked for, the module's trainer while it has
none, which optimizers impose the constraints, and the Trainer settings refused (fp16, sharding)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.cli import SaveConfigCallback

from lit_constrained.module_parts.trainer_checks import (
    attached_trainer, check_trainer, imposes_constraints, requested_precision,
)
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


@pytest.mark.parametrize("precision", ["16-mixed", "16-true"])
def test_fp16_precision_is_rejected(precision):
    # on a CPU, Lightning itself turns 16-mixed into bf16; on a GPU the module's check is what fires
    fake = SimpleNamespace(precision=precision, strategy=object(), gradient_clip_val=None, accumulate_grad_batches=1)
    with pytest.raises(ValueError, match="bf16-mixed"):
        check_trainer(fake, "CurveFit")


def _trainer_with(strategy: Any) -> Any:
    return SimpleNamespace(precision="32-true", strategy=strategy, gradient_clip_val=None, accumulate_grad_batches=1)


def test_sharding_strategies_are_rejected_by_class():
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

    # DeepSpeedStrategy() needs deepspeed installed: an instance without __init__ is still one
    for strategy in (FSDPStrategy(), ModelParallelStrategy(), object.__new__(DeepSpeedStrategy)):
        with pytest.raises(ValueError, match=rf"strategy {type(strategy).__name__} .*strategy='ddp'"):
            check_trainer(_trainer_with(strategy), "CurveFit")


def test_a_user_strategy_with_a_sharding_name_is_not_rejected():
    from lightning.pytorch.strategies import SingleDeviceStrategy

    MyFSDPish = type("MyFSDPish", (SingleDeviceStrategy,), {})
    DeepSpeedLike = type("DeepSpeedLike", (), {})
    for strategy in (MyFSDPish(device=torch.device("cpu")), DeepSpeedLike()):
        check_trainer(_trainer_with(strategy), "CurveFit")  # no error
