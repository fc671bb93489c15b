"""``lit-constrained fit --help``: one page, from the signatures of the Trainer, ConstrainedModule and the
package's optimizers (imported when the page is asked for: seconds); ``--help-all`` is LightningCLI's."""

from __future__ import annotations

import argparse
import inspect
import textwrap

HELP_ALL = "--help-all"
DESCRIPTION = "lit-constrained: train networks with hard constraints, inequalities and bounds included (PyTorch Lightning)."

#: what ``lit-constrained <subcommand>`` without a config answers (a run needs a task and its data)
NO_CONFIG = ("no --config given: a run needs a config naming its task and its data (model: class_path: ..., "
             "data: class_path: ...), e.g. lit-constrained {subcommand} --config "
             "configs/spring/recommended/sqp_adam.yaml (the repository's configs/), or --model and --data; "
             "lit-constrained {subcommand} --help lists the options")

#: the Trainer arguments the page shows as examples (each checked against the signature by the tests)
TRAINER_EXAMPLES = ("max_epochs 100", "devices 2", "precision bf16-mixed", "logger false")


def optimizer_names(module: object) -> list[str]:
    """The optimizer classes a module of the package exports (those of its ``__all__`` taking an ``lr``)."""
    return sorted(n for n, c in vars(module).items() if n in module.__all__ and isinstance(c, type)
                  and "lr" in inspect.signature(c).parameters)


def short_fit_help() -> str:
    """The page ``lit-constrained fit --help`` prints: the options a run uses, as an argparse parser's help
    (the options themselves are LightningCLI's), and the commands that list the rest."""
    from lightning.pytorch import Trainer  # start-up speed: the page names what the installed classes take

    from lit_constrained import optim
    from lit_constrained.hints import init_arguments
    from lit_constrained.module import ConstrainedModule
    from lit_constrained.optim import experimental

    module_arguments = [a for a in init_arguments(ConstrainedModule) if a not in ("optimizer", "lr_scheduler")]
    optimizers = (f"the arguments of an optimizer: {', '.join(optimizer_names(optim))} (lit_constrained.optim), "
                  f"{', '.join(optimizer_names(experimental))} (lit_constrained.optim.experimental) or torch.optim.Adam, ...")
    parser = argparse.ArgumentParser(
        prog="lit-constrained fit", usage="%(prog)s --config CONFIG [--KEY VALUE ...]", add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill("Train a task. A config (YAML) names the task (model: class_path: ...), its data "
                                  "(data: class_path: ...) and the Trainer's settings; every key of it can be "
                                  "overridden on the command line.", 100),
        epilog=f"more help:\n  lit-constrained fit {HELP_ALL}\n      every option (all of the Trainer's arguments)\n"
               "  lit-constrained fit --model.help lit_constrained.tasks.spring.Spring\n"
               "      the arguments of a task (its own and ConstrainedModule's)\n"
               "  lit-constrained fit --config CONFIG --model.optimizer.help SQPAdam\n"
               + textwrap.fill(optimizers, 100, initial_indent=" " * 6, subsequent_indent=" " * 6) + "\n")
    add = parser.add_argument
    add("-c", "--config", metavar="CONFIG", help="a config, e.g. configs/spring/recommended/sqp_adam.yaml "
        "(given twice: the later overrides the earlier)")
    add("--trainer.NAME", metavar="VALUE", help=f"an argument of Lightning's Trainer (one of its "
        f"{len(init_arguments(Trainer))}): " + ", ".join(f"--trainer.{example}" for example in TRAINER_EXAMPLES))
    add("--model.init_args.NAME", metavar="VALUE", help="an argument of the task: its own, and ConstrainedModule's "
        f"({', '.join(module_arguments[:4])}, ...)")
    add("--model.init_args.optimizer.init_args.NAME", metavar="VALUE",
        help="an argument of its optimizer: --model.init_args.optimizer.init_args.lr 1e-4")
    add("--data.init_args.NAME", metavar="VALUE", help="an argument of the data: --data.init_args.batch_mode minibatch")
    add("--seed_everything", metavar="SEED", help="the seed of the run (weights, data order)")
    add("--ckpt_path", metavar="PATH", help="resume from a checkpoint; last: the newest last*.ckpt of the run's "
        "checkpoint directory (an error without one), last-or-fresh: that or a fresh start")
    add("--print_config", action="store_true", help="print the resolved config and exit")
    return parser.format_help()
