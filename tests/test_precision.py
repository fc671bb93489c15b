"""Precision settings behave as the README says: 16-mixed (however spelled) and bf16-true are refused at
set-up, also where Lightning itself would have run 16-mixed as bf16-mixed (on CPU); bf16-mixed trains."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lit_constrained.cli.fit import main

CONFIG = Path(__file__).resolve().parents[1] / "configs/curve/sqp_adam.yaml"


def _fit(tmp_path: Path, precision: str) -> None:
    main(["fit", "--config", str(CONFIG), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.enable_checkpointing", "false", "--trainer.max_steps", "2", "--trainer.accelerator", "cpu",
          "--trainer.precision", precision, "--trainer.default_root_dir", str(tmp_path)])


@pytest.mark.parametrize("precision", ["16-mixed", "16", "bf16-true"])
def test_refused_precisions_are_refused_on_the_command_line(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One line on stderr with the fix, exit status 2 (a set-up refusal, not a traceback)."""
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    expected = "'bf16-true' is not supported" if precision == "bf16-true" else (
        "'16-mixed' is not supported (Lightning would run it as 'bf16-mixed' here)")
    with pytest.raises(SystemExit) as exit_info:
        _fit(tmp_path, precision)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert expected in error and "Traceback" not in error


def test_bf16_mixed_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    _fit(tmp_path, "bf16-mixed")
    assert "steps        2 in" in capsys.readouterr().out
