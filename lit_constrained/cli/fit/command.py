"""The fit layer of ``lit-constrained``: LightningCLI over ConstrainedModule subclasses and DataModules.

:func:`run_fit` trains as ``lit-constrained fit <args>`` does, in the calling process; the console
script (:mod:`lit_constrained.cli.console`) and the comparison's workers (:mod:`lit_constrained.compare`)
both call it. :func:`main` is the Lightning part of the command line (``[-c CONFIG] [--print_config]
{fit,validate,test,predict} ...``). This module never imports :mod:`lit_constrained.compare`: the
comparison is a layer on top of this one.

The package's optimizers, callbacks and tasks are imported here so that short ``class_path`` names
(``SQPAdam``, ``Spring``) resolve; the working directory is on ``sys.path`` (as for ``python -m``), so
a config can name a task in a file next to it (``class_path: mytask.MyTask``). The parser's behaviour
(plain help, no abbreviations, no silently dropped init args, the resolved config saved only into the
run's log directory) is :mod:`lit_constrained.cli.fit.parser`.

Every hook overridden here is one of LightningCLI's public extension points (``parse_arguments``,
``instantiate_trainer``, ``before_fit``); none of its private methods is overridden or called.

``python -m lit_constrained.cli ...`` (e.g. under ``torchrun -m``) is the whole ``lit-constrained``
command: that script is :mod:`lit_constrained.cli.__main__`, which nothing imports, so this module never
imports the console (console -> compare -> fit is one-way).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningCLI

import lit_constrained.callbacks  # noqa: F401  (registers short class paths)
import lit_constrained.optim  # noqa: F401
import lit_constrained.tasks  # noqa: F401
from lit_constrained.callbacks.checkpointing import resolve_last, with_default_checkpoint
from lit_constrained.callbacks.integrity import exit_after_write_failure, write_failure
from lit_constrained.callbacks.monitoring import default_logger
from lit_constrained.callbacks.progress import LineProgress
from lit_constrained.callbacks.signals import TrainingInterrupted
from lit_constrained.callbacks.watchdog import LauncherWatchdog
from lit_constrained.checkpoint_integrity import read_checkpoint
from lit_constrained.class_spec import TRUSTED_MODULES, check_checkpoint_names, class_paths_in
from lit_constrained.cli.fit.parser import (
    ConstrainedArgumentParser, RunConfigSaver, check_no_dropped_init_args, with_the_default_optimizer,
)
from lit_constrained.hints import SetupError
from lit_constrained.module_parts.checkpoint_trust import refuse_another_task
from lit_constrained.module_parts.trainer_checks import check_trainer
from lit_constrained.module import DEFAULT_OPTIMIZER, ConstrainedModule


class ConstrainedCLI(LightningCLI):
    """LightningCLI with the package's defaults.

    * Constructor defaults: any :class:`~lit_constrained.module.ConstrainedModule` subclass as the
      model and any LightningDataModule as the data (``class_path`` in the config), the optimizer
      configured by the module (``auto_configure_optimizers=False``: the module owns its optimizer
      and scheduler arguments), the package's parser (:mod:`lit_constrained.cli.fit.parser`) and the
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

    # --- parsing, trusted checkpoints ---
    def parse_arguments(self, parser: Any, args: Any) -> None:
        """LightningCLI's parsing, then the trusted-checkpoint check.

        * Without LightningCLI's warning about ``args`` given next to a command line: the package's
          entry points (the console script, the comparison's workers) pass the command line they
          dispatch as ``args``.
        * A bare optimizer class on the command line that would drop init args the config set is an
          error (:func:`~lit_constrained.cli.fit.parser.check_no_dropped_init_args`), before
          ``--print_config`` is answered.
        * An argument of the optimizer where no optimizer is named (``--model.init_args.optimizer.init_args.lr
          1e-2`` over a config that leaves the default) goes to the default optimizer
          (:func:`~lit_constrained.cli.fit.parser.with_the_default_optimizer`).
        * The Trainer's settings that cannot work (:func:`check_trainer_settings`), before LightningCLI
          seeds the run or Lightning says a word about them.
        * ``--ckpt_path``: LightningCLI reads the checkpoint's hyper-parameters into the config right
          after this hook returns (importing every class path they name); only class paths of trusted
          modules may be named there, checked here, before (:func:`check_trusted_checkpoint`).
        """
        if isinstance(args, (list, tuple)) or args is None:
            given = list(sys.argv[1:] if args is None else args)
            dropped = check_no_dropped_init_args(given)
            if dropped:
                parser.argv = given  # (for the error's words: the subcommand)
                parser.error(dropped)
            named = with_the_default_optimizer(given, DEFAULT_OPTIMIZER["class_path"])
            args = named if named != given else args
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ARGS_WITH_COMMAND_LINE_WARNING)
            super().parse_arguments(parser, args)
        check_trusted_checkpoint(self.config)
        section = self.config.get(str(self.config.get("subcommand")), self.config)
        model = section.get("model")
        check_trainer_settings(dict(section.get("trainer") or {}), str(getattr(model, "class_path", "task")).rsplit(".")[-1],
                               RunConfigSaver(parser, section))
    # --- end parsing, trusted checkpoints ---

    # --- the Trainer: default logger, progress, crash-safe checkpoints, watchdog ---
    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """LightningCLI's Trainer, with the package's defaults passed as its ``kwargs``:

        * ``logger`` unset: TensorBoard under ``lightning_logs/<task>/<Optimizer>/version_<nnn>``
          (:func:`~lit_constrained.callbacks.monitoring.default_logger`); a configured logger, or
          ``--trainer.logger false``, is kept as it is;
        * ``callbacks``: a CrashSafeCheckpoint (rolling last.ckpt) unless checkpointing is off or
          configured, a StopOnSignal unless a callback handles signals already
          (:func:`~lit_constrained.callbacks.checkpointing.with_default_checkpoint`), a
          LauncherWatchdog unless configured, and a line-per-interval progress report instead of the
          bar when stdout is not a terminal (unless a progress bar is configured or bars are off).
        """
        config = self._with_default_logger({**self._subcommand_config().get("trainer", {}), **kwargs})
        if "logger" in config:
            kwargs["logger"] = config["logger"]
        callbacks = with_default_checkpoint(config)
        if callbacks is None:
            callbacks = _as_list(config.get("callbacks"))
        if not any(isinstance(c, LauncherWatchdog) for c in callbacks):
            callbacks = [*callbacks, LauncherWatchdog()]
        if (not sys.stdout.isatty() and config.get("enable_progress_bar", True) is not False
                and not any(isinstance(c, pl.callbacks.ProgressBar) for c in [*callbacks, *self._other_callbacks()])):
            callbacks = [*callbacks, LineProgress()]
        kwargs["callbacks"] = callbacks
        return super().instantiate_trainer(**kwargs)

    def _with_default_logger(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` (the Trainer's) with ``logger`` unset (None or True) replaced by the package's
        TensorBoard logger (:func:`~lit_constrained.callbacks.monitoring.default_logger`); a configured
        logger, or ``--trainer.logger false``, is kept as it is."""
        if config.get("logger") in (None, True) and isinstance(getattr(self, "model", None), ConstrainedModule):
            config = {**config, "logger": default_logger(self.model, config.get("default_root_dir"))}
        return config

    def _subcommand_config(self) -> Namespace:
        """The instantiated config of the running subcommand (the whole config when there is none)."""
        return self.config_init.get(str(self.subcommand), self.config_init)

    def _other_callbacks(self) -> list[Any]:
        """The callbacks LightningCLI adds besides ``trainer.callbacks``: those of the subcommand's own
        callback arguments (``add_lightning_class_args(SomeCallback, key)``: instantiated at the top
        level of its config) and of ``trainer_defaults``."""
        own = [value for value in self._subcommand_config().values() if isinstance(value, pl.Callback)]
        return [*own, *_as_list(self.trainer_defaults.get("callbacks"))]
    # --- end the Trainer ---

    # --- ckpt_path last (lit_constrained.callbacks.checkpointing) ---
    def before_fit(self) -> None:
        """``--ckpt_path last`` without a last checkpoint is an error (``last-or-fresh`` opts in to start fresh)."""
        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_last(self.trainer, config.get("ckpt_path"))
    # --- end ckpt_path last ---


#: the start of LightningCLI's warning about ``args`` given while ``sys.argv`` holds a command line
_ARGS_WITH_COMMAND_LINE_WARNING = "LightningCLI's args parameter is intended"


def _as_list(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


#: Lightning's precision names for the short ones (``16`` -> ``16-mixed``)
_PRECISION_NAMES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}


def check_trainer_settings(config: dict[str, Any], task_name: str, asked: pl.Callback) -> None:
    """The Trainer settings of ``config`` that cannot work with a constrained step (fp16 AMP, bf16-true,
    a sharded strategy, gradient clipping, accumulation) refused with the module's own message
    (:func:`~lit_constrained.module_parts.trainer_checks.check_trainer`, given the settings as Lightning
    would run them and, in ``asked``, the run's config), before the Trainer is built: Lightning's fallback
    warning and AMP banner for ``16-mixed`` on a CPU would come first."""
    precision = str(config.get("precision") or "32-true")
    precision = _PRECISION_NAMES.get(precision, precision)
    on_cpu = config.get("accelerator") == "cpu" or (config.get("accelerator") in (None, "auto")
                                                    and not torch.cuda.is_available())
    ran_as = "bf16-mixed" if precision == "16-mixed" and on_cpu else precision  # Lightning's CPU fallback
    check_trainer(types.SimpleNamespace(
        precision=ran_as, callbacks=[asked], strategy=config.get("strategy"),
        gradient_clip_val=config.get("gradient_clip_val"),
        accumulate_grad_batches=config.get("accumulate_grad_batches") or 1), task_name)


class QuietStart(logging.Filter):
    """Drops Lightning's start-up lines that tell nothing: an accelerator that is not there ("TPU
    available: False, using: 0 TPU cores") and its advertising tips; a GPU that is there is still said."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (re.match(r"[GTH]PU available: False", message) or message.startswith("\N{ELECTRIC LIGHT BULB} Tip:"))


#: warnings the command line does not show: a seed chosen (its info line "Seed set to 0" says it), Lightning's
#: about the validation_step every ConstrainedModule
#: defines (a task without validation data did not write one), and Lightning's own use of a torch API
#: that torch deprecates (nothing a user can change)
QUIET_WARNINGS = ("No seed found, seed set to 0", "You defined a `validation_step` but have no `val_dataloader`", r"`isinstance\(treespec, LeafSpec\)`")

#: Lightning's logger of its start-up lines (``rank_zero_info``)
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"


def check_trusted_checkpoint(config: Namespace) -> None:
    """Raise :class:`~lit_constrained.class_spec.UntrustedClassPathError` if the subcommand's
    ``ckpt_path`` names, in its hyper-parameters, a class path outside the trusted modules and the
    modules the config itself names (:func:`lit_constrained.class_spec.check_checkpoint_names`);
    an unreadable checkpoint is one clear error (:func:`lit_constrained.checkpoint_integrity.read_checkpoint`).
    Nothing is imported."""
    subcommand = config.get("subcommand")
    ckpt_path = config[subcommand].get("ckpt_path") if subcommand else None
    if not ckpt_path or not os.path.isfile(str(ckpt_path)):
        return
    checkpoint = read_checkpoint(ckpt_path, weights_only=True, map_location="cpu", mmap=True)
    named_in_config = {path.rpartition(".")[0] for path in class_paths_in(config[subcommand].as_dict())}
    trusted = (*TRUSTED_MODULES, *named_in_config)
    check_checkpoint_names(checkpoint, trusted, str(ckpt_path))
    # before LightningCLI puts the checkpoint's task class in place of the config's (issue 37)
    refuse_another_task(checkpoint, config[subcommand].get("model"), str(ckpt_path), trusted=trusted,
                        how="the config's model")


def put_working_directory_on_path() -> None:
    """Make modules next to the user importable (``class_path: mytask.MyTask``), as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def main(args: Sequence[str] | None = None) -> None:
    """The Lightning part of ``lit-constrained``: ``[-c CONFIG] [--print_config] {fit,validate,test,predict}
    <options>`` (``args``; None: ``sys.argv[1:]``), run in this process.

    A :class:`~lit_constrained.hints.SetupError` (a setting that cannot work, its message naming the fix:
    the Trainer's ``gradient_clip_val``, ``precision='16-mixed'``, ConstantStepAdam without its callback)
    is printed as one line, ``lit-constrained <subcommand>: error: <message>``, and exits with status 2,
    as an argument error does; its traceback would only show where the check is made. So is one of the
    package's own validation errors at training time (:func:`is_package_validation_error`: an ``Imposed``
    part, the constraint checks, non-finite values, ``--ckpt_path last`` without a checkpoint) unless
    ``LIT_CONSTRAINED_TRACEBACK`` is set; an error of the user's own code keeps its traceback. A run whose files
    cannot be written any more (a full disk, a read-only file system) ends with the one line that names
    the directory and exit status 1 (:func:`~lit_constrained.callbacks.integrity.exit_after_write_failure`)."""
    put_working_directory_on_path()
    quiet = logging.getLogger(RANK_ZERO_LOGGER)
    if not any(isinstance(f, QuietStart) for f in quiet.filters):
        quiet.addFilter(QuietStart())
    given = list(sys.argv[1:] if args is None else args)
    grouped_before = process_group_exists()
    try:
        with warnings.catch_warnings():
            for message in QUIET_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            ConstrainedCLI(args=None if args is None else given)
        end_process_group(grouped_before)
    except TrainingInterrupted:  # every rank stopped after the same step: an agreed end, as above
        end_process_group(grouped_before)
        raise
    except Exception as error:
        if isinstance(error, SetupError) or (is_package_validation_error(error)
                                              and not os.environ.get(TRACEBACK_VARIABLE)):
            subcommand = next((a for a in given if a in ("fit", "validate", "test", "predict")), None)
            prog = f"lit-constrained {subcommand}" if subcommand else "lit-constrained"
            sys.stderr.write(f"{prog}: error: {' '.join(str(error).split())}\n")
            raise SystemExit(2) from None
        if write_failure(error) is None:  # a file system that filled up or turned read-only: its one line, exit 1
            raise
        exit_after_write_failure(error)


#: set (to anything non-empty) to see the traceback of the package's own validation errors
TRACEBACK_VARIABLE = "LIT_CONSTRAINED_TRACEBACK"

#: the one list of the exception types the package's validation raises (``Imposed``, the constraint
#: checks of ``optim.checks``, non-finite values, ``MissingCheckpointError`` (a FileNotFoundError)); one
#: of them is the package's only when it was raised by the package's own code (below)
PACKAGE_VALIDATION_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, FileNotFoundError,
                                                            FloatingPointError)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def is_package_validation_error(error: BaseException) -> bool:
    """Whether ``error`` is one of :data:`PACKAGE_VALIDATION_ERRORS` raised by a check of this package:
    its innermost frame is in ``lit_constrained/`` and no other exception caused it (an error of a
    user's own code, or of a library the package calls, keeps its traceback)."""
    if not isinstance(error, PACKAGE_VALIDATION_ERRORS) or error.__cause__ is not None or error.__context__ is not None:
        return False
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep)


def end_process_group(grouped_before: bool) -> None:
    """Destroy the process group this run's DDP strategy made (``grouped_before``: one existed before
    the run, which is then the caller's and stays) once every rank has ended the fit together.

    Lightning leaves it to the process's exit; gloo's worker threads are then torn down during the
    interpreter's finalization, and a rank can abort there (SIGABRT, "terminate called without an
    active exception") after a fit that succeeded, which turns its exit status into a failure
    (pytorch/pytorch#190489; measured once in this project's torchrun resume test under load). Only
    on an agreed end: after an error on one rank the others may still be inside a collective."""
    if not grouped_before and process_group_exists():
        torch.distributed.destroy_process_group()


def process_group_exists() -> bool:
    """Whether this process is in a ``torch.distributed`` process group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def run_fit(args: Sequence[str] = (), top_level: Sequence[str] = ()) -> None:
    """Train as ``lit-constrained [top_level] fit <args>`` does, in this process.

    ``args`` are the fit subcommand's options (``["--config", "run.yaml", "--trainer.max_epochs", "5"]``);
    ``top_level`` the options LightningCLI takes before the subcommand (``["--config", "all.yaml"]``, a
    config with a ``fit:`` section). Errors in the arguments exit (``SystemExit``) as on the command line.
    """
    main([*top_level, "fit", *args])

