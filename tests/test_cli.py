"""The lit-constrained command (LightningCLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_constrained.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _command_line_is_the_args(monkeypatch):
    """main(args) in a test: sys.argv holds pytest's options, which LightningCLI would warn about."""
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])


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
    assert {"Objective/train", "Violation/train", "Objective/val", "Violation/val"} <= tags
    assert (tmp_path / "lightning_logs/curvefit/SQPAdam/version_000/config.yaml").exists()  # <task>/<optimizer>


@pytest.mark.parametrize(
    "optimizer", ["SQPAdam", "SQPHeavyBall", "AdamCon", "{class_path: torch.optim.Adam, init_args: {lr: 0.01}}"]
)
def test_short_class_paths_resolve(tmp_path, optimizer):
    main([
        "fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"),
        "--model.optimizer", optimizer, "--model.optimizer.lr", "0.01",
        "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
    ])


def test_switching_the_optimizer_class_never_drops_init_args_silently(capsys):
    """The paper config sets SQPAdam(lr, rho=1, h=1, eps=1e-7): torch.optim.Adam takes no rho, so a bare
    switch is an error naming it; SQPHeavyBall keeps lr, rho and h; the whole new optimizer given
    explicitly is accepted."""
    config = str(ROOT / "configs/spring/paper/sqp_adam.yaml")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer", "torch.optim.Adam", "--print_config"])
    assert exit_info.value.code != 0
    assert "'rho': 1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer", "SQPHeavyBall", "--print_config"])
    printed = capsys.readouterr().out
    assert exit_info.value.code in (0, None) and "rho: 1.0" in printed and "lr: 0.0005" in printed
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.optimizer",
              "{class_path: torch.optim.Adam, init_args: {lr: 0.01}}", "--print_config"])
    assert exit_info.value.code in (0, None) and "torch.optim.Adam" in capsys.readouterr().out


def test_abbreviated_options_are_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"), "--trainer.max_epoch", "5"])
    assert exit_info.value.code != 0 and "max_epoch" in capsys.readouterr().err


def test_help_is_plain_words(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "configs/curve/sqp_adam.yaml"), "--model.optimizer.help", "SQPAdam"])
    text = capsys.readouterr().out
    assert "--optimizer.rho" in text
    for markup in (":math:", ":class:", ":meth:", ":func:", "``", "\\rho", "\\alpha", "\\beta"):
        assert markup not in text, markup


def test_top_level_help_lists_compare_without_importing_torch():
    code = (
        "import sys, time; t = time.perf_counter(); from lit_constrained.console import main; main(['--help']); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch', time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "compare" in out.stdout and "no torch" in out.stdout
    assert float(out.stdout.split()[-1]) < 3.0
    full = run_cli("--help")  # LightningCLI's own help lists it too
    assert "compare" in full.stdout


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


def test_a_config_naming_another_optimizer_gets_that_class_defaults(tmp_path):
    """Not SQP-Adam's values for shared argument names (torch Adam's eps is 1e-8, SQP-Adam's 1e-7)."""
    import yaml

    config = yaml.safe_load((ROOT / "configs/curve/sqp_adam.yaml").read_text())
    config["model"]["init_args"]["optimizer"] = {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}}
    (tmp_path / "adam.yaml").write_text(yaml.safe_dump(config))
    from lit_constrained.cli import ConstrainedCLI
    from lit_constrained.cli_parsing import ConstrainedArgumentParser
    from lit_constrained.module import ConstrainedModule
    import lightning.pytorch as pl

    cli = ConstrainedCLI(
        ConstrainedModule, pl.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
        auto_configure_optimizers=False, parser_class=ConstrainedArgumentParser, run=False,
        args=["--config", str(tmp_path / "adam.yaml"), "--trainer.logger", "false"],
    )
    optimizer = cli.model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["eps"] == 1e-8
    assert cli.model.hparams.optimizer["init_args"]["eps"] == 1e-8
