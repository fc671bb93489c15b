"""FitSummary's feasibility finding: a fit whose imposed max |c| ends above the optimizer's tolerance says
so in its summary with the measured floors and the fix, and warns from ``WARN_AFTER_STEPS`` steps on."""

from __future__ import annotations

import re
import warnings

import torch

from lit_constrained.module_parts.constraint_precision import WARN_AFTER_STEPS
from lit_constrained.tasks.poisson import Poisson, PoissonData
from tests.helpers.lightning import quiet_trainer


def _fit(steps: int, capsys) -> tuple[str, list[warnings.WarningMessage]]:
    torch.manual_seed(0)
    # a tolerance no float32 evaluation reaches (1e-10 x max |c_1|): the finding must appear
    model = Poisson(hidden=8, constraint_dtype="native", num_threads=1,
                    optimizer={"class_path": "lit_constrained.optim.SQPAdam",
                               "init_args": {"lr": 1e-3, "constraint_tol": 1e-10}})
    data = PoissonData(n_pde=30, n_boundary=12, n_pde_imposed=6, n_boundary_imposed=6, n_check=4, n_test=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(max_steps=steps, limit_val_batches=0).fit(model, data)
    return capsys.readouterr().out.split("fit summary", 1)[1], caught


def _findings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "above the optimizer's tolerance" in str(w.message)]


def test_a_fit_above_the_tolerance_is_warned_with_its_floors_and_the_fix(capsys):
    summary, caught = _fit(WARN_AFTER_STEPS, capsys)
    line = next(line for line in summary.splitlines() if "above the optimizer's tolerance" in line)
    assert line.startswith("  warning      the imposed constraints end at max |c| = ")
    floor = re.search(r"max \|c - c_64\| at the final weights is ([0-9.e+-]+);", line)
    assert floor is not None and float(floor.group(1)) > 0  # the float32 evaluation noise, measured
    weights = re.search(r"one ulp of every weight moves c by ([0-9.e+-]+):", line)
    assert weights is not None and float(weights.group(1)) > 0
    # the fix for where it ended (each branch: tests/module_parts/test_constraint_precision.py)
    assert "train the network in float64" in line or "constraint_dtype='float64'" in line
    assert _findings(caught) == [f"lit-constrained: {line.removeprefix('  warning      ')}"]


def test_a_short_fit_says_it_without_a_warning(capsys):
    summary, caught = _fit(3, capsys)
    assert "above the optimizer's tolerance" in summary
    assert _findings(caught) == []
