"""The Burgers task: data generators, residual, objective, Jacobian, a short fit, the figure."""

from __future__ import annotations

import functools

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from lit_constrained.tasks.burgers import (
    Burgers,
    BurgersData,
    burgers_derivatives,
    burgers_residual,
    cole_hopf,
    cole_hopf_grid,
    generate_burgers,
    method_of_lines,
    taylor_derivatives,
)
from lit_constrained.tasks.burgers_data import grid, initial_condition
from lit_constrained.batch import cast_floats

SMALL = dict(n_train=2, n_val=1, n_test=1, data_rows_per_ic=200, n_constraints=10, seed=3)


class ExactSolution(nn.Module):
    """A parameter-free "network" returning the Cole-Hopf solution; xi is read back from u0(x_0)."""

    def __init__(self, nu: float = 0.01, shift: float = 0.0) -> None:
        super().__init__()
        self.nu = nu
        self.shift = shift

    def forward(self, inputs: Tensor) -> Tensor:
        xi = torch.asin(inputs[:, 2]) / math.pi  # u0(0) = sin(xi pi), xi pi in [0, 0.2 pi]
        return (cole_hopf(inputs[:, 0], inputs[:, 1], xi, self.nu) + self.shift)[:, None]


def random_inputs(n: int, seed: int = 0, n_x: int = 32) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    x, t = torch.rand(n, generator=g, dtype=torch.float64), torch.rand(n, generator=g, dtype=torch.float64)
    xi = 0.2 * torch.rand(n, generator=g, dtype=torch.float64)
    u0 = torch.sin(2 * math.pi * torch.arange(n_x, dtype=torch.float64) / n_x + math.pi * xi[:, None])
    return torch.cat([x[:, None], t[:, None], u0], dim=1)


def full_batch(dm: BurgersData, split: str = "train") -> dict[str, Tensor]:
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return next(iter(loader))


# -- data -----------------------------------------------------------------------------------------


def test_cole_hopf_agrees_with_method_of_lines() -> None:
    xi = np.array([0.0, 0.07, 0.2])
    exact = cole_hopf_grid(xi, 32, 32)
    mol = method_of_lines(xi, 32, 32)
    assert exact.shape == mol.shape == (3, 32, 32)
    assert np.abs(exact - mol).max() < 1e-3
    # both start from the initial condition
    x, _ = grid(32, 32)
    np.testing.assert_allclose(mol[:, 0], initial_condition(x, xi), atol=1e-12)
    np.testing.assert_allclose(exact[:, 0], initial_condition(x, xi), atol=1e-8)


def test_solutions_are_periodic_in_x() -> None:
    xi = torch.tensor([0.03, 0.15], dtype=torch.float64)[:, None, None]
    x = torch.linspace(0, 1, 17, dtype=torch.float64)[None, None, :]
    t = torch.linspace(0, 1, 9, dtype=torch.float64)[None, :, None]
    np.testing.assert_allclose(cole_hopf(x + 1.0, t, xi).numpy(), cole_hopf(x, t, xi).numpy(), atol=1e-9)
    # the grid data wrap around: u(x = 1) (outside the grid) equals the data at x_0 = 0, for both solvers
    xis = np.array([0.03, 0.15])
    at_one = cole_hopf(torch.ones(1, dtype=torch.float64)[None, None, :],
                       torch.as_tensor(grid(32, 32)[1])[None, :, None],
                       torch.as_tensor(xis)[:, None, None]).numpy()[:, :, 0]
    for data in (cole_hopf_grid(xis, 32, 32), method_of_lines(xis, 32, 32)):
        np.testing.assert_allclose(data[:, :, 0], at_one, atol=1e-3)
        # periodic Burgers conserves the mean of u (0 for these initial conditions)
        assert np.abs(data.mean(axis=2)).max() < 1e-3


def test_torch_series_matches_grid_series() -> None:
    xi = np.array([0.01, 0.12])
    x, t = grid(32, 32)
    series = cole_hopf(torch.as_tensor(x)[None, None, :], torch.as_tensor(t)[None, :, None],
                       torch.as_tensor(xi)[:, None, None]).numpy()
    np.testing.assert_allclose(series, cole_hopf_grid(xi, 32, 32), atol=1e-8)


def test_generate_is_seeded_and_laid_out() -> None:
    a = generate_burgers(**SMALL)
    b = generate_burgers(**SMALL)
    c = generate_burgers(**{**SMALL, "seed": 4})
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["train_xi"], c["train_xi"])
    assert a["train_inputs"].shape == (2 * 1024, 34) and a["val_inputs"].shape == (1024, 34)
    assert np.all((a["train_xi"] >= 0) & (a["train_xi"] <= 0.2))
    # 200 labelled rows per initial condition, m distinct constraint rows
    assert a["train_labeled"].reshape(2, 1024).sum(axis=1).tolist() == [200, 200]
    assert len(np.unique(a["constraint_rows"])) == 10
    # the row layout: columns x, t, u0(grid); target = the exact solution at (x, t)
    rows = a["train_inputs"]
    xi = a["train_xi"][a["train_ic"]]
    np.testing.assert_allclose(rows[:, 2:], initial_condition(grid(32, 32)[0], xi), atol=1e-15)
    exact = cole_hopf(torch.as_tensor(rows[:, 0]), torch.as_tensor(rows[:, 1]), torch.as_tensor(xi)).numpy()
    np.testing.assert_allclose(a["train_u"], exact, atol=1e-8)
    assert np.all(rows[a["train_ix"] == 0, 0] == 0) and np.all(rows[a["train_it"] == 0, 1] == 0)
    # the paper's route gives the same data set (same draws, solution within 1e-3)
    mol = generate_burgers(**{**SMALL, "method": "odeint"})
    np.testing.assert_array_equal(mol["train_inputs"], a["train_inputs"])
    np.testing.assert_allclose(mol["train_u"], a["train_u"], atol=1e-3)


def test_generate_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="data_rows_per_ic"):
        generate_burgers(1, 0, 0, data_rows_per_ic=2000)
    with pytest.raises(ValueError, match="n_constraints"):
        generate_burgers(1, 0, 0, n_constraints=5000)
    with pytest.raises(ValueError, match="method"):
        generate_burgers(1, 0, 0, method="euler")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_mode"):
        BurgersData(batch_mode="stochastic")  # type: ignore[arg-type]


def test_datamodule_batches_and_cache(tmp_path) -> None:
    dm = BurgersData(batch_mode="minibatch", batch_fraction=0.2, cache_dir=str(tmp_path), **SMALL)
    dm.prepare_data()
    assert len(list(tmp_path.glob("burgers-*.npz"))) == 1
    dm.setup("fit")
    sizes = [len(b["u"]) for b in dm.train_dataloader()]
    assert sizes == [410, 410, 410, 410, 408]
    batch = full_batch(dm, "val")
    assert batch["inputs"].shape == (1024, 34)
    np.testing.assert_array_equal(batch["x_con"].numpy(), dm.arrays["train_inputs"][dm.arrays["constraint_rows"]])
    # a second DataModule loads the same arrays from the cache
    again = BurgersData(cache_dir=str(tmp_path), **SMALL)
    again.setup("fit")
    for key in dm.arrays:
        np.testing.assert_array_equal(dm.arrays[key], again.arrays[key])
    assert len(full_batch(again)["u"]) == 2048


# -- residual, objective, Jacobian ----------------------------------------------------------------


def test_residual_vanishes_on_the_exact_solution() -> None:
    inputs = random_inputs(1000)
    d = burgers_derivatives(ExactSolution(), inputs)
    r = burgers_residual(d, 0.01)
    assert d.u_xx.abs().max() > 100  # the points reach the steep front
    assert r.abs().max() < 1e-7
    # and it does not vanish for the solution of another viscosity (the check has teeth)
    wrong = burgers_residual(burgers_derivatives(ExactSolution(nu=0.012), inputs), 0.01)
    assert wrong.abs().max() > 0.1


def test_objective_on_exact_and_shifted_solution() -> None:
    dm = BurgersData(cache_dir=None, **SMALL)
    dm.setup("fit")
    batch = full_batch(dm)
    task = Burgers(dtype="float64", derivative="autograd")  # a callable "network": nested autograd
    task.net = ExactSolution()
    assert task.objective(batch).item() < 1e-12
    assert task.constraints(batch).abs().max().item() < 1e-7
    # u + s: data and initial errors are s^2, periodic error 0, residual s u_x
    s = 0.1
    task.net = ExactSolution(shift=s)
    x, t, xi = batch["inputs"][:, 0], batch["inputs"][:, 1], torch.asin(batch["inputs"][:, 2]) / math.pi
    h = 1e-5  # u_x by central differences of the series (independent of autograd)
    u_x = (cole_hopf(x + h, t, xi) - cole_hopf(x - h, t, xi)) / (2 * h)
    expected = 1e-3 * (s * u_x).square().mean() + 1e-3 * (0.0 + s**2) + 1.0 * s**2
    torch.testing.assert_close(task.objective(batch), expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("derivative", ["taylor", "autograd"])
def test_constraint_jacobian_matches_finite_differences(derivative: str) -> None:
    from lit_constrained.jacobians import constraint_jacobian

    torch.manual_seed(0)
    dm = BurgersData(cache_dir=None, **SMALL)
    dm.setup("fit")
    batch = full_batch(dm)
    task = Burgers(hidden=16, derivative=derivative, dtype="float64")
    params = list(task.parameters())
    jac = constraint_jacobian(task.constraints(batch), params, method="batched")  # vmap over the backward
    n = sum(p.numel() for p in params)
    assert jac.shape == (10, n)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    columns = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:6].tolist() + [n - 1]

    def c_at(vector: Tensor) -> Tensor:
        torch.nn.utils.vector_to_parameters(vector, params)
        return task.constraints(batch).detach()

    h = 1e-6
    for k in columns:
        e = torch.zeros_like(flat)
        e[k] = h
        fd = (c_at(flat + e) - c_at(flat - e)) / (2 * h)
        torch.testing.assert_close(jac[:, k], fd, rtol=1e-5, atol=1e-7)
    c_at(flat)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_taylor_derivatives_match_nested_autograd(dtype: str) -> None:
    """The default derivative path (Taylor propagation through the MLP) against nested
    torch.autograd.grad: u, u_x, u_t, u_xx, and the weight gradients of the objective and of the
    constraints; without autograd (validation) as well."""
    torch.manual_seed(0)
    dm = BurgersData(cache_dir=None, **SMALL)
    dm.setup("fit")
    batch = cast_floats(full_batch(dm), getattr(torch, dtype))
    taylor = Burgers(dtype=dtype)
    with torch.no_grad():  # larger weights than at initialization: u_x, u_xx of order 0.1 to 1
        for p in taylor.parameters():
            p.mul_(3.0)
    nested = Burgers(dtype=dtype, derivative="autograd")
    nested.load_state_dict(taylor.state_dict())
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == "float64" else dict(rtol=1e-4, atol=1e-5)
    mine, reference = taylor.derivatives(batch["inputs"]), burgers_derivatives(nested.net, batch["inputs"])
    assert mine.u_xx.abs().max() > 0.1
    for name in ("u", "u_x", "u_t", "u_xx"):
        torch.testing.assert_close(getattr(mine, name), getattr(reference, name), **tol)
    for value in ("objective", "constraints"):
        for a, b in zip(torch.autograd.grad(getattr(taylor, value)(batch).sum(), list(taylor.parameters())),
                        torch.autograd.grad(getattr(nested, value)(batch).sum(), list(nested.parameters()))):
            assert a.dtype == getattr(torch, dtype)
            torch.testing.assert_close(a, b, **tol)
    with torch.no_grad():
        torch.testing.assert_close(taylor.validation_constraints(batch), nested.validation_constraints(batch), **tol)


def test_taylor_path_needs_an_mlp() -> None:
    task = Burgers(dtype="float64")
    task.net = ExactSolution()
    with pytest.raises(TypeError, match="derivative"):
        task.residual(random_inputs(3))
    with pytest.raises(TypeError, match="ReLU"):
        taylor_derivatives(nn.Sequential(nn.Linear(34, 4), nn.ReLU(), nn.Linear(4, 1)).double(), random_inputs(3))


def test_width_mismatch_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match="derivative"):
        Burgers(derivative="forward")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="viscosity"):
        Burgers(nu=0.0)
    with pytest.raises(ValueError, match="residual_weight"):
        Burgers(residual_weight=-1.0)
    with pytest.raises(ValueError, match="columns"):
        Burgers(n_x=16).residual(torch.zeros(3, 34))


def test_prediction_figure_has_true_and_predicted_panels() -> None:
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    task = Burgers(dtype="float64")
    task.net = ExactSolution()
    pred = task.predict_grid(0.1, 64, 21)
    np.testing.assert_allclose(pred, cole_hopf_grid(np.array([0.1]), 64, 21)[0], atol=1e-8)
    fig = task.prediction_figure(0.1)
    titles = [ax.get_title() for ax in fig.axes]
    assert {"true u(x, t)", "predicted u(x, t)", "|error|"} <= set(titles)
    rel = float(fig._suptitle.get_text().rsplit(" ", 1)[-1])
    assert rel < 1e-6


# -- training -------------------------------------------------------------------------------------


def test_short_fit_with_sqp_adam_lowers_objective_and_violation(tmp_path, request) -> None:
    """A short Lightning fit with SQP-Adam. rho = "full" (rho = 1 / lr) makes the normal step a full Gauss-Newton
    restoration (lr rho = 1), so the violation falls within a few steps; with the paper's rho = 1 it
    shrinks by only lr rho = 0.1 % per step, too little to see in 100 steps."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_constrained.optim import SQPAdam

    L.seed_everything(0, verbose=False)
    dm = BurgersData(cache_dir=None, **{**SMALL, "n_train": 1})
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))  # the task sets 1 thread at setup
    task = Burgers(optimizer=functools.partial(SQPAdam, lr=1e-3, rho="full"), num_threads=1, lr_decay="none")
    dm.setup("fit")
    batch = cast_floats(full_batch(dm), torch.float32)
    f0 = task.objective(batch).item()
    v0 = task.constraints(batch).abs().max().item()
    logger = TensorBoardLogger(str(tmp_path), name="burgers")
    trainer = L.Trainer(max_steps=100, logger=logger, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, limit_val_batches=1, check_val_every_n_epoch=1000)
    trainer.fit(task, dm)
    f1 = task.objective(batch).item()
    v1 = task.constraints(batch).abs().max().item()
    assert f1 < 0.8 * f0
    assert v1 < 0.1 * v0
    metrics = trainer.validate(task, dm, verbose=False)[0]
    with torch.no_grad():
        pred = task(torch.as_tensor(dm.arrays["val_inputs"], dtype=torch.float32)).double().numpy()
    truth = dm.arrays["val_u"]
    assert metrics["val/rel_l2"] == pytest.approx(np.linalg.norm(pred - truth) / np.linalg.norm(truth), rel=1e-5)
    assert {"Objective/val", "Violation/val", "residual/val"} <= set(metrics)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    assert "prediction" in events.Tags()["images"]


@pytest.mark.parametrize("derivative", ["taylor", "autograd"])
def test_imposed_pde_residual_has_a_per_point_jacobian_equal_to_the_general_one(derivative: str) -> None:
    """The second-order residual at 40 points: per point under torch.func (Taylor mode) or by the
    chunked-autograd path (nested torch.autograd.grad), both equal to the general autograd J."""
    from lit_constrained.optim import constraint_jacobian

    torch.manual_seed(0)
    task = Burgers(hidden=16, depth=2, dtype="float64", derivative=derivative)
    batch = {"x_con": random_inputs(40)}
    params = list(task.parameters())
    c = task.constraints(batch)
    if derivative == "taylor":
        J = task.constraint_jacobian(batch, c, params)
    else:
        with pytest.warns(RuntimeWarning, match="chunked autograd"):
            J = task.constraint_jacobian(batch, c, params)
    assert task.pointwise_jacobian.paths == {task.residual: "func" if derivative == "taylor" else "autograd"}
    torch.testing.assert_close(J, constraint_jacobian(c, params), rtol=1e-11, atol=1e-11)
    assert task.imposed({"x_con": random_inputs(0)}) is None  # m = 0: no constraints
