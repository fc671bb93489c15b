"""The manual-optimization strategy: one training step of a ConstrainedModule, start to end.

It is not a Lightning ``Strategy`` (those pick the hardware backend: keep ``strategy: auto`` or
``ddp``). Its step:

1. ``opt = module.optimizers()`` (the LightningOptimizer: stepping it advances ``global_step``);
2. evaluate ``f = objective(batch)`` and ``c = constraints(batch)``; check their shapes;
3. the Jacobian of c w.r.t. the optimizer's own parameters, in ``param_groups`` order, only if the
   optimizer's ``requires`` asks for it (``torch.autograd.grad``: no DDP hooks fire); on W ranks
   with ``module.constraints_shared`` (the same m constraints everywhere) only this rank's balanced
   slice of the rows (:func:`~lit_constrained.distributed.row_slice`);
4. ``manual_backward(f)`` (DDP averages the gradient);
5. ONE all-gather of [f, c, J rows] (:func:`~lit_constrained.distributed.gather_step`): f becomes
   the rank mean, J is assembled from the slices (shared) or the ranks' rows are stacked (per-rank
   constraints: the union, W m rows). All ranks then step with the same f, c, J: MoMo's step size
   and the SQP projection are identical on every replica, which therefore never drift apart. One
   fused flag (finite f, c, J and gradient; with shared constraints also: the same c on every rank)
   is the step's only host sync;
6. ``opt.step(closure=lambda: f_mean, **what the optimizer requires)``; the LR schedulers are stepped
   (manual optimization does not do it);
7. log the objective, the constraint violation and the optimizer's step diagnostics.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from .distributed import gather_step, row_counts, row_slice
from .optim.flat import group_params, numel_real

if TYPE_CHECKING:
    from .module import ConstrainedModule

NonFinitePolicy = Literal["raise", "skip"]


@dataclass
class StepResult:
    """What one training step saw, reduced over ranks (identical on every rank)."""

    objective: Tensor
    constraints: Tensor | None
    skipped: bool = False


def check_objective(f: Any, where: str) -> Tensor:
    if not isinstance(f, Tensor) or f.numel() != 1:
        shape = tuple(f.shape) if isinstance(f, Tensor) else type(f).__name__
        raise ValueError(f"{where} must return a scalar tensor, got {shape}.")
    return f.reshape(())


def check_constraints(c: Any, where: str, expected_m: int | None, need_grad: bool) -> Tensor | None:
    if c is None:
        if expected_m not in (None, 0):
            raise ValueError(f"{where} returned None after returning {expected_m} constraints at earlier steps.")
        return None
    if not isinstance(c, Tensor) or c.dim() != 1:
        shape = tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__
        raise ValueError(
            f"{where} must return a 1-D tensor of m residuals (or None), got shape {shape}; "
            "flatten it (e.g. residual.reshape(-1)) if it is a grid."
        )
    if c.is_complex():
        raise ValueError(
            f"{where} returned complex residuals (dtype {c.dtype}): a complex constraint c = 0 is two real "
            "ones, and the constrained optimizers work with real residuals. Return both parts, "
            "torch.cat([c.real, c.imag]) (2m real rows; both vanish exactly when |c| = 0)."
        )
    if expected_m is not None and c.numel() != expected_m:
        raise ValueError(
            f"{where} returned {c.numel()} constraints, but {expected_m} at the previous step: the "
            "constraint set must stay fixed (choose the constraint points once, e.g. in setup())."
        )
    if need_grad and not c.requires_grad:
        raise ValueError(
            f"{where} returned a tensor without grad (shape {tuple(c.shape)}): compute it from the "
            "network's output without detaching or torch.no_grad()."
        )
    return c


_INCONSISTENT = (
    "{name}.constraints() differs across ranks at step {step}, but {name}.constraints_shared is True "
    "(each rank differentiates only its share of the rows of ONE shared constraint set). Make the "
    "constraint points the same on every rank (fixed points, e.g. a buffer set in __init__ or setup()), "
    "or set constraints_shared = False to impose the union of the ranks' own constraints."
)


def _same_on_every_rank(ranks_c: Tensor) -> Tensor:
    """0-dim bool tensor (no host sync): every row of ``ranks_c`` (W, m) equals row 0 to round-off
    (relative tolerance sqrt(eps) of the dtype: replicas computing the same c differ at most by the
    kernels' round-off; NaNs are left to the finiteness check)."""
    if ranks_c.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=ranks_c.device)
    tol = torch.finfo(ranks_c.dtype).eps ** 0.5 if ranks_c.is_floating_point() else 0.0
    reference = ranks_c[0]
    gap = (ranks_c - reference).abs().amax()
    return ~(gap > tol * (1.0 + reference.abs().amax()))


_ACCEPTS_ROWS: dict[type, bool] = {}


def _jacobian_rows(module: "ConstrainedModule", batch: Any, c: Tensor, params: list[Tensor], rows: slice) -> Tensor:
    """``module.constraint_jacobian`` for the rows ``rows`` of c.

    An override written before the ``rows`` argument existed (``(batch, constraints, params)``) is
    called for the whole J, which is then sliced (correct, but every rank repeats all m rows)."""
    if rows == slice(0, c.numel()):
        return module.constraint_jacobian(batch, c, params)
    kind = type(module)
    if kind not in _ACCEPTS_ROWS:
        _ACCEPTS_ROWS[kind] = "rows" in inspect.signature(module.constraint_jacobian).parameters
    if _ACCEPTS_ROWS[kind]:
        return module.constraint_jacobian(batch, c, params, rows=rows)
    return module.constraint_jacobian(batch, c, params)[rows]


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
    """Owns a training step of a :class:`~lit_constrained.module.ConstrainedModule`."""

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

    def step(self, module: "ConstrainedModule", batch: Any) -> StepResult:
        opt = module.optimizers()
        if isinstance(opt, list):
            raise ValueError("ConstrainedModule trains with exactly one optimizer.")
        raw = opt.optimizer
        requires = getattr(raw, "requires", frozenset())
        name = type(module).__name__
        step_index = module.trainer.global_step

        opt.zero_grad()
        f = check_objective(module.objective(batch), f"{name}.objective()")
        need_jacobian = "jacobian" in requires
        with constraint_precision(module.device):  # c and J in the parameters' dtype, even under AMP
            c = check_constraints(
                module.constraints(batch), f"{name}.constraints()", self.num_constraints, need_jacobian
            )
        self.num_constraints = 0 if c is None else c.numel()
        loss = f
        if self.penalty_weight > 0 and c is not None and c.numel():
            loss = f + self.penalty_weight * c.pow(2).mean()

        params = group_params(raw.param_groups)
        rows = self._own_rows(module, 0 if c is None else c.numel())
        J = None
        if need_jacobian and c is not None:
            with constraint_precision(module.device):
                J = _jacobian_rows(module, batch, c, params, rows)
            expected = (rows.stop - rows.start, numel_real(params))
            if tuple(J.shape) != expected:
                raise ValueError(
                    f"{name}.constraint_jacobian() returned shape {tuple(J.shape)}, expected {expected} "
                    f"(rows {rows.start}:{rows.stop} of the {c.numel()} constraints)."
                )
        module.manual_backward(loss)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)

        loss_mean, c_mean, J_mean, consistent = self._reduce(module, loss, c, J)
        healthy = self._all_finite(loss_mean, c_mean, J_mean, params)
        if consistent is not None:
            healthy = healthy & consistent
        if not bool(healthy):  # the step's one host sync
            if consistent is not None and not bool(consistent):
                raise ValueError(_INCONSISTENT.format(name=name, step=step_index))
            report = self._nonfinite_report(module, step_index, loss_mean, c_mean, J_mean, params)
            if self.on_nonfinite == "raise":
                raise FloatingPointError(
                    f"{report} Lower the learning rate, check the data, or set on_nonfinite='skip' to skip "
                    "such batches."
                )
            opt.zero_grad()
            self.consecutive_skips += 1
            if self.consecutive_skips >= self.max_consecutive_skips:
                raise FloatingPointError(
                    f"{report} {self.consecutive_skips} consecutive batches skipped (on_nonfinite='skip', "
                    f"max_consecutive_skips={self.max_consecutive_skips}): the non-finite values persist, so "
                    "skipping cannot recover. Lower the learning rate, check the data, or resume from an "
                    "earlier checkpoint."
                )
            module.print(f"{report} Skipped ({self.consecutive_skips} in a row).")
            return StepResult(loss_mean, c_mean, skipped=True)
        self.consecutive_skips = 0
        self._last_finite = (step_index, loss_mean, c_mean)

        kwargs: dict[str, Any] = {}
        if "constraints" in requires:
            kwargs["constraints"] = c_mean
        if need_jacobian:
            kwargs["jacobian"] = J_mean
        if isinstance(getattr(raw, "diagnostics", None), dict):
            # the package's optimizers compute their diagnostics only on the steps the module logs
            logging_step = getattr(module, "is_logging_step", None)
            if logging_step is not None:
                kwargs["diagnostics"] = bool(logging_step())
            else:
                every = module.trainer.log_every_n_steps
                kwargs["diagnostics"] = bool(every) and (module.trainer.global_step + 1) % every == 0
        opt.step(closure=lambda: loss_mean, **kwargs)
        self._step_schedulers(module, loss_mean)
        return StepResult(loss_mean, c_mean)

    @staticmethod
    def _own_rows(module: "ConstrainedModule", m: int) -> slice:
        """The rows of J this rank differentiates: its balanced share when the constraints are the
        same on every rank (``module.constraints_shared``), else all of its own m rows."""
        trainer = module.trainer
        if trainer.world_size > 1 and module.constraints_shared:
            return row_slice(m, trainer.world_size, trainer.global_rank)
        return slice(0, m)

    @staticmethod
    def _reduce(
        module: "ConstrainedModule", f: Tensor, c: Tensor | None, J: Tensor | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """ONE collective per step (none on one process): an all-gather of [f, c, J rows].

        Returns f as the rank mean (as DDP averages the gradient), c and J assembled from the ranks'
        rows (identical on every rank), and, when the constraints are shared, a 0-dim bool tensor
        saying whether every rank computed the same c (to round-off): each rank sends its whole c
        (m numbers) with its slice of J, so a task whose constraints differ per rank while
        ``constraints_shared`` is True fails loudly instead of mixing rows of different points.
        ``f`` is the loss, penalty included. See :mod:`lit_constrained.distributed`.
        """
        f = f.detach()
        c = None if c is None else c.detach()
        J = None if J is None else J.detach()
        trainer = module.trainer
        world_size = trainer.world_size
        if world_size == 1:
            return f, c, J, None
        m = 0 if c is None else c.numel()
        all_gather = trainer.strategy.all_gather
        if module.constraints_shared:
            # every rank sends its whole c (m numbers) and its slice of J
            out = gather_step(all_gather, world_size, f, c, [m] * world_size, J, row_counts(m, world_size))
            if out.constraints is None:
                return out.objective, None, out.jacobian, None
            ranks_c = out.constraints.reshape(world_size, m)
            return out.objective, ranks_c[0], out.jacobian, _same_on_every_rank(ranks_c)
        out = gather_step(all_gather, world_size, f, c, [m] * world_size, J, [m] * world_size)
        return out.objective, out.constraints, out.jacobian, None

    @staticmethod
    def _all_finite(f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor]) -> Tensor:
        """A 0-dim bool tensor (no host sync): f, c, J and every gradient hold no NaN/inf.

        One fused flag: the caller reads it once per step (one sync on an accelerator instead of one
        per tensor)."""
        tensors = [f] + [t for t in (c, J) if t is not None] + [p.grad for p in params if p.grad is not None]
        return torch.stack([torch.isfinite(t).all() for t in tensors]).all()

    def _nonfinite_report(
        self,
        module: "ConstrainedModule",
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
            if tensor is not None and not bool(torch.isfinite(tensor).all()):
                count = int((~torch.isfinite(tensor)).sum())
                bad.append(f"{label} ({count} of {tensor.numel()} entries)")
        names = {id(p): n for n, p in module.named_parameters()}
        grads = [names.get(id(p), f"param[{i}]") for i, p in enumerate(params)
                 if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
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

    @staticmethod
    def _step_schedulers(module: "ConstrainedModule", f_mean: Tensor) -> None:
        schedulers = module.lr_schedulers()
        if schedulers is None:
            return
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers]:
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(f_mean)
            else:
                scheduler.step()
