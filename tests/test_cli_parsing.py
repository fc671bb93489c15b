"""The parser of ``lit-constrained`` (lit_constrained/cli/fit/parser.py): the private hooks of jsonargparse
and argparse it overrides still exist and still do their work in the installed versions."""

from __future__ import annotations

import argparse
import sys

import jsonargparse
import pytest

from lit_constrained.cli.fit.parser import ConstrainedArgumentParser, PlainHelpFormatter

#: (owner, private method) that cli/fit/parser.py overrides: no public hook does the same (see the comment
#: beside each override)
PRIVATE_HOOKS = ((jsonargparse.ArgumentParser, "_parse_common"), (argparse.HelpFormatter, "_split_lines"))


@pytest.mark.parametrize(("owner", "name"), PRIVATE_HOOKS, ids=[name for _, name in PRIVATE_HOOKS])
def test_the_private_hooks_the_parser_relies_on_exist(owner: type, name: str) -> None:
    versions = f"jsonargparse {jsonargparse.__version__}, Python {sys.version.split()[0]}"
    assert callable(getattr(owner, name, None)), (
        f"{versions}: {owner.__module__}.{owner.__qualname__}.{name} is gone; lit_constrained/cli/fit/parser.py "
        "overrides it (dropped init args / help wrapping): move the override to what replaced it"
    )


def test_parse_args_runs_the_dropped_init_args_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parse_args of the top parser passes through the overridden ``_parse_common``, before the
    config is returned (and before --print_config would be answered there)."""
    import lit_constrained.cli.fit.parser as cli_parsing

    checked: list[list[str]] = []
    monkeypatch.setattr(cli_parsing, "check_no_dropped_init_args", lambda argv: checked.append(argv) or None)
    parser = ConstrainedArgumentParser(prog="probe")
    parser.add_argument("--steps", type=int, default=1)
    assert parser.parse_args(["--steps", "3"]).steps == 3
    assert checked == [["--steps", "3"]]


def test_help_wraps_at_spaces_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word longer than the column stays whole (argparse's own wrapping cuts it)."""
    monkeypatch.setenv("COLUMNS", "40")
    long_word = "lit_constrained.callbacks.checkpointing.CrashSafeCheckpoint"
    text = f"the default is {long_word} when checkpointing is on"
    cut = argparse.HelpFormatter("probe")._split_lines(text, 30)
    assert long_word not in cut  # argparse's own wrapping (the reason for the override)
    assert long_word in PlainHelpFormatter("probe")._split_lines(text, 30)
    parser = ConstrainedArgumentParser(prog="probe")
    parser.add_argument("--callback", help=text)
    assert long_word in parser.format_help().split()


def test_help_is_plain_words_in_every_parser_of_the_class() -> None:
    parser = ConstrainedArgumentParser(prog="probe")
    parser.add_argument("--rho", help=r"the normal-step scale :math:`\rho` of :class:`~lit_constrained.optim.SQPAdam`")
    text = parser.format_help()
    assert "the normal-step scale rho of SQPAdam" in " ".join(text.split())
    assert ":math:" not in text and ":class:" not in text
