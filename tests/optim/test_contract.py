"""The torch.optim contract, checked the same way for all six optimizers (in the style of torch's
``OptimizerInfo`` tests: a small registry, every test parametrized over it).

What each optimizer must do as a ``torch.optim.Optimizer``: every hyperparameter in ``defaults`` and each
param group (``repr`` shows them, ``load_state_dict`` restores the saved ones, schedulers and Lightning's
``LearningRateMonitor`` read and write them), ``state_dict`` round trip and bit-exact resume, two param
groups (shared hyperparameters validated as shared, the others honoured per group), ``None`` grads,
complex parameters, float32/float64, the ``diagnostics`` attribute (0-dim tensors, only when asked, never
in ``state_dict``) and the host-sync budget of a step.

The problem: a small smooth objective of the parameters, and for the constrained optimizers two fixed
nonlinear constraints c(x) = 0 of the flat real vector x with their exact Jacobian J. The numerical
tests of each method (against independent references) stay in the per-optimizer test files.
"""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from tests.helpers.sync_counting import SyncCounter
from torch import Tensor
from torch.optim import Optimizer

from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall
from lit_constrained.optim.experimental import SQPMoMo, SQPMoMoAdam
from lit_constrained.jacobians import real_view

DT = torch.float64
STEPS = 3


# ---------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class OptimizerInfo:
    """How to build and drive one optimizer class in the contract tests."""

    cls: type[Optimizer]
    kwargs: dict[str, Any]
    """Non-default hyperparameters the tests use (all in ``defaults`` afterwards)."""
    other: dict[str, Any]
    """Different valid values of some hyperparameters: a new object built with these must still take
    the saved ones from ``load_state_dict``."""
    default_lr: float | None
    momentum_key: str
    """Where beta1 lives in a param group: ``"momentum"`` or ``"betas"`` (what torch schedulers cycle)."""
    shared: dict[str, Any]
    """Hyperparameters that must be equal in all groups, each with a different valid value."""
    per_group: dict[str, Any]
    """Hyperparameters honoured per group, each with a value that visibly changes the group's steps."""
    constrained: bool = False
    sync_free: bool = False
    """No host sync at all on the non-diagnostic step (MoMo, MoMo-Adam)."""
    variants: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """Further settings whose state must resume exactly too."""

    @property
    def name(self) -> str:
        return self.cls.__name__

    def make(self, params: Any, **overrides: Any) -> Optimizer:
        return self.cls(params, **{**self.kwargs, **overrides})


REGISTRY = [
    OptimizerInfo(
        SQPHeavyBall,
        kwargs=dict(lr=0.05, momentum=0.8, rho=0.5, h=1.5),
        other=dict(lr=0.01, momentum=0.3, rho=0.9, h=1.0),
        default_lr=1e-3,
        momentum_key="momentum",
        shared=dict(rho=0.9, rcond=1e-6),
        per_group=dict(lr=0.01, momentum=0.3, h=3.0),
        constrained=True,
        variants=(dict(rho="full"),),
    ),
    OptimizerInfo(
        SQPAdam,
        kwargs=dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, rho=0.5, h=1.5),
        other=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, rho=0.9, h=1.0),
        default_lr=1e-3,
        momentum_key="betas",
        shared=dict(rho=0.9, rcond=1e-6),
        per_group=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-1, h=3.0),
        constrained=True,
        variants=(dict(rho="full"),),
    ),
    OptimizerInfo(
        AdamCon,
        kwargs=dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, rho=0.5),
        other=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, rho=0.9),
        default_lr=1e-3,
        momentum_key="betas",
        shared=dict(rho=0.9, rcond=1e-6),
        per_group=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-1),
        constrained=True,
        variants=(dict(rho="full"),),
    ),
    OptimizerInfo(
        MoMo,
        kwargs=dict(lr=0.5, momentum=0.8, weight_decay=0.01, lower_bound=-0.1, estimate_lower_bound=True),
        other=dict(lr=0.1, momentum=0.5, weight_decay=0.1, lower_bound=-1.0),
        default_lr=1.0,  # the paper's (algorithms.md section 6): lr is a cap on the Polyak step
        momentum_key="momentum",
        shared=dict(momentum=0.5, lower_bound=-1.0, estimate_lower_bound=False, bias_correction=True),
        per_group=dict(lr=1e-4, weight_decay=0.5),
        sync_free=True,
        variants=(dict(bias_correction=True, estimate_lower_bound=False, weight_decay=0.0),),
    ),
    OptimizerInfo(
        MoMoAdam,
        kwargs=dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, estimate_lower_bound=True),
        other=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.1),
        default_lr=1e-2,  # the paper's (algorithms.md section 6)
        momentum_key="betas",
        shared=dict(betas=(0.5, 0.99), lower_bound=-1.0, estimate_lower_bound=False),
        per_group=dict(lr=1e-4, eps=1e-1, weight_decay=0.5, decoupled_weight_decay=True),
        sync_free=True,
        variants=(dict(decoupled_weight_decay=True, estimate_lower_bound=False),),
    ),
    OptimizerInfo(
        ConstantStepAdam,
        kwargs=dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6),
        other=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, bias_correction=True),
        default_lr=None,  # None: set by the LipschitzEstimator callback; stepping without an lr raises
        momentum_key="betas",
        shared={},
        per_group=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-1, bias_correction=True),
        variants=(dict(bias_correction=True),),
    ),
    OptimizerInfo(
        SQPMoMo,
        kwargs=dict(lr=0.5, momentum=0.8, lower_bound=-0.1, estimate_lower_bound=True, rho=0.5),
        other=dict(lr=0.1, momentum=0.5, lower_bound=-1.0, rho=0.9),
        default_lr=1.0,  # MoMo's: the lr caps the model-based step (experimental/sqp_momo.py)
        momentum_key="momentum",
        shared=dict(momentum=0.5, lower_bound=-1.0, estimate_lower_bound=False, bias_correction=True, rho=0.9,
                    rcond=1e-6),
        per_group=dict(lr=1e-4),
        constrained=True,
        variants=(dict(rho="full"), dict(bias_correction=True, estimate_lower_bound=False)),
    ),
    OptimizerInfo(
        SQPMoMoAdam,
        kwargs=dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, estimate_lower_bound=True, rho=0.5),
        other=dict(lr=0.01, betas=(0.5, 0.9), eps=1e-3, rho=0.9),
        default_lr=1e-2,  # MoMo-Adam's: the lr caps the model-based step (experimental/sqp_momo.py)
        momentum_key="betas",
        shared=dict(betas=(0.5, 0.99), lower_bound=-1.0, estimate_lower_bound=False, rho=0.9, rcond=1e-6,
                    geometry="euclidean"),
        per_group=dict(lr=1e-4, eps=1e-1),
        constrained=True,
        variants=(dict(rho="full"), dict(geometry="euclidean")),
    ),
]
IDS = [info.name for info in REGISTRY]
PER_GROUP = [(info, key) for info in REGISTRY for key in info.per_group]
SHARED = [(info, key) for info in REGISTRY for key in info.shared]
VARIANTS = [(info, variant) for info in REGISTRY for variant in ({},) + info.variants]


def variant_id(case: Any) -> str:
    if isinstance(case, OptimizerInfo):
        return case.name
    if isinstance(case, dict):
        return "-".join(f"{k}={v}" for k, v in case.items()) or "default"
    return str(case)


# ---------------------------------------------------------------------------- the problem


SHAPES = [(3, 2), (3,), (4,)]


def make_params(dtype: torch.dtype = DT, seed: int = 0, complex_: bool = False) -> list[Tensor]:
    """Three parameters (n = 13 real entries; 26 when complex), the same values for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape in SHAPES:
        if complex_:
            values = torch.view_as_complex(torch.randn(*shape, 2, generator=gen, dtype=torch.float64))
            out.append(torch.nn.Parameter(values.to(dtype)))
        else:
            out.append(torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)))
    return out


def two_groups(params: list[Tensor], **second: Any) -> list[dict[str, Any]]:
    return [{"params": params[:2]}, {"params": params[2:], **second}]


def all_params(opt: Optimizer) -> list[Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def objective(params: list[Tensor], k: int) -> Tensor:
    """f_k(x) = sum 0.5 (x - t_k)^2 + 0.05 x^4 over the real entries, t_k = 0.3 sin(k + 1) (>= 0)."""
    target = 0.3 * math.sin(k + 1)
    total = 0.0
    for p in params:
        z = real_view(p)
        total = total + (0.5 * (z - target) ** 2 + 0.05 * z**4).sum()
    return total


def constraints_and_jacobian(opt: Optimizer) -> tuple[Tensor, Tensor]:
    """c(x) = [(|x|^2 - n/4) / 2, a.x + 0.1 sum x^3 - 0.2] on the flat real vector, J exact (x's dtype)."""
    x = torch.cat([real_view(p.detach()).reshape(-1) for p in all_params(opt)])
    a = torch.cos(torch.arange(x.numel(), dtype=x.dtype))
    c = torch.stack([0.5 * (x @ x - 0.25 * x.numel()), a @ x + 0.1 * (x**3).sum() - 0.2])
    J = torch.stack([x, a + 0.3 * x**2])
    return c, J


def prepare(info: OptimizerInfo, opt: Optimizer, k: int, no_grad: tuple[int, ...] = ()) -> tuple[Tensor, dict]:
    """Gradients of f_k (None for the parameters at ``no_grad``), the loss and the step's keyword args."""
    opt.zero_grad()
    params = all_params(opt)
    loss = objective(params, k)
    loss.backward()
    for i in no_grad:
        params[i].grad = None
    kwargs: dict[str, Any] = {}
    if info.constrained:
        kwargs["constraints"], kwargs["jacobian"] = constraints_and_jacobian(opt)
    return loss, kwargs


def run(info: OptimizerInfo, opt: Optimizer, steps: int = STEPS, start: int = 0, **step_kwargs: Any) -> None:
    for k in range(start, start + steps):
        loss, kwargs = prepare(info, opt, k)
        opt.step(lambda: loss, **kwargs, **step_kwargs)


def flat(params: list[Tensor]) -> Tensor:
    return torch.cat([real_view(p.detach()).reshape(-1) for p in params])


def saved(opt: Optimizer) -> dict[str, Any]:
    """``opt.state_dict()`` through a real checkpoint (serialized, so later steps cannot change it)."""
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def tensors_in(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two state_dicts hold the same values (tensors bit for bit)."""
    assert a["param_groups"] == b["param_groups"]
    assert set(a["state"]) == set(b["state"])
    for key in a["state"]:
        left, right = a["state"][key], b["state"][key]
        if isinstance(left, dict):
            assert set(left) == set(right), key
            for name in left:
                assert_equal_values(left[name], right[name], f"{key}/{name}")
        else:
            assert_equal_values(left, right, str(key))


def assert_equal_values(a: Any, b: Any, where: str) -> None:
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


# ---------------------------------------------------------------------------- hyperparameters


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_every_hyperparameter_is_in_defaults_each_group_and_repr(info: OptimizerInfo) -> None:
    opt = info.make(make_params())
    signature = inspect.signature(info.cls.__init__)
    arguments = [
        name for name, p in signature.parameters.items()
        if name not in ("self", "params") and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    text = repr(opt)
    for name in arguments:
        assert name in opt.defaults, f"{info.name}({name}=...) is not in defaults"
        assert name in opt.param_groups[0], name
        assert re.search(rf"^\s+{re.escape(name)}: ", text, re.MULTILINE), f"repr lacks {name}:\n{text}"
    for name, value in info.kwargs.items():
        expected = tuple(value) if isinstance(value, list) else value
        assert opt.defaults[name] == expected and opt.param_groups[0][name] == expected, name


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_lr_has_a_default(info: OptimizerInfo) -> None:
    assert info.cls(make_params()).param_groups[0]["lr"] == info.default_lr


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_requires_and_the_step_keywords(info: OptimizerInfo) -> None:
    expected = frozenset({"constraints", "jacobian"}) if info.constrained else frozenset()
    assert info.cls.requires == expected
    opt = info.make(make_params())
    loss, kwargs = prepare(info, opt, 0)
    before = flat(all_params(opt))
    if not info.constrained:  # no accept-and-ignore: a constrained call to an unconstrained optimizer fails
        c, J = constraints_and_jacobian(opt)
        with pytest.raises(TypeError):
            opt.step(lambda: loss, constraints=c, jacobian=J)
        assert torch.equal(flat(all_params(opt)), before)
    assert opt.step(lambda: loss, **kwargs) is loss  # the closure's value is returned


# ---------------------------------------------------------------------------- state_dict and resume


@pytest.mark.parametrize("info, variant", VARIANTS, ids=variant_id)
def test_state_dict_round_trip_and_bit_exact_resume(info: OptimizerInfo, variant: dict) -> None:
    # two groups with different lrs: run 2 x STEPS straight, or STEPS, checkpoint, a new model and
    # optimizer, load, STEPS more: the same parameters and state, bit for bit.
    straight = make_params()
    opt = info.make(two_groups(straight, lr=0.5 * info.kwargs["lr"]), **variant)
    run(info, opt, 2 * STEPS)

    first = make_params()
    opt1 = info.make(two_groups(first, lr=0.5 * info.kwargs["lr"]), **variant)
    run(info, opt1, STEPS)
    checkpoint = {"params": [p.detach().clone() for p in first], "optim": saved(opt1)}
    run(info, opt1, 1, start=STEPS)  # the old objects move on: the checkpoint must not follow

    resumed = make_params(seed=123)
    with torch.no_grad():
        for p, value in zip(resumed, checkpoint["params"]):
            p.copy_(value)
    opt2 = info.make(two_groups(resumed, lr=0.5 * info.kwargs["lr"]), **variant)
    opt2.load_state_dict(checkpoint["optim"])
    assert_same_state(saved(opt2), checkpoint["optim"])  # load then save is the identity
    run(info, opt2, STEPS, start=STEPS)
    assert torch.equal(flat(resumed), flat(straight))
    assert_same_state(saved(opt2), saved(opt))


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_load_state_dict_restores_the_saved_hyperparameters(info: OptimizerInfo) -> None:
    straight = make_params()
    opt = info.make(straight)
    run(info, opt, 2 * STEPS)

    first = make_params()
    opt1 = info.make(first)
    run(info, opt1, STEPS)
    checkpoint = saved(opt1)
    opt2 = info.make(first, **info.other)  # other hyperparameters in the new object ...
    opt2.load_state_dict(checkpoint)
    for key in set(info.kwargs) | set(info.other):  # ... the saved ones win, as in torch's Adam
        expected = info.kwargs.get(key, inspect.signature(info.cls.__init__).parameters[key].default)
        assert opt2.param_groups[0][key] == (tuple(expected) if isinstance(expected, list) else expected), key
    run(info, opt2, STEPS, start=STEPS)
    assert torch.equal(flat(first), flat(straight))


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_deepcopy_and_pickle_keep_the_optimizer_whole(info: OptimizerInfo) -> None:
    # torch pickles only defaults, state and param_groups: the copy must still have its diagnostics
    # attribute and take the same steps as the original on its own copy of the parameters
    params = make_params()
    opt = info.make(params)
    run(info, opt, 1)
    for copied in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert copied.diagnostics == {}
        twin = all_params(copied)
        assert torch.equal(flat(twin), flat(params)) and twin[0] is not params[0]
    run(info, opt, STEPS, start=1)
    run(info, copied, STEPS, start=1)
    assert torch.equal(flat(all_params(copied)), flat(params))


# ---------------------------------------------------------------------------- param groups


@pytest.mark.parametrize("info, key", SHARED, ids=variant_id)
def test_a_shared_hyperparameter_that_differs_between_groups_is_an_error_naming_it(
    info: OptimizerInfo, key: str
) -> None:
    params = make_params()
    with pytest.raises(ValueError, match=re.escape(key)):
        opt = info.make(two_groups(params, **{key: info.shared[key]}))
        run(info, opt, 1)


@pytest.mark.parametrize("info, key", PER_GROUP, ids=variant_id)
def test_a_per_group_hyperparameter_is_honoured_in_its_group(info: OptimizerInfo, key: str) -> None:
    reference, changed = make_params(), make_params()
    run(info, info.make(two_groups(reference)))
    opt = info.make(two_groups(changed, **{key: info.per_group[key]}))
    assert opt.param_groups[1][key] == info.per_group[key] and opt.param_groups[0][key] != info.per_group[key]
    run(info, opt)
    assert not torch.equal(flat(changed[2:]), flat(reference[2:])), f"group 1's {key} was ignored"


# ---------------------------------------------------------------------------- None grads, complex, dtypes


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_parameters_without_grad(info: OptimizerInfo) -> None:
    params = make_params()
    opt = info.make(params)
    start = params[1].detach().clone()
    for k in range(STEPS):
        loss, kwargs = prepare(info, opt, k, no_grad=(1,))
        opt.step(lambda: loss, **kwargs)
    if not info.constrained:  # skipped, as in torch.optim: not moved, no state
        assert torch.equal(params[1].detach(), start) and params[1] not in opt.state
        assert not torch.equal(params[0].detach(), make_params()[0].detach())
        return
    # the projection needs all of x: a parameter without grad takes part with g = 0
    zero = make_params()
    ref = info.make(zero)
    for k in range(STEPS):
        loss, kwargs = prepare(info, ref, k)
        zero[1].grad = torch.zeros_like(zero[1])
        ref.step(lambda: loss, **kwargs)
    assert torch.equal(flat(params), flat(zero))


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_a_complex_parameter_is_a_pair_of_reals(info: OptimizerInfo) -> None:
    z = make_params(torch.complex128, complex_=True)
    r = [torch.nn.Parameter(torch.view_as_real(p.detach()).clone()) for p in z]
    oz, orr = info.make(z), info.make(r)
    run(info, oz)
    run(info, orr)
    torch.testing.assert_close(flat(z), flat(r), rtol=1e-12, atol=1e-14)
    assert all(p.dtype == torch.complex128 for p in z)


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_float32_and_float64(info: OptimizerInfo) -> None:
    # each dtype keeps its parameters and n-vector state in that dtype; float32 follows float64 closely
    runs = {}
    for dtype in (torch.float32, torch.float64):
        params = make_params(dtype)
        opt = info.make(params)
        run(info, opt)
        assert all(p.dtype == dtype for p in params)
        vectors = [t for t in tensors_in(opt.state_dict()["state"]) if t.numel() > 1]
        assert vectors and all(t.dtype == dtype for t in vectors), {t.dtype for t in vectors}
        runs[dtype] = flat(params)
    assert not torch.equal(runs[torch.float64], flat(make_params()))  # it moved
    torch.testing.assert_close(runs[torch.float32].double(), runs[torch.float64], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- schedulers, Lightning


def beta1(group: dict[str, Any], info: OptimizerInfo) -> float:
    return group["betas"][0] if info.momentum_key == "betas" else group["momentum"]


def set_beta1(group: dict[str, Any], info: OptimizerInfo, value: float) -> None:
    if info.momentum_key == "betas":
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


SCHEDULERS: dict[str, Callable[[Optimizer], Any]] = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=8, base_momentum=0.6, max_momentum=0.9
    ),
    "CyclicLR": lambda opt: torch.optim.lr_scheduler.CyclicLR(
        opt, base_lr=0.01, max_lr=0.1, step_size_up=2, cycle_momentum=True, base_momentum=0.6, max_momentum=0.9
    ),
    "ReduceLROnPlateau": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_schedulers_drive_the_lr_and_beta1_of_each_step(info: OptimizerInfo, scheduler: str) -> None:
    # Run with the scheduler, recording each step's lr and beta1 per group; then run again setting
    # those values by hand: the same trajectory, bit for bit (the step reads them from param_groups).
    params = make_params()
    opt = info.make(two_groups(params))
    sched = SCHEDULERS[scheduler](opt)
    record = []
    for k in range(6):
        record.append([(g["lr"], beta1(g, info)) for g in opt.param_groups])
        loss, kwargs = prepare(info, opt, k)
        opt.step(lambda: loss, **kwargs)
        if scheduler == "ReduceLROnPlateau":
            sched.step(1.0)  # no improvement: the lr halves
        else:
            sched.step()
    lrs = {lr for step in record for lr, _ in step}
    assert len(lrs) > 2, record
    if scheduler in ("OneCycleLR", "CyclicLR"):  # cycle_momentum=True found the momentum / beta1 key
        assert len({b for step in record for _, b in step}) > 2, record

    by_hand = make_params()
    ref = info.make(two_groups(by_hand))
    for k, values in enumerate(record):
        for group, (lr, b1) in zip(ref.param_groups, values):
            group["lr"] = lr
            set_beta1(group, info, b1)
        loss, kwargs = prepare(info, ref, k)
        ref.step(lambda: loss, **kwargs)
    assert torch.equal(flat(params), flat(by_hand))


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_learning_rate_monitor_reads_the_real_beta1(info: OptimizerInfo) -> None:
    opt = info.make(make_params())
    monitor = LearningRateMonitor(log_momentum=True)
    monitor.lrs = {"lr-opt": []}  # what its on_train_start sets up
    stats = monitor._get_optimizer_stats(opt, ["lr-opt"])  # the code that logs each step
    assert stats["lr-opt"] == info.kwargs["lr"]
    assert stats["lr-opt-momentum"] == 0.8  # every registry entry uses beta1 = 0.8 (not the 0 of a missing key)


# ---------------------------------------------------------------------------- diagnostics and host syncs


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_diagnostics_are_0_dim_tensors_only_when_asked_and_not_state(info: OptimizerInfo) -> None:
    asked, plain = make_params(), make_params()
    opt, ref = info.make(asked), info.make(plain)
    for k in range(STEPS):
        loss, kwargs = prepare(info, opt, k)
        opt.step(lambda: loss, **kwargs, diagnostics=True)
        diagnostics = opt.diagnostics
        assert isinstance(diagnostics, dict) and diagnostics, info.name
        for name, value in diagnostics.items():
            assert isinstance(value, Tensor) and value.shape == (), (name, value)
        loss, kwargs = prepare(info, ref, k)
        ref.step(lambda: loss, **kwargs)
        assert ref.diagnostics == {}
    assert torch.equal(flat(asked), flat(plain))  # asking does not change the step
    loss, kwargs = prepare(info, opt, STEPS)
    opt.step(lambda: loss, **kwargs)
    assert opt.diagnostics == {}  # emptied on a step that did not ask: never a stale value
    state = saved(opt)["state"]
    string_keyed = {key: value for key, value in state.items() if isinstance(key, str)}
    assert "diagnostics" not in string_keyed
    stored = {name for value in string_keyed.values() if isinstance(value, dict) for name in value}
    assert not stored & set(diagnostics), stored & set(diagnostics)


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_host_syncs_per_step(info: OptimizerInfo) -> None:
    params = make_params()
    opt = info.make(params)
    run(info, opt, 1)  # the first step creates the state
    loss, kwargs = prepare(info, opt, 1)
    with SyncCounter() as syncs:
        opt.step(lambda: loss, **kwargs)

    baseline = make_params()  # torch.optim.Adam(foreach=True) on the same parameters: its count is the budget
    adam = torch.optim.Adam(baseline, lr=1e-3, foreach=True)
    for k in range(2):
        adam.zero_grad()
        objective(baseline, k).backward()
        if k == 0:
            adam.step()
    with SyncCounter() as adam_syncs:
        adam.step()
    assert adam_syncs.count > 0  # (its per-parameter step counters are read on the host)

    if info.constrained:
        assert syncs.count <= 2, syncs.calls
    else:
        assert syncs.count <= adam_syncs.count, (syncs.calls, adam_syncs.calls)
    if info.sync_free:
        assert syncs.count == 0, syncs.calls


@pytest.mark.parametrize("info", REGISTRY, ids=IDS)
def test_autocast_does_not_reach_the_step(info: OptimizerInfo) -> None:
    """Under ``torch.autocast`` (bf16, as Lightning's bf16-mixed runs the whole training step) the step's
    linear algebra still runs in the parameters' dtype: the same iterates as without autocast, bit for bit."""
    plain = make_params(torch.float32)
    mixed = make_params(torch.float32)
    opt_plain, opt_mixed = info.make(plain), info.make(mixed)
    for k in range(3):
        loss, kwargs = prepare(info, opt_plain, k)
        opt_plain.step(lambda: loss, **kwargs)
        loss, kwargs = prepare(info, opt_mixed, k)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            opt_mixed.step(lambda: loss, **kwargs)
    assert torch.equal(flat(plain), flat(mixed))


def test_a_closure_keeps_the_callers_autocast() -> None:
    """The step runs outside autocast, but a closure that evaluates the model sees the caller's settings."""
    from lit_constrained.optim import SQPAdam

    w = torch.nn.Parameter(torch.ones(3))
    seen: list[bool] = []

    def closure() -> Tensor:
        seen.append(torch.is_autocast_enabled("cpu"))
        w.grad = torch.ones(3)
        return (w * w).sum()

    opt = SQPAdam([w], lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        opt.step(closure, constraints=w.detach()[:1] - 1.0, jacobian=torch.tensor([[1.0, 0.0, 0.0]]))
    assert seen == [True]
