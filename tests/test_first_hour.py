"""A new user's first hour (issue 14): their own task next to their own config.yaml, run from that
directory, must load without PYTHONPATH and leave their files as they wrote them."""

from __future__ import annotations

import sys

import pytest

from lit_constrained.cli.fit import main

TASK = '''
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl
from lit_constrained import ConstrainedModule


class LineData(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        t = torch.linspace(0, 1, 16).unsqueeze(-1)
        self.rows = TensorDataset(t, 2 * t + 1)

    def train_dataloader(self):
        return DataLoader(self.rows, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.rows, batch_size=8)


class LineFit(ConstrainedModule):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, t):
        return self.net(t)

    def objective(self, batch):
        t, y = batch
        return (self(t) - y).pow(2).mean()

    def constraints(self, batch):
        return self(torch.tensor([[0.0], [1.0]])).squeeze(-1) - torch.tensor([1.0, 3.0])

    def validation_constraints(self, batch):
        t, y = batch
        return (self(t) - y).squeeze(-1)
'''

CONFIG = """# my experiment: a line through two pinned points
# (comments I wrote; they must survive every run)
seed_everything: 0
trainer:
  max_steps: 20
  log_every_n_steps: 1
  check_val_every_n_epoch: null
  val_check_interval: 10
model:
  class_path: h14_user_task.LineFit   # next to this file
data:
  class_path: h14_user_task.LineData
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "h14_user_task.py").write_text(TASK)
    (tmp_path / "config.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    yield tmp_path
    sys.modules.pop("h14_user_task", None)


def test_user_task_loads_from_the_working_directory_and_config_yaml_is_never_overwritten(user_dir, capsys):
    original = (user_dir / "config.yaml").read_bytes()
    main(["fit", "--config", "config.yaml", "--trainer.logger", "false", "--trainer.max_epochs", "1"])
    assert (user_dir / "config.yaml").read_bytes() == original  # no logger: no run directory, nothing written
    main(["fit", "--config", "config.yaml"])
    assert (user_dir / "config.yaml").read_bytes() == original
    saved = [p for p in (user_dir / "lightning_logs").rglob("config.yaml")]
    assert len(saved) == 1 and "h14_user_task.LineFit" in saved[0].read_text()  # the resolved one, in the run dir
    out = capsys.readouterr().out
    assert out.count("fit summary") == 2


def test_validate_names_what_each_violation_figure_covers(user_dir, capsys):
    main(["validate", "--config", "config.yaml", "--trainer.logger", "false"])
    out = capsys.readouterr().out
    legend = out[out.index("val figures:"):]
    assert "max |r| over all 16 residuals of validation_constraints() (training imposes 2: constraints())" in legend
    assert "max |c| of the m = 2 imposed constraints" in legend


def test_a_run_shorter_than_the_validation_interval_still_reports_validation(user_dir, capsys):
    main(["fit", "--config", "config.yaml", "--trainer.logger", "false", "--trainer.max_steps", "5"])
    out = capsys.readouterr().out
    summary = out[out.index("fit summary"):]
    assert "validation   at the final weights (step 5):" in summary
    assert "max |r| over all 16 residuals of validation_constraints()" in summary
    assert "checkpoint   " in summary and "none written" not in summary
