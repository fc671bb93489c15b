"""The step owner: one training step of a constrained task, start to end, against a narrow interface.

It is not a Lightning ``Strategy`` (those pick the hardware backend: keep ``strategy: auto`` or
``ddp``), and it never reaches into a Trainer. It sees two things:

* the task (:class:`ConstrainedTask`: what a task provides): ``prepare_batch``, ``objective``,
  ``constraints``, ``constraint_jacobian`` and ``constraints_shared`` (a
  :class:`~lit_constrained.module.ConstrainedModule` is one), and ``named_parameters`` for errors;
* the services of the loop that runs it (:class:`StepServices`, built by the module at every step from
  Lightning): the optimizer and the call that steps it, backward, gradient clipping, the all-gather,
  the world size and rank, the step's index, whether to compute diagnostics, the device, the printer.

Its step:

1. ``batch = task.prepare_batch(batch)``; zero the gradients;
2. evaluate ``f = objective(batch)`` and ``c = constraints(batch)``; check them
   (:mod:`lit_constrained.optim.checks`);
3. the Jacobian of c w.r.t. the optimizer's own parameters, in ``param_groups`` order, only if the
   optimizer's ``requires`` asks for it (``torch.autograd.grad``: no DDP hooks fire); on W ranks
   with ``task.constraints_shared`` (the same m constraints everywhere) only this rank's balanced
   slice of the rows (:func:`~lit_constrained.distributed.row_slice`);
4. ``backward(f)`` (DDP averages the gradient); clip its norm if ``max_grad_norm`` is set
   (``services.clip_gradients``: Lightning's ``clip_gradients``, by norm);
5. ONE all-gather of [f, c, J rows] (:func:`~lit_constrained.distributed.reduce_step`): f becomes
   the rank mean, J is assembled from the slices (shared) or the ranks' rows are stacked (per-rank
   constraints: the union, W m rows). All ranks then step with the same f, c, J: MoMo's step size
   and the SQP projection are identical on every replica, which therefore never drift apart. One
   fused flag (finite f, c, J and gradient; with shared constraints also: the same c on every rank)
   is the step's only host sync;
6. ``optimizer_step(closure=lambda: f_mean, **what the optimizer requires)``, with a
   ``constraint_closure`` (c at the updated parameters, the same on every rank) for an optimizer
   whose ``step`` takes one: the post-step corrections of
   :func:`~lit_constrained.optim.kernel.correct`.

**Inequality rows.** A task whose rows have senses (``Imposed(..., sense="<=" | ">=")``, read from
the parts' layout: :func:`row_signs`) is evaluated as above (all m rows: c, J, the one all-gather,
the finiteness flag); the optimizer then gets the equality rows as ``constraints``/``jacobian`` and the
inequality rows, signed to read :math:`g \\le 0` (``">="``: :math:`g = -r`), as
``inequalities``/``inequality_jacobian`` (:class:`~lit_constrained.imposed.SenseRows`); its
``constraint_closure`` returns ``(c, g)``. An optimizer that imposes constraints (``"jacobian"`` in its
``requires``) but has no ``accepts_inequalities`` is refused at the first step, before any update; an
unconstrained one (``torch.optim.Adam``) only monitors them. The step's result (and every violation
figure) holds :math:`v` (:func:`~lit_constrained.imposed.violated_part`): c on the equality rows, the
violated part :math:`\\max(g, 0)` on the inequality rows; ``penalty_weight`` penalizes :math:`v^2`.

The module logs the result and steps the LR schedulers (see
:class:`~lit_constrained.module.ConstrainedModule`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.optim import Optimizer

from .distributed import AllGather, reduce_step, row_slice
from .hints import DERIVATIVE_FIX, add_hint, describe_batch, is_derivative_without_graph
from .imposed import SenseRows, layout_signs, violated_part
from .optim.checks import check_constraints, check_objective, count_nonfinite
from .jacobians import numel_real
from .optim.flat import group_params

NonFinitePolicy = Literal["raise", "skip"]


@dataclass
class StepResult:
    """What one training step saw, reduced over ranks (identical on every rank)."""

    objective: Tensor
    constraints: Tensor | None
    """:math:`v`: c on the equality rows, the violated part max(g, 0) on the inequality rows (c itself
    when every row is an equality)."""
    skipped: bool = False
    inequalities: Tensor | None = None
    """:math:`g` (the inequality rows, signed to read g <= 0), None without inequality rows."""


INEQUALITY_OPTIMIZERS = "lit_constrained.optim.SQPAdam or lit_constrained.optim.SQPHeavyBall"
"""The optimizers that take inequality rows (named in the refusal)."""


def row_signs(task: Any, m: int) -> Tensor | None:
    """The per-row signs of a task's m constraint rows (0 ``"="``, +1 ``"<="``, -1 ``">="``), from the
    senses of the parts in its ``imposed_layout`` (:class:`~lit_constrained.module.ConstrainedModule`
    records it; :func:`~lit_constrained.imposed.layout_signs`: the same tensor for the same layout);
    None: all equalities (also for a task without a layout, or one of another size than m)."""
    layout = getattr(task, "imposed_layout", None)
    if m == 0 or layout is None or sum(part.size for part in layout) != m:
        return None
    return layout_signs(tuple(layout))


@runtime_checkable
class ConstrainedTask(Protocol):
    """What a task provides to the step (:class:`~lit_constrained.module.ConstrainedModule` documents
    each member)."""

    constraints_shared: bool

    def prepare_batch(self, batch: Any) -> Any: ...

    def objective(self, batch: Any) -> Tensor: ...

    def constraints(self, batch: Any) -> Tensor | None: ...

    def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any, rows: slice | None = None) -> Tensor: ...

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]: ...


def _single_process_gather(t: Tensor) -> Tensor:
    return t.unsqueeze(0)


@dataclass(frozen=True)
class StepServices:
    """What the loop running a step provides (injected: the step owner knows no Trainer).

    Attributes:
        optimizer: the optimizer (its ``param_groups``, ``requires``, ``diagnostics``, ``zero_grad``).
        optimizer_step: steps it, ``optimizer_step(closure=..., **kwargs)`` (in Lightning the
            LightningOptimizer's ``step``, which also counts the step).
        backward: back-propagates the loss (``manual_backward``).
        clip_gradients: scales the gradients so that their global 2-norm is at most the argument
            (Lightning's ``clip_gradients`` by norm); used only when ``max_grad_norm`` is set.
        all_gather: ``(L,) -> (W, L)``, every rank's tensor in rank order (the strategy's all-gather).
        world_size: W, the number of data-parallel ranks.
        rank: this rank, in [0, W).
        step_index: the number of optimizer steps taken so far (for messages).
        diagnostics: whether the optimizer should compute its step diagnostics this step (the steps
            the logger writes).
        device: where the parameters live (autocast is switched off there for c and J).
        report: prints a message once (rank 0), e.g. a skipped batch.
    """

    optimizer: Optimizer
    optimizer_step: Callable[..., Any]
    backward: Callable[[Tensor], Any]
    clip_gradients: Callable[[float], Any] | None = None
    all_gather: AllGather = _single_process_gather
    world_size: int = 1
    rank: int = 0
    step_index: int = 0
    diagnostics: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    report: Callable[[str], Any] = print


_INCONSISTENT = (
    "{name}.constraints() differs across ranks at step {step}, but {name}.constraints_shared is True "
    "(each rank differentiates only its share of the rows of ONE shared constraint set). Make the "
    "constraint points the same on every rank (fixed points, e.g. a buffer set in __init__ or setup()), "
    "or set constraints_shared = False to impose the union of the ranks' own constraints."
)


_ACCEPTS: dict[tuple[type, str, str], bool] = {}


def _accepts(owner: Any, method: str, argument: str) -> bool:
    """Whether ``owner.<method>`` takes ``argument`` (cached per class: an override written before the
    argument existed does not)."""
    key = (type(owner), method, argument)
    if key not in _ACCEPTS:
        _ACCEPTS[key] = argument in inspect.signature(getattr(owner, method)).parameters
    return _ACCEPTS[key]


def _jacobian_rows(task: ConstrainedTask, batch: Any, c: Tensor, params: list[Tensor], rows: slice) -> Tensor:
    """``task.constraint_jacobian`` for the rows ``rows`` of c.

    An override written before the ``rows`` argument existed (``(batch, constraints, params)``) is
    called for the whole J, which is then sliced (correct, but every rank repeats all m rows)."""
    if rows == slice(0, c.numel()):
        return task.constraint_jacobian(batch, c, params)
    if _accepts(task, "constraint_jacobian", "rows"):
        return task.constraint_jacobian(batch, c, params, rows=rows)
    return task.constraint_jacobian(batch, c, params)[rows]


def constraint_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off for the constraints and their Jacobian.

    Under ``bf16-mixed`` Lightning runs the training step under ``torch.autocast``, which would evaluate
    the network in bfloat16 (8 significant bits): the residuals, hence the feasibility the optimizer
    restores, would be capped at ~1e-3 relative accuracy. With autocast off the constraint forward and
    its Jacobian run in the parameters' own dtype (float32), while the objective keeps the mixed
    precision. A no-op when autocast is not active.
    """
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


class TrainingStepper:
    """Owns a training step of a :class:`ConstrainedTask` (see the module docstring for the step).

    Args:
        penalty_weight: adds ``penalty_weight * mean(c^2)`` to the objective (the penalty baseline).
        on_nonfinite: ``"raise"`` or ``"skip"`` a step whose f, c, J or gradient holds NaN/inf.
        max_grad_norm: clip the objective gradient's global 2-norm to this before the step (None: off).
        max_consecutive_skips: with ``"skip"``, raise after this many skipped steps in a row.
    """

    def __init__(
        self,
        penalty_weight: float = 0.0,
        on_nonfinite: NonFinitePolicy = "raise",
        max_grad_norm: float | None = None,
        max_consecutive_skips: int = 10,
    ) -> None:
        if penalty_weight < 0:
            raise ValueError(f"penalty_weight must be >= 0, got {penalty_weight}.")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}.")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None), got {max_grad_norm}.")
        if not isinstance(max_consecutive_skips, int) or max_consecutive_skips < 1:
            raise ValueError(f"max_consecutive_skips must be a positive integer, got {max_consecutive_skips!r}.")
        self.penalty_weight = penalty_weight
        self.on_nonfinite = on_nonfinite
        self.max_grad_norm = max_grad_norm
        self.max_consecutive_skips = max_consecutive_skips
        self.consecutive_skips = 0
        self._last_finite: tuple[int, Tensor, Tensor | None] | None = None
        self.num_constraints: int | None = None
        self.batch_description: str | None = None
        """What the first training batch was (:func:`~lit_constrained.hints.describe_batch`), for messages."""
        self._sense_rows: tuple[Tensor, int, SenseRows] | None = None  # (signs, copies, rows): the last split
        self._device_signs: tuple[Tensor, Tensor] | None = None  # (the task's signs, their copy on the device)

    def constraint_set_changed(self) -> None:
        """The task chose other constraint rows (a re-choice of its imposed points): the next step's m may
        differ from the last one's (otherwise a change of m is an error)."""
        self.num_constraints = None

    def step(self, task: ConstrainedTask, batch: Any, services: StepServices) -> StepResult:
        """One training step of ``task`` on ``batch`` (as the data loader gave it)."""
        try:
            return self._step(task, batch, services)
        except RuntimeError as error:
            # a derivative w.r.t. the inputs taken without create_graph=True (in objective(), constraints()
            # or the Jacobian): torch's message does not say which call or what to do
            if is_derivative_without_graph(error):
                raise add_hint(error, DERIVATIVE_FIX)
            raise

    def _step(self, task: ConstrainedTask, batch: Any, services: StepServices) -> StepResult:
        optimizer = services.optimizer
        need_jacobian = "jacobian" in getattr(optimizer, "requires", frozenset())
        batch = task.prepare_batch(batch)
        if self.batch_description is None:
            self.batch_description = describe_batch(batch)

        optimizer.zero_grad()
        f, c, signs = self._evaluate(task, batch, services, need_jacobian)
        loss = f
        if self.penalty_weight > 0 and c is not None and c.numel():
            loss = f + self.penalty_weight * violated_part(c, signs).pow(2).mean()
        params = group_params(optimizer.param_groups)
        J = self._jacobian(task, batch, c, params, services) if need_jacobian and c is not None else None
        services.backward(loss)
        if self.max_grad_norm is not None:
            if services.clip_gradients is None:
                raise ValueError("max_grad_norm is set, but the step was given no clip_gradients service.")
            services.clip_gradients(self.max_grad_norm)

        loss_mean, c_mean, J_mean, consistent = reduce_step(
            services.all_gather, services.world_size, task.constraints_shared, loss, c, J
        )
        if not self._may_step(loss_mean, c_mean, J_mean, params, consistent):
            return self._refuse_or_skip(task, services, loss_mean, c_mean, J_mean, params, consistent, signs)
        self.consecutive_skips = 0
        self._last_finite = (services.step_index, loss_mean, c_mean)

        sense_rows = None if signs is None or c_mean is None else self._rows_of(signs, c_mean.numel())
        kwargs, g = self._optimizer_arguments(task, batch, services, c, c_mean, J_mean, sense_rows)
        services.optimizer_step(closure=lambda: loss_mean, **kwargs)
        if sense_rows is None:
            return StepResult(loss_mean, c_mean)
        return StepResult(loss_mean, violated_part(c_mean, signs), inequalities=g)

    def _evaluate(
        self, task: ConstrainedTask, batch: Any, services: StepServices, need_jacobian: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """f and c on ``batch``, checked (c in the parameters' dtype, even under AMP), and the signs of
        c's rows on the step's device; inequality rows for an optimizer that cannot take them are
        refused here, before any update."""
        name = type(task).__name__
        f = check_objective(task.objective(batch), f"{name}.objective()")
        with constraint_precision(services.device):  # c and J in the parameters' dtype, even under AMP
            c = check_constraints(task.constraints(batch), f"{name}.constraints()", self.num_constraints, need_jacobian)
        self.num_constraints = 0 if c is None else c.numel()
        signs = self._on_device(row_signs(task, self.num_constraints), f)
        optimizer = services.optimizer
        if signs is not None and need_jacobian and not getattr(optimizer, "accepts_inequalities", False):
            raise ValueError(
                f"{name} imposes inequality rows (sense '<=' or '>='), which {type(optimizer).__name__} cannot "
                f"take: use {INEQUALITY_OPTIMIZERS} (or torch.optim.Adam to only monitor them)."
            )
        return f, c, signs

    def _jacobian(
        self, task: ConstrainedTask, batch: Any, c: Tensor, params: list[Tensor], services: StepServices
    ) -> Tensor:
        """This rank's rows of J (:meth:`_own_rows`), autocast off, checked for their shape."""
        rows = self._own_rows(task, services, c.numel())
        with constraint_precision(services.device):
            J = _jacobian_rows(task, batch, c, params, rows)
        expected = (rows.stop - rows.start, numel_real(params))
        if tuple(J.shape) != expected:
            raise ValueError(
                f"{type(task).__name__}.constraint_jacobian() returned shape {tuple(J.shape)}, expected "
                f"{expected} (rows {rows.start}:{rows.stop} of the {c.numel()} constraints)."
            )
        return J

    def _may_step(
        self, f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor], consistent: Tensor | None
    ) -> bool:
        """Whether f, c, J and the gradients are finite and (shared constraints) c is the same on every
        rank: ONE host read of the fused flag (:meth:`_all_finite`); only when it fails, the entrywise
        check (a sum that overflowed reads as not finite), with its own reads."""
        healthy = self._all_finite(f, c, J, params)
        if consistent is not None:
            healthy = healthy & consistent
        if bool(healthy):  # the step's one host sync
            return True
        return (consistent is None or bool(consistent)) and self._entrywise_finite(f, c, J, params)

    def _refuse_or_skip(
        self, task: ConstrainedTask, services: StepServices, f: Tensor, c: Tensor | None, J: Tensor | None,
        params: list[Tensor], consistent: Tensor | None, signs: Tensor | None,
    ) -> StepResult:
        """A step that may not update: an error for constraints that differ across ranks, or by
        ``on_nonfinite`` for a non-finite value (``"skip"``: the batch is skipped, until
        ``max_consecutive_skips`` in a row)."""
        if consistent is not None and not bool(consistent):
            raise ValueError(_INCONSISTENT.format(name=type(task).__name__, step=services.step_index))
        report = self._nonfinite_report(task, services.step_index, f, c, J, params)
        if self.on_nonfinite == "raise":
            raise FloatingPointError(
                f"{report} Lower the learning rate, check the data, or set on_nonfinite='skip' to skip "
                "such batches."
            )
        services.optimizer.zero_grad()
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise FloatingPointError(
                f"{report} {self.consecutive_skips} consecutive batches skipped (on_nonfinite='skip', "
                f"max_consecutive_skips={self.max_consecutive_skips}): the non-finite values persist, so "
                "skipping cannot recover. Lower the learning rate, check the data, or resume from an "
                "earlier checkpoint."
            )
        services.report(f"{report} Skipped ({self.consecutive_skips} in a row).")
        return StepResult(f, violated_part(c, signs) if c is not None else None, skipped=True)

    def _optimizer_arguments(
        self, task: ConstrainedTask, batch: Any, services: StepServices, c: Tensor | None, c_mean: Tensor | None,
        J_mean: Tensor | None, sense_rows: SenseRows | None,
    ) -> tuple[dict[str, Any], Tensor | None]:
        """The keyword arguments of ``optimizer_step`` by what the optimizer requires and takes (c and J,
        or with ``sense_rows`` the equality rows and g, G; ``diagnostics``; the ``constraint_closure``),
        and g (None without inequality rows)."""
        optimizer = services.optimizer
        requires = getattr(optimizer, "requires", frozenset())
        takes_inequalities = getattr(optimizer, "accepts_inequalities", False)
        kwargs: dict[str, Any] = {}
        c_eq, J_eq, g, G = (c_mean, J_mean, None, None) if sense_rows is None else sense_rows.split(c_mean, J_mean)
        if sense_rows is not None and not sense_rows.m:
            c_eq = J_eq = None
        if "constraints" in requires:
            kwargs["constraints"] = c_eq
        if "jacobian" in requires:
            kwargs["jacobian"] = J_eq
        if sense_rows is not None and takes_inequalities:
            kwargs["inequalities"], kwargs["inequality_jacobian"] = g, G
        if isinstance(getattr(optimizer, "diagnostics", None), dict):
            # the package's optimizers compute their diagnostics only on the steps asked for
            kwargs["diagnostics"] = bool(services.diagnostics)
        if c is not None and c.numel() and _accepts(optimizer, "step", "constraint_closure"):
            kwargs["constraint_closure"] = self._constraint_closure(task, batch, services, sense_rows, takes_inequalities)
        return kwargs, g

    def _on_device(self, signs: Tensor | None, like: Tensor) -> Tensor | None:
        """The task's signs on the step's device, copied once while the task returns the same tensor (a
        host-to-device copy every step would wait for the device)."""
        if signs is None or signs.device == like.device:
            return signs
        cached = self._device_signs
        if cached is None or cached[0] is not signs:
            self._device_signs = cached = (signs, signs.to(like.device))
        return cached[1]

    def _rows_of(self, signs: Tensor, rows: int) -> SenseRows:
        """The split of ``rows`` constraint rows by the task's m ``signs`` (``rows`` = W m for the ranks'
        union: the signs repeat), cached while the task returns the same signs tensor."""
        copies = rows // max(signs.numel(), 1)
        if copies * signs.numel() != rows:
            raise ValueError(f"the imposed parts' layout gives {signs.numel()} signs for {rows} constraint rows.")
        cached = self._sense_rows
        if cached is None or cached[0] is not signs or cached[1] != copies:
            self._sense_rows = (signs, copies, SenseRows.of(signs.repeat(copies) if copies > 1 else signs))
        return self._sense_rows[2]

    @staticmethod
    def _constraint_closure(
        task: ConstrainedTask, batch: Any, services: StepServices, sense_rows: SenseRows | None = None,
        pair: bool = True,
    ) -> Callable[[], Tensor | tuple[Tensor, Tensor]]:
        """c at the current parameters, for the optimizer's post-step corrections: the task's
        constraints (grad mode on, for residuals that differentiate w.r.t. their inputs; autocast off),
        detached; under data parallelism the same c on every rank (shared constraints: each rank's own,
        equal by construction; per-rank constraints: the ranks' union, as the step imposes it). With
        inequality rows (``sense_rows``) the pair ``(c_E, g)``, split as the step's rows (``pair``
        False, an optimizer that takes no inequalities: ``c_E`` alone)."""

        def constraints_now() -> Tensor | tuple[Tensor, Tensor]:
            with torch.enable_grad(), constraint_precision(services.device):
                c = task.constraints(batch)
            c = c.detach().reshape(-1)
            if services.world_size > 1 and not task.constraints_shared:
                c = services.all_gather(c).reshape(-1)
            if sense_rows is None:
                return c
            if not pair:
                return sense_rows.equalities(c)
            return sense_rows.equalities(c), sense_rows.inequalities(c)

        return constraints_now

    @staticmethod
    def _own_rows(task: ConstrainedTask, services: StepServices, m: int) -> slice:
        """The rows of J this rank differentiates: its balanced share when the constraints are the
        same on every rank (``task.constraints_shared``), else all of its own m rows."""
        if services.world_size > 1 and task.constraints_shared:
            return row_slice(m, services.world_size, services.rank)
        return slice(0, m)

    @staticmethod
    def _all_finite(f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor]) -> Tensor:
        """A 0-dim bool tensor (no host sync): f, c, J and every gradient hold no NaN/inf.

        One fused flag: the caller reads it once per step (one sync on an accelerator instead of one
        per tensor). A NaN or inf makes a tensor's sum non-finite, so each tensor costs one reduction and
        no temporary of its size (``isfinite(t).all()`` writes a t-sized float and two t-sized masks: 1.5x
        J's bytes at m = 1 000). A sum that overflows although every entry is finite reads as not finite
        here; the caller then checks entry by entry (:meth:`_entrywise_finite`) before reporting. A complex
        tensor (an FNO's spectral weights' gradients) is summed over its real view, so that a NaN or inf in an
        imaginary part shows too (casting its complex sum to float64 dropped it)."""
        sums = [(torch.view_as_real(t) if t.is_complex() else t).sum().to(torch.float64)
                for t in _checked_tensors(f, c, J, params)]
        return torch.isfinite(torch.stack(sums)).all()

    @staticmethod
    def _entrywise_finite(f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor]) -> bool:
        """Whether every entry is finite (the failure path of :meth:`_all_finite`: syncs are fine here)."""
        return all(bool(torch.isfinite(t).all()) for t in _checked_tensors(f, c, J, params))

    def _nonfinite_report(
        self,
        task: ConstrainedTask,
        step_index: int,
        f: Tensor,
        c: Tensor | None,
        J: Tensor | None,
        params: list[Tensor],
    ) -> str:
        """Which of f, c, J and which parameters' gradients hold NaN/inf, and the last finite values
        (computed only on the failure path: it syncs once per tensor)."""
        bad: list[str] = []
        for label, tensor in (("objective f", f), ("constraints c", c), ("Jacobian J", J)):
            if tensor is not None:
                count = count_nonfinite(tensor)
                if count:
                    bad.append(f"{label} ({count} of {tensor.numel()} entries)")
        names = {id(p): n for n, p in task.named_parameters()}
        grads = [names.get(id(p), f"param[{i}]") for i, p in enumerate(params)
                 if p.grad is not None and count_nonfinite(p.grad)]
        if grads:
            shown = ", ".join(grads[:5]) + (f" and {len(grads) - 5} more" if len(grads) > 5 else "")
            bad.append(f"the gradient of {shown}")
        what = "; ".join(bad) if bad else "no single tensor (the reduced values are finite; a rank disagreed)"
        if self._last_finite is None:
            last = "no finite step yet"
        else:
            step, f_last, c_last = self._last_finite
            last = f"last finite step {step}: f={float(f_last):.6g}"
            if c_last is not None and c_last.numel():
                last += f", max|c|={float(c_last.abs().max()):.6g}"
        return f"Non-finite values at step {step_index}: {what} ({last})."


def _checked_tensors(f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor]) -> list[Tensor]:
    """The tensors whose finiteness a step checks: f, c, J and every gradient."""
    return [f] + [t for t in (c, J) if t is not None] + [p.grad for p in params if p.grad is not None]
