"""RunHealth: one warning (log and fit summary) for divergence and for infeasible constraints; none for a
healthy run; lr = 0 with rho="full" said at the start, and what it does checked against a dense solve."""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained import ConstrainedModule
from lit_constrained.callbacks.health import RunHealth, RunHealthWarning, _Observation
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData, CurveFit
from tests.helpers.lightning import quiet_trainer


def _fit(model: Any, steps: int, data: Any = None) -> list[str]:
    """Fit ``model`` with a diagnostic on every step; the RunHealth warnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=steps, limit_val_batches=0, log_every_n_steps=1).fit(
            model, data if data is not None else CurveData(num_samples=16, batch_size=16)
        )
    return [str(w.message) for w in caught if issubclass(w.category, RunHealthWarning)]


def _summary_warnings(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("  warning      ")]


def test_a_diverging_run_warns_once_in_the_log_and_the_summary(capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    found = _fit(CurveFit(hidden=8, optimizer=functools.partial(SQPAdam, lr=1e6), lr_decay="none"), steps=30)
    assert len(found) == 1 and "the run is diverging" in found[0] and "Try a smaller lr (now 1e+06" in found[0]
    # once among the summary's warnings (the feasibility line of the end max |c| may be there too)
    assert len([line for line in _summary_warnings(capsys.readouterr().out) if "the run is diverging" in line]) == 1


class ConstantConstraints(CurveFit):
    """Three residuals equal to 1 whatever the weights (they depend on the weights only through 0 * x)."""

    def constraints(self, batch: Any) -> torch.Tensor:
        x = next(self.parameters())
        return torch.ones(3, dtype=x.dtype) + 0.0 * x.sum()


def test_infeasible_constraints_warn_once_in_the_log_and_the_summary(capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    found = _fit(ConstantConstraints(hidden=8, optimizer=functools.partial(SQPAdam, lr=1e-2)), steps=40)
    assert len(found) == 1 and "the constraints look infeasible" in found[0]
    assert "rank of J 0 < m = 3" in found[0] and "is 100% of ||c||" in found[0]
    found = [line for line in _summary_warnings(capsys.readouterr().out) if "the constraints look infeasible" in line]
    assert len(found) == 1


def test_a_healthy_run_warns_nothing(capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    assert _fit(CurveFit(hidden=8, optimizer=functools.partial(SQPAdam, lr=1e-2)), steps=60) == []
    assert _summary_warnings(capsys.readouterr().out) == []


def _observe(health: RunHealth, f: float, c: float, step: int) -> None:
    trainer = SimpleNamespace(optimizers=[], is_global_zero=True)
    health._check_divergence(trainer, _Observation(step=step, objective=f, violation=c, feasibility_error=None))


def test_the_divergence_rule_on_given_sequences() -> None:
    # restoring the constraints raises f 1e5-fold at the first step (left out of the minimum), then f falls
    legit = RunHealth()
    for step, (f, c) in enumerate([(1e-6, 10.0), (1e-1, 1e-3), (5e-2, 1e-4), (1e-2, 1e-5), (1e-5, 1e-3)]):
        _observe(legit, f, c, step)
    assert legit.findings == {}
    # f 1000x above its lowest since the first step, and above the start
    grown = RunHealth()
    for step, f in enumerate([1.0, 0.5, 0.2, 201.0]):
        _observe(grown, f, 1e-3, step)
    assert "objective grew to 2.01e+02 at step 3" in grown.findings["diverging"]
    nonfinite = RunHealth()
    _observe(nonfinite, 1.0, 1.0, 0)
    _observe(nonfinite, float("nan"), 1.0, 1)
    assert "objective is not finite at step 1" in nonfinite.findings["diverging"]


class LinearConstraints(ConstrainedModule):
    """x in R^5, f = ||x||^2 / 2, c = A x - b (2 rows): J = A."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        generator = torch.Generator().manual_seed(1)
        self.x = torch.nn.Parameter(torch.randn(5, generator=generator, dtype=torch.float64))
        self.register_buffer("A", torch.randn(2, 5, generator=generator, dtype=torch.float64))
        self.register_buffer("b", torch.randn(2, generator=generator, dtype=torch.float64))

    def objective(self, batch: Any) -> torch.Tensor:
        return 0.5 * self.x.pow(2).sum()

    def constraints(self, batch: Any) -> torch.Tensor:
        return self.A @ self.x - self.b


def _one_batch() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(1, 1)), batch_size=1)


def _projection(model: LinearConstraints, x0: torch.Tensor) -> torch.Tensor:
    """Independently: the minimum-norm correction of the linear constraints, x0 - A^+ (A x0 - b)."""
    return x0 - torch.linalg.pinv(model.A) @ (model.A @ x0 - model.b)


@pytest.mark.parametrize("settings, moves", [
    ({"rho": "full", "max_normal_step": None, "max_corrections": 0}, "the full normal step"),
    ({"rho": 1.0, "max_corrections": 3}, "up to 3 Gauss-Newton corrections"),
])
def test_lr_zero_that_still_moves_the_weights_warns_and_projects_onto_the_constraints(
    settings: dict[str, Any], moves: str
) -> None:
    model = LinearConstraints(optimizer=functools.partial(SQPAdam, lr=0.0, **settings))
    x0 = model.x.detach().clone()
    found = _fit(model, steps=1, data=_one_batch())
    assert len(found) == 1 and found[0].startswith("lit-constrained: lr = 0 (SQPAdam)") and moves in found[0]
    torch.testing.assert_close(model.x.detach(), _projection(model, x0), rtol=1e-10, atol=1e-12)


def test_lr_zero_with_a_numeric_rho_and_no_corrections_is_no_step_and_no_warning() -> None:
    model = LinearConstraints(optimizer=functools.partial(SQPAdam, lr=0.0, rho=1.0, max_corrections=0))
    x0 = model.x.detach().clone()
    assert _fit(model, steps=2, data=_one_batch()) == []
    assert torch.equal(model.x.detach(), x0)


def test_a_fit_resumed_at_a_feasible_point_is_not_called_diverging_for_round_off() -> None:
    # the same max |c| after step 20 of a float32 run: the uninterrupted run started at 76, the resumed
    # one starts its references at step 20, where max |c| is round-off (float32 sqrt(eps) = 3.5e-4)
    tail = [(0.31, 4e-6), (0.31, 1e-9), (0.31, 2e-7), (0.31, 6e-6), (0.31, 1e-5)]
    uninterrupted, resumed = RunHealth(), RunHealth()
    for step, (f, c) in enumerate([(1.9, 76.0)] + tail):
        _observe(uninterrupted, f, c, step)
    for step, (f, c) in enumerate(tail, start=20):
        _observe(resumed, f, c, step)
    assert uninterrupted.findings == {} and resumed.findings == {}
    # a real divergence from a feasible start is still one: max |c| to 1e-2 (10^7 x its lowest)
    diverged = RunHealth()
    for step, (f, c) in enumerate(tail + [(0.31, 1e-2)], start=20):
        _observe(diverged, f, c, step)
    assert "max |c| grew to 1.00e-02 at step 25" in diverged.findings["diverging"]
