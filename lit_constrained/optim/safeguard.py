r"""The normal-step safeguard (``max_normal_step``), written once for every constrained optimizer.

A number caps :math:`\|\Delta x_{normal}\| \le \text{max\_normal\_step}\,\|x\|` (any rho); ``None``
disables the cap; ``"adaptive"`` (the default) is a trust radius on the full normal step (active with
``rho="full"`` only: a numeric rho is the papers' method, whose normal step the small
:math:`\alpha\rho` already damps). The radius :math:`\Delta_k` bounds
:math:`\|\Delta x_{normal}\| \le \Delta_k \max(\|x_1\|, 1)` (:math:`x_1` the parameters at the first step:
a fixed scale; :math:`\Delta_k \le 1`) and is adapted from the ratio of the actual to the linearized
decrease of the violation on the capped steps,

.. math::
    r_k = \frac{\|c_k\| - \|c_{k+1}\|}{\|c_k\| - \|c_k + J_k \Delta x_k\|}, \qquad
    \Delta_{k+1} = \begin{cases} \max(\Delta_k / 2, \Delta_{\min}) & r_k < 1/4 \\ 2 \Delta_k & r_k > 3/4 \\
    \Delta_k & \text{else} \end{cases}

(:data:`ADAPTIVE_NORMAL_STEP`), applied only where the normal step was large enough to be capped:
uncapped steps leave the radius alone, so no step is slowed where the linearization is good. Everything
is a tensor operation (:math:`\|J^+ c\|^2 = c^T G^+ c` costs no pass over J): no host sync. Why the scale
is fixed rather than the current ||x_k||: docs/optim_measurements.md, "At scale", the Poisson sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .linalg.gram_factor import GramFactor
from .hyperparameters import MaxNormalStep, Rho

TINY = 1e-30


@dataclass(frozen=True)
class AdaptiveNormalStep:
    """Constants of the adaptive normal-step radius (relative to max(||x_1||, 1), x_1 the first step's
    parameters)."""

    initial: float = 0.02
    smallest: float = 1e-3
    largest: float = 1.0
    shrink_below: float = 0.25
    grow_above: float = 0.75
    shrink: float = 0.5
    grow: float = 2.0


ADAPTIVE_NORMAL_STEP = AdaptiveNormalStep()


def is_adaptive(cap: MaxNormalStep, rho: Rho) -> bool:
    """Whether the adaptive radius is active (``"adaptive"`` with ``rho="full"``)."""
    return cap == "adaptive" and rho == "full"


def normal_step_scale(
    cap: MaxNormalStep,
    rho: Rho,
    s: float,
    normal_norm: Tensor,
    c: Tensor,
    factor: GramFactor,
    x_norm: Callable[[], Tensor],
    state: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """The normal-step scale s * tau (0-dim float64: tau < 1 where the safeguard caps the step) and the
    resulting normal-step norm, for a normal step of norm ``s * normal_norm`` (``normal_norm`` =
    ||T J~^+ c||); updates the adaptive radius in ``state``. ``x_norm`` returns ||x|| (0-dim float64),
    called only where a cap needs it. The range of J~ = J H^{-1/2} is that of J: ``factor`` (of J~)
    gives the linearized violation."""
    s_t = torch.full((), s, dtype=torch.float64, device=c.device)
    norm = s * normal_norm
    adaptive = is_adaptive(cap, rho)
    if cap is None or (cap == "adaptive" and not adaptive):
        return s_t, norm
    size = None if adaptive and "reference_norm" in state else x_norm()  # (the radius needs ||x|| once)
    if adaptive:
        rule = ADAPTIVE_NORMAL_STEP
        c_norm = c.norm()
        radius = state.get("normal_radius")
        if radius is None:
            radius = torch.full((), rule.initial, dtype=torch.float64, device=c.device)
        if "previous_violation" in state:
            previous, was_capped = state["previous_violation"], state["normal_step_capped"]
            ratio = (previous - c_norm) / (previous - state["predicted_violation"]).clamp_min(TINY)
            change = torch.where(was_capped & (ratio < rule.shrink_below), rule.shrink,
                                 torch.where(was_capped & (ratio > rule.grow_above), rule.grow, 1.0))
            radius = (radius * change).clamp(rule.smallest, rule.largest)
        if "reference_norm" not in state:
            state["reference_norm"] = size.clamp_min(1.0)
        limit = radius * state["reference_norm"]
    else:
        limit = cap * size
    capped = norm > limit
    tau = (limit / norm.clamp_min(TINY)).clamp_max(1.0)
    if adaptive:
        state["normal_radius"] = radius
        state["previous_violation"] = c_norm
        state["predicted_violation"] = (c - (s * tau) * factor.range_part(c)).norm()
    state["normal_step_capped"] = capped
    return s_t * tau, norm * tau
