"""The step and the module with inequality rows (lit_constrained/stepping.py, module.py, the violation
figures and the fit summary): what the optimizer is handed (the equality rows as c/J, the inequality
rows signed to read g <= 0 as g/G, the closure's (c, g)), which optimizers are refused, and what is
logged, against a hand computation on u(x) = b + w x (w = 0.5, b = 0.2), where every residual and its
Jacobian row (x, 1) are known in closed form."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lit_constrained.imposed import Coupled, Imposed, PartLayout
from lit_constrained.module import ConstrainedModule
from lit_constrained.optim import AdamCon
from tests.helpers.lightning import MemoryLogger, quiet_trainer

F64 = torch.float64
X_BC = [[-1.0], [1.0]]
X_ABOVE = [[-0.5], [0.0], [0.5]]
X_BELOW = [[0.0], [0.4]]


def psi(x: Tensor) -> Tensor:
    return 0.3 - x[:, 0] ** 2


class Line(ConstrainedModule):
    """u = b + w x with u(+-1) = 0 (equality), u >= psi at three points, u <= 0.3 at two."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = torch.nn.Linear(1, 1).to(F64)
        with torch.no_grad():
            self.net.weight.fill_(0.5)
            self.net.bias.fill_(0.2)
        for name, x in (("x_bc", X_BC), ("x_above", X_ABOVE), ("x_below", X_BELOW)):
            self.register_buffer(name, torch.tensor(x, dtype=F64))

    def u(self, x: Tensor) -> Tensor:
        return self.net(x)[:, 0]

    def objective(self, batch: Any) -> Tensor:
        return (self.net.weight - 1.0).pow(2).sum() + self.net.bias.pow(2).sum()

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"boundary": Imposed(self.u, self.x_bc),
                "above": Imposed(lambda x: self.u(x) - psi(x), self.x_above, sense=">="),
                "below": Imposed(lambda x: self.u(x) - 0.3, self.x_below, sense="<=")}


class LineByCoupledRows(Line):
    """The same rows as Coupled parts (each part's rows computed as a whole, the general autograd Jacobian)."""

    def imposed(self, batch: Any) -> dict[str, Coupled]:
        return {"boundary": Coupled(lambda: self.u(self.x_bc)),
                "above": Coupled(lambda: self.u(self.x_above) - psi(self.x_above), sense=">="),
                "below": Coupled(lambda: self.u(self.x_below) - 0.3, sense="<=")}


# u = 0.2 + 0.5 x: boundary (-0.3, 0.7); above u - psi = (-0.1, -0.1, 0.4) so g = (0.1, 0.1, -0.4);
# below u - 0.3 = (-0.1, 0.1) = g
C_EQ = [-0.3, 0.7]
G_ROWS = [0.1, 0.1, -0.4, -0.1, 0.1]
J_EQ = [[-1.0, 1.0], [1.0, 1.0]]  # d/d(w, b) of b + w x: (x, 1)
G_JAC = [[0.5, -1.0], [0.0, -1.0], [-0.5, -1.0], [0.0, 1.0], [0.4, 1.0]]  # the ">=" rows negated


class Recording(torch.optim.Optimizer):
    """Records what the step hands it and changes nothing (the weights stay at the hand-computed point)."""

    requires = frozenset({"constraints", "jacobian"})
    accepts_inequalities = True

    def __init__(self, params: Any, lr: float = 1e-3) -> None:
        super().__init__(params, {"lr": lr})
        self.diagnostics: dict[str, Tensor] = {}
        self.calls: list[dict[str, Any]] = []

    def step(self, closure: Any = None, *, constraints: Tensor | None = None, jacobian: Tensor | None = None,
             diagnostics: bool = False, constraint_closure: Any = None, inequalities: Tensor | None = None,
             inequality_jacobian: Tensor | None = None) -> Any:
        self.calls.append({"c": constraints, "J": jacobian, "g": inequalities, "G": inequality_jacobian,
                           "closure": None if constraint_closure is None else constraint_closure()})
        if diagnostics:
            self.diagnostics = {"active": torch.tensor(float(len(self.calls) % 3)), "dual_max": torch.tensor(0.5)}
        return None if closure is None else closure()


class RecordingWithoutInequalities(Recording):
    accepts_inequalities = False


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(1, 1, dtype=F64)), batch_size=1)


def fit(task: ConstrainedModule, steps: int = 1, **kwargs: Any) -> Any:
    trainer = quiet_trainer(max_steps=steps, limit_val_batches=0, **kwargs)
    trainer.fit(task, train_dataloaders=loader())
    return trainer


@pytest.mark.parametrize("task_class", [Line, LineByCoupledRows])
def test_the_optimizer_gets_the_equality_rows_and_the_signed_inequality_rows(task_class: type) -> None:
    task = task_class(optimizer=Recording, jacobian_method="auto")
    fit(task)
    (call,) = task.optimizers().optimizer.calls
    torch.testing.assert_close(call["c"], torch.tensor(C_EQ, dtype=F64))
    torch.testing.assert_close(call["g"], torch.tensor(G_ROWS, dtype=F64))
    torch.testing.assert_close(call["J"], torch.tensor(J_EQ, dtype=F64))
    torch.testing.assert_close(call["G"], torch.tensor(G_JAC, dtype=F64))
    c_now, g_now = call["closure"]  # the post-step corrections' (c, g), split as the step's rows
    torch.testing.assert_close(c_now, call["c"])
    torch.testing.assert_close(g_now, call["g"])


def test_a_task_without_inequality_rows_steps_as_before() -> None:
    """Equalities only: c and J as they are, no inequality argument, the closure returns c alone."""

    class Equalities(Line):
        def imposed(self, batch: Any) -> dict[str, Imposed]:
            return {"boundary": Imposed(self.u, self.x_bc)}

    task = Equalities(optimizer=Recording)
    fit(task)
    (call,) = task.optimizers().optimizer.calls
    assert call["g"] is None and call["G"] is None
    torch.testing.assert_close(call["closure"], torch.tensor(C_EQ, dtype=F64))


@pytest.mark.parametrize("optimizer", [AdamCon, RecordingWithoutInequalities])
def test_a_constrained_optimizer_without_inequalities_is_refused_before_any_update(optimizer: type) -> None:
    task = Line(optimizer=optimizer)
    before = [p.detach().clone() for p in task.parameters()]
    with pytest.raises(ValueError, match="SQPAdam or lit_constrained.optim.SQPHeavyBall") as error:
        fit(task)
    assert "\n" not in str(error.value) and optimizer.__name__ in str(error.value)
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, task.parameters()))


def test_adam_monitors_the_inequality_rows_by_their_violated_part() -> None:
    """Violation/<part>/train at step 0 (the start weights): boundary max|c| = 0.7, above max(g, 0) = 0.1
    (not 0.4: the row u - psi = 0.4 holds), below 0.1; Violation/train = 0.7."""
    task = Line(optimizer={"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}})
    logger = MemoryLogger()
    fit(task, steps=2, logger=logger, log_every_n_steps=1)
    first = {k: v for step, m in logger.records if step == 0 for k, v in m.items()}
    assert first["Violation/train"] == pytest.approx(0.7, abs=1e-12)
    assert first["Violation/boundary/train"] == pytest.approx(0.7, abs=1e-12)
    assert first["Violation/above/train"] == pytest.approx(0.1, abs=1e-12)
    assert first["Violation/below/train"] == pytest.approx(0.1, abs=1e-12)


def test_the_penalty_counts_the_violated_part() -> None:
    """penalty_weight * mean(v^2), v = (-0.3, 0.7, 0.1, 0.1, 0, 0, 0.1): f + 2 * 0.61 / 7 at the start."""
    task = Line(optimizer={"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}}, penalty_weight=2.0)
    logger = MemoryLogger()
    fit(task, steps=1, logger=logger, log_every_n_steps=1)
    f = (0.5 - 1.0) ** 2 + 0.2**2
    assert logger.series("Objective/train")[0] == pytest.approx(f + 2.0 * 0.61 / 7, abs=1e-12)


def test_the_diagnostics_active_and_dual_max_are_charted_as_optim() -> None:
    task = Line(optimizer=Recording)
    logger = MemoryLogger()
    fit(task, steps=4, logger=logger, log_every_n_steps=1)
    assert logger.series("optim/active")  # it varies (1, 2, 0, 1): charted
    assert not logger.series("optim/dual_max")  # constant 0.5: the run's text summary, not a flat chart


def test_the_fit_summary_counts_the_active_inequality_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """g = (0.1, 0.1, -0.4, -0.1, 0.1) at the end: 3 rows at or past their bound, max(g, 0) = 0.1;
    max |v| = 0.7 (not 0.4, the satisfied row's |r|)."""
    fit(Line(optimizer=Recording))
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    line = next(row for row in summary.splitlines() if row.strip().startswith("inequality"))
    assert "3 of the p = 5 inequality rows active" in line and "max(g, 0) 1.00e-01" in line
    assert "7.00e-01 at the start -> 7.00e-01 at the end" in summary


class FeasibleLine(Line):
    """u(1) = 0, u >= psi at X_ABOVE (binding at x = 0: b >= 0.3), u <= 0.45 at X_BELOW: feasible for
    w = -b, b in [0.3, 0.45]; the start (w, b) = (0.5, 0.2) violates u(1) = 0 and u(0) >= 0.3."""

    def imposed(self, batch: Any) -> dict[str, Imposed]:
        return {"boundary": Imposed(self.u, self.x_bc[1:]),
                "above": Imposed(lambda x: self.u(x) - psi(x), self.x_above, sense=">="),
                "below": Imposed(lambda x: self.u(x) - 0.45, self.x_below, sense="<=")}


@pytest.mark.parametrize("optimizer", ["SQPAdam", "SQPHeavyBall"])
def test_the_real_optimizers_hold_linear_inequalities_after_one_full_normal_step(optimizer: str) -> None:
    """Every row is linear in (w, b): the full normal step (rho = full, no safeguard) solves the
    linearized subproblem exactly, so after ONE step u(1) = 0 and every inequality row holds to
    round-off, checked on the weights themselves (not the step's own figures)."""
    task = FeasibleLine(optimizer={"class_path": f"lit_constrained.optim.{optimizer}",
                                   "init_args": {"lr": 1e-2, "rho": "full", "max_normal_step": None}})
    fit(task)
    with torch.no_grad():
        w, b = float(task.net.weight), float(task.net.bias)
        x_above, x_below = task.x_above[:, 0].tolist(), task.x_below[:, 0].tolist()
    assert abs(w + b) < 1e-12
    assert all(b + w * x - (0.3 - x * x) >= -1e-12 for x in x_above)
    assert all(b + w * x - 0.45 <= 1e-12 for x in x_below)
    assert b == pytest.approx(0.3, abs=1e-12)  # the row u(0) >= 0.3 is active: the step stops on it


def test_the_violation_monitor_norms_count_the_violated_part() -> None:
    """ConstraintViolationMonitor at step 0: |v| = (0.3, 0.7, 0.1, 0.1, 0, 0, 0.1): l1 = 1.3, mean = 1.3 / 7,
    l2 = sqrt(0.61) (the satisfied rows' |r| = 0.4, 0.1 do not count)."""
    from lit_constrained.callbacks.violation import ConstraintViolationMonitor

    task = Line(optimizer={"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}})
    logger = MemoryLogger()
    fit(task, steps=1, logger=logger, log_every_n_steps=1,
        callbacks=[ConstraintViolationMonitor(metrics=("mean", "l1", "l2"), stages=("train",))])
    # (the metrics' states are float32)
    assert logger.series("Violation/train/l1")[0] == pytest.approx(1.3, rel=1e-6)
    assert logger.series("Violation/train/mean")[0] == pytest.approx(1.3 / 7, rel=1e-6)
    assert logger.series("Violation/train/l2")[0] == pytest.approx(0.61**0.5, rel=1e-6)


def test_per_rank_constraints_repeat_the_senses_over_the_ranks_union() -> None:
    """constraints_shared = False on W = 2 ranks: the step imposes the union (2 m rows, rank 0's then rank
    1's), whose senses are the m senses twice (E = rows 0, 2; I = rows 1, 3); a plain task and injected
    services, no Trainer."""
    from lit_constrained.stepping import StepServices, TrainingStepper

    class PlainRows(torch.nn.Module):
        constraints_shared = False

        def __init__(self) -> None:
            super().__init__()
            self.x = torch.nn.Parameter(torch.tensor([0.5, -0.25], dtype=F64))

        def prepare_batch(self, batch: Any) -> Any:
            return batch

        def objective(self, batch: Any) -> Tensor:
            return self.x.pow(2).sum()

        def constraints(self, batch: Any) -> Tensor:  # (x0 = 0, x1 >= 0): r = (0.5, -0.25)
            return self.x.clone()

        def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any, rows: Any = None) -> Tensor:
            return torch.eye(2, dtype=F64)

        imposed_layout = (PartLayout("x0", 0, 1, 1), PartLayout("x1", 1, 1, 1, ">="))  # the rows' senses

    task = PlainRows()
    optimizer = Recording(task.parameters())

    def all_gather(t: Tensor) -> Tensor:  # two ranks that computed the same rows
        return torch.stack([t, t])

    services = StepServices(optimizer=optimizer, optimizer_step=optimizer.step, backward=lambda f: f.backward(),
                            all_gather=all_gather, world_size=2, rank=0)
    result = TrainingStepper().step(task, None, services)
    (call,) = optimizer.calls
    torch.testing.assert_close(call["c"], torch.tensor([0.5, 0.5], dtype=F64))  # the equality row of each rank
    torch.testing.assert_close(call["g"], torch.tensor([0.25, 0.25], dtype=F64))  # -r of each ">=" row
    torch.testing.assert_close(call["G"], torch.tensor([[0.0, -1.0], [0.0, -1.0]], dtype=F64))
    torch.testing.assert_close(call["J"], torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(result.constraints, torch.tensor([0.5, 0.25, 0.5, 0.25], dtype=F64))
