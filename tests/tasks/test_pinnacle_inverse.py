"""The inverse tasks (PInv, HInv): the closed forms against their PDEs by nested autograd, the observations'
noise and points, the constraint Jacobian over both networks against central finite differences (float64),
the band's rows (senses and values), the objective by hand, and a few steps through the command line."""

from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_constrained.imposed import layout_signs, part_layout, imposed_values, violated_part
from lit_constrained.tasks.pinnacle_inverse import HeatInverse, HeatInverseData, PoissonInverse, PoissonInverseData
from lit_constrained.tasks.pinnacle_inverse_data import (
    NOISE, hinv_a, hinv_source, hinv_u, pinnacle_pinv_source, pinv_a, pinv_source, pinv_u,
)

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"n_pde": 16, "n_coef": 8, "n_pde_imposed": 3, "n_coef_imposed": 2, "n_band_imposed": 3, "n_check": 5,
         "cache_dir": None}
DATA = {
    "pinv": (PoissonInverse, PoissonInverseData, {**SMALL, "n_test": 11}),
    "hinv": (HeatInverse, HeatInverseData, {**SMALL, "n_obs": 200, "n_test_xy": 5, "n_test_t": 3}),
}


def small(problem: str, **overrides):
    task, data, args = DATA[problem]
    torch.manual_seed(0)
    return task(hidden=4, depth=2, dtype="float64"), data(**{**args, **overrides})


def _divergence_of_flux(u_fn, a_fn, x):
    """div(a grad u) over x's first two coordinates, and u_t (the third, if any), by nested autograd."""
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(u_fn(x).sum(), x, create_graph=True)
    a = a_fn(x)
    div = sum(torch.autograd.grad((a * g[:, i]).sum(), x, create_graph=True)[0][:, i] for i in range(2))
    return div, g


def test_pinv_source_is_minus_the_divergence_of_the_flux_of_its_u_and_a():
    x = torch.rand(64, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    div, _ = _divergence_of_flux(pinv_u, pinv_a, x)
    assert torch.allclose(pinv_source(x), -div, atol=1e-12, rtol=0)
    edge = torch.tensor([[0.0, 0.3], [1.0, 0.7], [0.2, 0.0], [0.9, 1.0]], dtype=torch.float64)
    assert pinv_u(edge).abs().max() < 1e-15  # u = 0 on the boundary (PINNacle imposes no condition on u)
    assert torch.allclose(pinv_a(torch.tensor([[0.5, 0.5]], dtype=torch.float64)), torch.tensor([1 / 2.0], dtype=torch.float64))


def test_pinnacles_pinv_source_differs_from_its_own_pair_by_4_pi_sin_a_squared():
    """PINNacle's f_src has (2x + 1), (2y + 1) where grad a gives (2x - 1), (2y - 1): the difference is
    4 pi sin(pi (x + y)) a^2, about 39 % of f in L2 on a grid."""
    grid = torch.stack(torch.meshgrid(*(torch.linspace(0, 1, 101, dtype=torch.float64),) * 2, indexing="ij"), -1).reshape(-1, 2)
    difference = pinnacle_pinv_source(grid) - pinv_source(grid)
    expected = 4 * math.pi * torch.sin(math.pi * grid.sum(1)) * pinv_a(grid) ** 2
    assert torch.allclose(difference, expected, atol=1e-12, rtol=0)
    assert 0.38 < float(difference.norm() / pinv_source(grid).norm()) < 0.40


def test_hinv_source_is_the_heat_equations_residual_of_its_u_and_a():
    x = torch.rand(64, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x[:, :2] = 2 * x[:, :2] - 1
    div, g = _divergence_of_flux(hinv_u, hinv_a, x)
    assert torch.allclose(hinv_source(x), g[:, 2] - div, atol=1e-11, rtol=0)
    sides = torch.tensor([[-1.0, 0.3, 0.5], [1.0, -0.2, 0.1], [0.4, 1.0, 0.9]], dtype=torch.float64)
    assert hinv_u(sides).abs().max() < 1e-15 and torch.allclose(hinv_a(sides), torch.full((3,), 2.0, dtype=torch.float64))


@pytest.mark.parametrize("problem", list(DATA))
def test_observations_are_the_exact_u_plus_seeded_noise_of_pinnacles_sigma(problem):
    data = (PoissonInverseData if problem == "pinv" else HeatInverseData)(n_band_imposed=50, cache_dir=None)
    a = data.arrays
    x, d = torch.from_numpy(a["x_obs"]), a["d_obs"]
    exact = (pinv_u if problem == "pinv" else hinv_u)(x).numpy()
    noise = d - exact
    assert len(d) == 2500 and abs(noise.mean()) < 3 * NOISE / 50 and abs(noise.std() / NOISE - 1) < 0.05
    assert np.abs(noise).max() < 5 * NOISE  # the truth lies in the default band (k = 5) at every observation
    if problem == "pinv":  # PINNacle's 50 x 50 linspace grid, the boundary included
        assert np.allclose(np.unique(a["x_obs"][:, 0]), np.linspace(0, 1, 50))
        on_boundary = (np.abs(a["x_coef"] - 0.5) == 0.5).any(1)
    else:
        assert (np.abs(a["x_obs"][:, :2]) <= 1).all() and ((a["x_obs"][:, 2] >= 0) & (a["x_obs"][:, 2] <= 1)).all()
        assert a["x_coef"].shape[1] == 2  # a's boundary: the square's sides (a depends on x, y only)
        on_boundary = (np.abs(a["x_coef"]) == 1).any(1)
    assert on_boundary.all()
    band = a["x_band_imposed"]
    rows = [np.flatnonzero((a["x_obs"] == p[:-1]).all(1)) for p in band]
    assert all(len(r) == 1 and d[r[0]] == p[-1] for r, p in zip(rows, band))  # each packed (x_i, d_i) an observation
    again = (PoissonInverseData if problem == "pinv" else HeatInverseData)(n_band_imposed=50, cache_dir=None).arrays
    assert all(np.array_equal(a[k], again[k]) for k in a)


@pytest.mark.parametrize("problem", list(DATA))
def test_the_jacobian_covers_both_networks_and_matches_central_differences(problem):
    """J of every imposed row over all weights of u's and a's networks (float64) against central differences;
    the pde rows depend on both networks, the band rows on u's only, the coef rows on a's only."""
    model, data = small(problem)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    params = list(model.parameters())
    c = model.constraints(batch)
    J = model.constraint_jacobian(batch, c, params)
    flat = torch.nn.utils.parameters_to_vector(params).detach()
    h, columns = 1e-6, []
    for j in range(flat.numel()):
        values = []
        for sign in (1, -1):
            moved = flat.clone()
            moved[j] += sign * h
            torch.nn.utils.vector_to_parameters(moved, params)
            values.append(model.constraints(batch).detach())
        columns.append((values[0] - values[1]) / (2 * h))
    torch.nn.utils.vector_to_parameters(flat, params)
    fd = torch.stack(columns, 1)
    assert J.shape == fd.shape == (3 + 2 + 3 + 3, flat.numel())
    assert torch.allclose(J, fd, atol=1e-7, rtol=1e-6)
    n_u = sum(p.numel() for p in model.u_net.parameters())
    pde, coef, band = J[:3], J[3:5], J[5:]
    assert pde[:, :n_u].abs().max() > 1e-3 and pde[:, n_u:].abs().max() > 1e-3
    assert coef[:, :n_u].abs().max() == 0 and coef[:, n_u:].abs().max() > 1e-3
    assert band[:, n_u:].abs().max() == 0 and band[:, :n_u].abs().max() > 1e-3


def test_the_band_rows_have_their_senses_and_values():
    model, data = small("pinv", n_band_imposed=4, n_pde_imposed=0, n_coef_imposed=0)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    parts = model.imposed(batch)
    assert list(parts) == ["band_upper", "band_lower"]
    assert (parts["band_upper"].sense, parts["band_lower"].sense) == ("<=", ">=")
    packed = batch["x_band_imposed"]
    u, d, k = model.u(packed[:, :2]).detach(), packed[:, 2], 5.0 * NOISE
    c = model.constraints(batch).detach()
    assert torch.allclose(c, torch.cat([u - d - k, u - d + k]), atol=1e-14, rtol=0)
    signs = layout_signs(part_layout(imposed_values(parts), parts))
    assert signs.tolist() == [1] * 4 + [-1] * 4  # g = s c <= 0: u - d <= k sigma and d - u <= k sigma
    # a u 0.2 above d + k sigma violates the upper row by 0.2 and leaves the lower row satisfied
    off = torch.cat([torch.full((4,), 0.2), torch.full((4,), 0.2 + 2 * k)]).to(torch.float64)
    assert torch.allclose(violated_part(off, signs), torch.cat([torch.full((4,), 0.2), torch.zeros(4)]).to(torch.float64))
    truth = torch.cat([pinv_u(packed[:, :2]) - d - k, pinv_u(packed[:, :2]) - d + k])
    assert violated_part(truth, signs).max() == 0  # the exact u is feasible


def test_with_a_count_the_pde_and_coef_rows_come_from_the_objectives_points():
    """imposed_count=3: the module imposes 3 of the 16 interior points (PDE) and 3 of the 8 boundary points
    (a = a*), the residuals' values at exactly those points of x_pde / x_coef."""
    _, data = small("pinv")
    torch.manual_seed(0)
    model = PoissonInverse(hidden=4, depth=2, dtype="float64", imposed_count=3)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    c = model.constraints(batch).detach()
    chosen = model.row_choice.chosen
    assert {name: index.numel() for name, index in chosen.items()} == {"pde": 3, "coef": 3}
    pde = model.pde_residual(batch["x_pde"][chosen["pde"]]).detach()
    coef = model.coef_residual(batch["x_coef"][chosen["coef"]]).detach()
    band = c.numel() - 6  # the band's rows stay at x_band_imposed (3 observations, two rows each)
    assert band == 6 and torch.allclose(c[:6], torch.cat([pde, coef]), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="count must be None"):
        PoissonInverse(imposed_count=0.5)


@pytest.mark.parametrize("problem", list(DATA))
def test_objective_is_pinnacles_sum_and_the_metrics_the_relative_errors(problem):
    model, data = small(problem)
    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    exact_a = pinv_a if problem == "pinv" else hinv_a
    by_hand = (model.pde_residual(batch["x_pde"]).pow(2).mean()
               + (model(batch["x_obs"])[:, 0] - batch["d_obs"]).pow(2).mean()
               + (model.a(batch["x_coef"]) - exact_a(batch["x_coef"])).pow(2).mean())
    assert torch.allclose(model.objective(batch), by_hand)
    metrics = model.evaluation_metrics(batch, "val")
    out = model(batch["x_test"]).detach()
    assert torch.allclose(metrics["rel_l2_u"], (out[:, 0] - batch["u_test"]).norm() / batch["u_test"].norm())
    assert torch.allclose(metrics["rel_l2_a"], (out[:, 1] - batch["a_test"]).norm() / batch["a_test"].norm())
    if problem == "hinv":  # a of (x, y) only
        x = batch["x_test"].clone()
        x[:, 2] = 0.0
        assert torch.equal(model.a(x), model.a(batch["x_test"]))


INVERSE_CONFIGS = sorted(str(p.relative_to(ROOT)) for d in ("pinnacle_pinv", "pinnacle_hinv")
                         for p in (ROOT / "configs" / d).rglob("*.yaml"))


@pytest.mark.parametrize("config", INVERSE_CONFIGS)
def test_a_few_steps_through_the_command_line(config, tmp_path, monkeypatch):
    """``lit-constrained fit --config <config>`` for 20 steps, its sizes made small: the summary comes out, and
    the recommended run ends with its rows held (max |c| below 1e-4; the normal step's safeguard caps the
    first steps, so a tiny network restores them in about 10 to 20 steps; at width 8 HInv's constant lr took 20 to 40)."""
    import yaml

    from lit_constrained.cli.fit import main

    problem = Path(config).parts[1].removeprefix("pinnacle_")
    args = yaml.safe_load((ROOT / config).read_text())["data"]["init_args"]
    sizes = {k: v for k, v in DATA[problem][2].items() if not k.endswith("_imposed")}
    sizes |= {k: min(v, 3) for k, v in args.items() if k.endswith("_imposed")}
    overrides = [f"--data.init_args.{k}={'null' if v is None else v}" for k, v in sizes.items()]
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        main(["fit", "--config", str(ROOT / config), *overrides, "--model.init_args.hidden=16",
              "--model.init_args.depth=2", "--trainer.max_epochs=20", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
              "--trainer.val_check_interval=20", f"--trainer.default_root_dir={tmp_path}"])
    text = out.getvalue()
    assert re.search(r"steps +20 in", text), text
    if "recommended" in config:  # the band's rows too (sqp_adam_band.yaml)
        line = next(line for line in text.splitlines() if "max |c|" in line)
        end = float(line.rsplit("->", 1)[1].split()[0])
        assert end < 1e-4, line
