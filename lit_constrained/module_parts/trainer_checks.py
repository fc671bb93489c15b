"""Trainer settings and start-of-training states that cannot work with constrained manual optimization,
found before the first step, each with the fix in its message.

At ``configure_callbacks`` (:func:`check_fitting_trainer`) and ``setup`` (:func:`check_trainer`): fp16
and bf16-true precision, a strategy that shards the parameters, the Trainer's gradient clipping and
gradient accumulation; the same from a config before the Trainer is built (:func:`check_trainer_settings`,
the command line's). At the start of training (:func:`check_training_start`): an lr still None (the
callback that sets it is missing); as warnings, a hard-constrained optimizer with no constraints to
impose, a ``ReduceLROnPlateau`` in a fit that never validates, and a ``TensorDataset`` served one row
per step by DataLoader's default batch size. At the first step (:func:`check_first_step_constraints`),
a warning: constraints the optimizer does not impose.

Each error is a :class:`~lit_constrained.hints.SetupError` (a ``ValueError``): its message names the
fix, and ``lit-constrained`` prints it as one line with exit status 2.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from ..hints import SetupError, not_imposed_hint, nothing_to_impose_hint, one_row_loader_hint

SHARDING_STRATEGIES: tuple[type, ...] = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)
"""Lightning strategies that shard the parameters (rejected at fit: the optimizers need the whole x)."""


def attached_trainer(module: Any) -> Any:
    """``module.trainer``, or None while the module is not attached to one (Lightning raises then)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def requested_precision(trainer: Any) -> str | None:
    """The ``trainer.precision`` a LightningCLI run was given (its config, as Lightning's
    ``SaveConfigCallback`` holds it), in Lightning's full names (``16`` -> ``"16-mixed"``); None for a
    Trainer built in Python (then only ``trainer.precision``, after Lightning's substitutions, is known)."""
    from lightning.pytorch.cli import SaveConfigCallback

    for callback in getattr(trainer, "callbacks", []):
        config = getattr(callback, "config", None) if isinstance(callback, SaveConfigCallback) else None
        value = config.get("trainer", {}).get("precision") if hasattr(config, "get") else None
        if value is not None:
            text = str(value)
            return {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}.get(text, text)
    return None


def check_trainer(trainer: Any, task_name: str) -> None:
    """Reject Trainer settings that cannot work with constrained manual optimization (``task_name``:
    the task's class, named in the fix for gradient clipping).

    The precision checked is the one asked for: on CPU, Lightning turns ``precision='16-mixed'``
    into ``'bf16-mixed'`` (with its own warning) before any module sees the Trainer, so
    ``trainer.precision`` alone would let it through; a config or command-line run keeps the value
    given (:func:`requested_precision`)."""
    precision = str(trainer.precision)
    asked = requested_precision(trainer)
    if precision.startswith("16") or (asked or "").startswith("16"):
        shown = asked if (asked or "").startswith("16") else precision
        ran_as = f" (Lightning would run it as {precision!r} here)" if shown != precision else ""
        raise SetupError(
            f"precision={shown!r} is not supported{ran_as}: fp16 AMP's grad scaler cannot carry a "
            "constraint Jacobian. Use precision='bf16-mixed' (the constraints and their Jacobian are "
            "then evaluated in float32) or '32-true'."
        )
    if precision == "bf16-true":
        raise SetupError(
            "precision='bf16-true' is not supported: bfloat16 parameters and residuals (8 significant "
            "bits) cap the constraint violation near 1e-3. Use precision='bf16-mixed' (constraints and "
            "their Jacobian in float32) or '32-true'."
        )
    if isinstance(trainer.strategy, SHARDING_STRATEGIES):
        raise SetupError(
            f"strategy {type(trainer.strategy).__name__} is not supported: sharded parameters break the "
            "flat-vector linear algebra of the constrained optimizers. Use strategy='ddp'."
        )
    if trainer.gradient_clip_val:
        raise SetupError(
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) does not apply to the constrained "
            "step (manual optimization): clip with the module's max_grad_norm instead (the objective "
            "gradient's 2-norm, before the step). Remove gradient_clip_val and set, in the config, "
            f"model: {{init_args: {{max_grad_norm: {trainer.gradient_clip_val}}}}} (on the command line "
            f"--model.init_args.max_grad_norm {trainer.gradient_clip_val}), or in Python "
            f"{task_name}(..., max_grad_norm={trainer.gradient_clip_val})."
        )
    if trainer.accumulate_grad_batches != 1:
        raise SetupError(
            "Trainer(accumulate_grad_batches=...) is not supported (the constraints and their Jacobian "
            "belong to one point): use a larger batch instead."
        )


def check_trainer_settings(config: Mapping[str, Any], task_name: str, asked: Any) -> None:
    """The Trainer settings of ``config`` a constrained step cannot take (fp16 AMP, bf16-true, sharding,
    clipping, accumulation) from a config, before the Trainer is built (the command line): refused by
    :func:`check_trainer`, given them as Lightning would run them and, in ``asked``, as given. For
    ``16-mixed`` on a CPU Lightning's fallback warning would otherwise come first."""
    precision = str(config.get("precision") or "32-true")
    precision = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}.get(precision, precision)
    on_cpu = config.get("accelerator") == "cpu" or (config.get("accelerator") in (None, "auto")
                                                    and not torch.cuda.is_available())
    check_trainer(types.SimpleNamespace(
        precision="bf16-mixed" if precision == "16-mixed" and on_cpu else precision,  # Lightning's CPU fallback
        callbacks=[asked], strategy=config.get("strategy"), gradient_clip_val=config.get("gradient_clip_val"),
        accumulate_grad_batches=config.get("accumulate_grad_batches") or 1), task_name)


def check_fitting_trainer(module: Any) -> None:
    """:func:`check_trainer` on the Trainer ``module`` is attached to, if it is fitting (at the module's
    ``configure_callbacks``).

    Lightning rejects ``gradient_clip_val`` and ``accumulate_grad_batches`` under manual optimization
    right after that hook, before ``setup()``, with "switch to automatic optimization": checked there
    first, so that the message names the module's own setting (``max_grad_norm``)."""
    trainer = attached_trainer(module)
    if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
        check_trainer(trainer, type(module).__name__)


def imposes_constraints(optimizer: Any) -> bool:
    """Whether ``optimizer`` imposes the task's constraints: its ``requires`` names ``"constraints"``
    (the package's hard-constrained methods); torch's optimizers and MoMo step on the objective alone,
    and the constraints are then only monitored (``Violation/<stage>``)."""
    return "constraints" in getattr(optimizer, "requires", frozenset())


def check_lr_is_set(optimizer: Optimizer, why: str) -> None:
    """Raise, naming the callback to add, if a param group of ``optimizer`` has ``lr=None`` (the step
    size of ConstantStepAdam that its LipschitzEstimator sets at the start of training)."""
    if not any(group.get("lr", 0.0) is None for group in optimizer.param_groups):
        return
    name = type(optimizer).__name__
    raise SetupError(
        f"{name} has lr=None: its step size is set at the start of training by the LipschitzEstimator "
        f"callback, {why}. Add it: in the config, trainer: {{callbacks: [{{class_path: "
        "lit_constrained.callbacks.LipschitzEstimator, init_args: {num_samples: 10, mode: full}}]}; in "
        "Python, Trainer(callbacks=[lit_constrained.callbacks.LipschitzEstimator()]). Or give "
        f"{name} a number as lr."
    )


def check_lr_setter(trainer: Any, optimizer: Optimizer, setter: type) -> None:
    """At fit start: an lr still None is an error unless a ``setter`` callback (the LipschitzEstimator)
    is among the Trainer's callbacks (:func:`check_lr_is_set`)."""
    if not any(isinstance(callback, setter) for callback in trainer.callbacks):
        check_lr_is_set(optimizer, "which this Trainer does not have")


def check_first_step_constraints(optimizer: Optimizer, constraints: Tensor | None, penalty_weight: float) -> None:
    """At the fit's first training step: constraints that the optimizer does not impose warn (they are
    monitored only). Decided on the step's c, not on the class: a task that declares ``imposed()`` but
    imposes no point in this run (every ``n_*_imposed`` 0: PINNacle's vanilla configs) has nothing
    to monitor, and is not warned."""
    if constraints is not None and constraints.numel() > 0 and not imposes_constraints(optimizer):
        rank_zero_warn(not_imposed_hint(type(optimizer).__name__, penalty_weight))


def check_training_start(trainer: Any, optimizer: Optimizer, scheduler: Any, has_constraints: bool) -> None:
    """At the start of training (the callbacks' ``on_train_start`` done): a ``ReduceLROnPlateau`` in a
    fit without validation warns; an lr still None is an error; a hard-constrained optimizer given a task
    with no constraints, and a TensorDataset served one row per step by DataLoader's default, are
    warnings."""
    if isinstance(scheduler, ReduceLROnPlateau) and not trainer.limit_val_batches:
        rank_zero_warn(
            "ReduceLROnPlateau is stepped at the end of each validation, and this fit does not validate "
            "(limit_val_batches=0): its lr will not change. Let the fit validate, or use another scheduler."
        )
    check_lr_is_set(optimizer, "which did not set it")
    if not has_constraints and imposes_constraints(optimizer):
        rank_zero_warn(nothing_to_impose_hint(type(optimizer).__name__, type(trainer.lightning_module).__name__))
        if hasattr(optimizer, "warns_without_constraints"):
            optimizer.warns_without_constraints = False  # said here, in the task's words: not again at its step
    from torch.utils.data import DataLoader, TensorDataset

    loaders = trainer.train_dataloader
    for loader in loaders.values() if isinstance(loaders, Mapping) else loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        dataset = getattr(loader, "dataset", None)
        if (isinstance(loader, DataLoader) and loader.batch_size == 1 and isinstance(dataset, TensorDataset)
                and len(dataset) > 1 and type(loader.batch_sampler).__name__ == "BatchSampler"
                and type(loader.sampler).__name__ in ("SequentialSampler", "RandomSampler", "DistributedSampler")):
            rank_zero_warn(one_row_loader_hint(len(dataset)))
