"""The diagnostics of a constrained step (``step(..., diagnostics=True)``): 0-dim tensors, no host sync
to produce them (a pass over J for the feasibility error)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .linalg.gram_factor import GramFactor
from .linalg.products import exact_matvec
from .projection import Projector
from .safeguard import TINY


def record_step(
    record: dict[str, Tensor],
    *,
    state: dict[str, Any],
    factor: GramFactor,
    projector: Projector,
    to_x: Callable[[Tensor], Tensor],
    c: Tensor,
    delta: Tensor,
    scale: Tensor | None,
    normal_norm: Tensor,
    lr: float,
    rho: Any,
) -> None:
    """Fill ``record``: rank, conditioning and smallest singular value of J (``factor``), the step's
    norms (total, normal, tangential, direction), violation, rho_k, refinements, the safeguard's state and
    the relative error of the intended linearized reduction J delta = -s c."""
    J = projector.jacobian
    device = c.device
    as_tensor = lambda value: torch.as_tensor(value, dtype=torch.float64, device=device)  # noqa: E731
    violation = c.abs().max() if c.numel() else c.new_zeros(())
    step_norm = delta.norm().to(torch.float64)
    record.update(
        rank=factor.rank,
        gram_condition=factor.condition.to(torch.float64),
        smallest_singular_value=factor.smallest_singular_value,
        rho=as_tensor((1.0 / lr if lr > 0 else math.inf) if rho == "full" else float(rho)),
        step_norm=step_norm,
        normal_step_norm=torch.as_tensor(normal_norm, dtype=torch.float64, device=device),
        violation_max=violation,
        violation_ratio=violation / state["initial_violation"].clamp_min(TINY),
        refinements=as_tensor(projector.plan.steps),
    )
    if c.numel() and scale is not None:
        normal = to_x(projector.normal(scale * c, torch.empty_like(delta)))
        record["tangential_step_norm"] = (delta - normal).norm().to(torch.float64)
    else:
        record["tangential_step_norm"] = step_norm
    if "normal_step_capped" in state:
        record["normal_step_capped"] = state["normal_step_capped"].to(torch.float64)
    if "normal_radius" in state:
        record["normal_radius"] = state["normal_radius"]
    if lr > 0:
        record["direction_norm"] = step_norm / lr
    if c.numel() and scale is not None:
        # ||J d + rho c|| / (rho ||c||) with d = delta / lr: the relative error of the intended
        # linearized reduction J delta = -lr rho c (~1e-10 or less in float64 when healthy).
        record["linearized_feasibility_error"] = (exact_matvec(J, delta) + scale * c).norm() / (
            scale * c.norm()
        ).clamp_min(TINY)
