"""The density task (lit_constrained/tasks/density.py, density_data.py): exact draws from p* (against its
closed-form CDF), the rows and their senses from the imposed parts (a coupled mass row, per-point bounds), and short fits: SQP-Adam holds the
mass and p >= 0 at the imposed points, Adam alone lets the fit go negative."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from lit_constrained.tasks.density import Density, DensityData
from lit_constrained.tasks.density_data import density_exact, density_points, density_samples
from lit_constrained.stepping import row_signs
from tests.helpers.lightning import quiet_trainer


def test_the_samples_follow_the_closed_form_cdf() -> None:
    x = np.sort(density_samples(20000, seed=1))
    cdf = 0.5 + 0.75 * x - 0.25 * x**3
    empirical = np.arange(1, len(x) + 1) / len(x)
    assert np.all(np.abs(x) <= 1)
    assert np.max(np.abs(cdf - empirical)) < 1.63 / np.sqrt(len(x))  # Kolmogorov-Smirnov at the 1 % level


def test_the_density_has_mass_one_and_the_quadrature_integrates_it() -> None:
    arrays = density_points(n_quad=512)
    # p* has kinks at +-1 (Gauss-Legendre is not exact there): the mass to 1e-4
    assert float(np.sum(arrays["w_quad"] * density_exact(arrays["x_quad"][:, 0]))) == pytest.approx(1.0, abs=1e-4)
    assert float(np.trapezoid(arrays["p_test"], arrays["x_test"][:, 0])) == pytest.approx(1.0, abs=1e-5)


def _batch(split: str, dtype: torch.dtype = torch.float64, **data: Any) -> dict[str, torch.Tensor]:
    module = DensityData(**data)
    return {k: v.to(dtype) for k, v in module.collate(split)(list(range(module._n_rows(split)))).items()}


def test_the_rows_are_the_mass_equality_and_the_bounds_below() -> None:
    torch.manual_seed(0)
    task = Density(dtype="float64")
    batch = _batch("train", n_nonnegative=11)
    c = task.constraints(batch)
    with torch.no_grad():
        mass = float((batch["w_quad"] * task(batch["x_quad"])).sum())
        assert float(c[0]) == pytest.approx(mass - 1, abs=1e-14)
        torch.testing.assert_close(c[1:], task(batch["x_nonnegative"]))
    assert [(p.name, p.size, p.sense) for p in task.imposed_layout] == [("mass", 1, "="), ("nonnegative", 11, ">=")]
    assert row_signs(task, 12).tolist() == [0] + [-1] * 11


def _fit(optimizer: dict[str, Any], steps: int = 25) -> tuple[Density, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    task = Density(dtype="float64", hidden=16, num_threads=1, optimizer=optimizer)
    data = DensityData(n_samples=400, n_quad=128, n_nonnegative=31, n_test=301)
    quiet_trainer(max_steps=steps, limit_val_batches=0).fit(task, data)
    return task, _batch("val", n_samples=400, n_quad=128, n_nonnegative=31, n_test=301)


def test_sqp_adam_holds_the_mass_and_the_bound_adam_does_not() -> None:
    task, batch = _fit({"class_path": "lit_constrained.optim.SQPAdam",
                        "init_args": {"lr": 1e-2, "rho": "full", "rcond": 1e-12}})
    with torch.no_grad():
        assert float(task(batch["x_nonnegative"]).min()) >= -1e-6
        assert float(task.mass(batch)) == pytest.approx(1.0, abs=1e-6)
    adam, _ = _fit({"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-2}})
    with torch.no_grad():
        assert float(adam(batch["x_nonnegative"]).min()) < -1e-3 or abs(float(adam.mass(batch)) - 1) > 1e-3
