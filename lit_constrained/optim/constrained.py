r"""The base class of the hard-constrained optimizers: one step from (g, c, J) to x_{k+1}.

A subclass computes, from the flat float64 gradient g, the constraints c and a factorization of J,

* the unit normal component :math:`\hat v` with :math:`J \hat v = -c` (minimum norm), and
* the tangential component t with :math:`J t = 0` (momentum, scaling, ...),

and this class composes the step

.. math::
    x_{k+1} = x_k + \alpha_k \rho \hat v + \alpha_k t

(:math:`v = \rho \hat v` is the paper's normal step, :math:`d = v + t`). With ``rho="full"`` the normal
part is :math:`\hat v` itself (:math:`\rho_k = 1/\alpha_k` at every step, so it follows LR schedulers):
the linearized constraint :math:`c + J \Delta x` is restored in one step instead of shrinking by
:math:`(1 - \alpha \rho)`. Far from feasibility the linearization can be poor and a full normal step
large: ``max_normal_step`` caps :math:`\|\Delta x_{normal}\| \le \text{max\_normal\_step}\,\|x\|` (off by
default; use it when the first steps blow up, e.g. a network initialized far from satisfying c = 0).

Several parameter groups: group i's block of the step is scaled by its own lr. When the groups' lrs
differ, the tangential part :math:`\mathrm{diag}(\alpha) t` is projected again on the null space of J, so
it still leaves the linearized constraints unchanged; the normal part is scaled per block as well
(``rho`` numeric) or not at all (``rho="full"``), so :math:`J \Delta x = -\alpha\rho c` holds exactly
only when all groups share one lr or with ``rho="full"``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Literal, Union

import torch
from torch import Tensor
from torch.optim import Optimizer

from .checks import check_finite, check_lr, check_positive
from .flat import add_flat_, block_sizes, gather, group_params
from .nullspace import DEFAULT_RCOND, NullSpace

Rho = Union[float, Literal["full"]]
ParamsT = Union[Iterable[Tensor], Iterable[dict[str, Any]]]

STATE_KEY = "flat"
DIAGNOSTICS_KEY = "diagnostics"
_TINY = 1e-30


def check_rho(rho: Rho) -> None:
    if rho == "full":
        return
    if isinstance(rho, str) or not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"Invalid rho={rho!r}: a number > 0, or 'full' for rho_k = 1 / lr_k.")


class ConstrainedOptimizer(Optimizer, ABC):
    """Shared machinery: input checks, the flat layout, rho / "full", diagnostics, state."""

    requires = frozenset({"constraints", "jacobian"})

    def __init__(
        self,
        params: ParamsT,
        defaults: dict[str, Any],
        rho: Rho = 1.0,
        rcond: float = DEFAULT_RCOND,
        max_normal_step: float | None = None,
    ) -> None:
        check_lr(defaults.get("lr"))
        check_rho(rho)
        check_positive("rcond", rcond)
        if max_normal_step is not None:
            check_positive("max_normal_step", max_normal_step)
        self.rho = rho
        self.rcond = rcond
        self.max_normal_step = max_normal_step
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ subclass hook
    @abstractmethod
    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Any]
    ) -> tuple[Tensor, Tensor, NullSpace]:
        """Return (v_hat, t, nullspace of J): J v_hat = -c (min norm), J t = 0."""

    def _init_state(self, n: int, device: torch.device) -> dict[str, Any]:
        return {"step": 0}

    def _factorize(self, jacobian: Tensor) -> NullSpace:
        """NullSpace of J, converting into a reused float64 buffer (not part of the state)."""
        workspace = getattr(self, "_jacobian_workspace", None)
        if jacobian.dtype != torch.float64 and (workspace is None or workspace.shape != jacobian.shape):
            workspace = torch.empty(jacobian.shape, dtype=torch.float64, device=jacobian.device)
            self._jacobian_workspace = workspace
        return NullSpace.from_jacobian(jacobian, self.rcond, workspace=workspace)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        constraints: Tensor | None = None,
        jacobian: Tensor | None = None,
    ) -> Any:
        """One step; g is read from ``p.grad``, c and J are given (J in the flat layout)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = group_params(self.param_groups)
        for group in self.param_groups:
            check_lr(group["lr"])
        n = sum(block_sizes(params))
        device = params[0].device if params else torch.device("cpu")
        g = gather([p.grad for p in params], params, torch.float64)
        check_finite("The objective gradient g", g)
        c, J = self._checked_constraints(constraints, jacobian, n, device)

        state = self.state[STATE_KEY]
        if not state:
            state.update(self._init_state(n, device))
        elif state.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {state['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        state["n"] = n
        state["step"] += 1
        diagnostics: dict[str, Any] = {}
        v_hat, t, nullspace = self._directions(g, c, J, state, diagnostics)

        lr_blocks = [float(group["lr"]) for group in self.param_groups for _ in group["params"]]
        uniform = len(set(lr_blocks)) <= 1
        lr = lr_blocks[0] if lr_blocks else 0.0
        if uniform:
            tangential = lr * t
            normal_scale: float | Tensor = 1.0 if self.rho == "full" else lr * float(self.rho)
        else:
            lr_vec = torch.cat(
                [torch.full((size,), rate, dtype=torch.float64, device=device)
                 for size, rate in zip(block_sizes(params), lr_blocks)]
            )
            tangential = nullspace.project(lr_vec * t)
            normal_scale = 1.0 if self.rho == "full" else lr_vec * float(self.rho)
        normal = normal_scale * v_hat
        # the linearized reduction the step intends: J delta = -scale * c (None: mixed lrs, numeric rho)
        scale: float | None = normal_scale if isinstance(normal_scale, float) else None
        if self.max_normal_step is not None and c.numel():
            x_norm = float(gather([p.detach() for p in params], params, torch.float64).norm())
            normal_norm = float(normal.norm())
            limit = self.max_normal_step * x_norm
            capped = normal_norm > limit
            if capped:
                normal = normal * (limit / normal_norm)
                scale = None if scale is None else scale * limit / normal_norm
            diagnostics["normal_step_capped"] = float(capped)
        delta = normal + tangential
        check_finite("The step", delta)
        add_flat_(params, delta)

        self._record(state, diagnostics, c, delta, normal, tangential, nullspace, lr, scale)
        return loss

    # ------------------------------------------------------------------ helpers
    def _checked_constraints(
        self, constraints: Tensor | None, jacobian: Tensor | None, n: int, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        if constraints is None:
            if jacobian is not None and jacobian.numel():
                raise ValueError("A jacobian was given without constraints; pass both (or neither for m = 0).")
            return torch.zeros(0, dtype=torch.float64, device=device), torch.zeros(
                0, n, dtype=torch.float64, device=device
            )
        if not isinstance(constraints, Tensor) or constraints.dim() != 1:
            shape = tuple(constraints.shape) if isinstance(constraints, Tensor) else type(constraints).__name__
            raise ValueError(f"constraints must be a 1-D tensor of m residuals, got shape {shape}.")
        m = constraints.numel()
        if jacobian is None:
            raise ValueError(f"{type(self).__name__} requires jacobian= (shape ({m}, {n})) with the constraints.")
        if jacobian.dim() != 2 or tuple(jacobian.shape) != (m, n):
            raise ValueError(
                f"jacobian has shape {tuple(jacobian.shape)}, expected (m, n) = ({m}, {n}): one row per "
                "constraint, one column per real parameter entry in param_groups order "
                "(complex parameters as view_as_real)."
            )
        c = constraints.detach().to(torch.float64)
        J = jacobian.detach()
        check_finite("The constraints c", c)
        check_finite("The jacobian J", J)
        return c, J

    def _record(
        self,
        state: dict[str, Any],
        diagnostics: dict[str, Any],
        c: Tensor,
        delta: Tensor,
        normal: Tensor,
        tangential: Tensor,
        nullspace: NullSpace,
        lr: float,
        scale: float | None,
    ) -> None:
        violation = c.abs().max() if c.numel() else c.new_zeros(())
        if "initial_violation" not in state:
            state["initial_violation"] = violation.clone()
        rho_eff = (1.0 / lr if lr > 0 else math.inf) if self.rho == "full" else float(self.rho)
        diagnostics.update(
            rank=nullspace.rank,
            smallest_singular_value=nullspace.smallest_singular_value,
            rho=rho_eff,
            step_norm=delta.norm(),
            normal_step_norm=normal.norm(),
            tangential_step_norm=tangential.norm(),
            violation_max=violation,
            violation_ratio=violation / state["initial_violation"].clamp_min(_TINY),
        )
        if lr > 0:
            diagnostics["direction_norm"] = delta.norm() / lr
        if c.numel():
            J64 = nullspace.jacobian
            if scale is not None and scale > 0:
                # ||J d + rho c|| / (rho ||c||) with d = delta / lr: the relative error of the intended
                # linearized reduction J delta = -lr rho c (~1e-10 or less when healthy).
                diagnostics["linearized_feasibility_error"] = (J64 @ delta + scale * c).norm() / max(
                    scale * float(c.norm()), _TINY
                )
        self.state[DIAGNOSTICS_KEY] = diagnostics
