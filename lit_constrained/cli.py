"""The fit layer of ``lit-constrained``: LightningCLI over ConstrainedModule subclasses and DataModules.

:func:`run_fit` trains as ``lit-constrained fit <args>`` does, in the calling process; the console
script (:mod:`lit_constrained.console`) and the comparison's workers (:mod:`lit_constrained.compare`)
both call it. :func:`main` is the Lightning part of the command line (``[-c CONFIG] [--print_config]
{fit,validate,test,predict} ...``). This module never imports :mod:`lit_constrained.compare`: the
comparison is a layer on top of this one.

The package's optimizers, callbacks and tasks are imported here so that short ``class_path`` names
(``SQPAdam``, ``Spring``) resolve; the working directory is on ``sys.path`` (as for ``python -m``), so
a config can name a task in a file next to it (``class_path: mytask.MyTask``). The parser's behaviour
(plain help, no abbreviations, no silently dropped init args, the resolved config saved only into the
run's log directory) is :mod:`lit_constrained.cli_parsing`.

``python -m lit_constrained.cli ...`` (e.g. under ``torchrun -m``) is the whole ``lit-constrained``
command.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

import lit_constrained.callbacks  # noqa: F401  (registers short class paths)
import lit_constrained.optim  # noqa: F401
import lit_constrained.tasks  # noqa: F401
from lit_constrained.callbacks.checkpointing import resolve_last, with_default_checkpoint
from lit_constrained.callbacks.watchdog import LauncherWatchdog
from lit_constrained.callbacks.monitoring import default_logger
from lit_constrained.callbacks.progress import LineProgress
from lit_constrained.class_spec import TRUSTED_MODULES, check_trusted, class_paths_in
from lit_constrained.cli_parsing import ConstrainedArgumentParser, RunConfigSaver
from lit_constrained.module import ConstrainedModule

class ConstrainedCLI(LightningCLI):
    """LightningCLI with the package's defaults.

    * Constructor defaults: any :class:`~lit_constrained.module.ConstrainedModule` subclass as the
      model and any LightningDataModule as the data (``class_path`` in the config), the optimizer
      configured by the module (``auto_configure_optimizers=False``: the module owns its optimizer
      and scheduler arguments), the package's parser (:mod:`lit_constrained.cli_parsing`) and the
      resolved config saved into the run's log directory only (:class:`RunConfigSaver`).
    * ``--ckpt_path``: a checkpoint's hyper-parameters may name only classes of trusted modules.
    * The Trainer: TensorBoard under ``lightning_logs/<task>/<Optimizer>/version_<nnn>`` when no
      logger is configured, a line-per-interval progress report when stdout is not a terminal, a
      rolling crash-safe ``last.ckpt`` unless checkpointing is configured or off, SIGTERM/SIGINT
      stopping every rank after the same step with one ``last.ckpt`` whatever the checkpoint callback
      (:mod:`lit_constrained.callbacks.signals`), under DDP a rank whose launching process died ending too
      (:class:`~lit_constrained.callbacks.watchdog.LauncherWatchdog`), and ``--ckpt_path last`` without a
      last checkpoint an error (``last-or-fresh`` starts fresh).

    Arguments are LightningCLI's; those given override the defaults (e.g. ``args=[...], run=False`` to
    parse and instantiate only).
    """

    #: LightningCLI arguments the package sets (besides the model and data base classes).
    DEFAULTS: dict[str, Any] = {
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "auto_configure_optimizers": False,
        "parser_class": ConstrainedArgumentParser,
        "save_config_callback": RunConfigSaver,  # into the run's log directory, never over an existing file
    }

    def __init__(self, model_class: Any = ConstrainedModule, datamodule_class: Any = pl.LightningDataModule,
                 **kwargs: Any) -> None:
        super().__init__(model_class, datamodule_class, **{**self.DEFAULTS, **kwargs})

    # --- parsing, trusted checkpoints, progress ---
    def parse_arguments(self, parser: Any, args: Any) -> None:
        """As LightningCLI's, without its warning about ``args`` given next to a command line: the
        package's entry points (the console script, the comparison's workers) pass the command line
        they dispatch as ``args``."""
        self.config = parser.parse_object(args) if isinstance(args, (dict, Namespace)) else parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """Lightning reads ``--ckpt_path``'s hyper-parameters into the config (importing every class
        path they name): only class paths of trusted modules are allowed through, checked before."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and os.path.isfile(str(ckpt_path)):
            from lit_constrained.checkpoint_integrity import read_checkpoint  # one clear line if unreadable
            from lit_constrained.class_spec import check_checkpoint_names  # any importable string, any key

            checkpoint = read_checkpoint(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
            named_in_config = {path.rpartition(".")[0] for path in class_paths_in(self.config[subcommand].as_dict())}
            check_checkpoint_names(checkpoint, (*TRUSTED_MODULES, *named_in_config), str(ckpt_path))
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
    # --- end parsing, trusted checkpoints, progress ---

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
        """Adds a CrashSafeCheckpoint (rolling last.ckpt) unless checkpointing is off or configured, a
        StopOnSignal unless a callback handles signals already, and a LauncherWatchdog unless configured."""
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = with_default_checkpoint(config)
        if callbacks is None:
            configured = config.get("callbacks")
            callbacks = list(configured) if isinstance(configured, (list, tuple)) else [] if configured is None else [configured]
        if not any(isinstance(c, LauncherWatchdog) for c in callbacks):
            callbacks = [*callbacks, LauncherWatchdog()]
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


def main(args: Sequence[str] | None = None) -> None:
    """The Lightning part of ``lit-constrained``: ``[-c CONFIG] [--print_config] {fit,validate,test,predict}
    <options>`` (``args``; None: ``sys.argv[1:]``), run in this process."""
    put_working_directory_on_path()
    ConstrainedCLI(args=None if args is None else list(args))


def run_fit(args: Sequence[str] = (), top_level: Sequence[str] = ()) -> None:
    """Train as ``lit-constrained [top_level] fit <args>`` does, in this process.

    ``args`` are the fit subcommand's options (``["--config", "run.yaml", "--trainer.max_epochs", "5"]``);
    ``top_level`` the options LightningCLI takes before the subcommand (``["--config", "all.yaml"]``, a
    config with a ``fit:`` section). Errors in the arguments exit (``SystemExit``) as on the command line.
    """
    main([*top_level, "fit", *args])


if __name__ == "__main__":
    from lit_constrained.console import main as console_main  # the whole command, compare included

    console_main()
