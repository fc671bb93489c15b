"""FitSummary: the words of the end-of-fit summary (one word for one meaning: "imposed" only where the
optimizer imposes the constraints) and its timing of a resumed run (the steps before the interruption
apart from this run's steps and seconds)."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from lit_constrained import ConstrainedModule, Imposed
from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.curve import CurveData
from tests.helpers.lightning import quiet_trainer


class TwoPartCurve(ConstrainedModule):
    """y(x) ~ sin(2 pi x) with two parts of imposed(): the value at 3 anchors and the value at 2 more."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.register_buffer("x_left", torch.tensor([[0.1], [0.2], [0.3]]))
        self.register_buffer("x_right", torch.tensor([[0.7], [0.9]]))

    def objective(self, batch):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def value(self, x):
        return (self.net(x) - torch.sin(2 * torch.pi * x))[:, 0]

    def imposed(self, batch):
        return {"left": Imposed(self.value, self.x_left), "boundary": Imposed(self.value, self.x_right)}


def _summary(optimizer, capsys) -> str:
    quiet_trainer(max_steps=2).fit(TwoPartCurve(optimizer=optimizer), CurveData(num_samples=8, batch_size=8))
    return capsys.readouterr().out.split("fit summary", 1)[1]


def test_plain_adam_never_calls_its_monitored_parts_imposed(capsys):
    summary = _summary(functools.partial(torch.optim.Adam, lr=1e-2), capsys)
    assert "over the m = 5 constraints, monitored, not imposed" in summary  # the headline
    part_lines = [line for line in summary.splitlines() if re.search(r"Violation/(left|boundary)/val", line)]
    assert len(part_lines) == 2, summary
    for line in part_lines:
        assert "monitored, not imposed" in line and "imposed part" not in line, line
    assert "imposed constraints" not in summary


def test_a_constrained_optimizer_names_its_parts_imposed(capsys):
    summary = _summary(functools.partial(SQPAdam, lr=1e-2), capsys)
    assert "over the m = 5 imposed constraints" in summary
    for part in ("left", "boundary"):
        line = next(line for line in summary.splitlines() if f"Violation/{part}/val" in line)
        assert f"the imposed part {part!r} (imposed())" in line and "monitored" not in line, line


def _fit_curve(tmp_path, max_steps: int, resume: bool):
    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint
    from lit_constrained.tasks.curve import CurveFit

    torch.manual_seed(0)
    model = CurveFit(hidden=8, optimizer=functools.partial(SQPAdam, lr=1e-2))
    trainer = quiet_trainer(max_steps=max_steps, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[CrashSafeCheckpoint(dirpath=str(tmp_path), every_n_steps=1)])
    trainer.fit(model, CurveData(num_samples=8, batch_size=8), ckpt_path="last" if resume else None)


def test_a_resumed_fit_says_the_steps_before_apart_from_this_runs_steps_and_seconds(tmp_path, capsys):
    _fit_curve(tmp_path, 3, resume=False)
    first = capsys.readouterr().out.split("fit summary", 1)[1]
    assert re.search(r"\n  steps        3 in [0-9.]+ s \([0-9.]+ ms a step\)\n", first), first
    assert "at the start ->" in first and "health" not in first  # an uninterrupted run: as before
    _fit_curve(tmp_path, 7, resume=True)
    summary = capsys.readouterr().out.split("fit summary", 1)[1]
    found = re.search(r"\n  steps        7: 3 before the resume \(from the checkpoint\), 4 in this run in "
                      r"([0-9.]+) s \(([0-9.]+) ms a step\)\n", summary)
    assert found, summary
    seconds, per_step = map(float, found.groups())
    assert per_step == pytest.approx(1e3 * seconds / 4, abs=1e3 * 0.05 / 4 + 0.05)  # this run's 4 steps, not 7
    assert "at this run's start (step 3) ->" in summary
    assert "\n  health       judged on this run's steps 3-7: no finding\n" in summary
    _fit_curve(tmp_path, 7, resume=True)  # resumed at its end: no step in this run
    again = capsys.readouterr().out.split("fit summary", 1)[1]
    assert ("\n  steps        7: 7 before the resume (from the checkpoint), none in this run (the checkpoint had "
            "reached max_steps / max_epochs already)\n") in again, again
    assert "health" not in again
