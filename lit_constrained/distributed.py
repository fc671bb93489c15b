r"""Sharing the constraint Jacobian across data-parallel ranks: balanced row slices and one all-gather.

Two layouts of the constraints over W ranks (a module's ``constraints_shared`` says which):

* **shared** (the default: the same m constraint points on every rank). Rank r evaluates c in full
  (one forward) but differentiates only its balanced slice of the rows, :func:`row_slice`: rows
  :math:`[s_r, s_{r+1})` with :math:`s_r = r\lfloor m/W\rfloor + \min(r, m \bmod W)`, so the slices
  differ in size by at most one (a rank gets no rows when m < W). One all-gather of the slices
  assembles :math:`c` and :math:`J` (m x n), bit-identical on every rank: each rank differentiates
  :math:`\lceil m/W\rceil` rows instead of m, and the collective moves about m n numbers
  (an all-reduce of J would move about 2 m n and repeat the m backward passes on every rank).
* **per rank** (``constraints_shared = False``: each rank's constraints come from its own batch).
  Every rank differentiates all of its m rows; the gather stacks the ranks' rows, so the step
  imposes the union :math:`c = (c^{(0)}, \dots, c^{(W-1)})` (W m rows), exactly what one process
  would impose on the union of the batches. Averaging :math:`\frac1W\sum_r c^{(r)} = 0` instead (a
  mean all-reduce) would impose one weaker constraint on a mixture of points.

In both layouts the objective value travels in the same buffer and is averaged (as DDP averages the
gradient), so the whole exchange is ONE collective per step: :func:`gather_step`, which
:func:`reduce_step` calls in either layout (with shared constraints it also says whether every rank
computed the same c). At the end of a run, :func:`end_process_group` closes the group the run made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

AllGather = Callable[[Tensor], Tensor]
"""``tensor (L,) -> (W, L)``: stack every rank's tensor (``trainer.strategy.all_gather``)."""


def row_counts(m: int, world_size: int) -> list[int]:
    """How many of the m rows each of the ``world_size`` ranks differentiates (balanced, the first
    ``m % world_size`` ranks one more)."""
    if m < 0 or world_size < 1:
        raise ValueError(f"need m >= 0 and world_size >= 1, got m={m}, world_size={world_size}.")
    base, extra = divmod(m, world_size)
    return [base + (r < extra) for r in range(world_size)]


def row_slice(m: int, world_size: int, rank: int) -> slice:
    """The rows ``[start, stop)`` of J that ``rank`` differentiates (empty when m < world_size and
    rank >= m)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, {world_size}), got {rank}.")
    counts = row_counts(m, world_size)
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])


@dataclass
class GatheredStep:
    """What every rank steps with after the exchange (identical on every rank)."""

    objective: Tensor
    constraints: Tensor | None
    jacobian: Tensor | None


def gather_step(
    all_gather: AllGather,
    world_size: int,
    objective: Tensor,
    constraints: Tensor | None,
    constraint_counts: list[int],
    jacobian: Tensor | None,
    jacobian_counts: list[int],
) -> GatheredStep:
    """ONE all-gather of ``[f, c rows, J rows]``, each block padded to the largest rank's share.

    Args:
        all_gather: the strategy's all-gather (a stack over ranks, in rank order).
        world_size: W.
        objective: this rank's scalar f.
        constraints: this rank's entries of c (1-D), or None.
        constraint_counts: the number of entries of c of every rank.
        jacobian: this rank's rows of J (2-D), or None (the optimizer needs no J).
        jacobian_counts: the number of rows of J of every rank (:func:`row_counts` when shared).

    Returns:
        f as the rank mean, c and J as the rank-order concatenation of the ranks' entries / rows, in
        the dtypes given (the buffer travels in the widest of their dtypes).
    """
    dtype = objective.dtype  # the widest of the three: a bfloat16 f (mixed precision) must not round J
    for t in (constraints, jacobian):
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    pieces = [objective.detach().reshape(1).to(dtype)]
    c_width = max(constraint_counts)
    if constraints is not None:
        pieces.append(_pad_rows(constraints.detach().reshape(-1, 1).to(dtype), c_width).reshape(-1))
    J_width, n = max(jacobian_counts), 0
    if jacobian is not None:
        n = jacobian.shape[1]
        pieces.append(_pad_rows(jacobian.detach().to(dtype), J_width).reshape(-1))
    gathered = all_gather(torch.cat(pieces)).reshape(world_size, -1)
    f_mean = gathered[:, 0].mean().to(objective.dtype)
    c = J = None
    offset = 1
    if constraints is not None:
        block = gathered[:, offset:offset + c_width]
        c = torch.cat([block[r, :constraint_counts[r]] for r in range(world_size)]).to(constraints.dtype)
        offset += c_width
    if jacobian is not None:
        block = gathered[:, offset:offset + J_width * n].reshape(world_size, J_width, n)
        J = torch.cat([block[r, :jacobian_counts[r]] for r in range(world_size)]).to(jacobian.dtype)
    return GatheredStep(f_mean, c, J)


def reduce_step(
    all_gather: AllGather, world_size: int, shared: bool, f: Tensor, c: Tensor | None, J: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """ONE collective per step (none on one process): an all-gather of [f, c, J rows].

    Returns f as the rank mean (as DDP averages the gradient), c and J assembled from the ranks'
    rows (identical on every rank), and, when the constraints are ``shared``, a 0-dim bool tensor
    saying whether every rank computed the same c (to round-off): each rank sends its whole c
    (m numbers) with its slice of J, so a task whose constraints differ per rank while
    ``constraints_shared`` is True fails loudly instead of mixing rows of different points.
    ``f`` is the loss, penalty included.
    """
    f = f.detach()
    c = None if c is None else c.detach()
    J = None if J is None else J.detach()
    if world_size == 1:
        return f, c, J, None
    m = 0 if c is None else c.numel()
    if shared:
        # every rank sends its whole c (m numbers) and its slice of J
        out = gather_step(all_gather, world_size, f, c, [m] * world_size, J, row_counts(m, world_size))
        if out.constraints is None:
            return out.objective, None, out.jacobian, None
        ranks_c = out.constraints.reshape(world_size, m)
        return out.objective, ranks_c[0], out.jacobian, _same_on_every_rank(ranks_c)
    out = gather_step(all_gather, world_size, f, c, [m] * world_size, J, [m] * world_size)
    return out.objective, out.constraints, out.jacobian, None


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


def _pad_rows(rows: Tensor, width: int) -> Tensor:
    """``rows`` (k, w) padded with zero rows to (width, w)."""
    if rows.shape[0] == width:
        return rows
    return torch.cat([rows, rows.new_zeros(width - rows.shape[0], rows.shape[1])])


def exchanged_numbers(m: int, n: int, world_size: int, shared: bool, with_jacobian: bool = True) -> dict[str, int]:
    """The numbers in the step's collective buffer (for the bytes-per-step accounting).

    ``payload``: the numbers each rank contributes, as the stepper sends them: f, its whole c (m) and
    its rows of J, padded to ceil(m / W) rows when shared (1 + m + ceil(m/W) n), all m rows otherwise;
    ``total``: the gathered buffer, W payloads; ``sent_per_rank`` in a ring all-gather: (W - 1)
    payloads. For comparison ``allreduce_sent_per_rank``: a ring all-reduce of the [f, c, J] buffer
    of the mean design (1 + m + m n numbers) sends 2 (W - 1) / W of it.
    """
    width = -(-m // world_size) if shared else m
    payload = 1 + m + width * (n if with_jacobian else 0)
    full = 1 + m + m * (n if with_jacobian else 0)
    return {
        "payload": payload,
        "total": world_size * payload,
        "sent_per_rank": (world_size - 1) * payload,
        "allreduce_sent_per_rank": (2 * (world_size - 1) * full) // world_size,
    }


def end_process_group(grouped_before: bool) -> None:
    """Destroy the process group this run made (not the caller's) once every rank ended the fit: left to the
    interpreter's exit, gloo's threads can abort a rank that succeeded (pytorch/pytorch#190489). Only on an
    agreed end: after an error on one rank the others may still be inside a collective."""
    if not grouped_before and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
