"""LightningCLI over ConstrainedModule subclasses and DataModules: :class:`ConstrainedCLI` (only public
hooks overridden), :func:`main` (the command line's Lightning part) and :func:`run_fit` (``lit-constrained
fit <args>`` in this process: the console and compare's workers). The package's optimizers, callbacks and
tasks are imported so that short class paths (``SQPAdam``) resolve. Imports neither compare nor the console.
"""

from __future__ import annotations

import logging
import os
import re
import sys
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
from lit_constrained.module_parts.tensorboard import default_logger
from lit_constrained.callbacks.progress import LineProgress
from lit_constrained.callbacks.signals import TrainingInterrupted
from lit_constrained.callbacks.watchdog import LauncherWatchdog
from lit_constrained.cli.fit.parser import (
    ConstrainedArgumentParser, RunConfigSaver, check_no_dropped_init_args, print_config_request, printed_config,
    with_own_defaults,
)
from lit_constrained.hints import TRACEBACK_VARIABLE, SetupError, is_package_validation_error
from lit_constrained.module import ConstrainedModule
from lit_constrained.module_parts.checkpoint_trust import check_run_checkpoint
from lit_constrained.distributed import end_process_group
from lit_constrained.module_parts.trainer_checks import check_trainer_settings


class ConstrainedCLI(LightningCLI):
    """LightningCLI with the package's defaults (:data:`DEFAULTS`; LightningCLI's arguments win): any
    ConstrainedModule subclass and LightningDataModule, the module's own optimizer, the package's parser,
    the resolved config saved in the run's log directory only; trusted ``--ckpt_path`` class paths; the
    Trainer's defaults (:meth:`instantiate_trainer`); ``--ckpt_path last`` without one an error."""

    #: LightningCLI arguments the package sets (besides the model and data base classes).
    DEFAULTS: dict[str, Any] = {"subclass_mode_model": True, "subclass_mode_data": True,
                                "auto_configure_optimizers": False, "parser_class": ConstrainedArgumentParser,
                                "save_config_callback": RunConfigSaver}

    def __init__(self, model_class: Any = ConstrainedModule, datamodule_class: Any = pl.LightningDataModule,
                 **kwargs: Any) -> None:
        super().__init__(model_class, datamodule_class, **{**self.DEFAULTS, **kwargs})

    def init_parser(self, **kwargs: Any) -> Any:
        """LightningCLI's parser, kept: :attr:`parsers` names each subcommand's (its ``--print_config`` page)."""
        self._made = [*getattr(self, "_made", []), super().init_parser(**kwargs)]  # the main one, then in order
        self.parsers = dict(zip(self.subcommands(), self._made[1:]))
        return self._made[-1]

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """LightningCLI's parsing (without its warning about ``args`` beside a command line: the entry points
        pass the one they dispatch) between the checks of :mod:`~lit_constrained.cli.fit.parser` (and its
        ``--print_config`` page, after :func:`with_own_defaults`) and, after,
        :func:`check_trainer_settings` (before the seed or Lightning's first word) and
        :func:`~lit_constrained.module_parts.checkpoint_trust.check_run_checkpoint`."""
        printing = None
        if isinstance(args, (list, tuple)) or args is None:
            given = list(sys.argv[1:] if args is None else args)
            if dropped := check_no_dropped_init_args(given):
                parser.argv = given  # (the error's words name the subcommand)
                parser.error(dropped)
            stripped, printing = print_config_request(given)
            args = stripped if printing is not None else args
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            super().parse_arguments(parser, args)
            explicit = parser.parse_object(args, defaults=False) if isinstance(args, (dict, Namespace)) else \
                parser.parse_args(args, defaults=False)  # what the configs and options gave (public parameter)
        section, explicit = (self.config, explicit) if not self.config.get("subcommand") else \
            (self.config[self.config["subcommand"]], explicit[self.config["subcommand"]])
        with_own_defaults(section.get("model"), explicit.get("model"))
        if printing is not None:
            flags, of_section = printing
            page_parser, page = (self.parsers[self.config["subcommand"]], section) if of_section else (parser, self.config)
            sys.stdout.write(printed_config(page_parser, page, flags))
            parser.exit()
        if self.config.get("subcommand"):  # before LightningCLI reads, importing, the checkpoint's names
            check_run_checkpoint(section.get("ckpt_path"), section.as_dict(), section.get("model"))
        task = str(getattr(section.get("model"), "class_path", "Task")).rsplit(".")[-1]
        check_trainer_settings(dict(section.get("trainer") or {}), task, RunConfigSaver(parser, section))

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """LightningCLI's Trainer with the package's defaults: the logger (:meth:`_with_default_logger`), a
        rolling crash-safe ``last.ckpt`` and a stop on SIGTERM/SIGINT agreed by every rank unless configured
        (:func:`~lit_constrained.callbacks.checkpointing.with_default_checkpoint`), a LauncherWatchdog, and a
        line-per-interval progress report when stdout is not a terminal (unless a bar is configured or off)."""
        section = self.config_init.get(str(self.subcommand), self.config_init)  # the running subcommand's
        config = self._with_default_logger({**section.get("trainer", {}), **kwargs})
        if "logger" in config:
            kwargs["logger"] = config["logger"]
        callbacks = with_default_checkpoint(config)
        callbacks = _as_list(config.get("callbacks")) if callbacks is None else callbacks
        callbacks += [] if any(isinstance(c, LauncherWatchdog) for c in callbacks) else [LauncherWatchdog()]
        # the callbacks LightningCLI adds: the subcommand's own callback arguments and trainer_defaults'
        added = [*(v for v in section.values() if isinstance(v, pl.Callback)), *_as_list(self.trainer_defaults.get("callbacks"))]
        if (not sys.stdout.isatty() and config.get("enable_progress_bar", True) is not False
                and not any(isinstance(c, pl.callbacks.ProgressBar) for c in [*callbacks, *added])):
            callbacks = [*callbacks, LineProgress()]
        return super().instantiate_trainer(**{**kwargs, "callbacks": callbacks})

    def _with_default_logger(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with ``logger`` unset (None, True) the package's TensorBoard logger (``lightning_logs/<task>/
        <Optimizer>/version_<nnn>``, :func:`~lit_constrained.module_parts.tensorboard.default_logger`)."""
        if config.get("logger") in (None, True) and isinstance(getattr(self, "model", None), ConstrainedModule):
            config = {**config, "logger": default_logger(self.model, config.get("default_root_dir"))}
        return config

    def before_fit(self) -> None:
        """``--ckpt_path last`` without a last checkpoint is an error (``last-or-fresh`` starts fresh)."""
        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_last(self.trainer, config.get("ckpt_path"))


def _as_list(callbacks: Any) -> list[Any]:
    return [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


def quiet_start(record: logging.LogRecord) -> bool:
    """A logging filter without Lightning's start-up lines that tell nothing: an accelerator that is not
    there ("TPU available: False, using: 0 TPU cores") and its tips; a GPU that is there is still said."""
    return not re.match(r"[GTH]PU available: False|\N{ELECTRIC LIGHT BULB} Tip:", record.getMessage())


#: warnings the command line does not show: the seed chosen (the next line, "Seed set to 0", says it),
#: Lightning's about the validation_step every ConstrainedModule defines (a task without validation data
#: did not write one), and Lightning's own use of a torch API torch deprecates (nothing a user can change)
QUIET_WARNINGS = ("No seed found, seed set to 0", "You defined a `validation_step` but have no `val_dataloader`",
                  r"`isinstance\(treespec, LeafSpec\)`")


def main(args: Sequence[str] | None = None) -> None:
    """``lit-constrained [-c CONFIG] [--print_config] {fit,validate,test,predict} <options>`` (``args``; None:
    ``sys.argv[1:]``) in this process. A :class:`~lit_constrained.hints.SetupError` and the package's own
    validation errors (:func:`is_package_validation_error`; ``LIT_CONSTRAINED_TRACEBACK`` set: the traceback)
    are one line and exit 2; a user's own error keeps its traceback; files that cannot be written any more:
    one line, exit 1. Without Lightning's empty start-up lines (:func:`quiet_start`, :data:`QUIET_WARNINGS`)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # modules next to the user (class_path: mytask.MyTask), as python -m does
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(quiet_start)  # (added once: a set)
    given = list(sys.argv[1:] if args is None else args)
    grouped_before = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:
        with warnings.catch_warnings():
            for message in QUIET_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            ConstrainedCLI(args=None if args is None else given)
        end_process_group(grouped_before)
    except TrainingInterrupted:  # every rank stopped after the same step: an agreed end
        end_process_group(grouped_before)
        raise
    except Exception as error:
        if isinstance(error, SetupError) or (is_package_validation_error(error) and not os.environ.get(TRACEBACK_VARIABLE)):
            subcommand = next((a for a in given if a in ("fit", "validate", "test", "predict")), None)
            sys.stderr.write(f"lit-constrained{' ' + subcommand if subcommand else ''}: error: {' '.join(str(error).split())}\n")
            raise SystemExit(2) from None
        if write_failure(error) is None:  # a file system that filled up or turned read-only: its one line, exit 1
            raise
        exit_after_write_failure(error)


def run_fit(args: Sequence[str] = (), top_level: Sequence[str] = ()) -> None:
    """``lit-constrained [top_level] fit <args>`` in this process (argument errors: ``SystemExit``)."""
    main([*top_level, "fit", *args])
