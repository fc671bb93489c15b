"""The ``lit-constrained`` console script: answers ``--help`` at once, then hands over to the CLI.

``lit-constrained`` and ``lit-constrained --help`` print the subcommands without importing torch or
Lightning (seconds of imports); everything else is :func:`lit_constrained.cli.main`.
"""

from __future__ import annotations

import sys

HELP = """usage: lit-constrained {fit,validate,test,predict,compare} ...

lit-constrained: train networks with hard equality constraints (PyTorch Lightning).

subcommands:
  fit        train: lit-constrained fit --config configs/spring/recommended/sqp_adam.yaml
  validate   one pass over the validation data (--ckpt_path to evaluate a checkpoint)
  test       one pass over the test data
  predict    run the model's forward on the prediction data
  compare    re-run the papers' comparisons (task x method x lr x seed)

Each subcommand has its own help, e.g. lit-constrained fit --help (all Trainer, model and data
options), lit-constrained fit --model.help lit_constrained.tasks.spring.Spring (one task's options),
lit-constrained compare --help. A config names a task by class path; a task in a file next to the
config (mytask.py) is found from the working directory: class_path: mytask.MyTask."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(HELP)
        return
    from lit_constrained.cli import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
