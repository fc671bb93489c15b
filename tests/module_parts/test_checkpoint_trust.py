"""module_parts.checkpoint_trust: the modules a checkpoint may name, a non-finite weight refused before
it is written, and hyper-parameters that hold the optimizer as plain data (what a safe load reads)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from lit_constrained.class_spec import TRUSTED_MODULES
from lit_constrained.module_parts.checkpoint_trust import refuse_nonfinite_weights, trusted_modules_for
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveFit


def test_trusted_modules_are_the_packages_the_task_and_the_callers() -> None:
    assert trusted_modules_for(CurveFit, ["mine"]) == (*TRUSTED_MODULES, "lit_constrained.tasks.curve", "mine")
    assert {"lit_constrained", "torch", "lightning"} <= set(TRUSTED_MODULES)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nonfinite_weight_is_refused_by_name(bad: float) -> None:
    weights = torch.ones(3)
    weights[1] = bad
    with pytest.raises(FloatingPointError, match="'net.0.weight' holds NaN/inf"):
        refuse_nonfinite_weights({"state_dict": {"net.0.bias": torch.ones(2), "net.0.weight": weights}})


def test_a_nonfinite_complex_weight_is_refused() -> None:
    """A NaN in an imaginary part of a complex (spectral) weight."""
    spectral = torch.ones(2, dtype=torch.complex64)
    spectral[0] = complex(1.0, math.nan)
    with pytest.raises(FloatingPointError, match="'fno.spectral' holds NaN/inf"):
        refuse_nonfinite_weights({"state_dict": {"fno.spectral": spectral}})
    refuse_nonfinite_weights({"state_dict": {"fno.spectral": torch.ones(2, dtype=torch.complex64)}})


def test_finite_and_integer_entries_pass() -> None:
    """Finite floating and complex weights, integer buffers and non-tensor entries pass, the checkpoint
    left as it was; only the weights are looked at: an optimizer's f* of -inf (MoMo's lower bound before
    its first estimate) is not a weight. The same checkpoint with one weight NaN is refused."""
    checkpoint = {
        "state_dict": {"w": torch.ones(2), "z": torch.ones(2, dtype=torch.complex64), "steps": torch.tensor([2**40]),
                       "x": "text"},
        "optimizer_states": [{"state": {"global": {"lower_bound": torch.tensor(-math.inf)}}}],
    }
    before = {name: value.clone() if isinstance(value, torch.Tensor) else value
              for name, value in checkpoint["state_dict"].items()}
    assert refuse_nonfinite_weights(checkpoint) is None
    assert refuse_nonfinite_weights({}) is None
    assert list(checkpoint) == ["state_dict", "optimizer_states"] and list(checkpoint["state_dict"]) == list(before)
    for name, value in before.items():
        kept = checkpoint["state_dict"][name]
        if isinstance(value, torch.Tensor):
            assert torch.equal(kept, value) and kept.dtype == value.dtype, name
        else:
            assert kept == value, name
    checkpoint["state_dict"]["w"][0] = math.nan
    with pytest.raises(FloatingPointError, match="'w' holds NaN/inf"):
        refuse_nonfinite_weights(checkpoint)


def test_the_hyper_parameters_hold_the_optimizer_as_a_plain_spec() -> None:
    # what the checkpoint stores (hparams) and what the logger is given (hparams_initial): the same dict
    task = CurveFit(hidden=4, optimizer=functools.partial(SQPAdam, lr=0.02))
    expected = {"class_path": f"{SQPAdam.__module__}.SQPAdam", "init_args": {"lr": 0.02}}
    assert task.hparams["optimizer"] == task.hparams_initial["optimizer"] == expected
    assert task.hparams["lr_scheduler"] is None and task.hparams_initial["lr_scheduler"] is None
    assert list(task.hparams)[:2] == list(task.hparams_initial)[:2]  # the init order kept
    assert task.hparams["hidden"] == 4
