r"""The base class of the hard-constrained optimizers: one step from (g, c, J) to x_{k+1}.

A subclass computes, from the flat gradient g, the constraints c and a factorization of J,

* the unit normal component :math:`\hat v` with :math:`J \hat v = -c` (minimum norm), and
* the tangential component t with :math:`J t = 0` (momentum, scaling, ...),

and this class composes the step

.. math::
    x_{k+1} = x_k + \alpha_k \rho \hat v + \alpha_k t

(:math:`v = \rho \hat v` is the paper's normal step, :math:`d = v + t`). With ``rho="full"`` (the
default) the normal part is :math:`\hat v` itself (:math:`\rho_k = 1/\alpha_k` at every step, so it
follows LR schedulers): the linearized constraint :math:`c + J \Delta x` is restored in one step instead
of shrinking by :math:`(1 - \alpha \rho)` per step. A numeric ``rho`` is the papers' method.

Hyperparameters follow torch.optim's conventions: every one is in ``defaults`` and hence in each param
group (``repr``, ``state_dict``/``load_state_dict`` and schedulers see them). ``rho``, ``rcond``,
``max_normal_step`` and ``precision`` define the one projection shared by all groups and must be equal in
all groups; the others (``lr``, momenta, ``eps``, ``h``) are honoured per group. When the groups' lrs
differ, the tangential part :math:`\mathrm{diag}(\alpha) t` is projected again on the null space of J,
so it still leaves the linearized constraints unchanged; the normal part is scaled per block as well
(``rho`` numeric) or not at all (``rho="full"``), so :math:`J \Delta x = -\alpha\rho c` holds exactly
only when all groups share one lr or with ``rho="full"``.

Step diagnostics (rank, norms, violation, ...) are computed only when asked,
``step(..., diagnostics=True)``, into the plain attribute ``optimizer.diagnostics`` (0-dim tensors: no
host sync to produce them); ``optimizer.state`` holds only what resuming needs.
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
MaxNormalStep = Union[float, None]
Precision = Literal["native", "float64"]
ParamsT = Union[Iterable[Tensor], Iterable[dict[str, Any]]]

DEFAULT_LR = 1e-3
DEFAULT_RHO: Rho = "full"
DEFAULT_MAX_NORMAL_STEP: MaxNormalStep = None
"""The default of ``max_normal_step`` (see :class:`ConstrainedOptimizer`)."""

STATE_KEY = "flat"
_TINY = 1e-30
PRECISIONS = ("native", "float64")


def check_rho(rho: Rho) -> None:
    if rho == "full":
        return
    if isinstance(rho, (str, bool)) or not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"Invalid rho={rho!r}: a number > 0, or 'full' for rho_k = 1 / lr_k.")


def check_max_normal_step(value: MaxNormalStep) -> None:
    if value is None:
        return
    if isinstance(value, (str, bool)) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"Invalid max_normal_step={value!r}: a number > 0 (a fixed cap relative to ||x||) or None (no cap)."
        )


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(
            f"Invalid precision={precision!r}: 'native' (the parameters' dtype, float64 only for the m x m "
            "algebra) or 'float64' (everything in float64, the reference path)."
        )


class ConstrainedOptimizer(Optimizer, ABC):
    """Shared machinery: hyperparameters, input checks, the flat layout, rho / "full", diagnostics, state."""

    requires = frozenset({"constraints", "jacobian"})
    shared_keys: tuple[str, ...] = ("rho", "rcond", "max_normal_step", "precision")
    """Hyperparameters of the one projection: equal in all param groups."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        defaults = {
            "lr": DEFAULT_LR,
            "rho": DEFAULT_RHO,
            "rcond": DEFAULT_RCOND,
            "max_normal_step": DEFAULT_MAX_NORMAL_STEP,
            "precision": "native",
            **defaults,
        }
        self._check_group(defaults)
        super().__init__(params, defaults)
        self.diagnostics: dict[str, Tensor] = {}
        self._check_groups()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("diagnostics", {})

    # ------------------------------------------------------------------ hyperparameters
    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate one group's hyperparameters (subclasses extend it with their own)."""
        check_lr(group["lr"])
        check_rho(group["rho"])
        check_positive("rcond", group["rcond"])
        check_max_normal_step(group["max_normal_step"])
        check_precision(group["precision"])

    def _check_groups(self) -> None:
        first = self.param_groups[0]
        for i, group in enumerate(self.param_groups):
            self._check_group(group)
            for key in self.shared_keys:
                if group[key] != first[key]:
                    raise ValueError(
                        f"{type(self).__name__}: param group {i} has {key}={group[key]!r} but group 0 has "
                        f"{first[key]!r}. It defines the one projection shared by all groups (the constraints "
                        "couple them): set it once, in the optimizer's arguments, not per group."
                    )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "diagnostics"):  # after __init__: validate the new group at once
            self._check_groups()

    @property
    def rho(self) -> Rho:
        """The normal-step scale shared by all groups (``param_groups[i]["rho"]``)."""
        return self.param_groups[0]["rho"]

    # ------------------------------------------------------------------ subclass hook
    @abstractmethod
    def _directions(
        self, g: Tensor, c: Tensor, jacobian: Tensor, state: dict[str, Any], diagnostics: dict[str, Tensor] | None
    ) -> tuple[Tensor, Tensor, NullSpace]:
        """Return (v_hat, t, nullspace of J): J v_hat = -c (min norm), J t = 0."""

    def _init_state(self, n: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
        return {"step": 0}

    def _factorize(self, jacobian: Tensor) -> NullSpace:
        """NullSpace of J, converting into a reused float64 buffer (not part of the state)."""
        workspace = getattr(self, "_jacobian_workspace", None)
        if jacobian.dtype != torch.float64 and (workspace is None or workspace.shape != jacobian.shape):
            workspace = torch.empty(jacobian.shape, dtype=torch.float64, device=jacobian.device)
            self._jacobian_workspace = workspace
        return NullSpace.from_jacobian(jacobian, self.param_groups[0]["rcond"], workspace=workspace)

    def _group_blocks(self) -> list[tuple[dict[str, Any], slice]]:
        """Each param group with its slice of the flat vector."""
        blocks, offset = [], 0
        for group in self.param_groups:
            size = sum(block_sizes(group["params"]))
            blocks.append((group, slice(offset, offset + size)))
            offset += size
        return blocks

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(
        self,
        closure: Callable[[], Any] | None = None,
        *,
        constraints: Tensor | None = None,
        jacobian: Tensor | None = None,
        diagnostics: bool = False,
    ) -> Any:
        """One step; g is read from ``p.grad``, c and J are given (J in the flat layout).

        Args:
            closure: optional, re-evaluates the model and returns the loss (called under grad mode).
            constraints: c, shape (m,); ``None`` for m = 0.
            jacobian: J, shape (m, n), columns in ``param_groups`` order (complex parameters as
                ``view_as_real``).
            diagnostics: fill ``self.diagnostics`` with this step's diagnostics (0-dim tensors); when
                False it is left empty (a stale value is never read as current).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_groups()
        self.diagnostics = {}
        params = group_params(self.param_groups)
        n = sum(block_sizes(params))
        device = params[0].device if params else torch.device("cpu")
        g = gather([p.grad for p in params], params, torch.float64)
        check_finite("The objective gradient g", g)
        c, J = self._checked_constraints(constraints, jacobian, n, device)

        state = self.state[STATE_KEY]
        if not state:
            state.update(self._init_state(n, device, torch.float64))
        elif state.get("n", n) != n:
            raise ValueError(
                f"The number of parameters changed from {state['n']} to {n} since the first step; "
                "create a new optimizer after adding parameter groups."
            )
        state["n"] = n
        state["step"] += 1
        record: dict[str, Tensor] | None = {} if diagnostics else None
        v_hat, t, nullspace = self._directions(g, c, J, state, record)

        first = self.param_groups[0]
        rho, max_normal_step = first["rho"], first["max_normal_step"]
        lr_blocks = [float(group["lr"]) for group in self.param_groups for _ in group["params"]]
        uniform = len(set(lr_blocks)) <= 1
        lr = lr_blocks[0] if lr_blocks else 0.0
        if uniform:
            tangential = lr * t
            normal_scale: float | Tensor = 1.0 if rho == "full" else lr * float(rho)
        else:
            lr_vec = torch.cat(
                [torch.full((size,), rate, dtype=torch.float64, device=device)
                 for size, rate in zip(block_sizes(params), lr_blocks)]
            )
            tangential = nullspace.project(lr_vec * t)
            normal_scale = 1.0 if rho == "full" else lr_vec * float(rho)
        normal = normal_scale * v_hat
        # the linearized reduction the step intends: J delta = -scale * c (None: mixed lrs, numeric rho)
        scale: float | None = normal_scale if isinstance(normal_scale, float) else None
        capped = None
        if isinstance(max_normal_step, float) and c.numel():
            x_norm = float(gather([p.detach() for p in params], params, torch.float64).norm())
            normal_norm = float(normal.norm())
            limit = max_normal_step * x_norm
            capped = normal_norm > limit
            if capped:
                normal = normal * (limit / normal_norm)
                scale = None if scale is None else scale * limit / normal_norm
        delta = normal + tangential
        check_finite("The step", delta)
        add_flat_(params, delta)

        if "initial_violation" not in state:
            state["initial_violation"] = c.abs().max() if c.numel() else c.new_zeros(())
        if record is not None:
            if capped is not None:
                record["normal_step_capped"] = torch.tensor(float(capped), dtype=torch.float64)
            self._record(state, record, c, delta, normal, tangential, nullspace, lr, scale)
            self.diagnostics = record
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
        diagnostics: dict[str, Tensor],
        c: Tensor,
        delta: Tensor,
        normal: Tensor,
        tangential: Tensor,
        nullspace: NullSpace,
        lr: float,
        scale: float | None,
    ) -> None:
        as_tensor = lambda value: torch.as_tensor(value, dtype=torch.float64, device=c.device)  # noqa: E731
        violation = c.abs().max() if c.numel() else c.new_zeros(())
        rho = self.param_groups[0]["rho"]
        rho_eff = (1.0 / lr if lr > 0 else math.inf) if rho == "full" else float(rho)
        diagnostics.update(
            rank=as_tensor(nullspace.rank),
            smallest_singular_value=as_tensor(nullspace.smallest_singular_value),
            rho=as_tensor(rho_eff),
            step_norm=delta.norm(),
            normal_step_norm=normal.norm(),
            tangential_step_norm=tangential.norm(),
            violation_max=violation,
            violation_ratio=violation / state["initial_violation"].clamp_min(_TINY),
        )
        if lr > 0:
            diagnostics["direction_norm"] = delta.norm() / lr
        if c.numel() and scale is not None and scale > 0:
            # ||J d + rho c|| / (rho ||c||) with d = delta / lr: the relative error of the intended
            # linearized reduction J delta = -lr rho c (~1e-10 or less when healthy).
            J64 = nullspace.jacobian
            diagnostics["linearized_feasibility_error"] = (J64 @ delta + scale * c).norm() / (
                scale * c.norm()
            ).clamp_min(_TINY)
