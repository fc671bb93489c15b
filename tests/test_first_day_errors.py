"""A new user's first-day mistakes (issue 30), each made as the user made it: the error or warning
must name the fix (the setting, argument, callback or helper to use), not only what went wrong."""

from __future__ import annotations

import functools
import traceback
import warnings

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained import ConstrainedModule
from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, SQPAdam
from tests.helpers.lightning import quiet_trainer


def samples(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.linspace(0.0, 2.0, n).unsqueeze(-1)
    return t, torch.exp(-t)


def full_batch(n: int) -> DataLoader:
    return DataLoader([samples(n)], batch_size=None)


class ExpFit(ConstrainedModule):
    """u(t) ~ exp(-t) by an MLP, with the ODE u' + u = 0 imposed at 3 points (torch.autograd.grad)."""

    def __init__(self, hidden: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        self.register_buffer("t_ode", torch.tensor([[0.25], [1.0], [1.75]]))

    def forward(self, t):
        return self.net(t)

    def objective(self, batch):
        t, u = batch
        return (self(t) - u).pow(2).mean()

    def constraints(self, batch):
        t = self.t_ode.clone().requires_grad_(True)
        u = self(t)
        (du,) = torch.autograd.grad(u.sum(), t, create_graph=True)
        return (du + u).reshape(-1)


class PointsOfTheBatch(ExpFit):
    """Constraints at the batch's own points (u = exp(-t) there): m is the batch size."""

    def constraints(self, batch):
        t, u = batch
        return (self(t) - u).reshape(-1)


class HandWrittenLaplacian(ExpFit):
    """A 2D Laplacian written with torch.autograd.grad, the second derivative in x without create_graph."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.field = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.register_buffer("x_pde", torch.tensor([[0.2, 0.3], [0.5, 0.5], [0.7, 0.1]]))

    def constraints(self, batch):
        x = self.x_pde.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.field(x).sum(), x, create_graph=True)
        (u_xx,) = torch.autograd.grad(grad[:, 0].sum(), x)  # the mistake: no create_graph=True
        (u_yy,) = torch.autograd.grad(grad[:, 1].sum(), x, create_graph=True)
        return u_xx[:, 0] + u_yy[:, 1]


class BothDerivativesWithoutGraph(HandWrittenLaplacian):
    """u_xx written with torch.autograd.grad, create_graph forgotten in both calls (issue 37)."""

    def constraints(self, batch):
        x = self.x_pde.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.field(x).sum(), x)  # the mistake, twice
        (u_xx,) = torch.autograd.grad(grad[:, 0].sum(), x)
        return u_xx[:, 0]


def printed(error: BaseException) -> str:
    """What the user reads: the message and its notes, as the traceback prints them."""
    return "".join(traceback.format_exception_only(type(error), error))


def fit(module, train, val=None, **trainer_kwargs):
    trainer = quiet_trainer(max_steps=trainer_kwargs.pop("max_steps", 3), **trainer_kwargs)
    trainer.fit(module, train, val)
    return trainer


def test_a_smaller_last_batch_names_drop_last_and_full_batch():
    rows = TensorDataset(*samples(200))  # 200 = 3 x 64 + 8
    with pytest.raises(ValueError) as caught:
        fit(PointsOfTheBatch(), DataLoader(rows, batch_size=64), max_steps=5)
    message = printed(caught.value)
    assert "returned 8 constraints, but 64 at the previous step" in message
    assert "drop_last=True" in message and "batch_mode='full'" in message


def test_the_summary_does_not_call_the_validation_points_imposed(capsys):
    rows = TensorDataset(*samples(192))
    fit(PointsOfTheBatch(), DataLoader(rows, batch_size=64, drop_last=True), DataLoader(TensorDataset(*samples(51)), batch_size=64),
        max_steps=3, val_check_interval=3, check_val_every_n_epoch=None)
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    violation = next(line for line in summary.splitlines() if line.strip().startswith("Violation/val"))
    assert "51 rows a batch" in violation and "not the m = 64" in violation, violation
    assert "m = 64 imposed constraints, constraints() on the val" not in violation


def test_objective_on_a_validation_batch_says_that_it_runs_there_and_what_it_got():
    # the user's validation loader gives the collocation points only (no targets)
    with pytest.raises(ValueError) as caught:
        fit(ExpFit(), full_batch(64), DataLoader([samples(51)[0]], batch_size=None))
    message = printed(caught.value)
    assert "too many values to unpack" in message  # the user's own error, kept
    assert "objective() failed on a validation batch" in message
    assert "on every validation and test batch too" in message and "Tensor (51, 1) float32" in message


def test_constant_step_adam_without_its_estimator_names_the_callback():
    with pytest.raises(ValueError) as caught:
        fit(ExpFit(optimizer=ConstantStepAdam), full_batch(64))
    message = printed(caught.value)
    assert "lr=None" in message and "lit_constrained.callbacks.LipschitzEstimator" in message
    assert "Trainer(callbacks=[" in message and "NoneType" not in message


def test_constant_step_adam_with_its_estimator_trains():
    from lit_constrained.callbacks import LipschitzEstimator

    module = ExpFit(optimizer=ConstantStepAdam)
    fit(module, full_batch(64), callbacks=[LipschitzEstimator(num_samples=2)])
    assert module.optimizers().optimizer.param_groups[0]["lr"] > 0


def test_precision_64_true_trains_in_float64(capsys):
    module = ExpFit()
    fit(module, full_batch(64), full_batch(41), precision="64-true", max_steps=3)
    assert module.dtype == torch.float64
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    assert "Violation/val" in summary and "not evaluated" not in summary


@pytest.mark.parametrize("optimizer", [
    functools.partial(SQPAdam, momentum=0.9),
    {"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"momentum": 0.9}},
])
def test_sqp_adam_given_momentum_names_sqp_heavyball_and_lists_its_arguments(optimizer):
    with pytest.raises(TypeError) as caught:
        fit(ExpFit(optimizer=optimizer), full_batch(64))
    message = printed(caught.value)
    assert "SQPAdam takes no 'momentum'" in message and "lit_constrained.optim.SQPHeavyBall" in message
    assert "its arguments are lr, betas, eps, rho" in message


def test_a_laplacian_without_create_graph_points_to_every_call_and_to_physics():
    with pytest.raises(RuntimeError) as caught:
        fit(HandWrittenLaplacian(), full_batch(64))
    message = printed(caught.value)
    assert "backward through the graph a second time" in message
    assert "create_graph=True in EVERY torch.autograd.grad call" in message and "lit_constrained.physics" in message


@pytest.mark.parametrize("validation", [True, False], ids=["validated-first", "no-validation"])
def test_create_graph_forgotten_in_both_derivative_calls_names_create_graph(validation):
    """Before (issue 37): with validation, a hint about the validation batch's shapes; without, no hint."""
    with pytest.raises(RuntimeError) as caught:
        fit(BothDerivativesWithoutGraph(), full_batch(64), full_batch(41) if validation else None)
    message = printed(caught.value)
    assert "does not require grad and does not have a grad_fn" in message  # torch's own error, kept
    assert "create_graph=True in EVERY torch.autograd.grad call" in message and "lit_constrained.physics" in message
    assert "failed on a validation batch" not in message


def test_the_derivative_fix_is_not_given_for_a_backward_of_a_graphless_value():
    from lit_constrained.hints import is_derivative_without_graph

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError) as through_grad:
        torch.autograd.grad(torch.autograd.grad(x.pow(2).sum(), x)[0].sum(), x)
    with pytest.raises(RuntimeError) as through_backward:
        torch.ones(()).backward()  # an objective that does not depend on the weights: another mistake
    assert is_derivative_without_graph(through_grad.value)
    assert not is_derivative_without_graph(through_backward.value)


def test_gradient_clip_val_names_max_grad_norm_before_lightning_refuses_it():
    with pytest.raises(ValueError) as caught:
        fit(ExpFit(), full_batch(64), gradient_clip_val=1.0)
    message = printed(caught.value)
    assert "max_grad_norm" in message and "switch to automatic optimization" not in message
    assert "--model.init_args.max_grad_norm 1.0" in message and "ExpFit(..., max_grad_norm=1.0)" in message


def test_gradient_clipping_by_max_grad_norm_trains():
    module = ExpFit(max_grad_norm=1.0)
    fit(module, full_batch(64))
    assert module.last_step is not None


def test_a_tensordataset_at_the_default_batch_size_warns_and_names_full_batch():
    with pytest.warns(UserWarning, match="ONE row per step") as caught:
        fit(ExpFit(), DataLoader(TensorDataset(*samples(64))), max_steps=2)
    message = next(str(w.message) for w in caught if "ONE row per step" in str(w.message))
    assert "DataLoader([dataset.tensors], batch_size=None)" in message and "RowDataModule" in message


def test_full_batch_and_explicit_batch_sizes_do_not_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(ExpFit(), full_batch(64), max_steps=2)
        fit(ExpFit(), DataLoader(TensorDataset(*samples(64)), batch_size=16), max_steps=2)
    assert not [w for w in caught if "row per step" in str(w.message)]


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, MoMo])
def test_an_unconstrained_optimizer_warns_once_and_the_summary_says_monitored(optimizer, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(ExpFit(optimizer=optimizer), full_batch(64), full_batch(41), max_steps=3)
    notes = [str(w.message) for w in caught if "does not impose constraints" in str(w.message)]
    assert len(notes) == 1 and "SQPAdam" in notes[0] and "monitored, not imposed" in notes[0], notes
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    assert "over the m = 3 constraints, monitored, not imposed" in summary
    assert "imposed constraints" not in summary


def test_a_constrained_optimizer_is_not_warned_about():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(ExpFit(), full_batch(64), max_steps=2)
    assert not [w for w in caught if "does not impose" in str(w.message) or "no constraints" in str(w.message)
                or "declares none" in str(w.message)]


class NoConstraints(ConstrainedModule):
    """A task that forgot imposed()/constraints(): only the objective (issue 37)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Linear(1, 1)

    def objective(self, batch):
        t, u = batch
        return (self.net(t) - u).pow(2).mean()


@pytest.mark.parametrize("optimizer", [None, AdamCon], ids=["the default SQPAdam", "AdamCon"])
def test_a_constrained_optimizer_with_nothing_to_impose_warns_once_naming_the_fix(optimizer):
    """Before (issue 37): it trained silently."""
    module = NoConstraints() if optimizer is None else NoConstraints(optimizer=optimizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(module, full_batch(16), max_steps=3)
    notes = [str(w.message) for w in caught if "declares none" in str(w.message)]
    name = "SQPAdam" if optimizer is None else "AdamCon"
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"{name} imposes constraints, and NoConstraints declares none")
    assert "define imposed()" in notes[0] and "constraints()" in notes[0] and "torch.optim.Adam" in notes[0]
    assert not [w for w in caught if "was given no constraints" in str(w.message)]  # said once, not twice


class PlainLightningModule(pl.LightningModule):
    """Not a ConstrainedModule: Lightning's automatic optimization, SQPAdam as its optimizer (issue 37)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_index):
        t, u = batch
        return (self.net(t) - u).pow(2).mean()

    def configure_optimizers(self):
        return SQPAdam(self.parameters())


def test_sqp_adam_on_a_plain_lightning_module_warns_once_naming_constrained_module():
    """Before (issue 37): it trained silently, as Adam."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(PlainLightningModule(), full_batch(16), max_steps=3)
    notes = [str(w.message) for w in caught if "was given no constraints" in str(w.message)]
    assert len(notes) == 1, notes
    assert notes[0].startswith("SQPAdam.step() was given no constraints")
    assert "lit_constrained.ConstrainedModule" in notes[0] and "torch.optim.Adam" in notes[0]


def test_an_unconstrained_optimizer_on_a_task_without_constraints_is_not_warned_about():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(NoConstraints(optimizer=torch.optim.Adam), full_batch(16), max_steps=2)
    assert not [w for w in caught if "declares none" in str(w.message) or "does not impose" in str(w.message)]


def test_the_penalty_baseline_is_called_penalized():
    with pytest.warns(UserWarning, match="penalized") as caught:
        fit(ExpFit(optimizer=torch.optim.Adam, penalty_weight=10.0), full_batch(64), max_steps=2)
    assert any("penalty_weight=10" in str(w.message) for w in caught)
