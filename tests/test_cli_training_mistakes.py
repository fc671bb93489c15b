"""Issue 47 item 4: a user's mistake at training time, through the command line, is the package's one
line naming the fix and exit status 2 (no traceback; ``LIT_CONSTRAINED_TRACEBACK=1`` shows it); an error
of the user's own code keeps its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TASK = '''
import torch
from torch.utils.data import DataLoader
import lightning.pytorch as pl
from lit_constrained import ConstrainedModule, Imposed

MISTAKE = "MISTAKE_NAME"


class Data(pl.LightningDataModule):
    def train_dataloader(self):
        t = torch.linspace(0, 1, 8).unsqueeze(-1)
        return DataLoader([(t, t)], batch_size=None)


class Task(ConstrainedModule):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Linear(1, 1)

    def forward(self, t):
        return self.net(t)[:, 0]

    def objective(self, batch):
        t, u = batch
        if MISTAKE == "own_error":
            raise ValueError("a mistake of the user's own code")
        return (self.net(t) - u).pow(2).mean()

    def imposed(self, batch):
        points = torch.tensor([[0.25], [0.75]])
        if MISTAKE == "sense":
            return {"c": Imposed(self, points, sense="=>")}
        if MISTAKE == "points_1d":
            return {"c": Imposed(self, points[:, 0])}
        if MISTAKE == "nan":
            return {"c": Imposed(lambda x: self(x) * float("nan"), points)}
        return {"c": Imposed(self, points)}
'''

CONFIG = """trainer: {max_steps: 2, logger: false, enable_checkpointing: false, enable_progress_bar: false,
          enable_model_summary: false}
model: {class_path: mistake_task.Task, init_args: {num_threads: 1}}
data: {class_path: mistake_task.Data}
"""


def run_fit(tmp_path: Path, mistake: str, extra: list[str] = (), env: dict | None = None) -> tuple[int, str]:
    """``lit-constrained fit`` through the console's ``main`` in a fresh interpreter: the exit status and
    everything it printed (stdout and stderr)."""
    (tmp_path / "mistake_task.py").write_text(TASK.replace("MISTAKE_NAME", mistake))
    (tmp_path / "config.yaml").write_text(CONFIG)
    code = textwrap.dedent(f"""
        from lit_constrained.cli.console import main
        main(["fit", "--config", "config.yaml", *{list(extra)!r}])
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout + done.stderr


#: Lightning's start-up lines, printed by every run before training starts (not the mistake's)
BANNER = ("Seed set to", "GPU available:", "TPU available:", "HPU available:", "\N{ELECTRIC LIGHT BULB} Tip:")


def after_the_banner(output: str) -> list[str]:
    """The non-empty lines of ``output`` other than Lightning's start-up banner."""
    return [line for line in output.splitlines() if line.strip() and not line.startswith(BANNER)]


@pytest.mark.parametrize("mistake, fix", [
    ("sense", "'='"),
    ("points_1d", "2-D tensor"),
    ("nan", "on_nonfinite"),
])
def test_a_validation_error_of_the_package_is_one_line_with_exit_status_2(tmp_path: Path, mistake, fix) -> None:
    status, output = run_fit(tmp_path, mistake)
    lines = after_the_banner(output)
    assert status == 2 and "Traceback" not in output, output[-3000:]
    assert len(lines) == 1 and lines[0].startswith("lit-constrained fit: error: ") and fix in lines[0], lines


def test_ckpt_path_last_before_any_checkpoint_is_one_line(tmp_path: Path) -> None:
    status, output = run_fit(tmp_path, "none", ["--ckpt_path", "last"])
    lines = after_the_banner(output)
    assert status == 2 and "Traceback" not in output, output[-3000:]
    assert len(lines) == 1 and "last-or-fresh" in lines[0], lines


def test_the_environment_variable_shows_the_traceback(tmp_path: Path) -> None:
    status, output = run_fit(tmp_path, "sense", env={"LIT_CONSTRAINED_TRACEBACK": "1"})
    assert status == 1 and "Traceback" in output and "=>" in output, output[-3000:]


def test_an_error_of_the_users_own_code_keeps_its_traceback(tmp_path: Path) -> None:
    status, output = run_fit(tmp_path, "own_error")
    assert status == 1 and "Traceback" in output and "a mistake of the user's own code" in output, output[-3000:]
