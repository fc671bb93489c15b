"""The Darcy task: generator and solver, vmap-safe spectral conv, residuals, Jacobians, an SQP step, a fit."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from lit_constrained.optim import SQPAdam
from lit_constrained.optim.flat import gather, group_params
from lit_constrained.jacobians import constraint_jacobian, constraint_units, per_sample_jacobian, real_view
from lit_constrained.tasks.darcy import Darcy, DarcyData, darcy_residual
from lit_constrained.tasks.darcy_data import (
    darcy_dataset,
    gaussian_random_field,
    generate_darcy,
    medoid_order,
    solve_darcy,
    threshold_field,
)
from lit_constrained.tasks.fno import build_fno
from lit_constrained.tasks.spectral import VmapSpectralConv

from tests.helpers.lightning import quiet_trainer

SMALL_DATA = dict(n_train=6, n_val=2, n_test=2, n_generate=40, n_constraints=8, seed=1, cache_dir=None)
SMALL_NET = dict(hidden_channels=2, n_layers=2, n_modes=(6, 6))


def small_task(dtype: str = "float64", **kwargs: object) -> Darcy:
    torch.manual_seed(0)
    return Darcy(**{**SMALL_NET, "dtype": dtype, "output_scale": 0.004, **kwargs})


def train_batch(dm: DarcyData) -> dict[str, Tensor]:
    return next(iter(dm.train_dataloader()))


def dense_darcy_solve(nu: np.ndarray, forcing: float = 1.0) -> np.ndarray:
    """An independent, loop-based assembly of the harmonic-mean 5-point scheme, solved densely."""
    n = nu.shape[0]
    h2 = (1.0 / (n - 1)) ** 2
    inner = [(i, j) for i in range(1, n - 1) for j in range(1, n - 1)]
    number = {node: k for k, node in enumerate(inner)}
    a = np.zeros((len(inner), len(inner)))
    for (i, j), k in number.items():
        for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            face = 2.0 * nu[i, j] * nu[i + di, j + dj] / (nu[i, j] + nu[i + di, j + dj]) / h2
            a[k, k] += face
            if (i + di, j + dj) in number:
                a[k, number[(i + di, j + dj)]] -= face
    u = np.zeros_like(nu)
    sol = np.linalg.solve(a, np.full(len(inner), forcing))
    for (i, j), k in number.items():
        u[i, j] = sol[k]
    return u


# -- data -----------------------------------------------------------------------------------------


def test_solver_matches_independent_dense_assembly() -> None:
    rng = np.random.default_rng(0)
    nu = rng.choice([3.0, 12.0], size=(3, 7, 7))
    np.testing.assert_allclose(solve_darcy(nu), np.stack([dense_darcy_solve(s) for s in nu]), rtol=1e-12, atol=1e-15)


def test_constant_coefficient_solution_converges_to_the_poisson_series() -> None:
    # -Laplace(u) = 1 on the unit square, u = 0 on the boundary: the classical double sine series
    def error(n: int) -> float:
        x = np.linspace(0, 1, n)
        k = np.arange(1, 400, 2)
        sx = np.sin(np.pi * np.outer(x, k))
        coef = 16.0 / (np.pi**4 * np.outer(k, k) * (k[:, None] ** 2 + k[None, :] ** 2))
        exact = sx @ coef @ sx.T
        return float(np.abs(solve_darcy(np.ones((1, n, n)))[0] - exact).max())

    coarse, fine = error(17), error(33)
    assert fine < 1e-3 * 0.0737  # max of u is 0.0737
    assert 3.5 < coarse / fine < 4.5  # second order in h


def test_generated_solutions_have_zero_residual_in_float64() -> None:
    data = generate_darcy(n_generate=60, n_keep=20, seed=3)
    u, nu = torch.from_numpy(data["u"]), torch.from_numpy(data["nu"])
    assert u.dtype == torch.float64 and u.shape == (20, 16, 16)
    assert float(darcy_residual(u, nu).abs().max()) < 1e-10
    assert float(u[:, 0].abs().max() + u[:, -1].abs().max() + u[:, :, 0].abs().max() + u[:, :, -1].abs().max()) == 0
    assert set(np.unique(data["nu"])) == {3.0, 12.0}
    assert u.min() >= 0  # maximum principle: f = 1 > 0, u = 0 on the boundary
    # residual of a perturbed field is not zero: the check is not vacuous
    assert float(darcy_residual(u * 1.01, nu).abs().max()) > 1e-3


def test_gaussian_random_field_is_seeded_zero_mean_and_splits_nu_evenly() -> None:
    psi = gaussian_random_field(400, seed=5)
    np.testing.assert_array_equal(psi, gaussian_random_field(400, seed=5))
    assert not np.allclose(psi, gaussian_random_field(400, seed=6))
    assert abs(psi.mean()) < 0.1 * psi.std()
    frac_high = (threshold_field(psi) == 12.0).mean()
    assert 0.4 < frac_high < 0.6
    # smooth field: neighbouring nodes are strongly correlated (alpha = 2, tau = 3)
    corr = np.corrcoef(psi[:, 5, 5], psi[:, 5, 6])[0, 1]
    assert corr > 0.8


def test_medoid_order_on_a_hand_made_example() -> None:
    base = np.zeros((4, 4), dtype=bool)
    masks = np.stack([base.copy() for _ in range(5)])
    masks[1, 0, :1] = True  # 1 flip from all-zero
    masks[2, 0, :2] = True  # 2 flips
    masks[3, :, :] = True  # 16 flips
    masks[4, 0, :3] = True  # 3 flips
    order = medoid_order(masks)
    # total Hamming distances: 0 -> 22, 1 -> 19, 2 -> 18, 3 -> 58, 4 -> 19: the medoid is sample 2;
    # its distances 2, 1, 0, 14, 1 give the order 2, (1, 4), 0, 3
    assert order.tolist() == [2, 1, 4, 0, 3]


def test_dataset_splits_masks_and_constraint_points() -> None:
    d = darcy_dataset(n_train=8, n_val=3, n_test=4, n_generate=50, n_constraints=12, seed=2)
    assert d["train_u"].shape == (8, 16, 16) and d["val_u"].shape == (3, 16, 16) and d["test_u"].shape == (4, 16, 16)
    all_nu = np.concatenate([d["train_nu"], d["val_nu"], d["test_nu"]]).reshape(15, -1)
    assert len({row.tobytes() for row in all_nu}) == 15  # held-out samples are not training samples
    # exactly 20 % of the nodes carry data (51 of 256)
    np.testing.assert_array_equal(d["train_data_mask"].reshape(8, -1).sum(1), np.full(8, round(0.2 * 256)))
    pairs = set(zip(d["con_sample"].tolist(), d["con_node"].tolist()))
    assert len(pairs) == 12
    assert d["con_sample"].max() < 8 and d["con_node"].max() < 14 * 14
    # inputs: the mask channel matches nu, the coordinate channels are the node grid
    np.testing.assert_array_equal(d["train_x"][:, 0], (d["train_nu"] == 12.0).astype(float))
    np.testing.assert_allclose(d["train_x"][0, 1, :, 0], np.linspace(0, 1, 16))
    np.testing.assert_allclose(d["train_x"][0, 2, 0, :], np.linspace(0, 1, 16))


def test_datamodule_batches_and_cache(tmp_path: Path) -> None:
    dm = DarcyData(batch_mode="minibatch", batch_fraction=0.5, **{**SMALL_DATA, "cache_dir": str(tmp_path)})
    sizes = [b["u"].shape[0] for b in dm.train_dataloader()]
    assert sizes == [3, 3]
    batch = train_batch(dm)
    assert batch["con_sample"].shape == batch["con_node"].shape == (8,)
    assert batch["con_x"].shape[0] == int(batch["con_sample"].max()) + 1
    assert len(list(tmp_path.glob("darcy-*.npz"))) == 1
    again = DarcyData(**{**SMALL_DATA, "cache_dir": str(tmp_path)})
    torch.testing.assert_close(again.tensors["test_u"], dm.tensors["test_u"])


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="n_generate"):
        darcy_dataset(n_train=30, n_val=10, n_test=10, n_generate=40)
    with pytest.raises(ValueError, match="batch_mode"):
        DarcyData(batch_mode="half", **SMALL_DATA)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_modes"):
        build_fno(n_modes=(4,))
    with pytest.raises(ValueError, match="output_scale"):
        Darcy(output_scale=-1.0)
    with pytest.raises(ValueError, match="dtype"):
        Darcy(dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="factorization"):
        VmapSpectralConv(2, 2, n_modes=(4, 4), factorization="tucker")
    with pytest.raises(ValueError, match="same shape|same length"):
        constraint_units(torch.tensor([0, 1]), torch.tensor([0]))
    task = small_task()
    with pytest.raises(ValueError, match="not parameters of Darcy"):
        per_sample_jacobian(task, [nn.Parameter(torch.zeros(2))], task._sample_residuals,
                            (torch.zeros(1, 3, 16, 16), torch.ones(1, 16, 16)), torch.tensor([0]), torch.tensor([0]))


# -- the task's network and checkpoints ------------------------------------------------------------


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    dm = DarcyData(**SMALL_DATA)
    task = Darcy(**SMALL_NET, optimizer=partial(SQPAdam, lr=1e-3, rho=0.5))
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(task, dm)
    # neuraloperator's BaseModel.state_dict would add an un-prefixed "_metadata" entry here
    assert all(isinstance(v, Tensor) for v in task.state_dict().values())
    path = tmp_path / "darcy.ckpt"
    trainer.save_checkpoint(path)
    back = Darcy.load_from_checkpoint(path, weights_only=False)
    x = dm.tensors["test_x"]
    torch.testing.assert_close(back(x), task(x), rtol=0, atol=0)
    assert back.output_scale.item() == pytest.approx(dm.u_std)


def test_fno_in_float64_keeps_complex_weights_complex() -> None:
    task = small_task("float64")
    dtypes = {p.dtype for p in task.parameters()}
    assert dtypes == {torch.float64, torch.complex128}
    assert any(isinstance(m, VmapSpectralConv) for m in task.modules())
    assert task(torch.zeros(2, 3, 16, 16)).dtype == torch.float64


# -- residuals, objective, constraints ------------------------------------------------------------


class ExactSolution(nn.Module):
    """A parameter-free "network" returning the finite-difference solution (looked up by mask)."""

    def __init__(self, inputs: Tensor, solutions: Tensor) -> None:
        super().__init__()
        self.inputs = inputs.flatten(1)
        self.solutions = solutions

    def forward(self, x: Tensor) -> Tensor:
        match = (x.flatten(1)[:, None, :] == self.inputs[None]).all(-1).double().argmax(1)
        return self.solutions[match][:, None]


def test_objective_and_constraints_vanish_on_the_exact_solution() -> None:
    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64", output_scale=1.0)
    t = dm.tensors
    task.net = ExactSolution(t["train_x"], t["train_u"])
    batch = train_batch(dm)
    assert abs(float(task.objective(batch))) < 1e-20
    c = task.constraints(batch)
    assert c.shape == (8,) and float(c.abs().max()) < 1e-10
    val = next(iter(dm.val_dataloader()))
    task.net = ExactSolution(t["val_x"], t["val_u"])
    assert float(task.validation_constraints(val).abs().max()) < 1e-10
    assert float(task.relative_l2(val)) < 1e-12


def test_constraints_are_the_residuals_at_the_chosen_pairs() -> None:
    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64")
    batch = train_batch(dm)
    c = task.constraints(batch)
    t = dm.tensors
    u = task(t["train_x"])
    r = darcy_residual(u, t["train_nu"]).flatten(1)
    torch.testing.assert_close(c, r[t["con_sample"], t["con_node"]])


# -- the constraint Jacobian ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rows", "samples", "auto"])
def test_vmap_jacobian_equals_the_general_autograd_jacobian(mode: str) -> None:
    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64", jacobian_grouping=mode)
    batch = train_batch(dm)
    params = list(task.parameters())
    c = task.constraints(batch)
    fast = task.constraint_jacobian(batch, c, params)
    assert fast.shape == (8, sum(real_view(p).numel() for p in params))
    for method in ("batched", "loop"):
        torch.testing.assert_close(fast, constraint_jacobian(c, params, method=method), rtol=1e-10, atol=1e-12)
    # a different parameter order permutes the column blocks accordingly
    reordered = params[::-1]
    blocks = torch.split(fast, [real_view(p).numel() for p in params], dim=1)
    torch.testing.assert_close(task.constraint_jacobian(batch, c, reordered), torch.cat(blocks[::-1], dim=1))


def test_jacobian_matches_central_differences_on_real_and_imaginary_parts() -> None:
    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64")
    batch = train_batch(dm)
    params = list(task.parameters())
    J = task.constraint_jacobian(batch, task.constraints(batch), params)
    sizes = [real_view(p).numel() for p in params]
    offsets = np.cumsum([0] + sizes)
    spectral = [i for i, p in enumerate(params) if p.is_complex()]
    real_params = [i for i, p in enumerate(params) if not p.is_complex()]
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for i in spectral[:2] + real_params[:3]:
        view = real_view(params[i]).view(-1)
        # a few entries; for complex weights both parts of the same entries (even: real, odd: imaginary)
        entries = torch.randint(0, view.numel() // 2, (2,), generator=gen) * 2
        for k in torch.cat([entries, entries + 1]).tolist() if params[i].is_complex() else entries.tolist():
            if k >= view.numel():
                continue
            eps = 1e-6
            with torch.no_grad():
                old = view[k].item()
                view[k] = old + eps
                plus = task.constraints(batch)
                view[k] = old - eps
                minus = task.constraints(batch)
                view[k] = old
            fd = (plus - minus) / (2 * eps)
            torch.testing.assert_close(J[:, offsets[i] + k], fd, rtol=1e-6, atol=1e-8)
            checked += 1
    assert checked >= 8
    # the imaginary-part columns are not all zero: the check covers them
    first = spectral[0]
    im_cols = J[:, offsets[first] + 1:offsets[first + 1]:2]
    assert float(im_cols.abs().max()) > 1e-6


def test_sqp_adam_step_satisfies_the_linearized_constraints() -> None:
    """J d = -rho c after a real SQP-Adam step, with d read off the parameters (complex as real view)."""
    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64")
    batch = train_batch(dm)
    lr, rho = 1e-3, 0.5
    opt = SQPAdam(task.parameters(), lr=lr, rho=rho)
    params = group_params(opt.param_groups)
    x0 = gather([p.detach() for p in params], params, torch.float64).clone()
    opt.zero_grad()
    f = task.objective(batch)
    c = task.constraints(batch)
    J = task.constraint_jacobian(batch, c, params)
    f.backward()
    c = c.detach()
    opt.step(closure=lambda: f.detach(), constraints=c, jacobian=J)
    d = (gather([p.detach() for p in params], params, torch.float64) - x0) / lr
    assert float(d.norm()) > 0
    torch.testing.assert_close(J @ d, -rho * c, rtol=1e-7, atol=1e-9)
    # the parameters moved along d: c(x0 + t d) - c(x0) - t J d = O(t^2) (the layouts agree)
    from lit_constrained.optim.flat import FlatLayout

    def remainder(t: float) -> float:
        with torch.no_grad():
            FlatLayout.of(params).add_(params, x0 + t * d - gather([p.detach() for p in params], params, torch.float64))
            return float((task.constraints(batch) - c - t * (J @ d)).abs().max())

    # (a wrong J d would leave an O(t) remainder: the ratio would be ~10, not ~100)
    big, small = remainder(lr / 10), remainder(lr / 100)
    assert 70 < big / small < 130


# -- training ---------------------------------------------------------------------------------------


def test_short_fit_lowers_objective_and_violation_and_logs_the_figure(tmp_path: Path) -> None:
    threads = torch.get_num_threads()  # the task's num_threads=1 sets it process-wide
    try:
        _short_fit(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _short_fit(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    torch.manual_seed(0)
    dm = DarcyData(batch_mode="minibatch", batch_fraction=0.5, **SMALL_DATA)
    task = Darcy(
        hidden_channels=4, n_layers=2, n_modes=(8, 8), optimizer=partial(SQPAdam, lr=5e-3, rho=0.5), num_threads=1
    )
    start = train_batch(dm)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(task, dm)  # one step to set the output scale from the data
    with torch.no_grad():
        f0, c0 = float(task.objective(start)), float(task.constraints(start).abs().max())
    logger = TensorBoardLogger(str(tmp_path), name="darcy")
    trainer = quiet_trainer(max_steps=150, logger=logger, check_val_every_n_epoch=1000)
    trainer.fit(task, dm)
    with torch.no_grad():
        f1, c1 = float(task.objective(start)), float(task.constraints(start).abs().max())
    assert f1 < 0.5 * f0
    # the normal step shrinks c by (1 - lr rho) per step to first order: 0.9975^150 = 0.69
    assert c1 < 0.85 * c0
    assert task.output_scale.item() == pytest.approx(dm.u_std)
    events = list(Path(logger.log_dir).glob("events.out.tfevents.*"))
    assert events and any(e.stat().st_size > 10_000 for e in events)  # the figure is in there
    (result,) = quiet_trainer().test(task, dm, verbose=False)
    assert 0 < result["test/rel_l2"] < 1.0
