"""The spring task: exact solution, points, residuals, Jacobian, a short constrained fit."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from lit_constrained.optim import SQPAdam
from lit_constrained.optim.flat import group_params
from lit_constrained.tasks.spring import Spring, SpringData, spring_exact, spring_points, spring_residual
from lit_constrained.tasks.spring_data import spring_constants

from tests.helpers.lightning import quiet_trainer


class ExactSpring(nn.Module):
    """A "network" that returns the exact solution (float64), for residual checks."""

    def forward(self, t: Tensor) -> Tensor:
        return spring_exact(t, 4.0, 400.0)


def _batch(datamodule: SpringData, loader: str = "val", dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    batch = next(iter(getattr(datamodule, f"{loader}_dataloader")()))
    return {k: v.to(dtype) for k, v in batch.items()}


# --- the exact solution --------------------------------------------------------------------------


def test_exact_solution_satisfies_ode_and_initial_conditions() -> None:
    t = torch.linspace(0.0, 1.0, 201, dtype=torch.float64)[:, None]
    residual = spring_residual(lambda s: spring_exact(s), t, mu=4.0, k=400.0)
    assert residual.abs().max() < 1e-10

    t0 = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    u0 = spring_exact(t0)
    (du0,) = torch.autograd.grad(u0.sum(), t0)
    assert abs(u0.item() - 1.0) < 1e-10
    assert abs(du0.item()) < 1e-10


def test_exact_solution_matches_an_ode_solver() -> None:
    from scipy.integrate import solve_ivp

    t = np.linspace(0.0, 1.0, 50)
    sol = solve_ivp(lambda _, y: [y[1], -4.0 * y[1] - 400.0 * y[0]], (0.0, 1.0), [1.0, 0.0], t_eval=t,
                    rtol=1e-12, atol=1e-12, method="DOP853")
    exact = spring_exact(torch.from_numpy(t)).numpy()
    np.testing.assert_allclose(exact, sol.y[0], atol=1e-9)


def test_constants_of_the_paper() -> None:
    delta, omega, phi, amplitude = spring_constants(4.0, 400.0)
    assert delta == 2.0 and omega == pytest.approx(math.sqrt(396.0))
    assert phi == pytest.approx(math.atan(-2.0 / math.sqrt(396.0)))
    assert amplitude == pytest.approx(1.0 / (2.0 * math.cos(phi)))
    with pytest.raises(ValueError, match="under-damped"):
        spring_constants(40.0, 400.0)


def test_points_of_the_paper() -> None:
    p = spring_points()
    np.testing.assert_allclose(p["t_res"], np.arange(30) / 29)
    np.testing.assert_allclose(p["t_data"], 20 * np.arange(10) / 499)
    np.testing.assert_allclose(p["t_con"], [4 / 29, 12 / 29, 21 / 29])
    assert p["t_test"].shape == (500,) and p["t_test"][0] == 0.0 and p["t_test"][-1] == 1.0
    assert p["t_data"].max() < 0.4
    with pytest.raises(ValueError, match="constraint_indices"):
        spring_points(constraint_indices=(30,))
    with pytest.raises(ValueError, match="data_stride"):
        spring_points(n_data=30, data_stride=20)


# --- the DataModule ------------------------------------------------------------------------------


def test_full_and_minibatch_batches() -> None:
    full = list(SpringData(batch_mode="full").train_dataloader())
    assert len(full) == 1 and full[0]["t_res"].shape == (30, 1)
    assert full[0]["t_con"].shape == (3, 1) and full[0]["t_data"].shape == (10, 1)

    mini = list(SpringData(batch_mode="minibatch", batch_fraction=0.5).train_dataloader())
    assert [b["t_res"].shape[0] for b in mini] == [15, 15]
    seen = torch.cat([b["t_res"] for b in mini])[:, 0].sort().values
    torch.testing.assert_close(seen, torch.arange(30, dtype=torch.float64) / 29)  # one pass = all points
    for b in mini:  # the constraint points and data are whole in every batch
        torch.testing.assert_close(b["t_con"], full[0]["t_con"])
        torch.testing.assert_close(b["u_data"], full[0]["u_data"])
    with pytest.raises(ValueError, match="batch_mode"):
        SpringData(batch_mode="half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_fraction"):
        SpringData(batch_mode="minibatch", batch_fraction=0.0)


# --- residuals and Jacobian ----------------------------------------------------------------------


def test_task_residuals_vanish_on_the_exact_solution() -> None:
    task = Spring(dtype="float64")
    task.net = ExactSpring()
    batch = _batch(SpringData())
    assert task.objective(batch).item() < 1e-20
    assert task.constraints(batch).abs().max().item() < 1e-10
    assert task.validation_constraints(batch).abs().max().item() < 1e-10
    assert task.evaluation_metrics(batch, "val")["mse"].item() < 1e-25


def test_constraint_jacobian_matches_central_differences() -> None:
    torch.manual_seed(0)
    task = Spring(dtype="float64")
    batch = _batch(SpringData(), "train")
    params = group_params([{"params": list(task.parameters())}])
    c = task.constraints(batch)
    J = task.constraint_jacobian(batch, c, params)
    assert J.shape == (3, 2209)

    flat = torch.nn.utils.parameters_to_vector(params).detach()
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


def test_float64_option_and_batch_cast() -> None:
    task = Spring(dtype="float64")
    assert all(p.dtype == torch.float64 for p in task.parameters())
    data = _batch(SpringData())  # the batch in the data's own dtype; the hooks get the network's
    assert task.prepare_batch(data)["t_res"].dtype == torch.float64
    assert Spring().prepare_batch(data)["t_res"].dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        Spring(dtype="float16")  # type: ignore[arg-type]


# --- a short constrained fit ---------------------------------------------------------------------


def test_short_sqp_adam_fit_lowers_objective_and_violation(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    data = SpringData()
    task = Spring(optimizer=partial(SQPAdam, lr=5e-4, rho=1.0), num_threads=1)
    batch = _batch(data, "train", torch.float32)
    f0 = task.objective(batch).item()
    c0 = task.constraints(batch).abs().max().item()

    logger = TensorBoardLogger(tmp_path, name="spring")
    trainer = quiet_trainer(max_epochs=300, logger=logger, check_val_every_n_epoch=300, log_every_n_steps=50)
    trainer.fit(task, data)

    f1 = task.objective(batch).item()
    c1 = task.constraints(batch).abs().max().item()
    assert f1 < 0.7 * f0
    assert c1 < c0
    assert trainer.global_step == 300
    assert {"val/mse", "Violation/val", "residual/val"} <= set(trainer.callback_metrics)

    # the prediction figure reached TensorBoard at the end of fit
    events = EventAccumulator(str(Path(logger.log_dir))).Reload()
    assert "prediction" in events.Tags()["images"]


def test_network_dtype_other_than_the_data_trains_and_summarizes(capsys: pytest.CaptureFixture[str]) -> None:
    """The batch cast (prepare_batch) reaches every consumer: the step, validation and the end-of-fit
    summary, whose final max |c| is recomputed from the last training batch."""
    torch.manual_seed(0)
    task = Spring(optimizer=partial(SQPAdam, lr=1e-3))  # a float32 network, the data are float64
    quiet_trainer(max_steps=3, limit_val_batches=1).fit(task, SpringData())
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "max |c|" in x and "->" in x)
    end = float(line.split("->")[1].split()[0])  # "n/a" (a failed evaluation) would not parse
    batch = task.prepare_batch(_batch(SpringData(), "train"))
    assert end == pytest.approx(float(task.constraints(batch).detach().abs().max()), rel=2e-3)  # printed to 3 digits


def test_many_imposed_points_take_the_torch_func_path_and_match_the_general_jacobian() -> None:
    """The residual (mlp_taylor in plain operations) runs inside torch.func: at 40 points (above the
    engine's small-part size) J comes from the per-point transforms and equals the general J."""
    from lit_constrained.optim import constraint_jacobian

    torch.manual_seed(0)
    task = Spring(dtype="float64")
    batch = dict(_batch(SpringData(), "train"), t_con=torch.linspace(0.0, 1.0, 40, dtype=torch.float64)[:, None])
    params = list(task.parameters())
    c = task.constraints(batch)
    J = task.constraint_jacobian(batch, c, params)
    assert task.pointwise_jacobian.paths == {task.residual: "func"}
    torch.testing.assert_close(J, constraint_jacobian(c, params, method="batched"), rtol=1e-10, atol=1e-9)
