"""``ConstrainedModule(default_callbacks=...)``: which of the package's callbacks every Trainer gets
(``configure_callbacks``), in Python and from a config; ``CheckpointIntegrity`` is always one of them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import yaml

from lit_constrained.callbacks.health import RunHealth
from lit_constrained.callbacks.integrity import CheckpointIntegrity
from lit_constrained.callbacks.log10 import Log10Headlines
from lit_constrained.callbacks.summary import FitSummary
from lit_constrained.cli.fit import main
from lit_constrained.module import OPTIONAL_CALLBACKS, chosen_callbacks
from lit_constrained.tasks.curve import CurveData, CurveFit

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/curve/sqp_adam.yaml"
ALL = {"FitSummary", "RunHealth", "CheckpointIntegrity", "Log10Headlines"}


def _package_callbacks(trainer: pl.Trainer) -> set[str]:
    """The names of the package's default callbacks among the Trainer's callbacks."""
    kinds = (FitSummary, RunHealth, CheckpointIntegrity, Log10Headlines)
    return {type(c).__name__ for c in trainer.callbacks if isinstance(c, kinds)}


class CallbacksSeen(pl.Callback):
    """Records, at the start of a fit, the package's callbacks the Trainer holds (after ``configure_callbacks``)."""

    seen: list[set[str]] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        CallbacksSeen.seen.append(_package_callbacks(trainer))


def _fit(tmp_path: Path, **module_args: Any) -> pl.Trainer:
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, limit_val_batches=0)
    trainer.fit(CurveFit(num_threads=1, **module_args), datamodule=CurveData())
    return trainer


@pytest.mark.parametrize("value,expected", [
    (True, ALL),
    (False, {"CheckpointIntegrity"}),
    (["FitSummary"], {"FitSummary", "CheckpointIntegrity"}),
    (("Log10Headlines", "RunHealth"), {"RunHealth", "Log10Headlines", "CheckpointIntegrity"}),
])
def test_a_trainer_holds_the_chosen_callbacks_and_always_checkpoint_integrity(tmp_path, value, expected):
    trainer = _fit(tmp_path, default_callbacks=value)
    assert _package_callbacks(trainer) == expected
    assert trainer.global_step == 1


def test_the_default_is_every_callback(tmp_path):
    assert _package_callbacks(_fit(tmp_path)) == ALL


def test_the_choice_keeps_the_package_order_and_refuses_other_names():
    assert OPTIONAL_CALLBACKS == ("FitSummary", "RunHealth", "Log10Headlines")
    assert chosen_callbacks(["Log10Headlines", "FitSummary"]) == ("FitSummary", "Log10Headlines")
    assert chosen_callbacks("RunHealth") == ("RunHealth",)
    for bad in (["CheckpointIntegrity"], ["Fitsummary"]):
        with pytest.raises(ValueError, match="CheckpointIntegrity is always added"):
            CurveFit(default_callbacks=bad)


@pytest.mark.parametrize("route", ["command line", "config file"])
def test_the_command_line_takes_the_argument(tmp_path, monkeypatch, route):
    """``--model.init_args.default_callbacks [FitSummary]`` and the same key in a YAML config reach the
    module: the Trainer of the fit holds FitSummary and CheckpointIntegrity only."""
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    monkeypatch.setattr(CallbacksSeen, "seen", [])
    if route == "command line":
        config = ["--config", str(CONFIG), "--model.init_args.default_callbacks", "[FitSummary]"]
    else:
        settings = yaml.safe_load(CONFIG.read_text())
        settings["model"]["init_args"]["default_callbacks"] = ["FitSummary"]
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(settings))
        config = ["--config", str(tmp_path / "config.yaml")]
    main(["fit", *config, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
          "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
          f"--trainer.callbacks+={__name__}.CallbacksSeen"])
    assert CallbacksSeen.seen == [{"FitSummary", "CheckpointIntegrity"}]


def test_the_command_line_refuses_checkpoint_integrity_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", str(CONFIG), "--model.init_args.default_callbacks", "[CheckpointIntegrity]",
              "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false"])
    assert raised.value.code == 2
    assert "default_callbacks" in capsys.readouterr().err
