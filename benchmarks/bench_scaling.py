r"""Row-sharded constraint Jacobian: Jacobian time per rank and bytes per step, 1 vs 2 processes.

For Darcy (paper size: FNO n = 18 733, m = 50, mini-batch 20 %) and Burgers (m = 10), two CPU
processes (gloo, 1 thread each) build the same task and batch and time, interleaved in blocks
(A, B, C, A, B, C, ...; medians). The compute parts are timed in CPU time of the (single) thread,
``time.thread_time``, so that the load of a shared machine does not enter; the collectives in wall
time:

* A "1 process": rank 0 alone computes c and the whole J (m rows), rank 1 waits at a barrier;
* B "2 processes": both ranks at once compute c and their own slice of J
  (:func:`~lit_constrained.distributed.row_slice`: 25 + 25 rows for Darcy, 5 + 5 for Burgers);
* C the collectives on the step's real buffers: the all-gather of [f, c, J rows]
  (:func:`~lit_constrained.distributed.gather_step`) against the mean all-reduce of [f, c, J] of
  the previous design (every rank computing all of J).

Rank 0 also times, for the projection, the Jacobian of ONE row (the per-row cost b and the fixed
cost a of ``T_J(k) = a + b k`` from k = 1 and k = m), the objective's forward and backward, and the
SQP-Adam step. The bytes per step are the sizes of the buffers handed to the collectives, and the
bytes each rank sends in a ring algorithm: (W - 1) payloads for the all-gather, 2 (W - 1) / W
buffers for the all-reduce.

The projection to W ranks (GPUs) uses the measured parts (of THIS machine: a GPU shrinks the
compute, which moves the crossover to fewer ranks) and a stated interconnect (bandwidth B per rank,
latency alpha per ring hop):

.. math::
    T(W) = T_f / W + T_{opt} + T_J(\lceil m/W \rceil) + (W-1)(\alpha + P_W / B)
           + 2 (W-1) (\alpha + 4 n / (W B))

(strong scaling: the global batch fixed, so the objective part divides by W; P_W the all-gather
payload in bytes; the last term DDP's gradient all-reduce), against the all-reduce design
:math:`T_f / W + T_{opt} + T_J(m) + 2 (W-1)(\alpha + S / (W B))` with S the [f, c, J] buffer.

    python benchmarks/bench_scaling.py [--tasks darcy burgers] [--reps 7] [--bandwidth 25e9 450e9]
        [--latency 5e-6] [--out scaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_constrained.distributed import exchanged_numbers, gather_step, row_counts, row_slice
from lit_constrained.optim import SQPAdam
from lit_constrained.optim.flat import group_params
from harness import quiet  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py

WORLD = 2


def build(task: str) -> tuple[Any, dict[str, Any]]:
    """The task (seeded, float32) and one training batch, as the Trainer would hand them over."""
    torch.manual_seed(0)
    if task == "darcy":
        from lit_constrained.tasks.darcy import Darcy, DarcyData

        data = DarcyData(batch_mode="minibatch")
        module = Darcy(hidden_channels=4, n_layers=4, n_modes=(16, 16), output_scale=0.01)
    elif task == "burgers":
        from lit_constrained.tasks.burgers import Burgers, BurgersData

        data = BurgersData()
        module = Burgers()
    else:
        raise ValueError(f"unknown task {task!r}: use darcy or burgers.")
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    batch = module.prepare_batch(batch)
    return module, batch


def jacobian_runner(module: Any, batch: Any, rows: slice) -> Callable[[], None]:
    """What a rank does for the Jacobian in a step: c in full (one forward), then J of its rows."""
    params = group_params([{"params": list(module.parameters())}])

    def run() -> None:
        c = module.constraints(batch)
        module.constraint_jacobian(batch, c, params, rows=rows)

    return run


def objective_runner(module: Any, batch: Any) -> Callable[[], None]:
    params = list(module.parameters())

    def run() -> None:
        torch.autograd.grad(module.objective(batch), params, allow_unused=True)

    return run


def optimizer_runner(module: Any, batch: Any) -> Callable[[], None]:
    """One SQP-Adam step with the task's (fixed) J, c and gradient."""
    params = list(module.parameters())
    optimizer = SQPAdam(params, lr=1e-6)
    c = module.constraints(batch)
    J = module.constraint_jacobian(batch, c, group_params(optimizer.param_groups)).detach()
    c = c.detach()
    grads = torch.autograd.grad(module.objective(batch), params, allow_unused=True)
    for p, g in zip(params, grads):
        p.grad = torch.zeros_like(p) if g is None else g
    return lambda: optimizer.step(constraints=c, jacobian=J)


def seconds(fn: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()`` (the collectives: their work runs in gloo's own threads)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_seconds(fn: Callable[[], Any]) -> float:
    """CPU seconds of this thread in ``fn()`` (the compute parts, 1 thread per process): unlike wall
    time it does not count the time the thread waits for a core on a loaded machine."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def all_gather_stack(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


def worker(rank: int, port: int, tasks: list[str], reps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    quiet()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results: dict[str, Any] = {}
    for task in tasks:
        module, batch = build(task)
        c = module.constraints(batch)
        m = c.numel()
        n = sum(torch.view_as_real(p).numel() if p.is_complex() else p.numel() for p in module.parameters())
        full = jacobian_runner(module, batch, slice(0, m))
        own_rows = row_slice(m, WORLD, rank)
        own = jacobian_runner(module, batch, own_rows)
        one_row = jacobian_runner(module, batch, slice(0, 1))
        half_alone = jacobian_runner(module, batch, row_slice(m, WORLD, 0))
        f = module.objective(batch).detach()
        J_own = module.constraint_jacobian(batch, c, list(module.parameters()), rows=own_rows).detach()
        J_full = module.constraint_jacobian(batch, c, list(module.parameters())).detach()
        counts = row_counts(m, WORLD)
        sizes: dict[str, int] = {}

        def gather() -> None:
            def recorded(t: torch.Tensor) -> torch.Tensor:
                sizes["all_gather_payload_bytes"] = t.numel() * t.element_size()
                return all_gather_stack(t)

            gather_step(recorded, WORLD, f, c.detach(), [m] * WORLD, J_own, counts)

        def reduce() -> None:
            buffer = torch.cat([f.reshape(1), c.detach(), J_full.reshape(-1)])
            sizes["all_reduce_buffer_bytes"] = buffer.numel() * buffer.element_size()
            dist.all_reduce(buffer)

        extra = {"objective": objective_runner(module, batch), "sqp_step": optimizer_runner(module, batch),
                 "one_row": one_row, "J_rank0_rows_alone": half_alone} if rank == 0 else {}
        for fn in [full, own, gather, reduce]:  # warm-up (vmap tracing, allocator), the same on both ranks
            dist.barrier()
            fn()
        for fn in extra.values():  # rank 0 only: no collective inside
            fn()
        times: dict[str, list[float]] = {k: [] for k in ["J_1proc", "J_2proc", "all_gather", "all_reduce", *extra]}
        for _ in range(reps):
            dist.barrier()
            if rank == 0:
                times["J_1proc"].append(cpu_seconds(full))
                for key, fn in extra.items():
                    times[key].append(cpu_seconds(fn))
            dist.barrier()
            times["J_2proc"].append(cpu_seconds(own))
            dist.barrier()
            times["all_gather"].append(seconds(gather))
            dist.barrier()
            times["all_reduce"].append(seconds(reduce))
        results[task] = {
            "m": m, "n": n, "dtype": str(J_full.dtype), "rows": (own_rows.start, own_rows.stop),
            "median_s": {k: statistics.median(v) for k, v in times.items() if v}, **sizes,
        }
    torch.save(results, Path(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def project(task: dict[str, Any], world: int, bandwidth: float, latency: float) -> dict[str, float]:
    """Projected step time (s) at ``world`` ranks: row-sharded all-gather vs the all-reduce design."""
    m, n = task["m"], task["n"]
    t = task["t"]
    per_row = (t["J_1proc"] - t["one_row"]) / max(m - 1, 1)
    fixed = t["one_row"] - per_row
    rows = -(-m // world)
    element = task["element_bytes"]
    payload = exchanged_numbers(m, n, world, shared=True)["payload"] * element
    full = (1 + m + m * n) * element
    grad = 2 * (world - 1) * (latency + n * element / (world * bandwidth))
    gather = (world - 1) * (latency + payload / bandwidth)
    allreduce = 2 * (world - 1) * (latency + full / (world * bandwidth))
    common = t["objective"] / world + t["sqp_step"] + grad
    return {
        "J_sharded": fixed + per_row * rows,
        "gather": gather,
        "sharded": common + fixed + per_row * rows + gather,
        "allreduce_design": common + t["J_1proc"] + allreduce,
        "allreduce": allreduce,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["darcy", "burgers"], choices=["darcy", "burgers"])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--bandwidth", type=float, nargs="+", default=[25e9, 450e9],
                        help="bytes/s per rank for the projection (25e9: 200 Gb/s InfiniBand; 450e9: NVLink 4)")
    parser.add_argument("--latency", type=float, default=5e-6, help="seconds per ring hop for the projection")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 8, 64])
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)  # before any op: a forked worker must not inherit a started thread pool
    for task in args.tasks:  # generate / cache the data once, before the workers
        build(task)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(os.environ.get("TMPDIR", "/tmp"), f"bench_scaling_{os.getpid()}")
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(worker, args=(port, args.tasks, args.reps, str(out)), nprocs=WORLD, join=True,
                       start_method="fork")
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    cpu = cpu_model()
    print(f"CPU: {cpu}; torch {torch.__version__}; 1 thread per process; {args.reps} interleaved repetitions, "
          "medians; compute parts in thread CPU time, collectives in wall time\n")
    report: dict[str, Any] = {"cpu": cpu, "reps": args.reps, "tasks": {}}
    print("| task | m | n | J 1 process (ms) | J per rank, 2 processes (ms: rank 0 / rank 1) | speed-up | "
          "all-reduce [f,c,J] bytes (sent/rank) | all-gather payload bytes (sent/rank) | all-reduce ms | all-gather ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        r0, r1 = ranks[0][task], ranks[1][task]
        t0, t1 = r0["median_s"], r1["median_s"]
        m, n = r0["m"], r0["n"]
        element = r0["all_gather_payload_bytes"] // exchanged_numbers(m, n, WORLD, shared=True)["payload"]
        slowest = max(t0["J_2proc"], t1["J_2proc"])
        speedup = t0["J_1proc"] / slowest
        reduce_sent = 2 * (WORLD - 1) * r0["all_reduce_buffer_bytes"] // WORLD
        gather_sent = (WORLD - 1) * r0["all_gather_payload_bytes"]
        print(f"| {task} | {m} | {n} | {1e3 * t0['J_1proc']:.1f} | {1e3 * t0['J_2proc']:.1f} / {1e3 * t1['J_2proc']:.1f} "
              f"| {speedup:.2f}x | {r0['all_reduce_buffer_bytes']} ({reduce_sent}) | {r0['all_gather_payload_bytes']} "
              f"({gather_sent}) | {1e3 * t0['all_reduce']:.2f} | {1e3 * t0['all_gather']:.2f} |")
        report["tasks"][task] = {"m": m, "n": n, "element_bytes": element, "t": t0, "t_rank1": t1,
                                 "speedup": speedup, "all_reduce_buffer_bytes": r0["all_reduce_buffer_bytes"],
                                 "all_gather_payload_bytes": r0["all_gather_payload_bytes"]}
    print("\nParts measured on rank 0 (ms CPU): "
          + "; ".join(f"{task}: objective fwd+bwd {1e3 * report['tasks'][task]['t']['objective']:.1f}, "
                      f"SQP-Adam step {1e3 * report['tasks'][task]['t']['sqp_step']:.2f}, "
                      f"c and J of one row {1e3 * report['tasks'][task]['t']['one_row']:.1f}, "
                      f"c and J of rank 0's rows, alone {1e3 * report['tasks'][task]['t']['J_rank0_rows_alone']:.1f}"
                      for task in args.tasks))
    for bandwidth in args.bandwidth:
        print(f"\nProjected step (ms) at {bandwidth / 1e9:g} GB/s per rank, {1e6 * args.latency:g} us per hop "
              "(measured compute parts of this machine):")
        print("| task | W | J per rank | all-gather | step, row-sharded | step, all-reduce design | gather share of step |")
        print("|---|---|---|---|---|---|---|")
        for task in args.tasks:
            for world in args.worlds:
                p = project(report["tasks"][task], world, bandwidth, args.latency)
                report["tasks"][task].setdefault("projection", {})[f"{bandwidth:g}/{world}"] = p
                print(f"| {task} | {world} | {1e3 * p['J_sharded']:.2f} | {1e3 * p['gather']:.3f} | "
                      f"{1e3 * p['sharded']:.2f} | {1e3 * p['allreduce_design']:.2f} | "
                      f"{100 * p['gather'] / p['sharded']:.0f} % |")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
