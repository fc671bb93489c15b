"""Darcy benchmarks: per-iteration cost of SQP-Adam vs Adam(unc), Jacobian timings, a method table.

    python benchmarks/bench_darcy.py ratio      [--steps 40 --rounds 3 --threads 1 --size paper|embedded]
    python benchmarks/bench_darcy.py jacobian   [--reps 7 --threads 1]
    python benchmarks/bench_darcy.py table      [--epochs 60 --threads 1 --size embedded]

``ratio``: whole Lightning training steps (a Trainer fit of ``--steps`` mini-batch steps per
optimizer, interleaved over ``--rounds``; the time between consecutive ``on_train_batch_end`` calls,
first 3 steps of each fit dropped); prints the medians and their ratio. ``jacobian``: the constraint
Jacobian (m = 50) by the per-sample vmap against the general autograd helper ("batched": one
``is_grads_batched`` backward through the shared graph; "loop": one backward per row), interleaved,
medians, and the largest difference. ``table``: the four methods of the paper at its two learning
rates (seed 0, mini-batch 20 %): final objective on the whole training set, max |c| at the
constraint points, and the relative L2 test error on held-out permeabilities.
Timings are ratios measured side by side in one process; absolute numbers depend on the machine load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable

import lightning.pytorch as pl
import torch

from harness import interleaved_medians, quiet, repeated  # benchmarks/harness.py (scripts run from benchmarks/)
from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from lit_constrained.jacobians import constraint_jacobian
from lit_constrained.tasks.darcy import Darcy, DarcyData

SIZES: dict[str, dict[str, Any]] = {
    "paper": dict(hidden_channels=4, n_layers=4, n_modes=(16, 16)),
    "embedded": dict(hidden_channels=4, n_layers=4, n_modes=(8, 8)),
}


class IterationTimer(pl.Callback):
    """Wall time between consecutive training-batch ends (a whole iteration, data loading included)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.stamps.append(time.perf_counter())

    def steps(self, skip: int = 3) -> list[float]:
        diffs = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        return diffs[skip:]


def trainer(**kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def methods(lr: float) -> dict[str, Callable]:
    return {
        "SQP-Adam(con)": partial(SQPAdam, lr=lr, betas=(0.9, 0.999), eps=1e-7, rho=0.5),
        "SQP-HeavyBall(con)": partial(SQPHeavyBall, lr=lr, beta=0.9, rho=1.0),
        "Adam(con)": partial(AdamCon, lr=lr, betas=(0.9, 0.999), eps=1e-7),
        "Adam(unc)": partial(torch.optim.Adam, lr=lr, betas=(0.9, 0.999), eps=1e-7),
    }


def bench_ratio(args: argparse.Namespace) -> None:
    dm = DarcyData(batch_mode="minibatch", batch_fraction=0.2)
    chosen = {k: v for k, v in methods(1e-3).items() if k in ("SQP-Adam(con)", "Adam(unc)")}
    times: dict[str, list[float]] = {name: [] for name in chosen}
    per_round = []
    for r in range(args.rounds):
        medians = {}
        for name, make in chosen.items():
            pl.seed_everything(r, verbose=False)
            task = Darcy(optimizer=make, num_threads=args.threads, **SIZES[args.size])
            timer = IterationTimer()
            trainer(max_steps=args.steps, callbacks=[timer]).fit(task, dm)
            times[name] += timer.steps()
            medians[name] = statistics.median(timer.steps())
        per_round.append(medians["SQP-Adam(con)"] / medians["Adam(unc)"])
    sqp, adam = statistics.median(times["SQP-Adam(con)"]), statistics.median(times["Adam(unc)"])
    print(f"Darcy ({args.size} FNO, m = 50, mini-batch 20 samples), {args.threads} thread(s), "
          f"{args.rounds} interleaved rounds of {args.steps} steps")
    print(f"  per-iteration median: SQP-Adam {sqp * 1e3:.1f} ms, Adam(unc) {adam * 1e3:.1f} ms")
    print(f"  ratio SQP-Adam / Adam(unc) = {sqp / adam:.2f}  (per round: {', '.join(f'{x:.2f}' for x in per_round)})")


def bench_jacobian(args: argparse.Namespace) -> None:
    dm = DarcyData(batch_mode="minibatch")
    batch = next(iter(dm.train_dataloader()))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    task = Darcy(output_scale=dm.u_std, **SIZES[args.size])
    params = list(task.parameters())
    c = task.constraints(batch)
    runs: dict[str, Callable[[], torch.Tensor]] = {
        "vmap": lambda: task.constraint_jacobian(batch, c, params),
        "batched": lambda: constraint_jacobian(c, params, method="batched"),
        "loop": lambda: constraint_jacobian(c, params, method="loop"),
    }
    results = {k: f() for k, f in runs.items()}  # warm-up, and the values to compare
    med = interleaved_medians({k: repeated(f) for k, f in runs.items()}, args.reps, block=1)
    n = results["vmap"].shape[1]
    print(f"Darcy constraint Jacobian, m = {c.numel()}, n = {n}, {args.threads} thread(s), {args.reps} reps")
    for k in runs:
        diff = (results[k] - results["vmap"]).abs().max().item()
        print(f"  {k:8s} {med[k] * 1e3:8.1f} ms   x{med[k] / med['vmap']:.1f} of vmap   max |J - J_vmap| = {diff:.1e}")


def bench_table(args: argparse.Namespace) -> None:
    dm = DarcyData(batch_mode="minibatch", batch_fraction=0.2)
    full = DarcyData(batch_mode="full")
    whole = next(iter(full.train_dataloader()))
    rows = []
    for lr in args.lrs:
        for name, make in methods(lr).items():
            pl.seed_everything(0, verbose=False)
            task = Darcy(optimizer=make, num_threads=args.threads, **SIZES[args.size])
            start = time.perf_counter()
            trainer(max_epochs=args.epochs).fit(task, dm)
            wall = time.perf_counter() - start
            (test,) = trainer(limit_test_batches=1.0).test(task, dm, verbose=False)
            with torch.no_grad():
                f = float(task.objective(whole))
                c = float(task.constraints(whole).abs().max())
            rows.append((lr, name, f, c, test["test/rel_l2"], wall))
            print(f"  done lr={lr:g} {name}: {wall:.0f} s", file=sys.stderr)
    print(f"Darcy, {args.size} FNO, mini-batch 20 %, {args.epochs} epochs ({args.epochs * 5} steps), seed 0")
    print("| lr | method | objective (train) | max abs c (m = 50) | test rel. L2 | wall s |")
    print("|---|---|---|---|---|---|")
    for lr, name, f, c, rel, wall in rows:
        print(f"| {lr:g} | {name} | {f:.4g} | {c:.3g} | {rel:.3f} | {wall:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("ratio", "jacobian", "table"):
        p = sub.add_parser(name)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--size", choices=sorted(SIZES), default="paper")
    sub.choices["ratio"].add_argument("--steps", type=int, default=40)
    sub.choices["ratio"].add_argument("--rounds", type=int, default=3)
    sub.choices["jacobian"].add_argument("--reps", type=int, default=7)
    sub.choices["table"].add_argument("--epochs", type=int, default=60)
    sub.choices["table"].add_argument("--lrs", type=float, nargs="+", default=[5e-3, 1e-3])
    args = parser.parse_args()
    quiet()
    {"ratio": bench_ratio, "jacobian": bench_jacobian, "table": bench_table}[args.command](args)


if __name__ == "__main__":
    main()
