"""The ``lit-constrained`` console script: one argparse parser whose subcommands dispatch to the layers.

* ``fit``: :func:`lit_constrained.cli.fit.run_fit`; ``validate``, ``test``, ``predict``:
  :func:`lit_constrained.cli.fit.main`, everything after the subcommand handed to LightningCLI unparsed,
  and so are LightningCLI's options before it (``-c/--config``, ``--print_config``).
* ``compare``: :func:`lit_constrained.compare.run` with the arguments of
  :func:`lit_constrained.compare.add_arguments`, parsed here.

Building the parser imports neither torch nor Lightning, so ``lit-constrained --help``, ``compare --help``
and a subcommand given nothing to run answer at once; :mod:`lit_constrained.cli.fit` (seconds) is imported
inside :func:`main`, only when a Lightning subcommand runs (start-up speed, not a way around a circle:
console -> compare -> fit is one-way, and nothing imports this module but the console script and
``python -m lit_constrained.cli``). A bare ``--print_config`` that takes no value is a rewrite of the
arguments (:func:`bare_print_config_as_empty`), not an override of argparse's option matching.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from lit_constrained import compare  # neither imports torch nor Lightning
from lit_constrained.cli import help as fit_help

PROG = "lit-constrained"

#: LightningCLI's subcommands and what each does, in the words of ``lit-constrained --help``.
LIGHTNING_SUBCOMMANDS = {
    "fit": "train: lit-constrained fit --config configs/spring/recommended/sqp_adam.yaml",
    "validate": "one pass over the validation data (--ckpt_path to evaluate a checkpoint)",
    "test": "one pass over the test data",
    "predict": "run the model's forward on the DataModule's predict_dataloader() (a task's data must define one)",
}

#: every subcommand of ``lit-constrained`` (everything after one is that subcommand's)
SUBCOMMANDS = (*LIGHTNING_SUBCOMMANDS, "compare")

EPILOG = """\
Each subcommand has its own help, e.g. lit-constrained fit --help (the options a run uses; --help-all:
all Trainer, model and data options), lit-constrained fit --model.help lit_constrained.tasks.spring.Spring
(one task's options), lit-constrained compare --help. A config names a task by class path; a task in a file next to the
config (mytask.py) is found from the working directory: class_path: mytask.MyTask."""


class _CommandParser(argparse.ArgumentParser):
    """The top-level parser: a bare ``--print_config`` takes no value (jsonargparse reads ``--print_config=``)."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        return super().parse_known_args(bare_print_config_as_empty(sys.argv[1:] if args is None else args),
                                         namespace)


def bare_print_config_as_empty(argv: Sequence[str]) -> list[str]:
    """``argv`` with each bare ``--print_config`` before the subcommand (the first of :data:`SUBCOMMANDS`
    that is not the value of ``-c``/``--config``, up to ``--``) written ``--print_config=``."""
    argv = list(argv)
    after_config = False
    for index, arg in enumerate(argv):
        if (arg in SUBCOMMANDS and not after_config) or arg == "--":
            break
        if arg == "--print_config":
            argv[index] = "--print_config="
        after_config = arg in ("-c", "--config")
    return argv


def parser() -> argparse.ArgumentParser:
    """The command line of ``lit-constrained`` (the Lightning subcommands' own options are theirs)."""
    p = _CommandParser(prog=PROG, description=fit_help.DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", default=[], metavar="CONFIG",
                   help="a config with one section per subcommand (fit: ..., test: ...); for fit, validate, "
                        "test and predict (a subcommand's own --config takes that subcommand's config)")
    p.add_argument("--print_config", nargs=1, default=None, metavar="[=FLAGS]",
                   help="print the resolved config (of fit, validate, test or predict) and exit; flags: "
                        "comments, skip_default, skip_unset (comma-separated)")
    subcommands = p.add_subparsers(dest="subcommand", title="subcommands", parser_class=argparse.ArgumentParser,
                                   metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, summary in LIGHTNING_SUBCOMMANDS.items():
        # every argument after the subcommand goes to LightningCLI as it is: no prefix character of this
        # parser can start an option, so "--config" and "--help" are plain values of "args"
        lightning = subcommands.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
        lightning.add_argument("args", nargs=argparse.REMAINDER)
    compare.add_arguments(subcommands.add_parser("compare", help=compare.SUMMARY, description=compare.DESCRIPTION,
                                                 prog=f"{PROG} compare", formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    return p


def something_to_run(args: Sequence[str], top_level_configs: Sequence[str]) -> bool:
    """Whether a subcommand's ``args`` give anything (else: :data:`~lit_constrained.cli.help.NO_CONFIG` at
    once; options without a config get it from the fit layer, after an option's own mistake)."""
    return bool(top_level_configs) or any(arg.startswith("-") for arg in args)


def lightning_options(args: argparse.Namespace) -> list[str]:
    """LightningCLI's options before the subcommand, as they were given (``--config``, ``--print_config``)."""
    flags = args.print_config[0] if args.print_config is not None else None
    return [o for path in args.config for o in ("--config", path)] + (
        [] if flags is None else [f"--print_config={flags}" if flags else "--print_config"])


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``lit-constrained`` console script (``argv``; None: ``sys.argv[1:]``)."""
    command = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        command.print_help()
        return
    args = command.parse_args(argv)
    if args.subcommand is None:  # only options: LightningCLI would ask for a subcommand too
        command.error("a subcommand is required: fit, validate, test, predict or compare")
    if args.subcommand == "compare":
        if lightning_options(args):
            command.error("-c/--config and --print_config before a subcommand are for fit, validate, test and "
                          "predict; compare takes --config-dir (lit-constrained compare --help)")
        compare.check_arguments(compare.parser(), args)
        sys.exit(compare.run(args))
    rest = list(args.args)
    if args.subcommand == "fit" and ("--help" in rest or "-h" in rest):
        print(fit_help.short_fit_help(), end="")  # one page; --help-all has every option
        return
    rest = ["--help" if arg == fit_help.HELP_ALL else arg for arg in rest]
    if not something_to_run(rest, args.config):
        sys.stderr.write(f"lit-constrained {args.subcommand}: error: {fit_help.NO_CONFIG.format(subcommand=args.subcommand)}\n")
        raise SystemExit(2)
    from lit_constrained.cli import fit  # start-up speed: torch and Lightning (seconds), only to run

    if args.subcommand == "fit":
        fit.run_fit(rest, top_level=lightning_options(args))
    else:
        fit.main([*lightning_options(args), args.subcommand, *rest])
