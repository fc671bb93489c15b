"""The chemistry task: exact solution vs expm and odeint, conservation, residuals, Jacobian, a short fit."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from tests.helpers.lightning import quiet_trainer
from torch import Tensor, nn

from lit_constrained.optim import SQPAdam
from lit_constrained.optim.flat import group_params
from lit_constrained.tasks.chemistry import (
    Chemistry,
    ChemistryData,
    ModalSolution,
    chemistry_exact,
    chemistry_odeint,
    generate_chemistry,
    state_and_rate,
)
from lit_constrained.tasks.chemistry_data import MASS_WEIGHTS, U0_NOMINAL, reaction_matrix, sample_initial_conditions
from lit_constrained.stepping import row_signs

SMALL = dict(n_ic=6, n_val_ic=2, n_test_ic=2, n_times=16, n_constraints=10, seed=1, cache_dir=None)


class ExactChemistry(nn.Module):
    """A "network" that returns the exact solution at rows x = (u0, t) (float64)."""

    def __init__(self) -> None:
        super().__init__()
        self.solution = ModalSolution()

    def forward(self, x: Tensor) -> Tensor:
        return self.solution(x[:, :4], x[:, 4])


def _batch(datamodule: ChemistryData, loader: str, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    datamodule.setup("fit")
    batch = next(iter(getattr(datamodule, f"{loader}_dataloader")()))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


# --- the exact solution and the generator ----------------------------------------------------------


def test_rate_matrix_conserves_mass() -> None:
    K = reaction_matrix()
    np.testing.assert_allclose(np.asarray(MASS_WEIGHTS) @ K, 0.0, atol=1e-14)
    with pytest.raises(ValueError, match="5 rate constants"):
        reaction_matrix([1.0, 2.0])


def test_exact_solution_matches_scipy_expm_and_odeint() -> None:
    rng = np.random.default_rng(0)
    u0 = sample_initial_conditions(4, rng)
    times = 10.0 * np.arange(64) / 64
    exact = chemistry_exact(u0, times)
    assert exact.shape == (4, 64, 4)
    K = reaction_matrix()
    reference = np.stack([np.stack([scipy.linalg.expm(K * t) @ ic for t in times]) for ic in u0])
    np.testing.assert_allclose(exact, reference, rtol=1e-10, atol=1e-10)
    # the paper's route: odeint (default tolerances) agrees to 1e-5 relative to the largest state
    odeint = chemistry_odeint(u0, times, rtol=1.49012e-8, atol=1.49012e-8)
    assert np.abs(odeint - exact).max() / np.abs(exact).max() < 1e-5


def test_generated_data_conserve_mass() -> None:
    w = np.asarray(MASS_WEIGHTS)
    for solver in ("expm", "odeint"):
        arrays = generate_chemistry(n_ic=5, n_val_ic=1, n_test_ic=1, n_times=64, solver=solver, seed=0)
        mass = (arrays["u"] @ w).reshape(5, 64)
        initial = arrays["x"][::64, :4] @ w
        assert np.abs(mass - initial[:, None]).max() / np.abs(initial).max() < 1e-5
        # initial conditions: nominal + U[-1, 1]^4, and u(t=0) = u0
        assert np.abs(arrays["x"][:, :4] - np.asarray(U0_NOMINAL)).max() <= 1.0
        np.testing.assert_allclose(arrays["u"][::64], arrays["x"][::64, :4], atol=1e-12)


def test_generator_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = ChemistryData(**{**SMALL, "cache_dir": str(tmp_path)})
    first.setup()
    assert len(list(tmp_path.glob("chemistry-*.npz"))) == 1
    second = ChemistryData(**{**SMALL, "cache_dir": str(tmp_path)})
    second.setup()
    fresh = generate_chemistry(**{k: v for k, v in SMALL.items() if k != "cache_dir"})
    for key, value in fresh.items():
        np.testing.assert_array_equal(second.arrays[key], value)
        np.testing.assert_array_equal(first.arrays[key], value)
    other = generate_chemistry(**{**{k: v for k, v in SMALL.items() if k != "cache_dir"}, "seed": 2})
    assert not np.array_equal(other["x"], fresh["x"])
    assert fresh["labeled"].mean() == pytest.approx(0.2, abs=0.01)
    assert len(np.unique(fresh["con_rows"])) == 10


def test_full_and_minibatch_batches() -> None:
    full = ChemistryData(**SMALL)
    full.setup()
    batches = list(full.train_dataloader())
    assert len(batches) == 1 and batches[0]["x"].shape == (6 * 16, 5) and batches[0]["x_con"].shape == (10, 5)
    mini = ChemistryData(**{**SMALL, "batch_mode": "minibatch", "batch_fraction": 0.2})
    mini.setup()
    batches = list(mini.train_dataloader())
    assert [b["x"].shape[0] for b in batches] == [20, 20, 20, 20, 16]
    rows = torch.cat([b["x"] for b in batches])
    assert torch.unique(rows, dim=0).shape[0] == 96  # one epoch = one pass over the rows
    for b in batches:
        torch.testing.assert_close(b["x_con"], full.tensors["x_con"])


# --- residuals, derivatives and the Jacobian --------------------------------------------------------


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_task_residuals_vanish_on_the_exact_solution(mode: str) -> None:
    task = Chemistry(dtype="float64", derivative=mode)
    task.net = ExactChemistry()  # normalization is off: forward() is the exact solution
    batch = _batch(ChemistryData(**SMALL), "val")
    u, rate = task.state_and_rate(batch["x"])
    scale = rate.abs().max().item()
    assert task.ode_residual(u, rate).abs().max().item() < 1e-10 * scale
    assert task.mass_residual(rate).abs().max().item() < 1e-10 * scale
    assert task.constraints(batch).abs().max().item() < 1e-10 * scale
    assert task.objective(batch).item() < 1e-20 * scale**2
    metrics = task.evaluation_metrics(batch, "val")
    assert metrics["mse"].item() < 1e-20 and metrics["rel_l2"].item() < 1e-12


def test_forward_and_reverse_mode_rates_agree() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 4)).double()
    x = torch.rand(7, 5, dtype=torch.float64)
    u_f, r_f = state_and_rate(net, x, "forward")
    u_r, r_r = state_and_rate(net, x, "reverse")
    torch.testing.assert_close(u_f, u_r)
    torch.testing.assert_close(r_f, r_r)
    with pytest.raises(ValueError, match="forward"):
        state_and_rate(net, x, "central")  # type: ignore[arg-type]


@pytest.mark.parametrize("normalize", [False, True])
def test_tangent_mode_matches_forward_mode_ad(normalize: bool) -> None:
    """The default (tangent carried through the layers) against forward-mode AD of the whole module."""
    torch.manual_seed(0)
    tangent = Chemistry(dtype="float64", normalize=normalize, hidden=16, depth=2)
    forward = Chemistry(dtype="float64", normalize=normalize, hidden=16, depth=2, derivative="forward")
    forward.load_state_dict(tangent.state_dict())
    assert tangent.derivative == "taylor"
    x = torch.as_tensor(generate_chemistry(n_ic=2, n_val_ic=1, n_test_ic=1, n_times=8)["x"])
    for got, want in zip(tangent.state_and_rate(x), forward.state_and_rate(x)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_rate_matches_finite_differences_in_time(normalize: bool) -> None:
    """du/dt of the (optionally normalized) network against central differences of its output."""
    torch.manual_seed(0)
    task = Chemistry(dtype="float64", normalize=normalize, hidden=16, depth=2)
    x = torch.as_tensor(generate_chemistry(n_ic=2, n_val_ic=1, n_test_ic=1, n_times=8)["x"])
    _, rate = task.state_and_rate(x)
    h = 1e-5
    dt = torch.zeros_like(x)
    dt[:, 4] = h
    with torch.no_grad():
        fd = (task(x + dt) - task(x - dt)) / (2 * h)
    torch.testing.assert_close(rate.detach(), fd, rtol=1e-6, atol=1e-6 * fd.abs().max().item())
    if normalize:  # the network's input is O(1) and the output is on the trajectory's scale
        assert (task.out_scale > 1.0).any() and task.in_scale[4].item() == pytest.approx(10.0 / 12**0.5)


def test_constraint_jacobian_matches_central_differences() -> None:
    torch.manual_seed(0)
    task = Chemistry(dtype="float64", hidden=16, depth=2)
    batch = _batch(ChemistryData(**SMALL), "train")
    params = group_params([{"params": list(task.parameters())}])
    J = task.constraint_jacobian(batch, task.constraints(batch), params)
    flat = torch.nn.utils.parameters_to_vector(params).detach()
    assert J.shape == (10, flat.numel())
    step = 1e-6
    for j in torch.randperm(flat.numel())[:6].tolist():
        values = []
        for sign in (1.0, -1.0):
            shifted = flat.clone()
            shifted[j] += sign * step
            torch.nn.utils.vector_to_parameters(shifted, params)
            values.append(task.constraints(batch).detach())
        torch.nn.utils.vector_to_parameters(flat, params)
        fd = (values[0] - values[1]) / (2 * step)
        torch.testing.assert_close(J[:, j], fd, rtol=1e-6, atol=1e-6 * (1 + fd.abs().max().item()))
    # the output bias does not enter w^T du/dt: its columns are zero
    assert J[:, -4:].abs().max().item() == 0.0


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="derivative"):
        Chemistry(derivative="central")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mass_weight"):
        Chemistry(mass_weight=-1.0)
    with pytest.raises(ValueError, match="solver"):
        generate_chemistry(solver="rk4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_fraction"):
        ChemistryData(batch_mode="minibatch", batch_fraction=1.5)


# --- a short constrained fit ----------------------------------------------------------------------


def test_short_sqp_adam_fit_lowers_objective_and_violation(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    data = ChemistryData(n_ic=10, n_val_ic=2, n_test_ic=2, cache_dir=None)
    task = Chemistry(optimizer=partial(SQPAdam, lr=5e-4, rho=0.5), num_threads=1)
    batch = _batch(data, "train", torch.float32)
    f0 = task.objective(batch).item()
    c0 = task.constraints(batch).abs().max().item()

    logger = TensorBoardLogger(tmp_path, name="chemistry")
    trainer = quiet_trainer(max_epochs=200, logger=logger, check_val_every_n_epoch=200, log_every_n_steps=50)
    trainer.fit(task, data)

    f1 = task.objective(batch).item()
    c1 = task.constraints(batch).abs().max().item()
    assert f1 < 0.9 * f0
    assert c1 < c0
    assert {"val/mse", "val/rel_l2", "Violation/val", "residual/val"} <= set(trainer.callback_metrics)
    events = EventAccumulator(str(Path(logger.log_dir))).Reload()
    assert "prediction" in events.Tags()["images"]


@pytest.mark.parametrize("derivative", ["taylor", "reverse"])
def test_imposed_mass_balance_has_a_per_point_jacobian_equal_to_the_general_one(derivative: str) -> None:
    """m = 40 rows (past the engine's small-part size): the Taylor mode's imposed residual runs inside
    torch.func, the reverse mode's on the chunked-autograd path; both equal the general J."""
    from lit_constrained.optim import constraint_jacobian

    torch.manual_seed(0)
    task = Chemistry(dtype="float64", hidden=16, depth=2, normalize=True, derivative=derivative)
    batch = _batch(ChemistryData(**dict(SMALL, n_constraints=40)), "train")
    params = list(task.parameters())
    c = task.constraints(batch)
    torch.testing.assert_close(c, task.mass_residual(task.state_and_rate(batch["x_con"])[1]), rtol=1e-12, atol=1e-14)
    if derivative == "taylor":
        J = task.constraint_jacobian(batch, c, params, rows=slice(3, 38))
    else:
        with pytest.warns(RuntimeWarning, match="chunked autograd"):
            J = task.constraint_jacobian(batch, c, params, rows=slice(3, 38))
    assert task.pointwise_jacobian.paths == {task.mass_balance: "func" if derivative == "taylor" else "autograd"}
    torch.testing.assert_close(J, constraint_jacobian(c, params)[3:38], rtol=1e-11, atol=1e-12)


# --- nonnegative: true (inequality rows u >= 0 next to the mass balance) -------------------------


def test_nonnegative_imposes_every_concentration_from_below_at_the_constraint_rows() -> None:
    torch.manual_seed(0)
    data = ChemistryData(n_ic=4, n_val_ic=1, n_test_ic=1, n_constraints=6, cache_dir=None)
    task = Chemistry(nonnegative=True, hidden=16, depth=2, constraint_dtype="native")  # c as the parts give it
    batch = _batch(data, "train", torch.float32)
    c = task.constraints(batch)
    assert [(p.name, p.size, p.sense) for p in task.imposed_layout] == [("mass", 6, "="), ("nonnegative", 24, ">=")]
    with torch.no_grad():
        torch.testing.assert_close(c[6:], task(batch["x_con"]).reshape(-1))  # row-major over (point, species)
    assert row_signs(task, 30).tolist() == [0] * 6 + [-1] * 24
    assert row_signs(Chemistry(hidden=16, depth=2), 6) is None  # the default: the mass balance alone


def test_a_short_nonnegative_fit_keeps_every_concentration_nonnegative() -> None:
    """SQP-Adam (full normal step) in float64 from a network whose raw outputs are negative at some of
    the constraint rows: after 20 steps every u_i(x_j) >= 0 and the mass balance holds up to the last
    step's second-order remainder (<= 1e-6; measured 3.4e-8 for the mass balance), checked on the network
    itself."""
    torch.manual_seed(0)
    data = ChemistryData(n_ic=4, n_val_ic=1, n_test_ic=1, n_constraints=6, cache_dir=None)
    task = Chemistry(nonnegative=True, hidden=16, depth=2, dtype="float64", num_threads=1,
                     optimizer=partial(SQPAdam, lr=1e-3, rho="full", rcond=1e-12))
    batch = _batch(data, "train", torch.float64)
    with torch.no_grad():
        assert float(task(batch["x_con"]).min()) < -1e-2  # violated at the start
    trainer = quiet_trainer(max_steps=20, limit_val_batches=0)
    trainer.fit(task, data)
    with torch.no_grad():
        assert float(task(batch["x_con"]).min()) >= -1e-6
    assert float(task.mass_balance(batch["x_con"]).abs().max()) <= 1e-6
