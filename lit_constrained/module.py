"""ConstrainedModule: the LightningModule an informed-learning task subclasses.

It keeps what a task declares (:meth:`~ConstrainedModule.objective`, :meth:`~ConstrainedModule.constraints`
or :meth:`~ConstrainedModule.imposed`, the Jacobian choice, the optimizer and scheduler) and the Lightning
hooks, each of which hands its work to one piece:

* the step: :class:`~lit_constrained.stepping.TrainingStepper`, given this module (the task) and the
  :class:`~lit_constrained.stepping.StepServices` built from Lightning (the LightningOptimizer's step,
  ``manual_backward``, ``clip_gradients`` by norm for ``max_grad_norm``, the strategy's all-gather, rank,
  world size);
* what is logged: :mod:`~lit_constrained.module_parts.step_logging` (a training step),
  :mod:`~lit_constrained.module_parts.evaluation` (a validation/test batch),
  :mod:`~lit_constrained.module_parts.tensorboard` (the HParams and Custom Scalars summaries, figures);
* :mod:`~lit_constrained.module_parts.validation_pass` (the validation at the initial weights, step 0);
* :mod:`~lit_constrained.module_parts.trainer_checks` (settings that cannot work, found before step 1);
* :mod:`~lit_constrained.module_parts.schedulers`: manual optimization leaves the LR schedulers to the
  module: a ``ReduceLROnPlateau`` at the end of every validation during fit, with the validation metric
  ``lr_scheduler_monitor`` (default ``Objective/val``; missing: an error listing the logged metrics),
  every other scheduler after every optimizer step that was not skipped;
* :mod:`~lit_constrained.module_parts.checkpoint_trust` (finite weights written, trusted class paths read);
* the callbacks every Trainer gets (:meth:`~ConstrainedModule.configure_callbacks`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch.optim import Optimizer

from .batch import cast_floats
from .class_spec import SpecFactory, as_class_spec
from .hints import add_hint, unexpected_keyword
from .imposed import (
    Imposed, PartLayout, check_parts, concatenate_parts, imposed_values, layout_signs, part_layout, sense_signs,
)
from .module_parts import checkpoint_trust, schedulers, trainer_checks
from .module_parts.evaluation import log_evaluation_step, measures_residual
from .module_parts.optimizer_arguments import optimizer_argument_hint
from .module_parts.step_logging import DiagnosticCharts, is_logging_step, log_training_step, step_index
from .module_parts.tags import OBJECTIVE, headline_tags, scalar_layout, tag
from .module_parts.tensorboard import (
    drop_hp_metric_placeholder, log_figure, run_hparams, tensorboard_writers, write_summary,
)
from .module_parts.trainer_checks import SHARDING_STRATEGIES, requested_precision
from .module_parts.validation_pass import validate_at_start
from .module_parts.varying import VARYING_SCALARS_KEY
from .jacobians import constraint_jacobian
from .jacobians import PointwiseJacobian
from .stepping import NonFinitePolicy, StepResult, StepServices, TrainingStepper

__all__ = [
    "DEFAULT_OPTIMIZER", "SHARDING_STRATEGIES", "VARYING_SCALARS_KEY", "ConstrainedModule", "JacobianMethod",
    "default_optimizer", "requested_precision",
]

JacobianMethod = Literal["auto", "pointwise", "batched", "loop"]
"""How :meth:`ConstrainedModule.constraint_jacobian` differentiates c (see its ``jacobian_method``)."""

DEFAULT_OPTIMIZER: dict[str, Any] = {"class_path": "lit_constrained.optim.SQPAdam", "init_args": {}}
"""The optimizer when none is given: SQP-Adam with the class's defaults (lr = 1e-3, the full normal
step ``rho="full"`` and its default safeguard, ``max_normal_step``)."""


def default_optimizer(params: Iterable) -> Optimizer:
    """The default optimizer (:data:`DEFAULT_OPTIMIZER`) over ``params``.

    The module's default is this function, not the dict: a config that names another optimizer then
    starts from that class's own defaults (a dict default would carry SQP-Adam's values, e.g. its eps,
    into every class that takes the same argument names). The hyper-parameters store the dict.
    """
    return SpecFactory(DEFAULT_OPTIMIZER)(params)


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
        # the hyper-parameters (checkpoint, logger) hold the plain specs, never the callables: a second
        # call with a dict updates both hparams and hparams_initial, keeping the keys' order
        self.save_hyperparameters({"optimizer": optimizer_spec, "lr_scheduler": lr_scheduler_spec})
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
        self.diagnostic_charts = DiagnosticCharts()
        """The ``optim/<name>`` charts (the diagnostics that vary; saved in checkpoints)."""

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
        self._imposed_layout = part_layout(values, parts)
        return concatenate_parts(values)

    def constraint_senses(self, m: int) -> str | Sequence[str] | None:
        """The sense of the m rows of :meth:`constraints`, for a task that overrides it without
        :meth:`imposed`: ``"="`` (c_i = 0), ``"<="`` (c_i <= 0) or ``">="`` (c_i >= 0), one string for
        every row or a sequence of m, one per row (e.g. ``("=",) + (">=",) * (m - 1)``). None (the
        default): every row is an equality, or the senses of the :meth:`imposed` parts
        (``Imposed(..., sense=">=")``), which a non-None value overrides."""
        return None

    def constraint_signs(self, m: int) -> Tensor | None:
        """The per-row signs of the m rows of :meth:`constraints` (int8: 0 ``"="``, +1 ``"<="``, -1
        ``">="``; None when every row is an equality): :meth:`constraint_senses`, else the imposed
        parts' senses (:func:`~lit_constrained.imposed.layout_signs`). The same tensor while the senses
        stay the same (the step caches its split of the rows by it)."""
        senses = self.constraint_senses(m)
        if senses is not None:
            key: Any = ("senses", senses if isinstance(senses, str) else tuple(senses), m)
        else:
            layout = self._imposed_layout
            if layout is None or sum(part.size for part in layout) != m:
                return None
            key = ("layout", layout)
        cached = getattr(self, "_signs_cache", None)
        if cached is None or cached[0] != key:
            signs = sense_signs(key[1], m) if senses is not None else layout_signs(key[1])
            self._signs_cache = cached = (key, signs)
        return cached[1]

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
            layout = part_layout(imposed_values(parts), parts)  # constraints() was overridden: read the widths anew
        if sum(p.size for p in layout) != constraints.numel():
            raise ValueError(
                f"{type(self).__name__}.constraints() has {constraints.numel()} entries but imposed() declares "
                f"{sum(p.size for p in layout)}: with the pointwise Jacobian they must be the same residuals."
            )
        specs = [(part.residual, part.points, piece.width) for part, piece in zip(parts.values(), layout)]
        return self.pointwise_jacobian(self, params, specs, rows=rows, dtype=constraints.dtype)

    @property
    def imposed_layout(self) -> tuple[PartLayout, ...] | None:
        """Name, offset and size of each part of :meth:`imposed` in the c of the last :meth:`constraints`
        call (None: no ``imposed()``, or not called yet); each part's max |c| is logged by it."""
        return self._imposed_layout

    def _has_constraints(self) -> bool:
        return type(self).constraints is not ConstrainedModule.constraints or self._declares_imposed()

    def _has_residual(self) -> bool:
        """Whether validation_constraints() measures more than the imposed constraints."""
        return measures_residual(self)

    # ----------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        if stage == "fit":
            self._check_trainer(self.trainer)

    def _check_trainer(self, trainer: Any) -> None:
        """Reject Trainer settings that cannot work (:func:`~lit_constrained.module_parts.trainer_checks.check_trainer`)."""
        trainer_checks.check_trainer(trainer, type(self).__name__)

    def configure_optimizers(self) -> Any:
        """The optimizer, and the LR scheduler if one is set
        (:func:`~lit_constrained.module_parts.schedulers.optimizer_config` says when each steps)."""
        try:
            optimizer = self.optimizer_factory(self.parameters())
        except TypeError as error:
            argument, spec = unexpected_keyword(error), self.hparams.get("optimizer") or {}
            if argument is None or not spec.get("class_path"):
                raise
            from .class_spec import import_class

            raise add_hint(error, optimizer_argument_hint(import_class(spec["class_path"]), argument))
        scheduler = None if self.lr_scheduler_factory is None else self.lr_scheduler_factory(optimizer)
        return schedulers.optimizer_config(optimizer, scheduler)

    def on_validation_end(self) -> None:
        """A ``ReduceLROnPlateau`` is stepped here, with the monitored validation metric
        (:func:`~lit_constrained.module_parts.schedulers.step_at_validation_end`)."""
        super().on_validation_end()
        schedulers.step_at_validation_end(self.trainer, self.lr_scheduler_monitor)

    #: validate once before the first update (logged at step 0), so val curves start where train does
    validate_at_start: bool = True

    def _step_index(self) -> int:
        """s, the number of training batches before this one: the x value Lightning gives the values
        logged in this training step (:func:`~lit_constrained.module_parts.step_logging.step_index`)."""
        return step_index(self.trainer)

    def is_logging_step(self) -> bool:
        """Whether the logger writes this batch's values (Lightning's ``log_every_n_steps`` cadence).

        Step diagnostics and the progress-bar values are made only on these steps: reading a tensor's
        value on the host (``float(t)``) waits for the device."""
        return is_logging_step(self.trainer)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        from .callbacks.lipschitz import LipschitzEstimator

        if not any(isinstance(callback, LipschitzEstimator) for callback in self.trainer.callbacks):
            trainer_checks.check_lr_is_set(self.optimizers().optimizer, "which this Trainer does not have")
        drop_hp_metric_placeholder(self.trainer)  # the module writes real HParams metrics (on_train_start)
        self.diagnostic_charts.start()

    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self.trainer
        optimizer = self.optimizers().optimizer
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        has_constraints, has_residual = self._has_constraints(), self._has_residual()
        trainer_checks.check_training_start(trainer, optimizer, scheduler, has_constraints, self.stepper.penalty_weight)
        write_summary(
            trainer,
            run_hparams(self, optimizer, scheduler),
            headline_tags(has_constraints, has_residual),
            scalar_layout(has_constraints, has_residual),
        )
        if trainer.global_step == 0 and self.validate_at_start and validate_at_start(self):
            self._log_prediction_figure(step=0)

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
            schedulers.step_after_optimizer_step(self.trainer)
        self.last_step = result
        self._log_step(result)
        return {"objective": result.objective, "constraints": result.constraints}

    def _log_step(self, result: StepResult) -> None:
        """Log the step (:func:`~lit_constrained.module_parts.step_logging.log_training_step`)."""
        log_training_step(self, result, self._imposed_layout, self.diagnostic_charts)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return log_evaluation_step(self, batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return log_evaluation_step(self, batch, "test")

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.trainer.sanity_checking:
            self._log_prediction_figure(step=self._step_index())

    def _log_prediction_figure(self, step: int) -> None:
        """The task's :meth:`prediction_figure` as the ``prediction`` image at ``step`` (TensorBoard only)."""
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
        c = None if self.last_step is None else self.last_step.constraints
        self.diagnostic_charts.write_constants(self.trainer, None if c is None else c.numel())

    def configure_callbacks(self) -> list[pl.Callback]:
        """In every Trainer: the end-of-fit summary (:class:`~lit_constrained.callbacks.summary.FitSummary`),
        the run-health warnings (:class:`~lit_constrained.callbacks.health.RunHealth`) and hashed, verified
        checkpoints (:class:`~lit_constrained.callbacks.integrity.CheckpointIntegrity`), the ``Log10/<tag>``
        curves TensorBoard opens on (:class:`~lit_constrained.callbacks.log10.Log10Headlines`)."""
        trainer = trainer_checks.attached_trainer(self)
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
        :class:`~lit_constrained.class_spec.UntrustedClassPathError` is raised and nothing is imported
        (:mod:`~lit_constrained.module_parts.checkpoint_trust`). Loads with ``weights_only=True`` (torch's
        safe default; everything the package saves is plain data). An explicit ``weights_only=False``
        runs pickle code anyway and skips the check.
        """
        if weights_only is not False:
            checkpoint_path = checkpoint_trust.check_before_loading(checkpoint_path, cls, trusted_modules)
        return super().load_from_checkpoint(
            checkpoint_path, map_location=map_location, hparams_file=hparams_file, strict=strict,
            weights_only=weights_only, **kwargs,
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.diagnostic_charts.restore(checkpoint)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.diagnostic_charts.save(checkpoint)
        checkpoint_trust.refuse_nonfinite_weights(checkpoint)
