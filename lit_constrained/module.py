"""ConstrainedModule: what an informed-learning task declares, and the Lightning hooks' wiring: each hook
hands its work to the step (:class:`~lit_constrained.stepping.TrainingStepper`) or to one module of
:mod:`lit_constrained.module_parts` (its docstring lists them, one concern each)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from .batch import cast_floats
from .imposed import Part, PartLayout
from .jacobians import PointwiseJacobian, constraint_jacobian
from .module_parts import (
    checkpoint_trust, declarations, evaluation, imposed_rows, schedulers, step_logging, step_services, tensorboard,
    trainer_checks, validation_pass,
)
from .module_parts.constraint_precision import ConstraintDType, check_constraint_dtype
from .module_parts.declarations import JacobianMethod
from .module_parts.schedulers import LrDecay, check_lr_decay, default_decay
from .module_parts.optimizer_specs import build_optimizer, given_factories
from .module_parts.row_choice import CHECKPOINT_KEY as ROW_CHOICE_KEY
from .module_parts.row_choice import ImposedChoice, RowChoice, cost_clock
from .module_parts.tags import OBJECTIVE, tag
from .module_parts.trainer_checks import SHARDING_STRATEGIES, requested_precision
from .module_parts.varying import VARYING_SCALARS_KEY
from .optim import SQPAdam
from .stepping import NonFinitePolicy, StepResult, StepServices, TrainingStepper

__all__ = [
    "DEFAULT_OPTIMIZER", "OPTIONAL_CALLBACKS", "SHARDING_STRATEGIES", "VARYING_SCALARS_KEY", "ConstrainedModule",
    "JacobianMethod", "OptionalCallback", "chosen_callbacks", "requested_precision",
]

DEFAULT_OPTIMIZER: dict[str, Any] = {"class_path": "lit_constrained.optim.SQPAdam", "init_args": {}}
"""The optimizer when none is given, as the hyper-parameters store it: SQP-Adam with the class's defaults
(lr = 1e-3, the full normal step ``rho="full"`` and its default safeguard, ``max_normal_step``). The
module's default is the class itself, a value jsonargparse understands (``--model.optimizer.lr 1e-2``
sets SQP-Adam's lr); the command line gives a class a config names instead its own defaults
(:func:`~lit_constrained.cli.fit.parser.with_own_defaults`)."""


OptionalCallback = Literal["FitSummary", "RunHealth", "Log10Headlines"]
"""The default callbacks a module may leave out (``default_callbacks``); ``CheckpointIntegrity`` is not one."""
OPTIONAL_CALLBACKS: tuple[OptionalCallback, ...] = get_args(OptionalCallback)


def chosen_callbacks(value: bool | str | Sequence[str]) -> tuple[OptionalCallback, ...]:
    """The optional default callbacks ``value`` keeps, in the order of :data:`OPTIONAL_CALLBACKS`: all of
    them for True, none for False, else those it names (a name or a sequence of names); a ValueError
    naming the choices for any other name."""
    if isinstance(value, bool):
        return OPTIONAL_CALLBACKS if value else ()
    names = [value] if isinstance(value, str) else list(value)
    if any(name not in OPTIONAL_CALLBACKS for name in names):
        raise ValueError(
            f"Invalid default_callbacks={value!r}: true (all), false (none) or a list of {', '.join(OPTIONAL_CALLBACKS)}"
            " (CheckpointIntegrity is always added: it hashes and verifies every checkpoint)."
        )
    return tuple(name for name in OPTIONAL_CALLBACKS if name in names)


class ConstrainedModule(checkpoint_trust.TrustedLoading, pl.LightningModule, ABC):
    """Base class of a task trained with hard constraints (equalities, inequalities and bounds).

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
    Trainer only through the :class:`~lit_constrained.stepping.StepServices` of :meth:`step_services`.
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
            imposed parts (:mod:`lit_constrained.jacobians.pointwise`: linear in m). ``"batched"`` /
            ``"loop"``: the general autograd Jacobian of any c (O(m^2) for per-point constraints;
            the path for coupled constraints, whose rows depend on many points).
        num_threads: ``torch.set_num_threads`` at setup (small problems run faster on 1 thread).
        constraint_dtype: ``"float64"`` (default): the imposed parts' c and J are evaluated in float64 at
            a float32 network's weights (the objective, its gradient and the step's n-vectors stay
            float32; :mod:`~lit_constrained.module_parts.constraint_precision`): float32 noise in a PDE's
            second derivatives would otherwise stall max |c| near 1e-4-1e-3 (docs/float32.md).
            ``"native"``: in the network's dtype. No effect on a float64 network, on a task that
            overrides :meth:`constraints` without :meth:`imposed`, or on a declaration with a
            :class:`~lit_constrained.imposed.Coupled` part (c evaluated as one graph).
        lr_decay: the lr schedule when ``lr_scheduler`` is None and the optimizer is one of the package's
            SQP optimizers: ``"cosine"`` (default: from lr to lr / 100 over the Trainer's
            ``estimated_stepping_batches``, when that is finite), ``"linear"`` (the same end, a straight
            line) or ``"none"`` (a constant lr). A named ``lr_scheduler`` always wins
            (:func:`~lit_constrained.module_parts.schedulers.default_decay`; measured: docs/pinnacle.md).
        rechoose_every: steps between the re-choices of the imposed points of a part with a ``count``
            (``Imposed(residual, pool, count=k | "auto")``; :mod:`~lit_constrained.module_parts.row_choice`).
        imposed_cost_ratio: ``count="auto"`` imposes as many points as keep a step within this many
            unconstrained steps of the same objective (measured at the first choice), never more rows
            than the rank of J, and half as many after an interval whose rows did not hold.
        imposed_choice: which points of a part with a ``count`` are imposed: ``"spread"`` (default: spread
            over its pool, farthest-point sampling) or ``"largest"`` (its largest residuals, spread); measured
            in :mod:`~lit_constrained.module_parts.row_choice`.
        default_callbacks: which of the callbacks this module adds to every Trainer
            (:meth:`configure_callbacks`) are added: True (default) all, False none of the optional ones,
            or a list of :data:`OPTIONAL_CALLBACKS` (``["FitSummary"]``; in a config
            ``model.init_args.default_callbacks: [FitSummary]``). ``CheckpointIntegrity`` is always added:
            without it checkpoints would be written without their content hashes and atomic replace, and
            ``trainer.fit(ckpt_path=...)`` would restore a checkpoint unverified (no hash check, no check
            of the class paths it names or of its task class), so it cannot be left out.
    """

    def __init__(
        self,
        optimizer: OptimizerCallable = SQPAdam,
        lr_scheduler: LRSchedulerCallable | None = None,
        penalty_weight: float = 0.0,
        on_nonfinite: NonFinitePolicy = "raise",
        max_consecutive_skips: int = 10,
        max_grad_norm: float | None = None,
        jacobian_method: JacobianMethod = "auto",
        num_threads: int | None = None,
        lr_scheduler_monitor: str | None = None,
        constraint_dtype: ConstraintDType = "float64",
        lr_decay: LrDecay = "cosine",
        rechoose_every: int = 100,
        imposed_cost_ratio: float = 3.0,
        imposed_choice: ImposedChoice = "spread",
        default_callbacks: bool | Sequence[OptionalCallback] = True,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        specs, self.optimizer_factory, self.lr_scheduler_factory = given_factories(
            optimizer, lr_scheduler, SQPAdam, DEFAULT_OPTIMIZER
        )
        self.save_hyperparameters()
        # the hyper-parameters (checkpoint, logger) hold the plain specs, never the callables: a second
        # call with a dict updates both hparams and hparams_initial, keeping the keys' order
        self.save_hyperparameters(specs)
        self.jacobian_method = declarations.checked_jacobian_method(jacobian_method)
        self.constraint_dtype = check_constraint_dtype(constraint_dtype)
        self.lr_decay = check_lr_decay(lr_decay)
        self.pointwise_jacobian = PointwiseJacobian()
        """The per-point Jacobian engine (remembers per residual whether it runs under torch.func)."""
        self._imposed_rows = imposed_rows.ImposedRows()
        self.row_choice = RowChoice(rechoose_every, imposed_cost_ratio, imposed_choice)
        """Which points of each part with a ``count`` are imposed (saved in checkpoints)."""
        self.num_threads = num_threads
        self.lr_scheduler_monitor = tag(OBJECTIVE, "val") if lr_scheduler_monitor is None else lr_scheduler_monitor
        self.stepper = TrainingStepper(penalty_weight, on_nonfinite, max_grad_norm, max_consecutive_skips)
        self.last_step: StepResult | None = None
        self._first_step_pending = False  # set at train start: the first step's checks are still to do
        self.diagnostic_charts = step_logging.DiagnosticCharts()
        """The ``optim/<name>`` charts (the diagnostics that vary; saved in checkpoints)."""
        self.optional_callbacks = chosen_callbacks(default_callbacks)
        """The optional callbacks :meth:`configure_callbacks` adds (``default_callbacks``)."""

    # ----------------------------------------------------------------- what a task implements
    @abstractmethod
    def objective(self, batch: Any) -> Tensor:
        """The scalar objective f on ``batch`` (to be minimized); every task implements it."""

    def imposed(self, batch: Any) -> Mapping[str, Part] | None:
        """The hard constraints, declared once: named parts, each with its residual, its points, its
        sense and its per-point data (None, the default: no constraints, or a task that computes c
        itself in :meth:`constraints`, every row an equality).

        Return e.g. ``{"pde": Imposed(self.pde_residual, batch["x_pde"]), "wall":
        Imposed(self.flux, self.x_wall, data=self.n_wall), "obstacle": Imposed(self.gap, batch["x_o"],
        sense=">="), "mass": Coupled(lambda: self.mass(batch) - 1)}``
        (:class:`~lit_constrained.imposed.Imposed`: a residual mapping points (N, d), and their data when
        given, to (N,) or (N, k), row i depending only on point i;
        :class:`~lit_constrained.imposed.Coupled`: rows that may each depend on many points). The
        conditions of a geometry build such parts (``domain.dirichlet(u, n)``, ``domain.neumann(u, n)``,
        ``box.periodic(u, "x", n)``: :mod:`lit_constrained.physics.conditions`). Then the default
        :meth:`constraints` is their concatenation, the rows' senses are the parts' (the step reads them
        from :attr:`imposed_layout`), the default :meth:`constraint_jacobian` is computed point by point
        (linear in m; ``jacobian_method="auto"``; the general autograd Jacobian with a ``Coupled`` part),
        and with two parts or more each part's max |c| is logged on its own (``Violation/<name>/<stage>``).
        """
        return None

    def constraints(self, batch: Any) -> Tensor | None:
        """The 1-D tensor of m residuals the step imposes (None: no constraints).

        Default: the parts of :meth:`imposed`, each residual at its points flattened row-major over
        (N, k), concatenated in order (None when it declares none). A task that computes c itself (its
        rows all equalities, e.g. with its own :meth:`constraint_jacobian`) may override it instead of
        declaring :meth:`imposed`."""
        return self._imposed_rows.concatenate(self._imposed_rows.evaluated_parts(self, batch))

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
        if declarations.uses_pointwise_jacobian(self, ConstrainedModule):
            return self._imposed_rows.jacobian(self, batch, constraints, params, rows)
        return constraint_jacobian(constraints, params, method=self.jacobian_method, rows=rows)

    @property
    def imposed_layout(self) -> tuple[PartLayout, ...] | None:
        """Name, offset, size and sense of each part of :meth:`imposed` in the c of the last
        :meth:`constraints` call (None: no ``imposed()``, or not called yet); each part's max |c| is
        logged by it, and the step reads the rows' senses from it
        (:func:`~lit_constrained.stepping.row_signs`)."""
        return self._imposed_rows.layout

    # ----------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        if stage == "fit":
            trainer_checks.check_trainer(self.trainer, type(self).__name__)

    def configure_optimizers(self) -> Any:
        """The optimizer, and the LR scheduler if one is set
        (:func:`~lit_constrained.module_parts.schedulers.optimizer_config` says when each steps)."""
        optimizer = build_optimizer(self.optimizer_factory, self.parameters(), self.hparams.get("optimizer"))
        if self.lr_scheduler_factory is not None:
            scheduler = self.lr_scheduler_factory(optimizer)
        else:
            from .callbacks.lipschitz import LipschitzEstimator  # it sets a constant step itself: no decay

            trainer = trainer_checks.attached_trainer(self)
            fixed = trainer is not None and any(isinstance(c, LipschitzEstimator) for c in trainer.callbacks)
            steps = (lambda: float("inf")) if trainer is None else (lambda: trainer.estimated_stepping_batches)
            scheduler = default_decay(optimizer, "none" if fixed else self.lr_decay, steps)
        return schedulers.optimizer_config(optimizer, scheduler)

    def on_validation_end(self) -> None:
        """A ``ReduceLROnPlateau`` is stepped here, with the monitored validation metric
        (:func:`~lit_constrained.module_parts.schedulers.step_at_validation_end`)."""
        super().on_validation_end()
        schedulers.step_at_validation_end(self.trainer, self.lr_scheduler_monitor)

    #: validate once before the first update (logged at step 0), so val curves start where train does
    validate_at_start: bool = True

    def is_logging_step(self) -> bool:
        """Whether the logger writes this batch's values (Lightning's ``log_every_n_steps`` cadence).

        Step diagnostics and the progress-bar values are made only on these steps: reading a tensor's
        value on the host (``float(t)``) waits for the device."""
        return step_logging.is_logging_step(self.trainer)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        from .callbacks.lipschitz import LipschitzEstimator

        trainer_checks.check_lr_setter(self.trainer, self.optimizers().optimizer, LipschitzEstimator)
        tensorboard.drop_hp_metric_placeholder(self.trainer)  # the module writes the HParams metrics (on_train_start)
        self.diagnostic_charts.start()

    def on_train_start(self) -> None:
        super().on_train_start()
        optimizer = self.optimizers().optimizer
        scheduler = next(iter(schedulers.schedulers(self.trainer)), None)
        constrained = declarations.has_constraints(self, ConstrainedModule)
        trainer_checks.check_training_start(self.trainer, optimizer, scheduler, constrained)
        self._first_step_pending = True  # the constraints' check needs the first step's c
        tensorboard.write_run_summary(self, optimizer, scheduler, constrained, evaluation.measures_residual(self))
        if self.trainer.global_step == 0 and self.validate_at_start and validation_pass.validate_at_start(self):
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
        return step_services.lightning_step_services(self)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        if self.row_choice.update(self, self.prepare_batch(batch), self.trainer.global_step):
            self.stepper.constraint_set_changed()
        clock = cost_clock(self.device)
        started = clock()
        result = self.stepper.step(self, batch, self.step_services())
        self.row_choice.observed(clock() - started, result.constraints)
        if not result.skipped:
            schedulers.step_after_optimizer_step(self.trainer)
        self.last_step = result
        if self._first_step_pending:
            self._first_step_pending = False
            trainer_checks.check_first_step_constraints(self.optimizers().optimizer, result.constraints,
                                                        self.stepper.penalty_weight)
        self._log_step(result)
        return {"objective": result.objective, "constraints": result.constraints}

    def _log_step(self, result: StepResult) -> None:
        """Log the step (:func:`~lit_constrained.module_parts.step_logging.log_training_step`)."""
        step_logging.log_training_step(self, result, self.imposed_layout, self.diagnostic_charts)
        if self.row_choice.chosen and self.is_logging_step():
            for name, (points, _) in self.row_choice.rows().items():
                self.log(f"imposed/{name}/rows", float(points), on_step=True, on_epoch=False)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return evaluation.log_evaluation_step(self, batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor | None]:
        return evaluation.log_evaluation_step(self, batch, "test")

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.trainer.sanity_checking:
            self._log_prediction_figure(step=step_logging.step_index(self.trainer))

    def _log_prediction_figure(self, step: int) -> None:
        """The task's :meth:`prediction_figure` as the ``prediction`` image at ``step`` (TensorBoard only)."""
        from .callbacks.figure_memory import figure_memory_freed

        tensorboard.log_prediction_figure(self.trainer, self.prediction_figure, step, figure_memory_freed)

    def on_fit_end(self) -> None:
        super().on_fit_end()
        c = None if self.last_step is None else self.last_step.constraints
        self.diagnostic_charts.write_constants(self.trainer, None if c is None else c.numel())

    def configure_callbacks(self) -> list[pl.Callback]:
        """In every Trainer: hashed, verified checkpoints
        (:class:`~lit_constrained.callbacks.integrity.CheckpointIntegrity`, always) and, unless
        ``default_callbacks`` leaves them out, the end-of-fit summary
        (:class:`~lit_constrained.callbacks.summary.FitSummary`), the run-health warnings
        (:class:`~lit_constrained.callbacks.health.RunHealth`) and the ``Log10/<tag>`` curves TensorBoard
        opens on (:class:`~lit_constrained.callbacks.log10.Log10Headlines`)."""
        trainer_checks.check_fitting_trainer(self)
        from .callbacks import health, integrity, log10, summary

        kinds = {"FitSummary": summary.FitSummary, "RunHealth": health.RunHealth,
                 "CheckpointIntegrity": integrity.CheckpointIntegrity, "Log10Headlines": log10.Log10Headlines}
        kept = {*self.optional_callbacks, "CheckpointIntegrity"}
        return [kind() for name, kind in kinds.items() if name in kept]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.diagnostic_charts.restore(checkpoint)
        if ROW_CHOICE_KEY in checkpoint:
            self.row_choice.load_state_dict(checkpoint[ROW_CHOICE_KEY], self.device)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.diagnostic_charts.save(checkpoint)
        if self.row_choice.chosen:
            checkpoint[ROW_CHOICE_KEY] = self.row_choice.state_dict()
        checkpoint_trust.refuse_nonfinite_weights(checkpoint)
