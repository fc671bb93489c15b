"""The manual-optimization strategy: one training step of a ConstrainedModule, start to end.

It is not a Lightning ``Strategy`` (those pick the hardware backend: keep ``strategy: auto`` or
``ddp``). Its step:

1. ``opt = module.optimizers()`` (the LightningOptimizer: stepping it advances ``global_step``);
2. evaluate ``f = objective(batch)`` and ``c = constraints(batch)``; check their shapes;
3. the Jacobian of c w.r.t. the optimizer's own parameters, in ``param_groups`` order, only if the
   optimizer's ``requires`` asks for it (``torch.autograd.grad``: no DDP hooks fire);
4. ``manual_backward(f)`` (DDP averages the gradient);
5. ONE mean all-reduce of the buffer [f, c, J] through ``trainer.strategy.reduce`` (on a copy: it
   reduces in place). All ranks then step with the same f, c, J: MoMo's step size and the SQP
   projection are identical on every replica, which therefore never drift apart;
6. ``opt.step(closure=lambda: f_mean, **what the optimizer requires)``; the LR schedulers are stepped
   (manual optimization does not do it);
7. log the objective, the constraint violation and the optimizer's step diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from .optim.checks import all_finite
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


class TrainingStepper:
    """Owns a training step of a :class:`~lit_constrained.module.ConstrainedModule`."""

    def __init__(
        self,
        penalty_weight: float = 0.0,
        on_nonfinite: NonFinitePolicy = "raise",
        max_grad_norm: float | None = None,
    ) -> None:
        if penalty_weight < 0:
            raise ValueError(f"penalty_weight must be >= 0, got {penalty_weight}.")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}.")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None), got {max_grad_norm}.")
        self.penalty_weight = penalty_weight
        self.on_nonfinite = on_nonfinite
        self.max_grad_norm = max_grad_norm
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
        c = check_constraints(
            module.constraints(batch), f"{name}.constraints()", self.num_constraints, need_jacobian
        )
        self.num_constraints = 0 if c is None else c.numel()
        loss = f
        if self.penalty_weight > 0 and c is not None and c.numel():
            loss = f + self.penalty_weight * c.pow(2).mean()

        params = group_params(raw.param_groups)
        J = None
        if need_jacobian and c is not None:
            J = module.constraint_jacobian(batch, c, params)
            expected = (c.numel(), numel_real(params))
            if tuple(J.shape) != expected:
                raise ValueError(
                    f"{name}.constraint_jacobian() returned shape {tuple(J.shape)}, expected {expected}."
                )
        module.manual_backward(loss)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)

        loss_mean, c_mean, J_mean = self._reduce(module, loss, c, J)
        if not self._all_finite(loss_mean, c_mean, J_mean, params):
            message = (
                f"Non-finite objective, constraints, Jacobian or gradient at step {step_index} "
                f"(objective={float(loss_mean):.4g}). Lower the learning rate, check the data, or set "
                "on_nonfinite='skip' to skip such batches."
            )
            if self.on_nonfinite == "raise":
                raise FloatingPointError(message)
            opt.zero_grad()
            module.print(message + " Skipped.")
            return StepResult(loss_mean, c_mean, skipped=True)

        kwargs: dict[str, Any] = {}
        if "constraints" in requires:
            kwargs["constraints"] = c_mean
        if need_jacobian:
            kwargs["jacobian"] = J_mean
        opt.step(closure=lambda: loss_mean, **kwargs)
        self._step_schedulers(module, loss_mean)
        return StepResult(loss_mean, c_mean)

    @staticmethod
    def _reduce(
        module: "ConstrainedModule", f: Tensor, c: Tensor | None, J: Tensor | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One mean all-reduce of [f, c, J] (a no-op on one process)."""
        f = f.detach()
        pieces = [f.reshape(1)]
        if c is not None:
            pieces.append(c.detach().reshape(-1).to(f.dtype))
        if J is not None:
            pieces.append(J.detach().reshape(-1).to(f.dtype))
        if module.trainer.world_size > 1:
            buffer = module.trainer.strategy.reduce(torch.cat(pieces).clone(), reduce_op="mean")
        else:
            buffer = torch.cat(pieces)
        f_mean = buffer[0]
        c_mean = J_mean = None
        offset = 1
        if c is not None:
            m = c.numel()
            c_mean = buffer[offset:offset + m].to(c.dtype)
            offset += m
        if J is not None:
            J_mean = buffer[offset:].reshape(J.shape).to(J.dtype)
        return f_mean, c_mean, J_mean

    @staticmethod
    def _all_finite(f: Tensor, c: Tensor | None, J: Tensor | None, params: list[Tensor]) -> bool:
        tensors = [f] + [t for t in (c, J) if t is not None] + [p.grad for p in params if p.grad is not None]
        return all(all_finite(t) for t in tensors)

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
