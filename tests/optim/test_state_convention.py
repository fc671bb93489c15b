"""The one state convention of optim/ (lit_constrained/optim/state.py), for every optimizer class:
torch.optim's per-parameter entries (views of the flat vectors for the hard-constrained optimizers) and one
``state["global"]`` entry; checkpoints of the earlier layouts (``state["flat"]``, MoMo's ``state["momo"]``)
load and continue bit for bit, or are refused in one line; tensors moved (as Lightning moves the state to
the device) or of another precision continue too; the active set and the rank warning resume with the state.

Trajectories before and after the convention (every class, 30 steps, the Hock-Schittkowski problems):
``tests/optim/trajectories.py`` against another checkout."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor

from lit_constrained.jacobians import real_view
from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall
from lit_constrained.optim.experimental import SQPMoMo, SQPMoMoAdam
from lit_constrained.optim.state import STATE_KEY
from tests.optim.test_contract import REGISTRY, make_params, run, saved

CONSTRAINED = [info for info in REGISTRY if info.constrained]
VECTORS = {SQPHeavyBall: ("momentum",), SQPAdam: ("momentum", "second_moment"), AdamCon: ("exp_avg", "exp_avg_sq"),
           SQPMoMo: ("grad_avg",), SQPMoMoAdam: ("exp_avg", "exp_avg_sq"), MoMo: ("grad_avg",),
           MoMoAdam: ("exp_avg", "exp_avg_sq"), ConstantStepAdam: ("step", "exp_avg", "exp_avg_sq")}


def continued(info: Any, state_dict: dict[str, Any], start: list[Tensor], steps: int = 3, **kwargs: Any) -> Tensor:
    """The parameters after ``steps`` steps from ``start`` with ``state_dict`` loaded (steps 3..)."""
    params = [torch.nn.Parameter(p.detach().clone()) for p in start]
    opt = info.make(params, **kwargs)
    opt.load_state_dict(state_dict)
    run(info, opt, steps=steps, start=3)
    return torch.cat([real_view(p.detach()).reshape(-1) for p in params])


def straight(info: Any, steps: int = 6, **kwargs: Any) -> tuple[Tensor, Any, list[Tensor], dict[str, Any]]:
    """Six steps in one run, with the parameters and the checkpoint after step 3."""
    params = make_params()
    opt = info.make(params, **kwargs)
    run(info, opt, steps=3)
    middle = [p.detach().clone() for p in params]
    checkpoint = saved(opt)
    run(info, opt, steps=steps - 3, start=3)
    return torch.cat([real_view(p.detach()).reshape(-1) for p in params]), opt, middle, checkpoint


@pytest.mark.parametrize("info", REGISTRY, ids=lambda info: info.name)
def test_the_state_is_per_parameter_with_one_global_entry(info: Any) -> None:
    params = make_params()
    opt = info.make(params)
    run(info, opt)
    strings = {key for key in opt.state if isinstance(key, str)}
    assert strings == (set() if info.cls is ConstantStepAdam else {STATE_KEY})
    for p in params:
        assert set(opt.state[p]) == set(VECTORS[info.cls]), info.name
        for key in VECTORS[info.cls]:
            if key != "step":
                assert opt.state[p][key].shape == real_view(p).shape
    if info.cls is not ConstantStepAdam:
        assert opt.state[STATE_KEY]["step"] == 3
        assert not any(isinstance(v, Tensor) and v.dim() and v.numel() == sum(p.numel() for p in params)
                       for v in opt.state[STATE_KEY].values())  # no n-vector outside the parameters' entries


@pytest.mark.parametrize("info", CONSTRAINED, ids=lambda info: info.name)
def test_the_per_parameter_entries_are_views_of_one_flat_vector(info: Any) -> None:
    params = make_params()
    opt = info.make(params)
    run(info, opt)
    for key in VECTORS[info.cls]:
        entries = [opt.state[p][key] for p in params]
        storage = entries[0].untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == storage for t in entries)
        offsets = [t.storage_offset() for t in entries]
        assert offsets == [sum(p.numel() for p in params[:i]) + offsets[0] for i in range(len(params))]


@pytest.mark.parametrize("info", CONSTRAINED, ids=lambda info: info.name)
def test_a_checkpoint_of_the_flat_layout_continues_bit_for_bit(info: Any) -> None:
    end, _, middle, checkpoint = straight(info)
    old = copy.deepcopy(checkpoint)  # the layout before optim/state.py: everything in state["flat"]
    vectors = {key: torch.cat([checkpoint["state"][i][key].reshape(-1) for i in range(3)]) for key in VECTORS[info.cls]}
    old["state"] = {"flat": {**old["state"][STATE_KEY], **vectors}}
    assert torch.equal(continued(info, old, middle), end)


def test_a_flat_checkpoint_for_other_parameters_is_refused_in_one_line() -> None:
    info = next(i for i in REGISTRY if i.cls is SQPAdam)
    _, _, middle, checkpoint = straight(info)
    old = {"param_groups": checkpoint["param_groups"],
           "state": {"flat": {"step": 3, "n": 20, "momentum": torch.zeros(20), "second_moment": torch.zeros(20)}}}
    with pytest.raises(ValueError, match=r"state\['flat'\]\['momentum'\] has 20 entries.*n = 13") as error:
        continued(info, old, middle)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("cls", [MoMo, MoMoAdam])
def test_a_checkpoint_of_momos_earlier_key_continues_bit_for_bit(cls: type) -> None:
    info = next(i for i in REGISTRY if i.cls is cls)
    end, _, middle, checkpoint = straight(info)
    old = copy.deepcopy(checkpoint)
    old["state"]["momo"] = old["state"].pop(STATE_KEY)
    assert torch.equal(continued(info, old, middle), end)


@pytest.mark.parametrize("info", CONSTRAINED, ids=lambda info: info.name)
def test_moved_state_tensors_continue_bit_for_bit(info: Any) -> None:
    """New tensors in the entries (Lightning's ``_optimizer_to_device`` replaces them): the flat vectors are
    gathered from them once, and the entries become views again."""
    end, _, middle, checkpoint = straight(info)
    params = [torch.nn.Parameter(p.detach().clone()) for p in middle]
    opt = info.make(params)
    opt.load_state_dict(checkpoint)
    for p in params:
        opt.state[p] = {key: value.clone() for key, value in opt.state[p].items()}
    run(info, opt, steps=3, start=3)
    assert torch.equal(torch.cat([real_view(p.detach()).reshape(-1) for p in params]), end)
    assert opt.state[params[1]][VECTORS[info.cls][0]].untyped_storage().data_ptr() == \
        opt.state[params[0]][VECTORS[info.cls][0]].untyped_storage().data_ptr()


@pytest.mark.parametrize("cls", [SQPHeavyBall, SQPAdam, AdamCon])
def test_float64_moments_of_float32_parameters_resume_unrounded(cls: type) -> None:
    """``precision="float64"``: the entries are float64 views although the parameters are float32 (torch's
    ``load_state_dict`` alone would cast them to float32)."""
    info = next(i for i in REGISTRY if i.cls is cls)
    params = make_params(torch.float32)
    opt = info.make(params, precision="float64")
    run(info, opt, steps=3)
    middle = [p.detach().clone() for p in params]
    checkpoint = saved(opt)
    run(info, opt, steps=3, start=3)
    resumed = [torch.nn.Parameter(p.clone()) for p in middle]
    other = info.make(resumed, precision="float64")
    other.load_state_dict(checkpoint)
    assert all(t.dtype == torch.float64 for p in resumed for t in other.state[p].values())
    run(info, other, steps=3, start=3)
    assert all(torch.equal(a, b) for a, b in zip(params, resumed))


def test_a_changed_parameter_count_is_named() -> None:
    info = next(i for i in REGISTRY if i.cls is SQPHeavyBall)
    params = make_params()
    opt = info.make(params[:2])
    run(info, opt, steps=1)
    opt.add_param_group({"params": params[2:]})
    with pytest.raises(ValueError, match="number of parameters changed"):
        run(info, opt, steps=1)


def test_the_active_set_and_the_rank_warning_resume_with_the_state() -> None:
    """What the attributes showed (the last active rows, the multipliers) and the once-per-optimizer rank
    warning are in ``state["global"]``: a loaded optimizer shows them and does not warn again."""
    x = torch.nn.Parameter(torch.tensor([1.0, 0.0], dtype=torch.float64))  # on x0 + x1 = 1 and at x0 = 1
    opt = SQPAdam([x], lr=0.1)
    # x0 <= 1 (active: the gradient pushes x0 up along the equality), x1 >= -5 (inactive)
    g = lambda: torch.stack([x.detach()[0] - 1.0, -x.detach()[1] - 5.0])  # noqa: E731
    G = torch.eye(2, dtype=torch.float64) * torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    J = torch.tensor([[1.0, 1.0], [2.0, 2.0]], dtype=torch.float64)  # rank 1: warns once
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            x.grad = torch.tensor([-1.0, 1.0], dtype=torch.float64)
            c = torch.stack([x.detach().sum() - 1.0, 2 * x.detach().sum() - 2.0])
            opt.step(constraints=c, jacobian=J, inequalities=g(), inequality_jacobian=G)
    assert sum("numerical rank" in str(w.message) for w in seen) == 1
    assert opt.active_set.tolist() == [0] and opt.inequality_multipliers is not None
    other = SQPAdam([x], lr=0.1)
    other.load_state_dict(saved(opt))
    assert torch.equal(other.active_set, opt.active_set)
    assert torch.equal(other.inequality_multipliers, opt.inequality_multipliers)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        x.grad = torch.tensor([-1.0, 1.0], dtype=torch.float64)
        c = torch.stack([x.detach().sum() - 1.0, 2 * x.detach().sum() - 2.0])
        other.step(constraints=c, jacobian=J, inequalities=g(), inequality_jacobian=G)
    assert not any("numerical rank" in str(w.message) for w in seen)
