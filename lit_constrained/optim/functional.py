r"""The projected SQP step as functions over flat tensors: :func:`sqp_heavy_ball`, :func:`sqp_adam` and
:func:`adam_con` (the optimizer classes of :mod:`~lit_constrained.optim.sqp` and
:mod:`~lit_constrained.optim.adam_con` only gather g, c and J into the flat layout, call one of these,
add the step to the parameters and keep the state), as ``torch.optim.adam.adam`` is ``torch.optim.Adam``'s
core.

Each takes the parameters ``x`` (their real views, read only for the safeguard's ||x||), the flat
gradient, c (float64, (m,)), J ((m, n), the working dtype), the state dict and the param groups with
their blocks (``groups``: the hyperparameters stay in ``param_groups``; those of the one projection,
``rho``, ``rcond``, ``max_normal_step``, are group 0's), and returns a :class:`ProjectedStep`: the step
:math:`\Delta x` (not applied), the new state, the diagnostics (with ``diagnostics=True``) and what the
post-step corrections need. The state's moments are updated in place, as in ``torch.optim.adam.adam``
(after the host read: a NaN/inf raises ``ValueError`` before they change); the new state is a new dict
holding them and the step's scalars. ``workspace`` (:class:`~lit_constrained.optim.workspace.Workspace`)
holds scratch only: a fresh one gives the same step.

The step (:func:`compose_merged`) for a tangential direction w in the variables of a projection Jacobian
:math:`\tilde J` (J itself for the SQP methods; :math:`J H^{-1/2}` for Adam(con), never formed) with the
map T back to x (identity, or :math:`H^{-1/2}`) is

.. math::
    \Delta x = T\big(a \tilde P w - s\, \tilde J^+ c\big) = T\big(a w - \tilde J^T z\big), \qquad
    z = \tilde G^+ (s c + a \tilde J w),

:math:`\tilde G = \tilde J \tilde J^T`, :math:`\tilde P` the projector on its null space, a the
tangential scale (lr times the method's scalar), s the safeguarded normal-step scale (:math:`s = 1` for
``rho="full"``, :math:`\alpha\rho` for a numeric rho; :mod:`~lit_constrained.optim.safeguard`). J is read
for the Gram matrix, for :math:`\tilde J w` and for :math:`\tilde J^T z` (plus two reads per refinement
step; :mod:`~lit_constrained.optim.linalg`). Groups with different lrs project
:math:`\mathrm{diag}(\alpha) T \tilde P w` again on the null space of J
(:func:`~lit_constrained.optim.projection.mixed_lr_step`). With inequality rows (SQP-HeavyBall,
SQP-Adam) the step is the projection of the candidate on the linearized feasible set
(:mod:`~lit_constrained.optim.active_set`), warm-started from ``warm`` (the state's ``active_set``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .active_set import Inequalities
from .kernel import (
    Block,
    Composed,
    Rows,
    StackedCache,
    host_read,
    record_inequalities,
    stacked,
    to_x,
    violation,
    with_inequalities,
)
from .linalg.gram_factor import GramFactor
from .linalg.merged_step import merged_step
from .projection import NormalDirection, Projection, Projector, mixed_lr_step
from .safeguard import normal_step_scale
from .step_diagnostics import record_step
from .workspace import Workspace

__all__ = ["ProjectedStep", "adam_con", "compose_merged", "sqp_adam", "sqp_heavy_ball"]


@dataclass(frozen=True)
class ProjectedStep:
    """What a step function returns.

    Attributes:
        delta: the step :math:`\\Delta x` (flat, working dtype; a workspace buffer), not yet applied.
        state: the new state (the moments updated in place, ``step`` = k, the safeguard's scalars,
            ``initial_violation``, ``active_set``: the next step's working set).
        diagnostics: the step's diagnostics (0-dim tensors) with ``diagnostics=True``, else None.
        projection, projector: the step's factorization (for the corrections and diagnostics).
        imposed: the projector of the rows the step imposed (J, or [J; G_A]): the corrections' rows.
        active: the active inequality rows (None without inequality rows).
        multipliers: the inequality rows' multipliers ((p,), float64), or None.
        rank, condition: the numerical rank of J (of the projection Jacobian) and cond of its kept Gram.
    """

    delta: Tensor
    state: dict[str, Any]
    diagnostics: dict[str, Tensor] | None
    projection: Projection
    projector: Projector
    imposed: Projector
    active: list[int] | None = None
    multipliers: Tensor | None = None
    rank: int = 0
    condition: float = 1.0


def _inequality_rows(grad: Tensor, c: Tensor, J: Tensor, inequalities: Tensor | None,
                     inequality_jacobian: Tensor | None, warm: Sequence[int]) -> Rows:
    """The step's rows; g's finiteness joins the host read (a NaN/inf in G shows in the active-set
    check's G delta)."""
    if inequalities is None or not inequalities.numel():
        return Rows(grad, c, J)
    return Rows(grad, c, J, Inequalities(inequalities, inequality_jacobian), tuple(warm),
                torch.isfinite(inequalities).all())


def _advanced(state: dict[str, Any], n: int) -> dict[str, Any]:
    """The state of step k (``step`` = k, ``n``): a new dict sharing the moments."""
    return {**state, "n": n, "step": state["step"] + 1}


def _norm(tensors: Sequence[Tensor]) -> Tensor:
    """||x|| over the tensors (0-dim float64; the step runs under no_grad)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(tensors))).to(torch.float64))


def _finish(x: Sequence[Tensor], rows: Rows, state: dict[str, Any], read_projection: Projection,
            projector: Projector, composed: Composed, record: dict[str, Tensor] | None,
            groups: Sequence[Block], rank: int, condition: float, diagnostic_factor: GramFactor | None
            ) -> ProjectedStep:
    """The state's first violation, the active set, the diagnostics; the step's outcome."""
    if "initial_violation" not in state:
        state["initial_violation"] = violation(rows)
    active = multipliers = None
    if rows.inequalities is not None:
        outcome = composed.active_step
        active, multipliers = outcome.active, outcome.multipliers
        state["active_set"] = torch.tensor(outcome.working, dtype=torch.long)
    else:
        state.pop("active_set", None)
    if record is not None:
        first = groups[0][0]
        lr = float(first["lr"])
        record_step(record, state=state, factor=diagnostic_factor or read_projection.factor, projector=projector,
                    to_x=lambda step: to_x(read_projection, step), c=rows.c, delta=composed.delta,
                    scale=composed.scale, normal_norm=composed.normal_norm, lr=lr, rho=first["rho"])
        if rows.inequalities is not None:
            record_inequalities(record, rows, state, torch.tensor(active, dtype=torch.long), multipliers)
    return ProjectedStep(composed.delta, state, record, read_projection, projector,
                         composed.imposed or projector, active, multipliers, rank, condition)


# ---------------------------------------------------------------------------------------- composition


def _normal_direction(projection: Projection, c: Tensor, step_scale: float | None, workspace: Workspace
                      ) -> NormalDirection:
    r"""||T(J~^+ c)||: free for T = identity (:math:`c^T \tilde G^+ c`). For the scaled Jacobian of
    Adam(con) it takes a pass over J: the direction :math:`-\tilde J^+ c` is kept for the step itself, and
    when the groups share one lr (``step_scale`` = a) the same pass forms the tangential part
    :math:`-\tilde J^T \tilde G^+ (a \tilde J w)`: one product :math:`H^{-1/2} (Y^T J)^T` with two columns
    in Y costs one read of J, like one of them."""
    if projection.scaling is None:
        return NormalDirection(projection.factor.pinv_norm_sq(c).sqrt())
    J, factor = projection.jacobian, projection.factor
    n, dtype = J.shape[1], J.dtype
    d, scratch = workspace.scaling(projection.scaling)
    tangent = None
    if step_scale is None:
        direction = workspace.buffer("normal_direction", (n,), dtype, J.device)
        merged_step(J, factor, None, 0.0, c, 0, direction, scaling=(d, scratch))
    else:
        rhs = torch.stack([c, step_scale * projection.direction_product], dim=1)
        coefficients = factor.solve(rhs).T.neg().to(dtype)
        directions = workspace.buffer("directions", (2, n), dtype, J.device)
        torch.mm(coefficients, J, out=directions).mul_(d)  # -J~^T G~^+ [c, a J~ w] = -d (J^T ...)
        direction, tangent = directions[0], directions[1]
    norm = torch.mul(direction, d, out=scratch).norm().to(torch.float64)
    return NormalDirection(norm, direction, tangent)


def _mixed_lr_parts(projection: Projection, projector: Projector, w: Tensor, tangent_scale: float, c: Tensor,
                    delta: Tensor, groups: Sequence[Block]) -> Tensor:
    """Groups with different lrs: delta = P(diag(lr) T(a P~ w)) (a = tangent_scale); returns the
    normal direction T(-J~^+ c) for the caller to scale (per block or by s)."""
    tangent = to_x(projection, projector.project(w, torch.empty_like(w), tangent_scale))
    block_lrs = [(float(group["lr"]), block) for group, block in groups]
    mixed_lr_step(projector, tangent, block_lrs, groups[0][0]["rcond"], delta)
    return to_x(projection, projector.normal(c, torch.empty_like(w)))


def compose_merged(projection: Projection, projector: Projector, rows: Rows, state: dict[str, Any], w: Tensor,
                   tangent_scale: float, *, x: Sequence[Tensor], groups: Sequence[Block], workspace: Workspace,
                   tangent_projection: Projection | None, cache: StackedCache, owner: str) -> Composed:
    """Delta x = T(a P~ w - s J~^+ c) (the module docstring) with the safeguarded s (which updates the
    safeguard's scalars in ``state``); groups with different lrs scale their blocks of the tangential part;
    inequality rows (one lr in all groups) take the active-set step."""
    c, m = rows.c, rows.m
    first = groups[0][0]
    rho = first["rho"]
    lrs = [float(group["lr"]) for group, _ in groups]
    lr = lrs[0]
    uniform = all(rate == lr for rate in lrs)
    a = lr * tangent_scale
    delta = workspace.vector("delta", rows.g)
    x_norm = lambda: _norm(x)  # noqa: E731
    if rows.inequalities is not None:
        if m:
            s = 1.0 if rho == "full" else lr * float(rho)
            direction = _normal_direction(projection, c, a, workspace)
            scale, normal_norm = normal_step_scale(first["max_normal_step"], rho, s, direction.norm, c,
                                                   projection.factor, x_norm, state)
            fraction = scale / s if s > 0 else torch.ones((), dtype=torch.float64, device=c.device)
        else:
            scale = fraction = torch.ones((), dtype=torch.float64, device=c.device)
            normal_norm = torch.zeros((), dtype=torch.float64, device=c.device)
        outcome = with_inequalities(projector, rows, w, a, scale * c, fraction, delta, workspace=workspace,
                                    rcond=float(first["rcond"]), cache=cache,
                                    tangent_projection=tangent_projection, owner=owner)
        to_x(projection, delta)
        return Composed(delta, scale, normal_norm, outcome.projector, outcome.active, outcome)
    if m == 0:  # no constraints: the unprojected direction, scaled by each group's lr
        if uniform:
            torch.mul(w, a, out=delta)
        else:
            for group, block in groups:
                torch.mul(w[block], float(group["lr"]) * tangent_scale, out=delta[block])
        return Composed(delta, None, torch.zeros((), dtype=torch.float64, device=delta.device))
    if not uniform and rho != "full":  # each block's normal part scaled by its own lr * rho
        normal = _mixed_lr_parts(projection, projector, w, tangent_scale, c, delta, groups)
        lr_rho = torch.cat([torch.full((block.stop - block.start,), float(group["lr"]) * float(rho),
                                       dtype=delta.dtype, device=delta.device) for group, block in groups])
        delta.addcmul_(lr_rho, normal)
        return Composed(delta, None, torch.full((), math.nan, dtype=torch.float64, device=delta.device))
    s = 1.0 if rho == "full" else lr * float(rho)
    direction = _normal_direction(projection, c, a if uniform else None, workspace)
    scale, normal_norm = normal_step_scale(first["max_normal_step"], rho, s, direction.norm, c, projection.factor,
                                           x_norm, state)
    sc = scale * c
    if not uniform:  # rho = "full": the normal part unscaled, the tangential part per block
        delta.add_(_mixed_lr_parts(projection, projector, w, tangent_scale, c, delta, groups) * scale.to(delta.dtype))
        return Composed(delta, scale, normal_norm)
    if direction.direction is None:
        projector.merged(w, a, sc, delta)
    else:  # -J~^+ c was formed for the safeguard's norm: reuse it, a P~ w + s (-J~^+ c), then refine
        if direction.tangent is None:
            projector.unrefined(w, a, delta)
        else:  # -J~^T G~^+ (a J~ w) came from the same pass: a P~ w = a w + tangent
            torch.add(direction.tangent, w, alpha=a, out=delta)
        delta.addcmul_(direction.direction, scale.to(delta.dtype))
        projector.refine(delta, sc)
    to_x(projection, delta)
    return Composed(delta, scale, normal_norm)


# ---------------------------------------------------------------------------------------- the SQP methods


def _shared_momentum(groups: Sequence[Block], key: str) -> tuple[float, float] | None:
    """(beta1, h) when every group has the same first momentum and h, else None."""
    pairs = {(float(group[key][0] if key == "betas" else group[key]), float(group["h"])) for group, _ in groups}
    return next(iter(pairs)) if len(pairs) == 1 else None


def _projected_gradient_setup(rows: Rows, workspace: Workspace, rcond: float) -> Projection:
    """Factor J J^T and form J g (float32 products are enough: P g is projected again in the step). A
    NaN/inf in g shows in J g, one in J in the Gram."""
    factor, finite, Jg = workspace.factorize(rows.jacobian, rcond, None, rows.g)
    return Projection(rows.jacobian, factor, finite & torch.isfinite(Jg).all(), rows.c, gradient_product=Jg)


def _projected_gradient(projection: Projection, g: Tensor, workspace: Workspace,
                        record: dict[str, Tensor] | None, scale: float = 1.0) -> Tensor:
    """scale * P g = scale (g - J^T G^+ J g) into a workspace (one pass over J; the scale is free)."""
    factor, Jg = projection.factor, projection.gradient_product
    u = workspace.vector("projected_gradient", g)
    if not Jg.numel():
        return u.copy_(g) if scale == 1.0 else torch.mul(g, scale, out=u)
    J = projection.jacobian
    y = factor.solve(Jg).to(J.dtype)
    torch.addmv(g, J.T, y, beta=scale, alpha=-scale, out=u)
    if record is not None:  # the KKT multiplier of beta = 0
        record["multiplier_norm"] = factor.solve(projection.constraints - Jg).norm()
    return u


def _projected_method(direction: Any, x: Sequence[Tensor], grad: Tensor, c: Tensor, J: Tensor,
                      state: dict[str, Any], groups: Sequence[Block], workspace: Workspace | None,
                      inequalities: Tensor | None, inequality_jacobian: Tensor | None, warm: Sequence[int],
                      diagnostics: bool, owner: str) -> ProjectedStep:
    """The projected step of SQP-HeavyBall / SQP-Adam: factor J J^T with J g, the host read, the
    tangential moments on the null space of the rows E + the working set, ``direction`` (updates the
    moments, returns (w, its scale)), the merged composition."""
    workspace = workspace if workspace is not None else Workspace()
    rcond = float(groups[0][0]["rcond"])
    rows = _inequality_rows(grad, c, J, inequalities, inequality_jacobian, warm)
    read = host_read(_projected_gradient_setup(rows, workspace, rcond), rows, workspace, rcond)
    cache: StackedCache = {}
    tangent_projection = stacked(rows, rows.warm, workspace, rcond, cache, with_gradient=True)[0] if rows.warm else None
    state = _advanced(state, grad.numel())
    record: dict[str, Tensor] | None = {} if diagnostics else None
    w, tangent_scale = direction(tangent_projection or read.projection, grad, state, groups, workspace, record)
    composed = compose_merged(read.projection, read.projector, rows, state, w, tangent_scale, x=x, groups=groups,
                              workspace=workspace, tangent_projection=tangent_projection, cache=cache, owner=owner)
    return _finish(x, rows, state, read.projection, read.projector, composed, record, groups, read.rank,
                   read.condition, None)


def _heavy_ball_direction(projection: Projection, g: Tensor, state: dict[str, Any], groups: Sequence[Block],
                          workspace: Workspace, record: dict[str, Tensor] | None) -> tuple[Tensor, float]:
    """r <- beta r - P g / h (in place); w = r (d = v + P r: projected in the merged step)."""
    r = state["momentum"]
    shared = _shared_momentum(groups, "momentum")
    if shared is not None:  # r = beta r - P g / h = lerp(r, kappa P g, 1 - beta): one pass over r
        beta, h = shared
        u = _projected_gradient(projection, g, workspace, record, scale=-1.0 / (h * (1.0 - beta)))
        r.lerp_(u, 1.0 - beta)
        return r, 1.0
    u = _projected_gradient(projection, g, workspace, record)  # P g
    for group, block in groups:
        r[block].mul_(float(group["momentum"])).add_(u[block], alpha=-1.0 / float(group["h"]))
    return r, 1.0


def _adam_direction(projection: Projection, g: Tensor, state: dict[str, Any], groups: Sequence[Block],
                    workspace: Workspace, record: dict[str, Tensor] | None) -> tuple[Tensor, float]:
    """r, s <- the moments of u = -P g / h (in place); w = r / sqrt(s + eps), its scale eta_k."""
    k = state["step"]
    r, s = state["momentum"], state["second_moment"]
    w = workspace.vector("direction", r)
    shared = _shared_momentum(groups, "betas")
    if shared is not None:
        # u_k = -P g / h = (1 - beta1) u' with u' = kappa P g: r = lerp(r, u', 1 - beta1) in one pass,
        # s = beta2 s + (1 - beta1)^2 u' * u'
        beta1, h = shared
        u = _projected_gradient(projection, g, workspace, record, scale=-1.0 / (h * (1.0 - beta1)))
    else:
        u = _projected_gradient(projection, g, workspace, record)  # P g (u_k = -P g / h)
    etas = []
    for group, block in groups:
        beta1, beta2 = (float(b) for b in group["betas"])
        # one group: the whole vectors (no slice views to create)
        rb, sb, ub, wb = (r, s, u, w) if len(groups) == 1 else (r[block], s[block], u[block], w[block])
        if shared is not None:
            rb.lerp_(ub, 1.0 - beta1)
            sb.mul_(beta2).addcmul_(ub, ub, value=(1.0 - beta1) ** 2)
        else:
            h = float(group["h"])
            rb.mul_(beta1).add_(ub, alpha=-1.0 / h)
            sb.mul_(beta2).addcmul_(ub, ub, value=1.0 / h**2)
        torch.add(sb, float(group["eps"]), out=wb).sqrt_()
        torch.div(rb, wb, out=wb)  # r / sqrt(s + eps)
        etas.append((1.0 - beta1) * math.sqrt(1.0 - beta2**k) / math.sqrt(1.0 - beta2))
    tangent_scale = 1.0
    if all(eta == etas[0] for eta in etas):
        tangent_scale = etas[0]  # folded into the merged step's scalar
    else:
        for eta, (_, block) in zip(etas, groups):
            w[block].mul_(eta)
    if record is not None:
        record["eta"] = torch.tensor(etas[0], dtype=torch.float64, device=r.device)
    return w, tangent_scale


def sqp_heavy_ball(x: Sequence[Tensor], grad: Tensor, c: Tensor, J: Tensor, state: dict[str, Any], *,
                   groups: Sequence[Block], workspace: Workspace | None = None, inequalities: Tensor | None = None,
                   inequality_jacobian: Tensor | None = None, warm: Sequence[int] = (), diagnostics: bool = False,
                   owner: str = "SQPHeavyBall") -> ProjectedStep:
    r"""One SQP-HeavyBall(con) step (:class:`~lit_constrained.optim.sqp.SQPHeavyBall`'s math):
    :math:`u = -P g / h`, :math:`r \leftarrow \beta r + u` (``state["momentum"]``, in place),
    :math:`\Delta x = \alpha(v + P r)`, :math:`v = -\rho J^+ c`. ``groups``: (param group, block) pairs
    with ``lr``, ``momentum``, ``h`` (per block) and ``rho``, ``rcond``, ``max_normal_step`` (group 0's);
    ``inequalities`` (g, float64, (p,)) with ``inequality_jacobian`` (G, (p, n)) and the working set
    ``warm``: the active-set step. See the module docstring."""
    return _projected_method(_heavy_ball_direction, x, grad, c, J, state, groups, workspace, inequalities,
                             inequality_jacobian, warm, diagnostics, owner)


def sqp_adam(x: Sequence[Tensor], grad: Tensor, c: Tensor, J: Tensor, state: dict[str, Any], *,
             groups: Sequence[Block], workspace: Workspace | None = None, inequalities: Tensor | None = None,
             inequality_jacobian: Tensor | None = None, warm: Sequence[int] = (), diagnostics: bool = False,
             owner: str = "SQPAdam") -> ProjectedStep:
    r"""One SQP-Adam(con) step (:class:`~lit_constrained.optim.sqp.SQPAdam`'s math): the moments of
    :math:`u = -P g / h` without :math:`(1-\beta)` factors (``state["momentum"]``,
    ``state["second_moment"]``, in place), :math:`\eta_k = (1-\beta_1)\sqrt{1-\beta_2^k}/\sqrt{1-\beta_2}`,
    :math:`\Delta x = \alpha(v + \eta_k P(r / \sqrt{s + \epsilon}))`. ``groups``: with ``lr``, ``betas``,
    ``eps``, ``h`` per block; otherwise as :func:`sqp_heavy_ball`."""
    return _projected_method(_adam_direction, x, grad, c, J, state, groups, workspace, inequalities,
                             inequality_jacobian, warm, diagnostics, owner)


def adam_con(x: Sequence[Tensor], grad: Tensor, c: Tensor, J: Tensor, state: dict[str, Any], *,
             groups: Sequence[Block], workspace: Workspace | None = None, diagnostics: bool = False,
             owner: str = "AdamCon") -> ProjectedStep:
    r"""One Adam(con) step (:class:`~lit_constrained.optim.adam_con.AdamCon`'s math): Adam's moments of the
    raw gradient (``state["exp_avg"]``, ``state["exp_avg_sq"]``: new tensors in the new state, the old
    ones kept as the workspace's spares), :math:`H = \mathrm{diag}(\sqrt{\hat v + \epsilon})`, and the
    KKT step :math:`\Delta x = \alpha d`, :math:`[[H, J^T], [J, 0]] [d; y] = -[\hat m; c]`, solved in the
    scaled variable :math:`z = H^{1/2} d` with :math:`\tilde J = J H^{-1/2}` (never formed).
    ``groups``: with ``lr``, ``betas``, ``eps`` per block."""
    workspace = workspace if workspace is not None else Workspace()
    first = groups[0][0]
    rcond = float(first["rcond"])
    rows = Rows(grad, c, J)
    # the new moments go to spare buffers (committed into the new state after the host read)
    k = state["step"] + 1
    m_old, v_old = state["exp_avg"], state["exp_avg_sq"]
    shape, dtype, device = tuple(m_old.shape), m_old.dtype, m_old.device
    m_new = workspace.buffer("exp_avg_next", shape, dtype, device)
    v_new = workspace.buffer("exp_avg_sq_next", shape, dtype, device)
    inv_sqrt_h = workspace.buffer("inverse_sqrt_scaling", shape, dtype, device)
    w = workspace.buffer("direction", shape, dtype, device)
    scales = []
    for group, block in groups:
        beta1, beta2 = (float(b) for b in group["betas"])
        torch.lerp(m_old[block], grad[block], 1.0 - beta1, out=m_new[block])
        torch.mul(v_old[block], beta2, out=v_new[block]).addcmul_(grad[block], grad[block], value=1.0 - beta2)
        # H^{-1/2} = (v_hat + eps)^{-1/4}
        torch.div(v_new[block], 1.0 - beta2**k, out=inv_sqrt_h[block]).add_(float(group["eps"]))
        inv_sqrt_h[block].sqrt_().rsqrt_()
        # w = -H^{-1/2} m_hat: the tangential direction in the scaled variable z = H^{1/2} d; the scalar
        # -1 / (1 - beta1^k) is folded into the merged step when the groups share it
        torch.mul(m_new[block], inv_sqrt_h[block], out=w[block])
        scales.append(-1.0 / (1.0 - beta1**k))
    tangent_scale = 1.0
    if all(scale == scales[0] for scale in scales):
        tangent_scale = scales[0]
    else:
        for scale, (_, block) in zip(scales, groups):
            w[block].mul_(scale)
    # the Gram of J~ = J H^{-1/2} (never formed; NaN/inf in g or J shows in it) and J~ w from its pass
    factor, finite, Jw = workspace.factorize(J, rcond, inv_sqrt_h, w)
    projection = Projection(J, factor, finite, c, scaling=inv_sqrt_h, tangent_scale=tangent_scale, direction=w,
                            direction_product=Jw)
    read = host_read(projection, rows, workspace, rcond)
    state = _advanced(state, grad.numel())
    for key in ("exp_avg", "exp_avg_sq"):  # commit the new moments (swap with the spare buffers)
        state[key] = workspace.swap(key + "_next", state[key])
    record: dict[str, Tensor] | None = {} if diagnostics else None
    if record is not None and J.shape[0]:  # y of the KKT system
        Jw_scaled = tangent_scale * read.projection.direction_product
        record["multiplier_norm"] = read.projection.factor.solve(c + Jw_scaled).norm()
    composed = compose_merged(read.projection, read.projector, rows, state, w, tangent_scale, x=x, groups=groups,
                              workspace=workspace, tangent_projection=None, cache={}, owner=owner)
    diagnostic_factor = workspace.factorize(J, rcond)[0] if record is not None else None  # the rank of J itself
    return _finish(x, rows, state, read.projection, read.projector, composed, record, groups, read.rank,
                   read.condition, diagnostic_factor)
