"""The 2D Poisson task: its data, its residuals against nested autograd, its imposed parts, a short fit."""

from __future__ import annotations

import copy
import math
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.tasks.poisson import Poisson, PoissonData, poisson_exact, poisson_forcing
from lit_constrained.tasks.poisson_data import poisson_points


def autograd_laplacian(u_fn, x: torch.Tensor) -> torch.Tensor:
    """Δu by nested torch.autograd.grad (the independent reference)."""
    x = x.clone().requires_grad_(True)
    u = u_fn(x)
    (g,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    second = [torch.autograd.grad(g[:, i].sum(), x, create_graph=True)[0][:, i] for i in range(x.shape[1])]
    return sum(second)


def test_exact_solution_solves_the_problem():
    x = torch.rand(50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(-autograd_laplacian(poisson_exact, x), poisson_forcing(x), atol=1e-10)
    assert torch.allclose(poisson_forcing(torch.tensor([[0.5, 0.5]], dtype=torch.float64)),
                          torch.tensor([2 * math.pi**2], dtype=torch.float64))
    edges = torch.tensor([[0.0, 0.3], [1.0, 0.7], [0.2, 0.0], [0.9, 1.0]], dtype=torch.float64)
    assert float(poisson_exact(edges).abs().max()) < 1e-15


def test_points_are_seeded_and_where_they_belong():
    a, b = poisson_points(seed=3), poisson_points(seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["x_pde"], poisson_points(seed=4)["x_pde"])
    assert a["x_pde"].shape == (400, 2) and a["x_bc"].shape == (100, 2)
    assert a["x_pde_imposed"].shape == (25, 2) and a["x_bc_imposed"].shape == (25, 2)
    for key in ("x_bc", "x_bc_imposed", "x_bc_check"):
        x = a[key]
        assert ((x == 0) | (x == 1)).any(1).all(), key
    for key in ("x_pde", "x_pde_imposed", "x_pde_check"):
        assert ((a[key] > 0) & (a[key] < 1)).all(), key
    assert not np.isin(a["x_pde_imposed"], a["x_pde"]).all(1).any()  # the imposed points are other points
    assert a["x_test"].shape == (51 * 51, 2) and np.allclose(a["u_test"], poisson_exact(torch.from_numpy(a["x_test"])))
    with pytest.raises(ValueError, match="n_pde_imposed must be an integer >= 0"):
        poisson_points(n_pde_imposed=-1)


def test_residuals_match_nested_autograd_and_the_pointwise_jacobian_the_dense_one():
    torch.manual_seed(0)
    model = Poisson(dtype="float64")
    data = PoissonData(n_pde=16, n_boundary=8, n_pde_imposed=5, n_boundary_imposed=4)
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    x = batch["x_pde"]
    assert torch.allclose(model.pde_residual(x), -autograd_laplacian(model, x) - poisson_forcing(x), atol=1e-10)
    parts = model.imposed(batch)
    assert list(parts) == ["pde", "boundary"]
    c = model.constraints(batch)
    assert c.shape == (9,)
    params = list(model.parameters())
    reference = torch.cat([model.pde_residual(batch["x_pde_imposed"]), model(batch["x_bc_imposed"])])
    assert torch.allclose(c, reference)
    dense = constraint_jacobian(reference, params, method="loop")
    assert torch.allclose(model.constraint_jacobian(batch, c, params), dense, atol=1e-10)


def test_parts_with_no_points_are_left_out():
    model = Poisson()
    one = PoissonData(n_pde=8, n_boundary=8, n_pde_imposed=0, n_boundary_imposed=4)
    batch = next(iter(one.train_dataloader()))
    assert list(model.imposed(batch)) == ["boundary"]
    none = PoissonData(n_pde=8, n_boundary=8, n_pde_imposed=0, n_boundary_imposed=0)
    assert model.imposed(next(iter(none.train_dataloader()))) is None


def test_short_fit_imposes_both_parts_and_improves_the_solution():
    pl.seed_everything(0, verbose=False)
    model = Poisson(optimizer={"class_path": "lit_constrained.optim.SQPAdam", "init_args": {"lr": 1e-3, "rho": "full"}},
                    num_threads=1)
    data = PoissonData(n_pde=100, n_boundary=40, n_pde_imposed=10, n_boundary_imposed=10, n_check=6, n_test=11)
    trainer = pl.Trainer(max_steps=120, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, check_val_every_n_epoch=None, val_check_interval=120,
                         log_every_n_steps=1)
    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    with torch.no_grad():
        start_error = float(model.evaluation_metrics(batch, "val")["rel_l2"])
    start_violation = float(model.constraints(batch).detach().abs().max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data)
    metrics = trainer.callback_metrics
    assert float(metrics["Violation/pde/val"]) < 1e-3 * start_violation
    assert float(metrics["Violation/boundary/val"]) < 1e-3 * start_violation
    assert float(metrics["val/rel_l2"]) < 0.5 * start_error
    check_the_figure(model, data, float(metrics["val/rel_l2"]))


def check_the_figure(model: Poisson, data: PoissonData, rel_l2: float) -> None:
    """The prediction figure shows |u_net - u| with y up: pixel (i, j) is the error at (x, y) = (j, i) / (k - 1),
    the network evaluated there on its own; its title is the validation's rel_l2; the imposed points
    are marked where they are."""
    import matplotlib.pyplot as plt

    figure = model.prediction_figure()
    try:
        ax = figure.axes[0]
        image = np.asarray(ax.images[0].get_array())
        k = 11  # n_test
        assert image.shape == (k, k) and ax.images[0].get_extent() == [0, 1, 0, 1]
        y, x = np.meshgrid(np.arange(k) / (k - 1), np.arange(k) / (k - 1), indexing="ij")
        points = torch.tensor(np.stack([x.ravel(), y.ravel()], axis=1), dtype=torch.float32)
        with torch.no_grad():
            u_net = model(points).double().reshape(-1)
        expected = (u_net - poisson_exact(points.double())).abs().reshape(k, k).numpy()
        np.testing.assert_allclose(image, expected, rtol=1e-5, atol=1e-7)
        assert float(ax.get_title().rsplit(" ", 1)[1]) == pytest.approx(rel_l2, rel=1e-2)  # printed to 3 digits
        marked = [np.asarray(c.get_offsets()) for c in ax.collections]
        for imposed, offsets in zip(("x_pde_imposed", "x_bc_imposed"), marked, strict=True):
            np.testing.assert_allclose(offsets, data.arrays[imposed], rtol=0, atol=1e-7)
    finally:
        plt.close(figure)


def test_imposed_c_and_j_are_float64_evaluations_at_the_float32_weights_by_default():
    torch.manual_seed(0)
    model = Poisson()  # float32 network, constraint_dtype="float64"
    data = PoissonData(n_pde=16, n_boundary=8, n_pde_imposed=40, n_boundary_imposed=4)  # 40: the torch.func path
    batch = model.prepare_batch(next(iter(data.train_dataloader())))
    params = list(model.parameters())
    c = model.constraints(batch)
    J = model.constraint_jacobian(batch, c, params)
    twin = copy.deepcopy(model).double()  # an independent float64 evaluation of the same weights and points
    wide = {key: value.double() for key, value in batch.items()}
    reference = torch.cat([twin.pde_residual(wide["x_pde_imposed"]), twin(wide["x_bc_imposed"])])
    dense = constraint_jacobian(reference, list(twin.parameters()), method="loop")
    assert c.dtype == torch.float64 and torch.equal(c.detach(), reference.detach())
    assert (J - dense).abs().max() <= 2**-24 * dense.abs().max() * 1.01  # each entry rounded once to float32
    assert model.objective(batch).dtype == torch.float32  # the objective stays in the network's dtype
    native = Poisson(constraint_dtype="native")
    native.load_state_dict(model.state_dict())
    c32 = native.constraints(batch)
    assert c32.dtype == torch.float32 and 0 < (c32.double() - reference).abs().max() < 1e-4
    with pytest.raises(ValueError, match="constraint_dtype"):
        Poisson(constraint_dtype="float16")
