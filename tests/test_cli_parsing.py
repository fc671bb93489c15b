"""The parser of ``lit-constrained`` (lit_constrained/cli/fit/parser.py): help wrapped at spaces only and
in plain words, ``null`` read as null two class levels down, through public hooks only."""

from __future__ import annotations

import pytest

from lit_constrained.cli.fit.parser import ConstrainedArgumentParser


def test_help_wraps_at_spaces_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word longer than a narrow terminal's help column stays whole (argparse's own wrapping cuts it)."""
    monkeypatch.setenv("COLUMNS", "40")
    long_word = "lit_constrained.callbacks.checkpointing.CrashSafeCheckpoint"
    parser = ConstrainedArgumentParser(prog="probe")
    parser.add_argument("--callback", help=f"the default is {long_word} when checkpointing is on")
    assert long_word in parser.format_help().split()


def test_help_is_plain_words_in_every_parser_of_the_class() -> None:
    parser = ConstrainedArgumentParser(prog="probe")
    parser.add_argument("--rho", help=r"the normal-step scale :math:`\rho` of :class:`~lit_constrained.optim.SQPAdam`")
    text = parser.format_help()
    assert "the normal-step scale rho of SQPAdam" in " ".join(text.split())
    assert ":math:" not in text and ":class:" not in text


class Inner:
    def __init__(self, step: float | None = 1.0, name: str = "x") -> None:
        self.step, self.name = step, name


class Outer:
    def __init__(self, inner: Inner | None = None) -> None:
        self.inner = inner


def test_null_two_class_levels_down_is_null_and_a_config_string_stays_a_string(tmp_path) -> None:
    """jsonargparse hands a nested value on as ``f"--key={value}"``: the null it read arrived as "None"."""
    parser = ConstrainedArgumentParser(prog="probe", exit_on_error=False)
    parser.add_argument("--config", action="config")
    parser.add_subclass_arguments(Outer, "outer")
    given = ["--outer", f"{__name__}.Outer", "--outer.init_args.inner", f"{__name__}.Inner"]
    assert parser.parse_args([*given, "--outer.init_args.inner.init_args.step", "null"]).outer.init_args.inner.init_args.step is None
    assert parser.parse_args([*given, "--outer.init_args.inner.init_args.step", "2.5"]).outer.init_args.inner.init_args.step == 2.5
    (tmp_path / "c.yaml").write_text(f"outer:\n  class_path: {__name__}.Outer\n  init_args:\n    inner:\n"
                                     f"      class_path: {__name__}.Inner\n      init_args: {{name: None}}\n")
    assert parser.parse_args(["--config", str(tmp_path / "c.yaml")]).outer.init_args.inner.init_args.name == "None"
