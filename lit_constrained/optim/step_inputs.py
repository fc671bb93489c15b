"""What one constrained step works on (:class:`StepInputs`: g, c, J and the inequality rows in the flat
layout) and what its composition hands back (:class:`Composed`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .active_set import Inequalities
from .flat import FlatLayout
from .projection import Projection, Projector


@dataclass
class StepInputs:
    """One step's inputs in the flat layout: g, c (float64), J (working dtype), the state, the loss."""

    layout: FlatLayout
    reals: list[Tensor]
    dtype: torch.dtype
    g: Tensor
    c: Tensor
    jacobian: Tensor
    state: dict[str, Any]
    loss: Any = None
    finite: Tensor | None = None
    """0-dim bool: further inputs of an optimizer (SQP-MoMo's loss and <g, x>, the inequality rows) are
    finite; joins the step's one host read."""
    inequalities: Inequalities | None = None
    """The rows g <= 0 with their Jacobian (p > 0), or None."""
    warm: list[int] = field(default_factory=list)
    """The inequality rows active at the last step (``state["active_set"]``): this step's working set."""
    tangent_projection: Projection | None = None
    """With a working set: the projection of the rows E + warm, whose null space the tangential
    direction's moments are projected on (so that they vanish at a KKT point on the active face)."""
    stacked: dict[tuple[int, ...], tuple[Projection, Projector]] = field(default_factory=dict)
    """The factorizations of stacked rows [J; G_rows] made in this step."""

    @property
    def m(self) -> int:
        return self.c.numel()


@dataclass
class Composed:
    """A composed step: delta (in x), the normal-step scale s tau (None where it is per block) and the
    normal step's norm; with inequality rows also the projector of the rows E + A the step imposed (the
    corrections' rows) and the active rows."""

    delta: Tensor
    scale: Tensor | None
    normal_norm: Tensor
    imposed: Projector | None = None
    active: list[int] | None = None


def state_violation(state: dict[str, Any]) -> Tensor:
    """The first step's violation, the scale of the violation ratio (0-dim float64, at least TINY)."""
    return state["initial_violation"].clamp_min(1e-30)
