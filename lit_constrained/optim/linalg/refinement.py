r"""Iterative refinement of the merged step, and its plan (decided from cond(G) once per step).

Iterative refinement (residual :math:`-s\,U_r U_r^T c - J \delta`, correction :math:`J^T G^+ r`, two
passes over J) removes the errors of the first pass: that of the normal equations (each step multiplies
it by about :math:`q = \kappa(G)\,\epsilon_G`, :math:`\epsilon_G` the Gram's relative error) and, for
float32 J, the cancellation in :math:`J^T z`. :class:`RefinementPlan` holds the number of steps, or the
exact float64 Gram when the blocked one is too inaccurate for the conditioning of J; the residuals come
from :func:`~.products.blocked_matvec` or, where it cannot reach ``TARGET_ERROR``
(:func:`exact_residual_needed`), from :func:`~.products.exact_matvec`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .gram import gram_error
from .gram_factor import EIGH_MAX_SIZE, GramFactor
from .products import RESIDUAL_BLOCK, Scaling, add_rmatvec_, blocked_matvec, exact_matvec

REFINE_ABOVE_CONDITION = 1e3
"""float64 data: iterative refinement is applied when the condition number of the kept part of J J^T
exceeds this (the unrefined error is then ~1e-13 or less)."""

TARGET_ERROR = 1e-6
"""Refine until the estimated relative error of J delta = -s c is below this (float32 data; about the
rounding error of a float32 step itself at cond(J) = 1e3)."""

MAX_REFINEMENTS = 2
"""Beyond this many refinement steps with the blocked Gram, the exact (float64-product) Gram is used (m <=
``EIGH_MAX_SIZE``; see :func:`max_refinements`)."""

LARGE_MAX_REFINEMENTS = 8
""":func:`max_refinements` for m > ``EIGH_MAX_SIZE``: there the exact Gram's m^2 n float64 products cost far
more than a refinement step's two or three passes over J, so more steps with the blocked Gram come first
(the measured costs: docs/optim_measurements.md, large m)."""

assert MAX_REFINEMENTS <= LARGE_MAX_REFINEMENTS


def max_refinements(m: int) -> int:
    """The most refinement steps with the blocked Gram before the exact Gram is formed instead."""
    return MAX_REFINEMENTS if m <= EIGH_MAX_SIZE else LARGE_MAX_REFINEMENTS


SCALED_RESIDUAL_BLOCK = 64
r"""The block of the scaled residuals :math:`J (d \odot v)` (Adam(con)): the scaling spreads the products'
magnitudes (H^{-1/2} spans ~1e3 for a random gradient), which the estimate of :func:`residual_error`
does not see. At n = 1e5, m = 10, cond(J) = 1e2 (J from an SVD, 18 instances) Adam(con)'s
||J d + c|| / ||c|| was at most 9.2e-7 with 256-column blocks, 6.3e-7 with 128 and 4.5e-7 with 64.
Its cost against a 256-column residual: docs/optim_measurements.md (blocked residual)."""


def residual_error(factor: "GramFactor", n: int, dtype: torch.dtype) -> Tensor:
    r"""An estimate of the relative error of a residual from :func:`blocked_matvec`,
    :math:`\epsilon\sqrt{B/n}\,\kappa(J)` with :math:`\kappa(J) = \sqrt{\kappa(G)}` (the normal step's
    norm is at most :math:`\kappa(J)\|s c\|/\sigma_{\max}`); 0-dim float64. Measured 5-15x below this
    at n = 1e5-1e6, cond(J) = 180-1e3."""
    eps = torch.finfo(dtype).eps if dtype != torch.float64 else 0.0
    return eps * math.sqrt(min(RESIDUAL_BLOCK, max(n, 1)) / max(n, 1)) * factor.condition.sqrt()


def exact_residual_needed(factor: "GramFactor", n: int, dtype: torch.dtype) -> Tensor:
    """Whether the refinement residuals must come from :func:`exact_matvec` (0-dim bool): when the
    blocked residual's estimated error (:func:`residual_error`) exceeds ``TARGET_ERROR``."""
    return residual_error(factor, n, dtype) > TARGET_ERROR


@dataclass(frozen=True)
class RefinementPlan:
    """How a step's projections are refined (decided from cond(G) once per step).

    Attributes:
        steps: refinement steps of :func:`refine_`.
        exact_residual: their residuals from float64 products (:func:`exact_matvec`) rather than the
            blocked float32 ones (:func:`exact_residual_needed`).
        exact_gram: the blocked Gram is too inaccurate for the conditioning of J: form the Gram from
            float64 products (:func:`exact_gram`) and refine :func:`exact_refinements` times instead.
    """

    steps: int
    exact_residual: bool
    exact_gram: bool = False

    @classmethod
    def decode(cls, counts: tuple[float, float], m: int) -> "RefinementPlan":
        """The plan from :func:`refinement_counts` read on the host."""
        steps, residual = int(counts[0]), bool(counts[1])
        if steps > max_refinements(m):
            return cls(0, True, exact_gram=True)
        return cls(steps, residual)


def refinement_counts(factor: GramFactor, n: int, dtype: torch.dtype) -> Tensor:
    r"""The refinement decision as a float64 tensor (2,), read with one host sync by the caller
    (:meth:`RefinementPlan.decode`): [k, exact residual], k the fewest refinement steps with the Gram of
    :func:`gram` that reach ``TARGET_ERROR`` (``max_refinements(m) + 1`` when none does: the exact Gram).

    float64 data: one step when cond(G) > ``REFINE_ABOVE_CONDITION``, else none, never an exact residual.
    float32 data: each step multiplies the error by :math:`r = \max(\kappa(G)\epsilon_G,
    \epsilon\sqrt{\kappa(G)})` (the Gram's error; the cancellation in :math:`J^T z`), so k steps reach
    ``TARGET_ERROR`` iff :math:`r^{k+1} \le` ``TARGET_ERROR``; the residual is exact where the blocked one's
    estimated error (:func:`residual_error`) exceeds ``TARGET_ERROR``. Both are comparisons of cond(G)
    with thresholds computed once per shape on the host (one comparison and one product on the device)."""
    thresholds, weights = _plan_tensors(n, dtype, factor.size, factor.condition.device)
    return (factor.condition > thresholds).to(torch.float64) @ weights


@functools.lru_cache(maxsize=64)
def _plan_thresholds(n: int, dtype: torch.dtype, m: int) -> tuple[float, ...]:
    """Thresholds on cond(G): k + 1 of the first ``max_refinements(m) + 1`` exceeded means k + 1 steps
    needed; the last one is the exact residual's."""
    most = max_refinements(m)
    if dtype == torch.float64:
        return (REFINE_ABOVE_CONDITION,) + (math.inf,) * (most + 1)
    gram_eps, eps = gram_error(n, dtype, m), torch.finfo(dtype).eps
    # rate(kappa) = max(kappa gram_eps, eps sqrt(kappa)) > t  <=>  kappa > min(t / gram_eps, (t / eps)^2)
    steps = [min(t / gram_eps, (t / eps) ** 2) for t in (TARGET_ERROR ** (1.0 / (k + 1)) for k in range(most + 1))]
    # residual_error(kappa) = eps sqrt(B / n) sqrt(kappa) > TARGET_ERROR
    residual = (TARGET_ERROR / (eps * math.sqrt(min(RESIDUAL_BLOCK, max(n, 1)) / max(n, 1)))) ** 2
    return tuple(steps) + (residual,)


@functools.lru_cache(maxsize=64)
def _plan_tensors(n: int, dtype: torch.dtype, m: int, device: torch.device) -> tuple[Tensor, Tensor]:
    thresholds = _plan_thresholds(n, dtype, m)
    weights = torch.zeros(len(thresholds), 2, dtype=torch.float64)
    weights[:-1, 0] = 1.0  # k = the number of step thresholds exceeded
    weights[-1, 1] = 1.0  # the exact residual's flag
    return torch.tensor(thresholds, dtype=torch.float64, device=device), weights.to(device)


def exact_refinements(factor: GramFactor, dtype: torch.dtype) -> int:
    r"""Refinement steps with the exact Gram (a host-side decision, on that rare path only): the fewest
    k with :math:`r^{k+1} \le` ``TARGET_ERROR`` for :math:`r = \max(\kappa\epsilon_{64}, \epsilon\sqrt\kappa)`,
    at least one (the cancellation in :math:`J^T z`), at most 4."""
    kappa = float(factor.condition)
    rate = max(kappa * torch.finfo(torch.float64).eps, torch.finfo(dtype).eps * math.sqrt(kappa))
    if rate >= 1.0:
        return 4
    steps = math.ceil(math.log(TARGET_ERROR) / math.log(rate)) - 1 if rate > 0 else 0
    return min(max(steps, 1), 4)


def refine_(
    J: Tensor,
    factor: GramFactor,
    out: Tensor,
    sc: Tensor,
    refinements: int,
    workspace: tuple[Tensor, Tensor] | None = None,
    scaling: Scaling | None = None,
    exact: bool = True,
    scratch: Tensor | None = None,
) -> Tensor:
    r"""``refinements`` steps of iterative refinement of :math:`J\,out = -U_r U_r^T (sc)` (of
    :math:`J D\,out` with ``scaling``) in place: residual from :func:`exact_matvec` (``exact``) or
    :func:`blocked_matvec` (``SCALED_RESIDUAL_BLOCK`` columns with ``scaling``), correction
    :math:`J^T G^+ r` (see :func:`merged_step`).

    With exact residuals (an ill-conditioned J) the correction is formed apart (in ``scratch``, an n-vector
    in J's dtype, allocated when None; with ``scaling`` in its scratch), from split multipliers
    (:func:`_rmatvec_into`), and then added to ``out`` in one rounding. Accumulated into ``out`` inside the
    product (``out.addmv_(J.T, z)``: m row updates, each rounded at the magnitude of ``out``, far above the
    correction's) the refinement stalled at 1e-6-1e-5 relative error at n = 1e5, m = 10, cond(J) = 1e3
    (float32), against the ~3e-8 of rounding the exact step to float32 that it reaches this way. With
    blocked residuals (a well-conditioned J) the product accumulates into ``out`` (measured no less
    accurate there, and two n-vector passes cheaper)."""
    if refinements:
        target = -factor.range_part(sc)
        if exact:
            product = functools.partial(exact_matvec, workspace=workspace)
        else:
            block = RESIDUAL_BLOCK if scaling is None else SCALED_RESIDUAL_BLOCK
            product = functools.partial(blocked_matvec, block=block)
        if exact and scaling is None and scratch is None:
            scratch = torch.empty_like(out)
        for _ in range(refinements):
            if scaling is None:
                Jx = product(J, out)
            else:
                d, scaled = scaling
                Jx = product(J, torch.mul(d, out, out=scaled))
            z = factor.solve(target - Jx)
            add_rmatvec_(out, J, z, scaling=scaling, split=exact, scratch=scratch)
    return out
