"""The ``lit-constrained`` command: LightningCLI over ConstrainedModule subclasses and DataModules.

``lit-constrained fit --config configs/<task>/<optimizer>.yaml`` (also validate/test/predict,
``--print_config``, ``--help``; ``compare`` is :mod:`lit_constrained.compare`). The package's
optimizers, callbacks and tasks are imported here so that short ``class_path`` names (``SQPAdam``,
``Spring``) resolve; the working directory is on ``sys.path`` (as for ``python -m``), so a config can
name a task in a file next to it (``class_path: mytask.MyTask``). The parser's behaviour (plain help,
no abbreviations, no silently dropped init args, the resolved config saved only into the run's log
directory) is :mod:`lit_constrained.cli_parsing`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI

import lit_constrained.callbacks  # noqa: F401  (registers short class paths)
import lit_constrained.optim  # noqa: F401
import lit_constrained.tasks  # noqa: F401
from lit_constrained.callbacks.checkpointing import resolve_last, with_default_checkpoint
from lit_constrained.callbacks.monitoring import default_logger
from lit_constrained.callbacks.progress import LineProgress
from lit_constrained.class_spec import TRUSTED_MODULES, check_trusted, class_paths_in
from lit_constrained.cli_parsing import ConstrainedArgumentParser, RunConfigSaver
from lit_constrained.module import ConstrainedModule

COMPARE_HELP = "Re-run the papers' comparisons (task x method x lr x seed): lit-constrained compare --help"


class ConstrainedCLI(LightningCLI):
    """LightningCLI with the package's defaults (TensorBoard under lightning_logs/)."""

    # --- parsing, help, progress, trusted checkpoints ---
    def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
        """Lightning's subcommands, plus ``compare`` (run by :func:`main` before any parsing) in --help."""
        super()._add_subcommands(parser, **kwargs)
        compare = ConstrainedArgumentParser(description=COMPARE_HELP)
        parser._subcommands_action.add_subcommand("compare", compare, help=COMPARE_HELP)

    def _parse_ckpt_path(self) -> None:
        """Lightning reads ``--ckpt_path``'s hyper-parameters into the config (importing every class
        path they name): only class paths of trusted modules are allowed through, checked before."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and os.path.isfile(str(ckpt_path)):
            import torch

            hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu", mmap=True).get("hyper_parameters", {})
            named_in_config = {path.rpartition(".")[0] for path in class_paths_in(self.config[subcommand].as_dict())}
            check_trusted(hparams, (*TRUSTED_MODULES, *named_in_config))
        super()._parse_ckpt_path()

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> pl.Trainer:
        """A line-per-interval progress report instead of the bar when stdout is not a terminal."""
        config = self._with_default_logger(config)  # runs named by task and optimizer
        if not sys.stdout.isatty() and config.get("enable_progress_bar", True) is not False:
            configured = config.get("callbacks") or []
            configured = configured if isinstance(configured, list) else [configured]
            if not any(isinstance(c, pl.callbacks.ProgressBar) for c in [*configured, *callbacks]):
                callbacks = [*callbacks, LineProgress()]
        return super()._instantiate_trainer(config, callbacks)
    # --- end parsing, help, progress, trusted checkpoints ---

    # --- default logger: runs named by task and optimizer ---
    def _with_default_logger(self, config: dict[str, Any]) -> dict[str, Any]:
        """``trainer.logger`` unset: TensorBoard under ``lightning_logs/<task>/<Optimizer>/version_<nnn>``
        (:func:`~lit_constrained.callbacks.monitoring.default_logger`); a configured logger, or
        ``--trainer.logger false``, is kept as it is."""
        if config.get("logger") in (None, True) and isinstance(getattr(self, "model", None), ConstrainedModule):
            config = {**config, "logger": default_logger(self.model, config.get("default_root_dir"))}
        return config
    # --- end default logger ---

    # --- crash-safe checkpoints (lit_constrained.callbacks.checkpointing) ---
    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """Adds a CrashSafeCheckpoint (rolling last.ckpt) unless checkpointing is off or configured."""
        callbacks = with_default_checkpoint({**self._get(self.config_init, "trainer", default={}), **kwargs})
        if callbacks is not None:
            kwargs["callbacks"] = callbacks
        return super().instantiate_trainer(**kwargs)

    def before_fit(self) -> None:
        """``--ckpt_path last`` without a last checkpoint is an error (``last-or-fresh`` opts in to start fresh)."""
        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_last(self.trainer, config.get("ckpt_path"))
    # --- end crash-safe checkpoints ---


def put_working_directory_on_path() -> None:
    """Make modules next to the user importable (``class_path: mytask.MyTask``), as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else args
    put_working_directory_on_path()
    if argv and argv[0] == "compare":
        from lit_constrained.compare import main as compare_main

        sys.exit(compare_main(argv[1:]))
    ConstrainedCLI(
        ConstrainedModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        parser_class=ConstrainedArgumentParser,
        save_config_callback=RunConfigSaver,  # into the run's log directory, never over an existing file
        args=args,  # None: LightningCLI reads sys.argv itself (no mixed-arguments warning)
    )


if __name__ == "__main__":
    main()
