"""ConstrainedModule: the LightningModule an informed-learning task subclasses.

The Lightning glue around the step owner (:mod:`lit_constrained.stepping`): at every training batch it
hands the :class:`~lit_constrained.stepping.TrainingStepper` itself (the task) and the
:class:`~lit_constrained.stepping.StepServices` built from Lightning (the LightningOptimizer's step,
``manual_backward``, ``clip_gradients`` by norm for ``max_grad_norm``, the strategy's all-gather, rank,
world size), then logs the result. It also steps the LR schedulers, which manual optimization leaves
to the module: a ``ReduceLROnPlateau`` at the end of every validation during fit, with the validation
metric ``lr_scheduler_monitor`` (default ``Objective/val``; missing: an error listing the logged
metrics), every other scheduler after every optimizer step that was not skipped.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from .batch import cast_floats, clone_tensors
from .class_spec import TRUSTED_MODULES, SpecFactory, as_class_spec
from .imposed import Imposed, PartLayout, check_parts, concatenate_parts, imposed_values, part_layout
from .optim.jacobian import constraint_jacobian
from .optim.pointwise import PointwiseJacobian
from .callbacks.monitoring import (
    DIAGNOSTICS, OBJECTIVE, REDUNDANT_DIAGNOSTICS, RESIDUAL, VIOLATION, VaryingScalars, headline_tags, log_figure,
    part_tag, run_hparams, scalar_layout, tag, tensorboard_writers, write_scalars, write_summary, write_text,
)
from .hints import (
    DERIVATIVE_FIX, SECOND_BACKWARD, add_hint, describe_batch, evaluation_hook_hint, not_imposed_hint,
    one_row_loader_hint, optimizer_argument_hint, unexpected_keyword,
)
from .metrics.functional import violation_max
from .optim.checks import check_constraints, check_objective
from .stepping import NonFinitePolicy, StepResult, StepServices, TrainingStepper

JacobianMethod = Literal["auto", "pointwise", "batched", "loop"]
"""How :meth:`ConstrainedModule.constraint_jacobian` differentiates c (see its ``jacobian_method``)."""

DEFAULT_OPTIMIZER: dict[str, Any] = {"class_path": "lit_constrained.optim.SQPAdam", "init_args": {}}
"""The optimizer when none is given: SQP-Adam with the class's defaults (lr = 1e-3, the full normal
step ``rho="full"`` and its default safeguard, ``max_normal_step``)."""


VARYING_SCALARS_KEY = "lit_constrained_varying_scalars"
"""Checkpoint key of which optimizer diagnostics were charted (so a resumed run charts the same tags)."""


def default_optimizer(params: Iterable) -> Optimizer:
    """The default optimizer (:data:`DEFAULT_OPTIMIZER`) over ``params``.

    The module's default is this function, not the dict: a config that names another optimizer then
    starts from that class's own defaults (a dict default would carry SQP-Adam's values, e.g. its eps,
    into every class that takes the same argument names). The hyper-parameters store the dict.
    """
    return SpecFactory(DEFAULT_OPTIMIZER)(params)


def _batch_limit(limit: int | float, loader: Any) -> float:
    """How many batches of ``loader`` Lightning's ``limit_val_batches`` lets a validation see."""
    if isinstance(limit, int):
        return limit
    if limit >= 1.0:
        return math.inf
    try:
        return max(1, int(limit * len(loader)))
    except TypeError:  # an iterable without a length
        return math.inf


class ConstrainedModule(pl.LightningModule, ABC):
    """Base class of a task trained with hard equality constraints.

    A task implements :meth:`objective` (what is minimized) and :meth:`constraints` (the residuals
    that must vanish), plus its network::

        class CurveFit(ConstrainedModule):
            def __init__(self, hidden: int = 32, **kwargs: Any) -> None:
                super().__init__(**kwargs)
                self.net = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.Tanh(),
                                               torch.nn.Linear(hidden, 1))

            def objective(self, batch):
                x, y = batch
                return (self.net(x) - y).pow(2).mean()

            def constraints(self, batch):
                return self.net(self.anchor_x).squeeze(-1) - self.anchor_y

    Training uses manual optimization: the step is :class:`~lit_constrained.stepping.TrainingStepper`,
    which sees this module only as a :class:`~lit_constrained.stepping.ConstrainedTask` and the
    Trainer only through the :class:`~lit_constrained.stepping.StepServices` the module hands it
    (optimizer, ``manual_backward``, ``clip_gradients``, the strategy's all-gather, ...).
    Any optimizer of :mod:`lit_constrained.optim` or :mod:`torch.optim` works. This base class calls
    ``save_hyperparameters()`` (it also captures the subclass's init arguments), so
    ``load_from_checkpoint`` rebuilds the task and its optimizer.

    Args:
        optimizer: the optimizer class and its arguments: a class (``torch.optim.Adam``),
            ``functools.partial(SQPAdam, lr=1e-2)``, a dict ``{"class_path": ..., "init_args": {...}}``,
            or in a config ``class_path: lit_constrained.optim.SQPAdam`` with ``init_args: {lr: ...}``.
            Default: :data:`DEFAULT_OPTIMIZER` (SQP-Adam with its class defaults). It is
            stored in the hyper-parameters as that plain dict, so ``load_from_checkpoint`` rebuilds it
            from a ``weights_only=True`` load; a lambda or closure is rejected here (it is code, not data).
        lr_scheduler: optional scheduler class and arguments, in the same forms (it receives the
            optimizer). A ``ReduceLROnPlateau`` is stepped at the end of every validation during fit,
            with the validation metric ``lr_scheduler_monitor`` (no validation, no step); every other
            scheduler after every optimizer step (a skipped non-finite batch does not count), as
            Lightning's ``"interval": "step"`` (its scheduler config says so, for ``LearningRateMonitor``).
        lr_scheduler_monitor: the logged validation metric a ``ReduceLROnPlateau`` watches (e.g.
            ``"val/mse"``); default ``"Objective/val"``, the validation objective. A validation that
            did not log it stops the fit with an error listing the metrics it did log. Ignored by
            other schedulers.
        penalty_weight: soft-constraint option: adds ``penalty_weight * mean(c^2)`` to the objective
            (the penalty baseline, off by default).
        on_nonfinite: ``"raise"`` (stop with an error naming the step; no NaN reaches the weights or a
            checkpoint) or ``"skip"`` (skip the batch, identically on every rank).
        max_consecutive_skips: with ``on_nonfinite="skip"``, stop with an error naming the step and the
            non-finite tensor after this many batches in a row were skipped (a persistent NaN).
        max_grad_norm: clip the objective gradient's global 2-norm to this before the step, through
            Lightning's ``clip_gradients(optimizer, max_grad_norm, "norm")`` (use this instead of the
            Trainer's ``gradient_clip_val``, which manual optimization does not support).
        jacobian_method: how the default :meth:`constraint_jacobian` differentiates c.
            ``"auto"`` (default): ``"pointwise"`` when the task declares :meth:`imposed` (and keeps
            the default :meth:`constraints`), else the general autograd Jacobian (its own ``"auto"``:
            batched, falling back to the row loop). ``"pointwise"``: the per-point engine over the
            imposed parts (:mod:`lit_constrained.optim.pointwise`: linear in m). ``"batched"`` /
            ``"loop"``: the general autograd Jacobian of any c (O(m^2) for per-point constraints;
            the path for coupled constraints, whose rows depend on many points).
        num_threads: ``torch.set_num_threads`` at setup (small problems run faster on 1 thread).
    """

    def __init__(
        self,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        penalty_weight: float = 0.0,
        on_nonfinite: NonFinitePolicy = "raise",
        max_consecutive_skips: int = 10,
        max_grad_norm: float | None = None,
        jacobian_method: JacobianMethod = "auto",
        num_threads: int | None = None,
        lr_scheduler_monitor: str | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        optimizer_spec = DEFAULT_OPTIMIZER if optimizer is default_optimizer else as_class_spec(optimizer, "optimizer")
        if optimizer_spec is None:
            raise TypeError("optimizer=None: pass an optimizer class (or leave the default SQP-Adam).")
        lr_scheduler_spec = as_class_spec(lr_scheduler, "lr_scheduler")
        self.optimizer_factory = optimizer if callable(optimizer) else SpecFactory(optimizer_spec)
        self.lr_scheduler_factory = (
            None if lr_scheduler is None else lr_scheduler if callable(lr_scheduler) else SpecFactory(lr_scheduler_spec)
        )
        self.save_hyperparameters()
        # the hyper-parameters (checkpoint, logger) hold the plain specs, never the callables
        for hparams in (self._hparams, self._hparams_initial):
            hparams["optimizer"], hparams["lr_scheduler"] = optimizer_spec, lr_scheduler_spec
        if jacobian_method not in ("auto", "pointwise", "batched", "loop"):
            raise ValueError(
                f"jacobian_method must be 'auto', 'pointwise', 'batched' or 'loop', got {jacobian_method!r}."
            )
        self.jacobian_method = jacobian_method
        self.pointwise_jacobian = PointwiseJacobian()
        """The per-point Jacobian engine (remembers per residual whether it runs under torch.func)."""
        self._imposed_layout: tuple[PartLayout, ...] | None = None
        self.num_threads = num_threads
        self.lr_scheduler_monitor = tag(OBJECTIVE, "val") if lr_scheduler_monitor is None else lr_scheduler_monitor
        self.stepper = TrainingStepper(penalty_weight, on_nonfinite, max_grad_norm, max_consecutive_skips)
        self.last_step: StepResult | None = None

    # ----------------------------------------------------------------- what a task implements
    @abstractmethod
    def objective(self, batch: Any) -> Tensor:
        """The scalar objective f on ``batch`` (to be minimized); every task implements it."""

    def imposed(self, batch: Any) -> Mapping[str, Imposed] | None:
        """The hard constraints as named per-point parts (None, the default: the task overrides
        :meth:`constraints` instead, or has none).

        Return e.g. ``{"pde": Imposed(self.pde_residual, batch["x_pde"]), "boundary":
        Imposed(self.boundary_residual, self.x_bc)}``: each residual maps points (N, d) to (N,) or
        (N, k), row i depending only on point i (:class:`~lit_constrained.imposed.Imposed`). Then the
        default :meth:`constraints` is their concatenation, the default :meth:`constraint_jacobian`
        is computed point by point (linear in m; ``jacobian_method="auto"``), and with two parts or
        more each part's max |c| is logged on its own (``Violation/<name>/<stage>``).
        """
        return None

    def constraints(self, batch: Any) -> Tensor | None:
        """The 1-D tensor of m residuals that must vanish (None: no constraints).

        Default: the parts of :meth:`imposed`, each ``residual(points)`` flattened row-major over
        (N, k), concatenated in order (None when it declares none)."""
        parts = self.imposed(batch)
        if parts is None:
            return None
        values = imposed_values(parts)
        self._imposed_layout = part_layout(values)
        return concatenate_parts(values)

    def validation_constraints(self, batch: Any) -> Tensor | None:
        """Residuals reported at validation/test (default: the training constraints).

        Override to measure the physics beyond the m imposed points (e.g. all collocation points).
        """
        return self.constraints(batch)

    def evaluation_metrics(self, batch: Any, stage: str) -> dict[str, Tensor]:
        """Task metrics at validation/test (e.g. test MSE); logged as ``<stage>/<name>``."""
        return {}

    def prediction_figure(self) -> Any | None:
        """A matplotlib figure of the current prediction (None: no figure, the default).

        Logged as the ``prediction`` image at every validation (and at step 0), so TensorBoard's image
        slider shows training progress. Read data from ``self.trainer.datamodule``; keep it small with
        large fonts (TensorBoard shows images about 400 px wide) and title it with the scalar names it
        matches (e.g. ``val/mse``).
        """
        return None

    constraints_shared: bool = True
    """Whether :meth:`constraints` returns the SAME m residuals on every data-parallel rank (fixed
    constraint points, as in every task of the package). Then each rank differentiates only its
    balanced slice of the rows and one all-gather assembles J. Set it to ``False`` in a task whose
    constraints come from each rank's own batch: the ranks' rows are then gathered, and the step
    imposes their union (W x m rows), as one process on the union batch would. See
    :mod:`lit_constrained.distributed`."""

    def constraint_jacobian(
        self, batch: Any, constraints: Tensor, params: Sequence[Tensor], rows: slice | None = None
    ) -> Tensor:
        """J = dc/dx w.r.t. ``params`` in the optimizer's flat layout: shape (m, n), or only the
        rows ``rows`` (a contiguous slice of the m constraints: shape (len(rows), n)).

        Under data parallelism with :attr:`constraints_shared`, each rank asks only for its share of
        the rows (``constraints`` is still the full c). By :attr:`jacobian_method`: the per-point
        engine over :meth:`imposed` (``"pointwise"``; ``"auto"`` for a task that declares it), else
        the general autograd Jacobian of ``constraints``. Override for a faster problem-specific
        Jacobian, honouring ``rows`` (an override without a ``rows`` argument still works: its full
        J is then sliced, so each rank repeats all m rows).
        """
        if self._uses_pointwise_jacobian():
            return self._imposed_jacobian(batch, constraints, params, rows)
        return constraint_jacobian(constraints, params, method=self.jacobian_method, rows=rows)

    def _declares_imposed(self) -> bool:
        return type(self).imposed is not ConstrainedModule.imposed

    def _uses_pointwise_jacobian(self) -> bool:
        """``"pointwise"``, or ``"auto"`` with :meth:`imposed` declared and the default constraints."""
        if self.jacobian_method == "pointwise":
            if not self._declares_imposed():
                raise ValueError(
                    f"jacobian_method='pointwise' needs {type(self).__name__}.imposed() (the per-point parts to "
                    "differentiate); declare it, or use jacobian_method='auto'."
                )
            return True
        return (self.jacobian_method == "auto" and self._declares_imposed()
                and type(self).constraints is ConstrainedModule.constraints)

    def _imposed_jacobian(
        self, batch: Any, constraints: Tensor, params: Sequence[Tensor], rows: slice | None
    ) -> Tensor:
        """J of the imposed parts by the per-point engine, in the dtype of ``constraints``."""
        parts = self.imposed(batch)
        if parts is None:
            raise ValueError(f"{type(self).__name__}.imposed() returned None, but constraints() returned a tensor.")
        check_parts(parts)
        layout = self._imposed_layout
        if layout is None or [p.name for p in layout] != list(parts) or sum(p.size for p in layout) != constraints.numel():
            layout = part_layout(imposed_values(parts))  # constraints() was overridden: read the widths anew
        if sum(p.size for p in layout) != constraints.numel():
            raise ValueError(
                f"{type(self).__name__}.constraints() has {constraints.numel()} entries but imposed() declares "
                f"{sum(p.size for p in layout)}: with the pointwise Jacobian they must be the same residuals."
            )
        specs = [(part.residual, part.points, piece.width) for part, piece in zip(parts.values(), layout)]
        return self.pointwise_jacobian(self, params, specs, rows=rows, dtype=constraints.dtype)

    # ----------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        if stage == "fit":
            self._check_trainer(self.trainer)

    def _check_trainer(self, trainer: Any) -> None:
        """Reject Trainer settings that cannot work with constrained manual optimization.

        The precision checked is the one asked for: on CPU, Lightning turns ``precision='16-mixed'``
        into ``'bf16-mixed'`` (with its own warning) before any module sees the Trainer, so
        ``trainer.precision`` alone would let it through; a config or command-line run keeps the value
        given (:func:`requested_precision`)."""
        precision = str(trainer.precision)
        asked = requested_precision(trainer)
        if precision.startswith("16") or (asked or "").startswith("16"):
            shown = asked if (asked or "").startswith("16") else precision
            ran_as = f" (Lightning would run it as {precision!r} here)" if shown != precision else ""
            raise ValueError(
                f"precision={shown!r} is not supported{ran_as}: fp16 AMP's grad scaler cannot carry a "
                "constraint Jacobian. Use precision='bf16-mixed' (the constraints and their Jacobian are "
                "then evaluated in float32) or '32-true'."
            )
        if precision == "bf16-true":
            raise ValueError(
                "precision='bf16-true' is not supported: bfloat16 parameters and residuals (8 significant "
                "bits) cap the constraint violation near 1e-3. Use precision='bf16-mixed' (constraints and "
                "their Jacobian in float32) or '32-true'."
            )
        if isinstance(trainer.strategy, SHARDING_STRATEGIES):
            raise ValueError(
                f"strategy {type(trainer.strategy).__name__} is not supported: sharded parameters break the "
                "flat-vector linear algebra of the constrained optimizers. Use strategy='ddp'."
            )
        if trainer.gradient_clip_val:
            raise ValueError(
                f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) does not apply to the constrained "
                "step (manual optimization): clip with the module's max_grad_norm instead (the objective "
                "gradient's 2-norm, before the step). Remove gradient_clip_val and set, in the config, "
                f"model: {{init_args: {{max_grad_norm: {trainer.gradient_clip_val}}}}} (on the command line "
                f"--model.init_args.max_grad_norm {trainer.gradient_clip_val}), or in Python "
                f"{type(self).__name__}(..., max_grad_norm={trainer.gradient_clip_val})."
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                "Trainer(accumulate_grad_batches=...) is not supported (the constraints and their Jacobian "
                "belong to one point): use a larger batch instead."
            )

    def configure_optimizers(self) -> Any:
        """The optimizer, and the LR scheduler if one is set.

        The scheduler config's ``interval`` says when this module steps it (manual optimization leaves
        that to the module; Lightning's ``LearningRateMonitor`` reads it): ``"step"`` for every
        scheduler but ``ReduceLROnPlateau``, which is stepped at validation ends and keeps Lightning's
        default, ``"epoch"`` (the default validation cadence). The monitored metric is
        :attr:`lr_scheduler_monitor`, not a ``"monitor"`` key: Lightning drops that key in manual
        optimization."""
        try:
            optimizer = self.optimizer_factory(self.parameters())
        except TypeError as error:
            argument, spec = unexpected_keyword(error), self.hparams.get("optimizer") or {}
            if argument is None or not spec.get("class_path"):
                raise
            from .class_spec import import_class

            raise add_hint(error, optimizer_argument_hint(import_class(spec["class_path"]), argument))
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        if isinstance(scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler}}
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedulers(self) -> list[Any]:
        return [config.scheduler for config in self.trainer.lr_scheduler_configs]

    def _step_schedulers(self) -> None:
        """Every scheduler but ``ReduceLROnPlateau``, after an optimizer step."""
        for scheduler in self._schedulers():
            if not isinstance(scheduler, ReduceLROnPlateau):
                scheduler.step()

    def on_validation_end(self) -> None:
        """A ``ReduceLROnPlateau`` is stepped here, with the monitored validation metric (during fit;
        not in the sanity check or a ``trainer.validate``): the metrics logged with ``sync_dist`` are
        the same on every rank, so the lr stays the same too."""
        super().on_validation_end()
        trainer = self.trainer
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        plateaus = [s for s in self._schedulers() if isinstance(s, ReduceLROnPlateau)]
        if not plateaus:
            return
        metrics = trainer.callback_metrics
        if self.lr_scheduler_monitor not in metrics:
            logged = ", ".join(sorted(metrics)) or "none"
            raise KeyError(
                f"ReduceLROnPlateau monitors {self.lr_scheduler_monitor!r}, which this validation did not "
                f"log (logged: {logged}). Set the module's lr_scheduler_monitor to one of them."
            )
        value = metrics[self.lr_scheduler_monitor]
        for scheduler in plateaus:
            scheduler.step(value)

    # ----------------------------------------------------------------- logging (what TensorBoard shows)
    # Tag families: see lit_constrained.callbacks.monitoring. Objective/<stage> and Violation/<stage>
    # (max |c| of the imposed constraints) are the two groups TensorBoard opens with; residual/<stage>
    # is the residual over every point of validation_constraints(); optim/<name> the diagnostics that vary.

    #: validate once before the first update (logged at step 0), so val curves start where train does
    validate_at_start: bool = True

    def _step_index(self) -> int:
        """s, the number of optimizer steps taken before this batch: the x value Lightning gives the
        values logged in this training step (they are those at the weights x_s, before update s+1)."""
        loop = self.trainer.fit_loop.epoch_loop
        return int(getattr(loop, "_batches_that_stepped", self.trainer.global_step))

    def is_logging_step(self) -> bool:
        """Whether the logger writes this batch's values (Lightning's ``log_every_n_steps`` cadence).

        Step diagnostics and the progress-bar values are made only on these steps: reading a tensor's
        value on the host (``float(t)``) waits for the device."""
        n = self.trainer.log_every_n_steps
        return bool(n) and (self._step_index() + 1) % n == 0

    def _has_constraints(self) -> bool:
        return type(self).constraints is not ConstrainedModule.constraints or self._declares_imposed()

    def _has_residual(self) -> bool:
        """Whether validation_constraints() measures more than the imposed constraints."""
        return type(self).validation_constraints is not ConstrainedModule.validation_constraints

    def on_fit_start(self) -> None:
        super().on_fit_start()
        from .callbacks.lipschitz import LipschitzEstimator

        if not any(isinstance(callback, LipschitzEstimator) for callback in self.trainer.callbacks):
            _check_lr_is_set(self.optimizers().optimizer, "which this Trainer does not have")
        from lightning.pytorch.loggers import TensorBoardLogger

        # the module writes real HParams metrics (on_train_start): no constant hp_metric placeholder
        for logger in self.trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger._default_hp_metric = False
        self._varying = VaryingScalars()
        restored = getattr(self, "_restored_varying", None)
        if restored is not None:  # resumed: keep charting the diagnostics that varied before the stop
            self._varying.load_state_dict(restored)
            self._restored_varying = None

    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self.trainer
        optimizer = self.optimizers().optimizer
        schedulers = trainer.lr_scheduler_configs
        scheduler = schedulers[0].scheduler if schedulers else None
        if isinstance(scheduler, ReduceLROnPlateau) and not trainer.limit_val_batches:
            rank_zero_warn(
                "ReduceLROnPlateau is stepped at the end of each validation, and this fit does not validate "
                "(limit_val_batches=0): its lr will not change. Let the fit validate, or use another scheduler."
            )
        has_constraints, has_residual = self._has_constraints(), self._has_residual()
        self._check_start(trainer, optimizer, has_constraints)
        write_summary(
            trainer,
            run_hparams(self, optimizer, scheduler),
            headline_tags(has_constraints, has_residual),
            scalar_layout(has_constraints, has_residual),
        )
        if trainer.global_step == 0 and self.validate_at_start:
            self._validate_at_start()

    def _check_start(self, trainer: Any, optimizer: Optimizer, has_constraints: bool) -> None:
        """At the start of training (callbacks' on_train_start done): an lr still None (the callback that
        sets it is missing) is an error; constraints the optimizer does not impose, and a TensorDataset
        served one row per step by DataLoader's default, are warnings."""
        name = type(optimizer).__name__
        _check_lr_is_set(optimizer, "which did not set it")
        if has_constraints and "constraints" not in getattr(optimizer, "requires", frozenset()):
            rank_zero_warn(not_imposed_hint(name, self.stepper.penalty_weight))
        from torch.utils.data import DataLoader, TensorDataset

        loaders = trainer.train_dataloader
        for loader in loaders.values() if isinstance(loaders, Mapping) else loaders if isinstance(loaders, (list, tuple)) else [loaders]:
            dataset = getattr(loader, "dataset", None)
            if (isinstance(loader, DataLoader) and loader.batch_size == 1 and isinstance(dataset, TensorDataset)
                    and len(dataset) > 1 and type(loader.batch_sampler).__name__ == "BatchSampler"
                    and type(loader.sampler).__name__ in ("SequentialSampler", "RandomSampler", "DistributedSampler")):
                rank_zero_warn(one_row_loader_hint(len(dataset)))

    cast_batch_to_dtype: bool = False
    """Cast the floating tensors of every batch to the module's dtype before use (set by tasks whose
    network's dtype is a setting while the data keep their stored dtype). Callbacks that keep a batch
    and call the task's hooks later use :func:`lit_constrained.batch.as_task_sees_it`."""

    def prepare_batch(self, batch: Any) -> Any:
        """The batch as the task's hooks receive it (cast to the module's dtype if
        :attr:`cast_batch_to_dtype`). Done here rather than in ``on_after_batch_transfer``, which
        Lightning ignores with a warning on every fit when a DataModule is used."""
        return cast_floats(batch, self.dtype) if self.cast_batch_to_dtype else batch

    def step_services(self) -> StepServices:
        """What the step owner gets from Lightning for this step (:class:`~lit_constrained.stepping.StepServices`)."""
        opt = self.optimizers()
        if isinstance(opt, list):
            raise ValueError("ConstrainedModule trains with exactly one optimizer.")
        trainer = self.trainer

        def clip(max_norm: float) -> None:
            self.clip_gradients(opt, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")

        return StepServices(
            optimizer=opt.optimizer,
            optimizer_step=opt.step,  # the LightningOptimizer's: it advances global_step
            backward=self.manual_backward,
            clip_gradients=clip,
            all_gather=trainer.strategy.all_gather,
            world_size=trainer.world_size,
            rank=trainer.global_rank,
            step_index=trainer.global_step,
            diagnostics=self.is_logging_step(),
            device=self.device,
            report=self.print,
        )

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        result = self.stepper.step(self, batch, self.step_services())
        if not result.skipped:
            self._step_schedulers()
        self.last_step = result
        self._log_step(result)
        return {"objective": result.objective, "constraints": result.constraints}

    def _log_step(self, result: StepResult) -> None:
        # f and c are those at x_s (before this step's update) and identical on every rank (reduced in
        # the step): no sync_dist. Logged (progress bar included) only on the logger's steps, where
        # Lightning turns them into Python numbers; step 0 (the start) is written directly.
        c = result.constraints
        has_constraints = c is not None and c.numel() > 0
        if self.is_logging_step():
            self.log(tag(OBJECTIVE, "train"), result.objective, prog_bar=True)
            if has_constraints:
                self.log(tag(VIOLATION, "train"), violation_max(c), prog_bar=True)
                for key, value in self._part_violations(c, "train").items():
                    self.log(key, value)
            self._log_diagnostics()
        elif self._step_index() == 0:
            start = {tag(OBJECTIVE, "train"): float(result.objective)}
            if has_constraints:
                start[tag(VIOLATION, "train")] = float(violation_max(c))
                start.update({k: float(v) for k, v in self._part_violations(c, "train").items()})
            write_scalars(self.trainer, start, step=0)

    def _part_violations(self, c: Tensor, stage: str) -> dict[str, Tensor]:
        """``Violation/<name>/<stage>``: max |c| of each imposed part, for a task with two parts or more
        (one part's is ``Violation/<stage>`` itself). ``c`` is the imposed vector of the last
        :meth:`constraints` call, or W of them stacked (per-rank constraints: the union's parts)."""
        layout = self._imposed_layout
        if layout is None or len(layout) < 2 or c is None:
            return {}
        m = sum(part.size for part in layout)
        if m == 0 or c.numel() % m:
            return {}
        ranks = c.detach().reshape(-1, m)
        return {part_tag(VIOLATION, part.name, stage): violation_max(ranks[:, part.offset:part.offset + part.size])
                for part in layout}

    def _log_diagnostics(self) -> None:
        """The optimizer's step diagnostics (0-dim values) and lr, under ``optim/<name>``, each only
        once it has varied (constants go to the run's text summary at the end of fit); diagnostics that
        repeat another chart (``REDUNDANT_DIAGNOSTICS``) are left out. One host sync for all."""
        optimizer = self.optimizers().optimizer
        diagnostics = getattr(optimizer, "diagnostics", None) or {}  # torch optimizers have none
        names: list[str] = []
        values: list[Tensor] = []
        for key, value in diagnostics.items():
            if key in REDUNDANT_DIAGNOSTICS or (isinstance(value, Tensor) and value.numel() != 1):
                continue
            if isinstance(value, (Tensor, int, float)):
                names.append(key)
                values.append(torch.as_tensor(value).detach().reshape(()).to("cpu" if not isinstance(value, Tensor) else value.device, torch.float64))
        names.append("lr")
        lr = optimizer.param_groups[0]["lr"]
        values.append(torch.as_tensor(lr, dtype=torch.float64).reshape(()).to(values[0].device if values else "cpu"))
        numbers = torch.stack(values).tolist()  # the one host sync
        finite = {f"{DIAGNOSTICS}/{k}": v for k, v in zip(names, numbers) if math.isfinite(v)}
        if getattr(self, "_varying", None) is None:
            self._varying = VaryingScalars()
        for step, metrics in self._varying.update(self._step_index(), finite):
            write_scalars(self.trainer, metrics, step)

    def _evaluate(self, batch: Any, stage: str) -> tuple[Tensor, Tensor | None, Tensor | None, dict[str, Tensor]]:
        """f, the imposed constraints c (None unless :attr:`constraints_shared`), the residual over all
        points (None unless the task overrides validation_constraints or its constraints are per rank)
        and the task's metrics on one evaluation batch."""
        # residuals need input derivatives: leave Lightning's inference mode for this step
        with torch.inference_mode(False), torch.enable_grad():
            batch = self.prepare_batch(clone_tensors(batch))
            name = type(self).__name__
            f = check_objective(self._evaluation_hook("objective", batch, stage), f"{name}.objective()")
            # the imposed constraints are one fixed set only when shared (the same on every rank and in
            # every batch); per-rank constraints at validation are the residual of the val batches
            shared = bool(self.constraints_shared)
            c = None
            if shared:
                c = check_constraints(self._evaluation_hook("constraints", batch, stage), f"{name}.constraints()", None, False)
            r = None
            if self._has_residual() or not shared:
                r = check_constraints(self._evaluation_hook("validation_constraints", batch, stage),
                                      f"{name}.validation_constraints()", None, False)
            metrics = self._evaluation_hook("evaluation_metrics", batch, stage)
        detach = lambda t: None if t is None else t.detach()  # noqa: E731
        return f.detach(), detach(c), detach(r), {k: detach(v) if isinstance(v, Tensor) else v for k, v in metrics.items()}

    def _evaluation_hook(self, hook: str, batch: Any, stage: str) -> Any:
        """``self.<hook>(batch)`` on an evaluation batch; an error raised in it gets a hint saying that
        the hooks also run on validation/test batches, and what this batch holds."""
        try:
            return getattr(self, hook)(batch, stage) if hook == "evaluation_metrics" else getattr(self, hook)(batch)
        except Exception as error:
            if SECOND_BACKWARD in str(error):
                raise add_hint(error, DERIVATIVE_FIX)
            train_batch = getattr(self.stepper, "batch_description", None)
            raise add_hint(error, evaluation_hook_hint(type(self).__name__, hook, stage, batch, train_batch))

    def _evaluation_step(self, batch: Any, stage: str) -> dict[str, Tensor | None]:
        f, c, r, metrics = self._evaluate(batch, stage)
        # each evaluation batch weighs the same in the epoch mean (batch_size=1 says so to Lightning)
        self.log(tag(OBJECTIVE, stage), f, sync_dist=True, batch_size=1)
        if c is not None and c.numel():
            self.log(tag(VIOLATION, stage), violation_max(c), sync_dist=True, reduce_fx="max", batch_size=1)
            for key, value in self._part_violations(c, stage).items():
                self.log(key, value, sync_dist=True, reduce_fx="max", batch_size=1)
        if r is not None and r.numel():
            self.log(tag(RESIDUAL, stage), violation_max(r), sync_dist=True, reduce_fx="max", batch_size=1)
        for key, value in metrics.items():
            self.log(f"{stage}/{key}", value, sync_dist=True, batch_size=1)
        return {"objective": f, "constraints": c, "validation_constraints": r}

    def _validate_at_start(self) -> None:
        """The validation values at the initial weights, written at step 0 (the headline tags and the
        task metrics; reduced over the ranks: mean of the batch means, max of the maxima)."""
        trainer = self.trainer
        datamodule = getattr(trainer, "datamodule", None)
        loaders: Any = None
        if datamodule is not None and type(datamodule).val_dataloader is not pl.LightningDataModule.val_dataloader:
            loaders = datamodule.val_dataloader()
        elif trainer.val_dataloaders is not None:
            loaders = trainer.val_dataloaders
        if loaders is None or trainer.limit_val_batches == 0:
            return
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        sums: dict[str, Tensor] = {}
        maxima: dict[str, Tensor] = {}
        batches = 0
        was_training = self.training
        self.eval()
        try:
            for index, loader in enumerate(loaders):
                for seen, batch in enumerate(loader):
                    if seen >= _batch_limit(trainer.limit_val_batches, loader):
                        break
                    batch = trainer.strategy.batch_to_device(batch, dataloader_idx=index)
                    batch = trainer.precision_plugin.convert_input(batch)  # as the loops do: 64-true's cast
                    with trainer.precision_plugin.val_step_context():
                        f, c, r, metrics = self._evaluate(batch, "val")
                    batches += 1
                    for key, value in {tag(OBJECTIVE, "val"): f, **{f"val/{k}": v for k, v in metrics.items()}}.items():
                        value = torch.as_tensor(value, dtype=torch.float64, device=f.device)
                        sums[key] = sums.get(key, 0.0) + value
                    peaks = {tag(VIOLATION, "val"): c, tag(RESIDUAL, "val"): r}
                    if c is not None:
                        peaks.update(self._part_violations(c, "val"))
                    for key, value in peaks.items():
                        if value is not None and value.numel():
                            peak = violation_max(value).double()
                            maxima[key] = torch.maximum(maxima[key], peak) if key in maxima else peak
        finally:
            self.train(was_training)
        if not batches:
            return
        names = list(sums) + list(maxima)
        means = trainer.strategy.reduce(torch.stack([sums[k] for k in sums]) / batches, reduce_op="mean")
        peaks = torch.stack([maxima[k] for k in maxima]) if maxima else means.new_zeros(0)
        peaks = trainer.strategy.all_gather(peaks).reshape(-1, len(maxima)).amax(0) if maxima else peaks
        numbers = torch.cat([means.reshape(-1), peaks.reshape(-1)]).tolist()
        write_scalars(trainer, dict(zip(names, numbers)), step=0)
        self._log_prediction_figure(step=0)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.trainer.sanity_checking:
            self._log_prediction_figure(step=self._step_index())

    def _log_prediction_figure(self, step: int) -> None:
        if not tensorboard_writers(self.trainer):
            return
        from .callbacks.figure_memory import figure_memory_freed

        with figure_memory_freed():  # the figure's reference cycles freed now, not at a full collection
            figure = self.prediction_figure()
            if figure is not None:
                log_figure(self.trainer, figure, step)
            del figure

    def on_fit_end(self) -> None:
        super().on_fit_end()
        constants = getattr(self, "_varying", None)
        constants = constants.constants() if constants is not None else {}
        if not constants:
            return
        m = None if self.last_step is None or self.last_step.constraints is None else self.last_step.constraints.numel()
        rows = [f"| {name} | {value:.6g} |" for name, value in sorted(constants.items())]
        text = "Optimizer diagnostics that stayed constant during the run (not charted):\n\n| name | value |\n|---|---|\n"
        text += "\n".join(rows)
        if m is not None:
            text += f"\n\nm = {m} imposed constraints."
        write_text(self.trainer, "run/constants", text, step=self.trainer.global_step)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return self._evaluation_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return self._evaluation_step(batch, "test")

    def configure_callbacks(self) -> list[pl.Callback]:
        """In every Trainer: the end-of-fit summary (:class:`~lit_constrained.callbacks.summary.FitSummary`),
        the run-health warnings (:class:`~lit_constrained.callbacks.health.RunHealth`) and hashed, verified
        checkpoints (:class:`~lit_constrained.callbacks.integrity.CheckpointIntegrity`), the ``Log10/<tag>``
        curves TensorBoard opens on (:class:`~lit_constrained.callbacks.log10.Log10Headlines`)."""
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            # Lightning rejects gradient_clip_val and accumulate_grad_batches under manual optimization
            # right after this hook, before setup(), with "switch to automatic optimization": checked
            # here first, so that the message names the module's own setting (max_grad_norm)
            self._check_trainer(trainer)
        from .callbacks.health import RunHealth
        from .callbacks.integrity import CheckpointIntegrity
        from .callbacks.log10 import Log10Headlines
        from .callbacks.summary import FitSummary

        return [FitSummary(), RunHealth(), CheckpointIntegrity(), Log10Headlines()]

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path | IO,
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        trusted_modules: Iterable[str] = (),
        **kwargs: Any,
    ) -> Any:
        """Lightning's ``load_from_checkpoint``, refusing class paths from untrusted modules.

        The hyper-parameters hold the optimizer (and a LightningCLI run's classes) as class paths;
        rebuilding the module imports them, and importing a module runs its code. So each class path is
        checked first, from a ``weights_only=True`` read: it must lie in ``lit_constrained``, ``torch``,
        ``lightning``, this task's own module, or one of ``trusted_modules``; otherwise
        :class:`~lit_constrained.class_spec.UntrustedClassPathError` is raised and nothing is imported.
        Loads with ``weights_only=True`` (torch's safe default; everything the package saves is plain
        data). An explicit ``weights_only=False`` runs pickle code anyway and skips the check.
        """
        if weights_only is not False:
            trusted = (*TRUSTED_MODULES, cls.__module__, *trusted_modules)
            checkpoint_path = _check_class_paths(checkpoint_path, trusted)
        return super().load_from_checkpoint(
            checkpoint_path, map_location=map_location, hparams_file=hparams_file, strict=strict,
            weights_only=weights_only, **kwargs,
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._restored_varying = checkpoint.get(VARYING_SCALARS_KEY)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        varying = getattr(self, "_varying", None)
        if varying is not None:
            checkpoint[VARYING_SCALARS_KEY] = varying.state_dict()
        for name, tensor in checkpoint.get("state_dict", {}).items():
            if isinstance(tensor, Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise FloatingPointError(f"Refusing to write a checkpoint: parameter {name!r} holds NaN/inf.")


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


def _check_lr_is_set(optimizer: Optimizer, why: str) -> None:
    """Raise, naming the callback to add, if a param group of ``optimizer`` has ``lr=None`` (the step
    size of ConstantStepAdam that its LipschitzEstimator sets at the start of training)."""
    if not any(group.get("lr", 0.0) is None for group in optimizer.param_groups):
        return
    name = type(optimizer).__name__
    raise ValueError(
        f"{name} has lr=None: its step size is set at the start of training by the LipschitzEstimator "
        f"callback, {why}. Add it: in the config, trainer: {{callbacks: [{{class_path: "
        "lit_constrained.callbacks.LipschitzEstimator, init_args: {num_samples: 10, mode: full}}]}; in "
        "Python, Trainer(callbacks=[lit_constrained.callbacks.LipschitzEstimator()]). Or give "
        f"{name} a number as lr."
    )


SHARDING_STRATEGIES: tuple[type, ...] = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)
"""Lightning strategies that shard the parameters (rejected at fit: the optimizers need the whole x)."""


def _check_class_paths(checkpoint_path: str | Path | IO, trusted: tuple[str, ...]) -> str | Path | IO:
    """Check a checkpoint before it is loaded (a ``weights_only=True`` read): readable, naming only
    trusted modules, matching its content hash (:func:`~lit_constrained.checkpoint_integrity.check_before_loading`);
    the path back, or a rewound in-memory copy of a file object."""
    from .checkpoint_integrity import check_before_loading

    return check_before_loading(checkpoint_path, trusted)
