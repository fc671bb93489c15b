"""Per-iteration cost of SQP-Adam(con) relative to Adam(unc) on the spring and chemistry tasks.

Times the whole Lightning training step (objective, constraints, Jacobian when required, backward,
the optimizer step, logging), embedded sizes, one process on the CPU. For each repetition, a Trainer
fit of ``--steps`` steps per method, the methods interleaved (A, B, A, B, ...), so that load changes
on a shared machine hit both alike. Reported per method: the median over repetitions of the median
step time (``on_train_batch_start`` -> ``on_train_batch_end``, after ``--warmup`` steps) and the
fit's wall time per step (which adds the data loading and Lightning's per-epoch work); and the
median over repetitions of the per-repetition ratio SQP-Adam / Adam(unc).

    python benchmarks/bench_ode_tasks.py                     # spring and chemistry
    python benchmarks/bench_ode_tasks.py --tasks chemistry --derivatives taylor forward reverse
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import Any

import lightning as L
import torch

from lit_constrained.optim import SQPAdam
from lit_constrained.tasks.chemistry import Chemistry, ChemistryData
from lit_constrained.tasks.spring import Spring, SpringData
from harness import StepTimer  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py


def build(task: str, method: str, derivative: str, threads: int) -> tuple[L.LightningModule, L.LightningDataModule]:
    if method == "sqp_adam":
        rho = 1.0 if task == "spring" else 0.5
        optimizer: Any = partial(SQPAdam, lr=5e-4, rho=rho)
    else:
        optimizer = partial(torch.optim.Adam, lr=5e-4, eps=1e-7)
    if task == "spring":
        return Spring(optimizer=optimizer, num_threads=threads), SpringData()
    return (Chemistry(optimizer=optimizer, num_threads=threads, derivative=derivative),
            ChemistryData(cache_dir=None))


def time_fit(task: str, method: str, derivative: str, steps: int, warmup: int, threads: int) -> tuple[float, float]:
    """(median step seconds, fit wall seconds per step) of one fit of ``steps`` steps."""
    L.seed_everything(0, verbose=False)
    module, data = build(task, method, derivative, threads)
    timer = StepTimer()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[timer], log_every_n_steps=50,
    )
    start = time.perf_counter()
    trainer.fit(module, data)
    wall = (time.perf_counter() - start) / steps
    return statistics.median(timer.times[warmup:]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["spring", "chemistry"], choices=["spring", "chemistry"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--derivatives", nargs="+", default=["taylor"], choices=["taylor", "forward", "reverse"],
                        help="chemistry: how du/dt is computed (each is timed; the task's `derivative` option)")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; torch {torch.__version__}")

    for task in args.tasks:
        derivatives = args.derivatives if task == "chemistry" else ["-"]
        variants = [(method, d) for d in derivatives for method in ("sqp_adam", "adam_unc")]
        steps: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        walls: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for method, derivative in variants:  # interleaved
                step, wall = time_fit(task, method, derivative, args.steps, args.warmup, args.threads)
                steps[(method, derivative)].append(step)
                walls[(method, derivative)].append(wall)
        print(f"\n{task}: {args.repeats} interleaved repetitions x {args.steps} steps, {args.threads} thread(s)")
        for method, derivative in variants:
            label = method if derivative == "-" else f"{method} (du/dt {derivative})"
            print(f"  {label:32s} step {1e3 * statistics.median(steps[(method, derivative)]):7.2f} ms   "
                  f"fit wall/step {1e3 * statistics.median(walls[(method, derivative)]):7.2f} ms")
        for derivative in derivatives:
            ratios = [a / b for a, b in zip(steps[("sqp_adam", derivative)], steps[("adam_unc", derivative)])]
            wall_ratios = [a / b for a, b in zip(walls[("sqp_adam", derivative)], walls[("adam_unc", derivative)])]
            suffix = "" if derivative == "-" else f" (du/dt {derivative})"
            print(f"  ratio SQP-Adam / Adam(unc){suffix}: step {statistics.median(ratios):.2f} "
                  f"[{min(ratios):.2f}, {max(ratios):.2f}]   fit wall {statistics.median(wall_ratios):.2f}")
        for other in derivatives[1:]:
            for method in ("sqp_adam", "adam_unc"):
                ratios = [a / b for a, b in zip(steps[(method, other)], steps[(method, derivatives[0])])]
                print(f"  ratio {other} / {derivatives[0]} du/dt, {method}: step {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
