"""ConstrainedModule + TrainingStepper: training, bad input, checkpoints."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.lightning import quiet_trainer  # noqa: E402

from lit_constrained.module import ConstrainedModule  # noqa: E402
from lit_constrained.module_parts.declarations import has_constraints  # noqa: E402
from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall  # noqa: E402
from lit_constrained.tasks.curve import CurveData, CurveFit  # noqa: E402


@pytest.mark.parametrize(
    "optimizer",
    [
        functools.partial(SQPAdam, lr=0.01, rho="full"),
        functools.partial(SQPHeavyBall, lr=0.05, rho="full"),
        functools.partial(AdamCon, lr=0.01, rho="full"),
    ],
    ids=["SQPAdam", "SQPHeavyBall", "AdamCon"],
)
def test_hard_constrained_optimizers_reach_feasibility(optimizer):
    torch.manual_seed(0)
    model = CurveFit(optimizer=optimizer)
    data = CurveData(num_samples=64, batch_size=64)
    c0 = model.constraints(None).detach().abs().max()
    trainer = quiet_trainer(max_steps=200, limit_val_batches=0)
    trainer.fit(model, data)
    assert trainer.global_step == 200
    assert model.last_step.constraints.abs().max() < 1e-4 < c0
    assert model.constraints(None).detach().abs().max() < 1e-4


def test_torch_optimizer_gets_nothing_extra_and_trains():
    torch.manual_seed(0)
    model = CurveFit(optimizer=functools.partial(torch.optim.Adam, lr=0.01))
    data = CurveData(num_samples=64, batch_size=64)
    with torch.no_grad():
        f0 = model.objective(next(iter(data.train_dataloader())))
    trainer = quiet_trainer(max_steps=50, limit_val_batches=0)
    trainer.fit(model, data)
    assert model.last_step.objective < f0


def test_penalty_option_adds_mean_squared_constraints():
    model = CurveFit(penalty_weight=10.0, optimizer=functools.partial(torch.optim.SGD, lr=0.0))
    data = CurveData(num_samples=8, batch_size=8)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(model, data)
    batch = next(iter(data.train_dataloader()))
    # lr = 0: the weights did not move, so the reported objective is f + 10 mean(c^2) at them
    expected = model.objective(batch) + 10.0 * model.constraints(batch).pow(2).mean()
    # the dataloader shuffles, so recompute on the whole (single) batch in any order
    torch.testing.assert_close(model.last_step.objective, expected.detach(), rtol=1e-5, atol=1e-7)


class BadTask(ConstrainedModule):
    def __init__(self, mode: str = "2d", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mode = mode
        self.net = torch.nn.Linear(1, 1)
        self.calls = 0

    def objective(self, batch):
        x, y = batch
        f = (self.net(x) - y).pow(2).mean()
        if self.mode == "nan" and self.calls >= 2:
            f = f * float("nan")
        self.calls += 1
        return f

    def constraints(self, batch):
        out = self.net(torch.ones(3, 1))
        if self.mode == "2d":
            return out
        if self.mode == "scalar":
            return out.sum()
        if self.mode == "nograd":
            return out.detach().squeeze(-1)
        if self.mode == "varying":
            return out.squeeze(-1)[: 1 + self.calls % 2]
        return out.squeeze(-1) - 1.0


@pytest.mark.parametrize(
    "mode,message",
    [
        ("2d", r"BadTask.constraints\(\) must return a 1-D tensor .* shape \(3, 1\)"),
        ("scalar", r"BadTask.constraints\(\) must return a 1-D tensor .* shape \(\)"),
        ("nograd", r"BadTask.constraints\(\) returned a tensor without grad \(shape \(3,\)\)"),
        ("varying", r"returned 1 constraints, but 2 at the previous step"),
    ],
)
def test_bad_constraints_are_clear_errors(mode, message):
    model = BadTask(mode=mode, optimizer=functools.partial(SQPAdam, lr=0.01))
    with pytest.raises(ValueError, match=message):
        quiet_trainer(max_steps=4, limit_val_batches=0).fit(model, CurveData(num_samples=4, batch_size=4))


def test_nan_objective_stops_with_the_step_and_weights_stay_finite(tmp_path):
    model = BadTask(mode="nan", on_nonfinite="raise", optimizer=functools.partial(SQPAdam, lr=0.01))
    with pytest.raises(FloatingPointError, match="at step 2"):
        quiet_trainer(max_steps=5, limit_val_batches=0).fit(model, CurveData(num_samples=4, batch_size=4))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_objective_can_skip_the_batch():
    model = BadTask(mode="nan", on_nonfinite="skip", optimizer=functools.partial(SQPAdam, lr=0.01))
    trainer = quiet_trainer(max_epochs=4, limit_val_batches=0)
    trainer.fit(model, CurveData(num_samples=4, batch_size=4))
    assert trainer.global_step == 2  # the two finite steps; the later batches were skipped
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    "trainer_kwargs,message",
    [
        ({"gradient_clip_val": 1.0}, "gradient_clip_val"),
        ({"accumulate_grad_batches": 2}, "accumulate_grad_batches"),
    ],
)
def test_unsupported_trainer_settings_fail_at_setup(trainer_kwargs, message):
    model = CurveFit(optimizer=functools.partial(SQPAdam, lr=0.01))
    # Lightning's own check (MisconfigurationException) may fire before the module's setup check
    with pytest.raises(Exception, match=message):
        quiet_trainer(max_steps=1, **trainer_kwargs).fit(model, CurveData(num_samples=4, batch_size=4))


@pytest.mark.parametrize(
    "optimizer",
    [functools.partial(SQPAdam, lr=0.01), functools.partial(torch.optim.Adam, lr=0.01)],
    ids=["SQPAdam", "torch.Adam"],
)
def test_checkpoint_resume_is_bit_exact(tmp_path, optimizer):
    """2N steps == N steps, checkpoint, resume, N steps (checkpoint at an epoch boundary: Lightning
    restarts a partially seen epoch's sampler, so a mid-epoch resume sees other batches)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def make():
        torch.manual_seed(0)
        scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5)
        return CurveFit(optimizer=optimizer, lr_scheduler=scheduler), CurveData(num_samples=32, batch_size=8)

    model, data = make()
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=8, save_top_k=-1)
    quiet_trainer(max_steps=16, limit_val_batches=0, enable_checkpointing=True, callbacks=[every]).fit(model, data)
    straight = [p.detach().clone() for p in model.parameters()]
    half = next(tmp_path.glob("*step=8.ckpt"))  # 4 batches per epoch: step 8 ends epoch 1

    model, data = make()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the checkpoint must restore everything
    trainer = quiet_trainer(max_steps=16, limit_val_batches=0)
    trainer.fit(model, data, ckpt_path=half)  # weights_only=True: plain data
    assert trainer.global_step == 16
    for a, b in zip(model.parameters(), straight):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize(
    "optimizer, expected",
    [
        (functools.partial(SQPHeavyBall, lr=0.02, rho="full"), (SQPHeavyBall, 0.02)),
        (functools.partial(functools.partial(torch.optim.SGD, lr=0.03), momentum=0.5), (torch.optim.SGD, 0.03)),
        (torch.optim.Adam, (torch.optim.Adam, 1e-3)),
        ({"class_path": "lit_constrained.optim.AdamCon", "init_args": {"lr": 0.04}}, (AdamCon, 0.04)),
    ],
    ids=["partial", "nested-partial", "class", "dict"],
)
def test_load_from_checkpoint_rebuilds_the_optimizer_from_a_safe_load(tmp_path, optimizer, expected):
    """The optimizer is stored as class path + init args: torch's safe weights_only=True load suffices."""
    model = CurveFit(hidden=8, optimizer=optimizer)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(model, CurveData(num_samples=8, batch_size=8))
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    raw = torch.load(tmp_path / "m.ckpt", weights_only=True)  # no pickled code in the file
    assert raw["hyper_parameters"]["optimizer"]["class_path"].endswith(expected[0].__name__)
    loaded = CurveFit.load_from_checkpoint(tmp_path / "m.ckpt")
    assert loaded.hparams.hidden == 8
    config = loaded.configure_optimizers()
    opt = config["optimizer"] if isinstance(config, dict) else config  # the package's optimizers come with a decay
    assert type(opt) is expected[0] and opt.param_groups[0]["lr"] == expected[1]
    if expected[0] is torch.optim.SGD:
        assert opt.param_groups[0]["momentum"] == 0.5


def test_scheduler_survives_the_checkpoint_too(tmp_path):
    scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5)
    model = CurveFit(hidden=8, optimizer=functools.partial(SQPAdam, lr=0.01), lr_scheduler=scheduler)
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, CurveData(num_samples=8, batch_size=8))
    model.trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = CurveFit.load_from_checkpoint(tmp_path / "m.ckpt")
    config = loaded.configure_optimizers()
    step_lr = config["lr_scheduler"]["scheduler"]
    assert isinstance(step_lr, torch.optim.lr_scheduler.StepLR) and (step_lr.step_size, step_lr.gamma) == (3, 0.5)


@pytest.mark.parametrize("bad", [lambda params: SQPAdam(params, lr=0.1), functools.partial(lambda p, lr: None, lr=1)])
def test_lambda_optimizer_fails_at_construction_with_what_to_pass(bad):
    with pytest.raises(TypeError, match=r"functools.partial\(torch.optim.Adam, lr=1e-3\)"):
        CurveFit(optimizer=bad)


def test_non_plain_init_args_are_rejected_at_construction():
    with pytest.raises(TypeError, match="not plain data"):
        CurveFit(optimizer=functools.partial(torch.optim.Adam, lr=torch.tensor(0.1)))


def test_default_optimizer_is_sqp_adam_with_the_class_defaults():
    import inspect

    model = CurveFit()
    assert model.hparams.optimizer == {"class_path": "lit_constrained.optim.SQPAdam", "init_args": {}}
    config = model.configure_optimizers()
    opt = config["optimizer"]
    defaults = inspect.signature(SQPAdam).parameters
    assert isinstance(opt, SQPAdam) and opt.param_groups[0]["lr"] == defaults["lr"].default == 1e-3
    # the default lr decay (a cosine over the run; without a Trainer the run's length is unknown: constant)
    assert config["lr_scheduler"]["interval"] == "step" and config["lr_scheduler"]["scheduler"].get_last_lr() == [1e-3]
    assert opt.rho == defaults["rho"].default == "full"


def _crafted_checkpoint(tmp_path, module_name: str) -> Path:
    """A checkpoint that passes the safe load and names ``<module_name>.Evil`` as its optimizer; the
    module, on sys.path, would write a marker file if it were ever imported."""
    (tmp_path / f"{module_name}.py").write_text(
        f"from pathlib import Path\nPath({str(tmp_path / 'imported')!r}).write_text('ran')\n"
        "import torch\nclass Evil(torch.optim.SGD):\n    pass\n"
    )
    model = CurveFit(hidden=4, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, CurveData(num_samples=8, batch_size=8))
    model.trainer.save_checkpoint(tmp_path / "ok.ckpt")
    checkpoint = torch.load(tmp_path / "ok.ckpt", weights_only=True)
    checkpoint["hyper_parameters"]["optimizer"] = {"class_path": f"{module_name}.Evil", "init_args": {"lr": 0.1}}
    checkpoint.pop("lit_constrained_integrity")  # a crafted file carries no content hash (an edited one would not match)
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    return tmp_path / "crafted.ckpt"


def test_checkpoint_naming_an_untrusted_module_is_refused_before_import(tmp_path, monkeypatch):
    from lit_constrained.class_spec import UntrustedClassPathError

    crafted = _crafted_checkpoint(tmp_path, "h14_crafted_payload")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UntrustedClassPathError, match="h14_crafted_payload.Evil"):
        CurveFit.load_from_checkpoint(crafted)
    assert not (tmp_path / "imported").exists() and "h14_crafted_payload" not in sys.modules
    # the caller may name the module explicitly: then it loads (and its code runs)
    loaded = CurveFit.load_from_checkpoint(crafted, trusted_modules=["h14_crafted_payload"])
    assert type(loaded.configure_optimizers()).__name__ == "Evil" and (tmp_path / "imported").exists()
    sys.modules.pop("h14_crafted_payload", None)


def test_fit_ckpt_path_with_an_untrusted_class_is_refused_before_import(tmp_path, monkeypatch, capsys):
    from lit_constrained.cli.fit import main

    crafted = _crafted_checkpoint(tmp_path, "h14_crafted_cli_payload")
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = torch.load(crafted, weights_only=True)  # as a LightningCLI run stores it
    checkpoint["hyper_parameters"]["_class_path"] = "lit_constrained.tasks.curve.CurveFit"
    torch.save(checkpoint, crafted)
    config = Path(__file__).resolve().parents[1] / "configs/curve/sqp_adam.yaml"
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:  # UntrustedClassPathError, printed as one line
        main(["fit", "--config", str(config), "--ckpt_path", str(crafted), "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2"])
    assert raised.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "h14_crafted_cli_payload.Evil" in lines[0], lines
    assert not (tmp_path / "imported").exists() and "h14_crafted_cli_payload" not in sys.modules


def test_fit_prints_a_summary_with_the_violation_at_start_and_end(capsys):
    torch.manual_seed(0)
    model = CurveFit(optimizer=functools.partial(SQPAdam, lr=0.01, rho="full"))
    quiet_trainer(max_steps=30, limit_val_batches=0).fit(model, CurveData(num_samples=16, batch_size=16))
    out = capsys.readouterr().out
    assert "fit summary" in out and "steps        30 in" in out
    line = next(x for x in out.splitlines() if "max |c|" in x)
    assert "over the m = 3 imposed constraints" in line
    start = float(line.split()[2])
    torch.manual_seed(0)
    fresh = CurveFit(optimizer=functools.partial(SQPAdam, lr=0.01, rho="full"))
    assert start == pytest.approx(float(fresh.constraints(None).detach().abs().max()), rel=1e-2)  # c(x_0) anew
    end = float(line.split("->")[1].split()[0])
    assert end == pytest.approx(float(model.constraints(None).detach().abs().max()), rel=1e-2)


def test_validation_logs_task_metrics_with_input_derivatives_available():
    model = CurveFit(optimizer=functools.partial(SQPAdam, lr=0.01))
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(model, CurveData(num_samples=8, batch_size=8))
    result = trainer.validate(model, CurveData(num_samples=8, batch_size=8), verbose=False)[0]
    assert {"Objective/val", "val/mse", "Violation/val"} <= set(result)


class ForgotCreateGraph(ConstrainedModule):
    """An ODE residual u' + u at two points, with du/dt taken WITHOUT create_graph=True."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def objective(self, batch):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def constraints(self, batch):
        t = torch.tensor([[0.25], [0.75]], requires_grad=True)
        u = self.net(t)
        (du_dt,) = torch.autograd.grad(u.sum(), t)  # the mistake: the graph of u is freed here
        return (du_dt + u).squeeze(-1)


def test_forgotten_create_graph_is_named_in_the_error():
    model = ForgotCreateGraph(optimizer=functools.partial(SQPAdam, lr=0.01))
    with pytest.raises(RuntimeError, match=r"compute the residual with create_graph=True"):
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, CurveData(num_samples=8, batch_size=8))


# -- imposed(): per-point parts, the default constraints and Jacobian, per-part violation tags -------


class TwoParts(ConstrainedModule):
    """CurveFit's data term with two imposed parts: u' = 2 pi cos(2 pi x) at 4 points (by jvp) and
    (u, u^2) = (sin, sin^2) at 3 anchors (a (N, 2) residual)."""

    def __init__(self, part_name: str = "anchor", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.part_name = part_name
        self.register_buffer("x_slope", torch.tensor([[0.2], [0.4], [0.6], [0.9]]))
        self.register_buffer("x_anchor", torch.tensor([[0.1], [0.5], [0.8]]))

    def objective(self, batch):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def slope(self, x):
        _, u_x = torch.func.jvp(self.net, (x,), (torch.ones_like(x),))
        return (u_x - 2 * torch.pi * torch.cos(2 * torch.pi * x))[:, 0]

    def anchor(self, x):
        u, s = self.net(x), torch.sin(2 * torch.pi * x)
        return torch.cat([u - s, u**2 - s**2], dim=1)

    def imposed(self, batch):
        from lit_constrained import Imposed

        return {"slope": Imposed(self.slope, self.x_slope), self.part_name: Imposed(self.anchor, self.x_anchor)}


def test_imposed_parts_give_the_default_constraints_and_a_pointwise_jacobian():
    from lit_constrained.optim import constraint_jacobian

    model = TwoParts(constraint_dtype="native")  # the parts as they are (float64 c: tests/module_parts/test_imposed_rows.py)
    c = model.constraints(None)
    expected = torch.cat([model.slope(model.x_slope), model.anchor(model.x_anchor).reshape(-1)])
    torch.testing.assert_close(c, expected, rtol=0, atol=0)
    params = list(model.parameters())
    model.pointwise_jacobian.small_part_rows = 0  # the torch.func path even for these few rows
    J = model.constraint_jacobian(None, c, params, rows=slice(2, 9))  # jacobian_method="auto"
    assert set(model.pointwise_jacobian.paths.values()) == {"func"}  # auto chose the per-point engine
    torch.testing.assert_close(J, constraint_jacobian(c, params, method="loop")[2:9], rtol=1e-5, atol=1e-6)
    assert has_constraints(model, ConstrainedModule)


def test_imposed_part_violations_are_logged_per_part_at_train_and_val():
    from tests.helpers.lightning import MemoryLogger

    model = TwoParts(optimizer=functools.partial(SQPAdam, lr=0.01))
    start = {"slope": float(model.slope(model.x_slope).detach().abs().max()),
             "anchor": float(model.anchor(model.x_anchor).detach().abs().max())}
    logger = MemoryLogger()
    quiet_trainer(max_steps=4, logger=logger, log_every_n_steps=1, check_val_every_n_epoch=2).fit(
        model, CurveData(num_samples=8, batch_size=8))
    for stage in ("train", "val"):
        parts = [logger.series(f"Violation/{name}/{stage}") for name in ("slope", "anchor")]
        total = logger.series(f"Violation/{stage}")
        assert total and all(len(p) == len(total) for p in parts)
        for values in zip(total, *parts):  # the whole max is the larger part's
            assert values[0] == pytest.approx(max(values[1:]), rel=1e-6)
    first = {name: next(v for s, r in logger.records for k, v in r.items() if s == 0 and k == f"Violation/{name}/train")
             for name in start}
    assert first == pytest.approx(start, rel=1e-5)  # step 0: the parts at the initial weights


def test_bad_imposed_declarations_are_clear_errors():
    with pytest.raises(ValueError, match="jacobian_method must be"):
        TwoParts(jacobian_method="dense")
    with pytest.raises(ValueError, match="reserved"):
        TwoParts(part_name="val").constraints(None)
    with pytest.raises(ValueError, match="needs CurveFit.imposed"):
        model = CurveFit(jacobian_method="pointwise")
        model.constraint_jacobian(None, model.constraints(None), list(model.parameters()))
