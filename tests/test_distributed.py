"""The sharding helpers (lit_constrained.distributed) and the row-subset Jacobians, in one process.

The all-gather is simulated: W "ranks" are evaluated in turn and their buffers stacked, which is
what ``torch.distributed.all_gather`` returns; the 2-process runs are in test_ddp.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from lit_constrained.distributed import exchanged_numbers, gather_step, row_counts, row_slice
from lit_constrained.jacobians import constraint_jacobian



@pytest.mark.parametrize("m,world", [(3, 2), (50, 8), (1, 2), (0, 3), (10, 64), (64, 64)])
def test_row_slices_partition_the_rows_in_balanced_order(m: int, world: int) -> None:
    slices = [row_slice(m, world, r) for r in range(world)]
    covered = [i for s in slices for i in range(m)[s]]
    assert covered == list(range(m))  # every row once, in rank order
    sizes = [s.stop - s.start for s in slices]
    assert sizes == row_counts(m, world)
    assert max(sizes) - min(sizes) <= 1 and max(sizes) == -(-m // world)


def test_row_slice_rejects_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match="rank must lie in"):
        row_slice(4, 2, 2)


def _simulated_all_gather(buffers: list[Tensor]) -> list[Tensor]:
    """Each rank's view of an all-gather of the given per-rank buffers: the same stack."""
    stacked = torch.stack(buffers)
    return [stacked.clone() for _ in buffers]


@pytest.mark.parametrize("m,world", [(5, 2), (1, 3), (4, 4)])
def test_gather_step_assembles_slices_and_averages_f(m: int, world: int) -> None:
    gen = torch.Generator().manual_seed(0)
    n = 7
    J_full = torch.randn(m, n, generator=gen, dtype=torch.float64)
    c_full = torch.randn(m, generator=gen, dtype=torch.float64)
    f = torch.randn(world, generator=gen, dtype=torch.float64)
    counts = row_counts(m, world)
    sent: list[Tensor] = []
    # pass 1: record every rank's buffer (the fake all-gather returns its input, stacked once)
    for r in range(world):
        rows = row_slice(m, world, r)
        gather_step(lambda t: sent.append(t) or t.unsqueeze(0).expand(world, -1), world, f[r],
                    c_full[rows], counts, J_full[rows], counts)
    assert len({t.numel() for t in sent}) == 1  # equal-size buffers (padded)
    views = _simulated_all_gather(sent)
    for r in range(world):
        rows = row_slice(m, world, r)
        out = gather_step(lambda t, r=r: views[r], world, f[r], c_full[rows], counts, J_full[rows], counts)
        assert torch.equal(out.jacobian, J_full) and torch.equal(out.constraints, c_full)
        assert out.objective == pytest.approx(float(f.mean()), rel=1e-15)


def test_gather_step_stacks_per_rank_rows_into_the_union() -> None:
    world, m, n = 3, 2, 4
    gen = torch.Generator().manual_seed(1)
    c = [torch.randn(m, generator=gen) for _ in range(world)]
    J = [torch.randn(m, n, generator=gen) for _ in range(world)]
    sent: list[Tensor] = []
    for r in range(world):
        gather_step(lambda t: sent.append(t) or t.unsqueeze(0).expand(world, -1), world, torch.tensor(1.0 * r),
                    c[r], [m] * world, J[r], [m] * world)
    stacked = torch.stack(sent)
    out = gather_step(lambda t: stacked, world, torch.tensor(0.0), c[0], [m] * world, J[0], [m] * world)
    assert torch.equal(out.constraints, torch.cat(c)) and torch.equal(out.jacobian, torch.cat(J))
    assert float(out.objective) == pytest.approx(1.0)  # mean of 0, 1, 2


def test_exchanged_numbers_all_gather_against_all_reduce() -> None:
    """Darcy at the paper size: the all-gather sends ~m n per rank, the ring all-reduce ~2 m n (W large)."""
    m, n = 50, 18_733
    two = exchanged_numbers(m, n, 2, shared=True)
    assert two["payload"] == 1 + m + 25 * n and two["sent_per_rank"] == two["payload"]  # f, all of c, 25 rows
    assert two["allreduce_sent_per_rank"] == 1 + m + m * n  # 2 (W-1)/W = 1 at W = 2
    many = exchanged_numbers(m, n, 64, shared=True)
    assert many["sent_per_rank"] == 63 * (1 + m + n)  # ceil(50/64) = 1 row each
    assert many["allreduce_sent_per_rank"] / (m * n) == pytest.approx(2 * 63 / 64, rel=1e-3)
    assert exchanged_numbers(m, n, 4, shared=False)["total"] == 4 * (1 + m + m * n)


def test_exchanged_numbers_are_the_buffer_the_stepper_sends() -> None:
    m, n, world = 5, 3, 2
    sent: list[Tensor] = []
    J = torch.zeros(3, n)
    gather_step(lambda t: sent.append(t) or t.unsqueeze(0).expand(world, -1), world, torch.tensor(0.0),
                torch.zeros(m), [m] * world, J, row_counts(m, world))
    assert sent[0].numel() == exchanged_numbers(m, n, world, shared=True)["payload"]


# ---------------------------------------------------------------------------- row-subset Jacobians


@pytest.mark.parametrize("method", ["batched", "loop"])
def test_row_subset_of_the_autograd_jacobian(method: str) -> None:
    """Against the dense Jacobian of an explicit function: c_i = sum_j a_ij x_j^2 + b_i sin(y)."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(5, generator=gen, dtype=torch.float64)
    x = torch.randn(3, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn((), dtype=torch.float64, generator=gen).requires_grad_()
    c = a @ x.pow(2) + b * torch.sin(y)
    dense = torch.cat([a * 2 * x.detach(), (b * torch.cos(y.detach())).unsqueeze(1)], dim=1)
    for rows in (slice(0, 5), slice(1, 3), slice(4, 5), slice(2, 2)):
        J = constraint_jacobian(c, [x, y], method=method, rows=rows)
        torch.testing.assert_close(J, dense[rows], rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="contiguous slice"):
        constraint_jacobian(c, [x, y], rows=slice(0, 5, 2))


def test_darcy_per_sample_jacobian_by_constraint_rows() -> None:
    """Darcy's vmap Jacobian of a slice of the constraint rows (any samples they touch) equals those
    rows of the general autograd Jacobian."""
    from tests.tasks.test_darcy import SMALL_DATA, small_task, train_batch

    from lit_constrained.tasks.darcy import DarcyData

    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64")
    batch = train_batch(dm)
    params = list(task.parameters())
    c = task.constraints(batch)
    full = constraint_jacobian(c, params, method="batched")
    m = c.numel()
    world = 3  # 8 rows: 3 + 3 + 2
    parts = [task.constraint_jacobian(batch, c, params, rows=row_slice(m, world, r)) for r in range(world)]
    assert [p.shape[0] for p in parts] == row_counts(m, world)
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-10, atol=1e-12)
    assert task.constraint_jacobian(batch, c, params, rows=slice(m, m)).shape == (0, full.shape[1])  # m < W


def test_darcy_rows_grouping_makes_no_host_sync() -> None:
    """The grouping an accelerator uses ("rows") has no data-dependent shape: the per-sample Jacobian
    then adds no host sync to the step (the "auto" cost model reads group sizes on the host)."""
    from tests.tasks.test_darcy import SMALL_DATA, small_task, train_batch

    from lit_constrained.jacobians import per_sample_jacobian
    from lit_constrained.tasks.darcy import DarcyData

    from tests.helpers.sync_counting import SyncCounter

    dm = DarcyData(**SMALL_DATA)
    task = small_task("float64")
    b = task._batch(train_batch(dm))
    params = list(task.parameters())
    args = (task, params, task._sample_residuals, (b["con_x"], b["con_nu"]), b["con_sample"][2:7], b["con_node"][2:7])
    with SyncCounter() as syncs:
        rows = per_sample_jacobian(*args, mode="rows")
    assert syncs.count == 0, syncs.calls
    torch.testing.assert_close(rows, per_sample_jacobian(*args, mode="samples"), rtol=1e-10, atol=1e-12)


def test_gather_step_keeps_a_float32_jacobian_exact_beside_a_bfloat16_objective() -> None:
    J = torch.tensor([[1.0 + 2**-20, 3.0]])  # not representable in bfloat16
    out = gather_step(lambda t: t.unsqueeze(0), 1, torch.tensor(0.5, dtype=torch.bfloat16), torch.tensor([1e-7]),
                      [1], J, [1])
    assert out.jacobian.dtype == torch.float32 and torch.equal(out.jacobian, J)
    assert out.objective.dtype == torch.bfloat16 and float(out.objective) == 0.5


def test_an_override_without_rows_still_gives_the_rows() -> None:
    """A task's constraint_jacobian written before the ``rows`` argument: the stepper computes the
    whole J through it and keeps the rank's rows; one with ``rows`` is asked for those rows only."""
    from lit_constrained.stepping import _jacobian_rows

    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    c = x.pow(2) * torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    dense = torch.diag(2 * x.detach() * torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64))
    calls: list[Any] = []

    class Old:
        def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any) -> Tensor:
            calls.append("old")
            return constraint_jacobian(constraints, params)

    class New:
        def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any, rows: slice | None = None) -> Tensor:
            calls.append(rows)
            return constraint_jacobian(constraints, params, rows=rows)

    for module in (Old(), New()):
        torch.testing.assert_close(_jacobian_rows(module, None, c, [x], slice(1, 3)), dense[1:3])  # type: ignore[arg-type]
    assert calls == ["old", slice(1, 3)]
