"""The lit-constrained command (LightningCLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lit_constrained.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_fit_from_yaml_writes_tensorboard_events(tmp_path):
    main([
        "fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"),
        "--trainer.max_epochs", "3", "--trainer.log_every_n_steps", "1", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false",
    ])
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file was written"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/objective", "train/violation_max", "train/violation_mean", "train/violation_l1", "optim/rank"} <= tags
    assert (tmp_path / "lightning_logs/version_0/config.yaml").exists()


@pytest.mark.parametrize(
    "optimizer", ["SQPAdam", "SQPHeavyBall", "AdamCon", "torch.optim.Adam"]
)
def test_short_class_paths_resolve(tmp_path, optimizer):
    main([
        "fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"),
        "--model.optimizer", optimizer, "--model.optimizer.lr", "0.01",
        "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
    ])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lit_constrained.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_print_config_and_help():
    out = run_cli("fit", "--config", "configs/curve/sqp_adam.yaml", "--print_config")
    assert out.returncode == 0, out.stderr
    assert "lit_constrained.optim.SQPAdam" in out.stdout and "rho: full" in out.stdout
    help_text = run_cli("fit", "--model.help", "lit_constrained.tasks.curve.CurveFit").stdout
    assert "--model.penalty_weight" in help_text and "--model.optimizer" in help_text


def test_config_typo_is_a_clear_error():
    out = run_cli("fit", "--config", "configs/curve/sqp_adam.yaml", "--model.init_args.hiden", "3")
    assert out.returncode != 0
    assert "hiden" in out.stderr
