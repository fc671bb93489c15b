"""The PINNacle tasks: their points lie where they belong, their residuals match nested autograd, their
per-point Jacobian the dense one, their objective is PINNacle's sum of MSEs, and a short fit imposes
their conditions (small networks and point counts: the tests take seconds)."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.physics.features import FourierFeatures
from lit_constrained.tasks import pinnacle
from lit_constrained.tasks.pinnacle import BurgersPinnacle, HeatPinnacle, PinnacleData, PoissonPinnacle, WavePinnacle
from lit_constrained.tasks.pinnacle_burgers_data import NU, burgers_exact
from lit_constrained.tasks.pinnacle_heat_data import DIFFUSIVITY, heat_exact
from lit_constrained.tasks.pinnacle_poisson_data import CENTERS, RADIUS
from lit_constrained.tasks.pinnacle_wave_data import wave_exact

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"n_pde": 12, "n_boundary": 8, "n_pde_imposed": 3, "n_boundary_imposed": 4, "n_check": 6, "cache_dir": None}
TIMED = {"n_initial": 8, "n_initial_imposed": 3}
DATA = {
    "burgers": (BurgersPinnacle, functools.partial(PinnacleData, "burgers"), {**SMALL, **TIMED, "test_grid": [9, 5]}),
    "poisson": (PoissonPinnacle, functools.partial(PinnacleData, "poisson"), {**SMALL, "test_grid": [40, 4]}),
    "wave": (WavePinnacle, functools.partial(PinnacleData, "wave"), {**SMALL, **TIMED, "test_grid": [9]}),
    "heat": (HeatPinnacle, functools.partial(PinnacleData, "heat"), {**SMALL, **TIMED, "test_grid": [9, 3, 3]}),
}


def small(problem: str, **overrides):
    task, data, args = DATA[problem]
    torch.manual_seed(0)
    return task(hidden=8, depth=2, dtype="float64"), data(**{**args, **overrides})


def test_burgers_points_lie_where_they_belong_and_are_seeded():
    _, data = small("burgers")
    a = data.arrays
    assert ((a["x_pde"][:, 0] > -1) & (a["x_pde"][:, 0] < 1) & (a["x_pde"][:, 1] > 0) & (a["x_pde"][:, 1] < 1)).all()
    for key in ("x_boundary", "x_boundary_imposed", "x_boundary_check"):
        assert np.isin(a[key][:, 0], [-1.0, 1.0]).all(), key
    for key in ("x_initial", "x_initial_imposed", "x_initial_check"):
        assert (a[key][:, 1] == 0).all(), key
    assert a["x_test"].shape == (45, 2)
    assert np.allclose(a["u_test"], burgers_exact(a["x_test"][:, 0], a["x_test"][:, 1]))
    again = small("burgers")[1].arrays
    assert all(np.array_equal(a[k], again[k]) for k in a)
    assert not np.array_equal(a["x_pde"], a["x_pde_imposed"][:1].repeat(len(a["x_pde"]), 0))


def test_poisson_points_avoid_the_holes_and_share_the_boundary_by_length():
    _, data = small("poisson", n_pde=200, n_boundary=400)
    a = data.arrays
    distance = np.linalg.norm(a["x_pde"][:, None] - CENTERS[None], axis=2).min(1)
    assert (distance > RADIUS).all() and (np.abs(a["x_pde"]) < 0.5).all()
    assert a["x_pde"].shape == (200, 2)
    outer, holes = a["x_outer"], a["x_holes"]
    assert len(outer) + len(holes) == 400
    assert abs(len(outer) / 400 - 4 / (4 + 0.8 * math.pi)) < 0.05  # by arc length: sides 4, circles 0.8 pi
    assert (np.abs(outer) == 0.5).any(1).all() and (np.abs(outer) <= 0.5).all()
    on_circle = np.linalg.norm(holes[:, None] - CENTERS[None], axis=2).min(1)
    assert np.allclose(on_circle, RADIUS)
    assert np.isfinite(a["u_test"]).all() and (a["u_test"] >= 0).all() and (a["u_test"] <= 1).all()
    assert np.allclose(a["u_test"][(np.abs(a["x_test"]) == 0.5).any(1)], 1.0)


def test_wave_and_heat_points_lie_where_they_belong():
    a = small("wave")[1].arrays
    assert np.isin(a["x_boundary"][:, 0], [0.0, 1.0]).all() and (a["x_initial"][:, 1] == 0).all()
    assert np.allclose(a["u_test"], wave_exact(torch.from_numpy(a["x_test"])).numpy())
    h = small("heat")[1].arrays
    assert (np.isin(h["x_boundary"][:, 0], [0.0, 1.0]) | np.isin(h["x_boundary"][:, 1], [0.0, 1.0])).all()
    assert ((h["x_boundary"][:, 2] >= 0) & (h["x_boundary"][:, 2] <= 5)).all() and (h["x_initial"][:, 2] == 0).all()
    assert np.allclose(h["u_test"], heat_exact(torch.from_numpy(h["x_test"])).numpy())


def _grads(model, x):
    """u, its gradient and the diagonal of its Hessian by nested torch.autograd.grad (the reference)."""
    x = x.clone().requires_grad_(True)
    u = model(x)
    (g,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    second = torch.stack([torch.autograd.grad(g[:, i].sum(), x, create_graph=True)[0][:, i]
                          for i in range(x.shape[1])], 1)
    return u, g, second


@pytest.mark.parametrize("problem", list(DATA))
def test_pde_residual_matches_nested_autograd(problem):
    model, data = small(problem)
    x = model.prepare_batch(next(iter(data.train_dataloader())))["x_pde"]
    u, g, h = _grads(model, x)
    expected = {
        "burgers": lambda: g[:, 1] + u * g[:, 0] - NU * h[:, 0],
        "poisson": lambda: -(h[:, 0] + h[:, 1]),
        "wave": lambda: h[:, 1] - 4.0 * h[:, 0],
        "heat": lambda: g[:, 2] - DIFFUSIVITY[0] * h[:, 0] - DIFFUSIVITY[1] * h[:, 1],
    }[problem]()
    assert torch.allclose(model.pde_residual(x), expected, atol=1e-12)


def test_wave_initial_residual_has_the_value_and_the_velocity():
    model, data = small("wave")
    x = model.prepare_batch(next(iter(data.train_dataloader())))["x_initial"]
    u, g, _ = _grads(model, x)
    r = model.initial_residual(x)
    assert r.shape == (len(x), 2)
    assert torch.allclose(r[:, 0], u - torch.sin(math.pi * x[:, 0]) - 0.5 * torch.sin(4 * math.pi * x[:, 0]))
    assert torch.allclose(r[:, 1], g[:, 1])


@pytest.mark.parametrize("problem", list(DATA))
def test_objective_is_the_sum_of_the_conditions_mse_and_the_jacobian_the_dense_one(problem):
    model, data = small(problem)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    by_hand = 0.0
    for name in model.conditions:
        r = model.residual(name)(batch[f"x_{name}"])
        by_hand = by_hand + (r.pow(2).mean(0).sum() if r.dim() == 2 else r.pow(2).mean())
    assert torch.allclose(model.objective(batch), by_hand)
    parts = model.imposed(batch)
    assert list(parts) == list(model.conditions)
    c = model.constraints(batch)
    widths = {"wave": {"initial": 2}}.get(problem, {})
    assert c.shape == (sum(len(p.points) * widths.get(n, 1) for n, p in parts.items()),)
    params = list(model.parameters())
    dense = constraint_jacobian(c, params, method="loop")
    assert torch.allclose(model.constraint_jacobian(batch, c, params), dense, atol=1e-10)


def test_nothing_imposed_means_no_parts_and_validation_covers_every_condition():
    model, data = small("burgers", n_pde_imposed=0, n_boundary_imposed=0, n_initial_imposed=0)
    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    assert model.imposed(batch) is None
    assert model.validation_constraints(batch).shape == (3 * 6,)
    rel = model.evaluation_metrics(batch, "val")["rel_l2"]
    expected = (model(batch["x_test"]) - batch["u_test"]).norm() / batch["u_test"].norm()
    assert torch.allclose(rel, expected)
    with pytest.raises(ValueError, match="n_pde must be an integer >= 1"):
        PinnacleData("burgers", n_pde=0, cache_dir=None)


def test_one_data_module_serves_every_problem_with_its_own_defaults_and_refuses_what_it_lacks():
    """PinnacleData(problem): an argument left out is the problem's generator's default (Poisson2d-C
    imposes 25 boundary points by default, Wave1d-C 12), so the arrays equal the generator's own."""
    from lit_constrained.tasks.pinnacle_poisson_data import poisson_points
    from lit_constrained.tasks.pinnacle_wave_data import wave_points

    wave = PinnacleData("wave", n_pde=12, n_check=6, test_grid=[9], cache_dir=None)
    expected = wave_points(n_pde=12, n_check=6, n_test=9)
    assert wave.arrays.keys() == expected.keys() and all(np.array_equal(wave.arrays[k], expected[k]) for k in expected)
    assert wave.arrays["x_boundary_imposed"].shape[0] == 12
    poisson = PinnacleData("poisson", n_pde=12, n_check=6, test_grid=[40, 4], cache_dir=None)
    assert poisson.arrays["x_outer_imposed"].shape[0] + poisson.arrays["x_holes_imposed"].shape[0] == 25
    assert np.array_equal(poisson.arrays["u_test"], poisson_points(n_pde=12, n_check=6, n_reference=40)["u_test"])
    with pytest.raises(ValueError, match="'poisson' has no n_initial"):
        PinnacleData("poisson", n_initial=8, cache_dir=None)
    with pytest.raises(ValueError, match=r"test_grid of 'heat' takes 3 sizes \(n_test_x, n_test_y, n_test_t\)"):
        PinnacleData("heat", test_grid=[9], cache_dir=None)
    with pytest.raises(ValueError, match="problem must be one of"):
        PinnacleData("helmholtz", cache_dir=None)


@pytest.mark.parametrize("problem", ["poisson", "wave"])
def test_a_short_fit_with_sqp_adam_imposes_the_conditions(problem):
    """Ten SQP-Adam steps (lr 1e-4, the full normal step) on a small network: max |c| falls by 1e3 or more."""
    task, data_cls, args = DATA[problem]
    torch.manual_seed(0)
    model = task(hidden=16, depth=2, dtype="float64", num_threads=1,
                 optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 1e-4, "rho": "full"}})
    data = data_cls(**args)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    start = float(model.constraints(batch).detach().abs().max())
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(model, data)
    end = float(model.constraints(batch).detach().abs().max())
    assert end < 1e-3 * start


def test_the_pinnacle_names_map_to_the_tasks():
    assert set(pinnacle.PINNACLE_NAMES) == {"Burgers1d-C", "Poisson2d-C", "Wave1d-C", "Heat2d-MS"}
    assert all(issubclass(t, pinnacle.PinnacleTask) for t in pinnacle.PINNACLE_NAMES.values())
    model = PoissonPinnacle(fourier_features=0)  # PINNacle's network
    assert [p.shape for p in model.net.parameters()][:2] == [torch.Size([100, 2]), torch.Size([100])]
    assert sum(isinstance(m, torch.nn.Tanh) for m in model.net) == 5


def test_the_default_network_puts_five_fourier_features_in_front():
    model = PoissonPinnacle()
    features = model.net[0]
    assert isinstance(features, FourierFeatures) and features.frequencies == 5
    assert features.out_features == 2 * 2 * 5  # sin and cos of K = 5 frequencies per coordinate, d = 2
    assert [p.shape for p in model.net.parameters()][:1] == [torch.Size([100, 20])]
    assert not list(features.parameters())  # fixed: buffers, nothing to train


PINNACLE_CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("pinnacle_*/**/*.yaml")
                          if p.relative_to(ROOT).parts[1].removeprefix("pinnacle_") in DATA)  # the inverse ones: test_pinnacle_inverse.py


@pytest.mark.parametrize("config", PINNACLE_CONFIGS)
def test_every_pinnacle_config_trains_through_the_command_line(config, tmp_path, monkeypatch):
    """Two steps of ``lit-constrained fit --config <config>`` (the shipped config, only its sizes made
    small): the data module is built by LightningCLI, whose ``_class_path`` hyperparameter once reached
    the point generator (``heat_points() got an unexpected keyword argument '_class_path'``). The
    vanilla configs (nothing imposed) are not warned that constraints are monitored, not imposed: they
    have none."""
    import warnings

    import yaml

    from lit_constrained.cli.fit import main

    args = yaml.safe_load((ROOT / config).read_text())["data"]["init_args"]
    problem = Path(config).parts[1].removeprefix("pinnacle_")
    small_data = {k: v for k, v in DATA[problem][2].items() if not k.endswith("_imposed")}  # this file's sizes
    small_data |= {k: min(v, 3) for k, v in args.items() if k.endswith("_imposed")}  # the config's, at most 3
    overrides = [f"--data.init_args.{k}={'null' if v is None else v}" for k, v in small_data.items()]
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with contextlib.redirect_stdout(io.StringIO()) as out, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "--config", str(ROOT / config), *overrides, "--model.init_args.hidden=8",
              "--model.init_args.depth=2", "--trainer.max_epochs=2", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
              f"--trainer.default_root_dir={tmp_path}"])
    assert "steps        2 in" in out.getvalue()  # the fit summary
    assert not [w for w in caught if "does not impose constraints" in str(w.message)]
