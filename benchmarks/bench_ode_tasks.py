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
    python benchmarks/bench_ode_tasks.py --tasks spring --breakdown

``--breakdown`` also prints where a step's time goes (medians over the repetitions of the per-step mean
after the warm-up): the task's ``objective``, ``constraints`` (the step's own evaluation, and those the
optimizer's post-step corrections make through the constraint closure), ``constraint_jacobian``,
the backward, the optimizer's ``step`` (of it, the corrections), the module's logging, and the rest (the
step owner's checks, Lightning's loop and optimizer wrapper), with SQP-Adam's floor given its Jacobian
and its corrections: Adam(unc)'s step + the Jacobian + the corrections' constraint evaluations.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import lightning as L
import torch

from lit_constrained.optim import SQPAdam
from lit_constrained.optim.constrained import ConstrainedOptimizer
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


class Breakdown:
    """Seconds spent per step in named calls of the timed (post-warm-up) training steps: the calls are
    wrapped on their classes for this process (``install``); ``constraints`` made inside the optimizer's
    corrections count as ``corrections: constraints``."""

    LABELS = ("objective", "constraints", "jacobian", "backward", "optimizer step", "corrections",
              "corrections: constraints", "logging")

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.counting = False
        self._in_corrections = False

    def install(self) -> None:
        for task in (Spring, Chemistry):  # (on the task classes: they override some of these)
            self._wrap(task, "objective", "objective")
            self._wrap(task, "constraints", "constraints")
            self._wrap(task, "constraint_jacobian", "jacobian")
            if hasattr(task, "_log_step"):  # the module's logging of a step (a private hook: else in the rest)
                self._wrap(task, "_log_step", "logging")
        self._wrap(L.LightningModule, "manual_backward", "backward")
        self._wrap(SQPAdam, "step", "optimizer step")
        self._wrap(torch.optim.Adam, "step", "optimizer step")
        self._wrap(ConstrainedOptimizer, "_correct", "corrections")

    def _wrap(self, owner: type, name: str, label: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        breakdown = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            inner = label == "corrections"
            key = "corrections: constraints" if label == "constraints" and breakdown._in_corrections else label
            if inner:
                breakdown._in_corrections = True
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if breakdown.counting:
                    breakdown.totals[key] += time.perf_counter() - start
                if inner:
                    breakdown._in_corrections = False

        setattr(owner, name, timed)


class CountAfterWarmup(L.Callback):
    """Switches the breakdown's counting on after ``warmup`` steps."""

    def __init__(self, breakdown: Breakdown, warmup: int) -> None:
        self.breakdown, self.warmup = breakdown, warmup

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.breakdown.counting = trainer.global_step >= self.warmup


def time_fit(task: str, method: str, derivative: str, steps: int, warmup: int, threads: int,
             breakdown: Breakdown | None = None) -> tuple[float, float, dict[str, float]]:
    """(median step seconds, fit wall seconds per step, per-step seconds of the breakdown's calls) of one
    fit of ``steps`` steps."""
    L.seed_everything(0, verbose=False)
    module, data = build(task, method, derivative, threads)
    timer = StepTimer()
    callbacks: list[L.Callback] = [timer]
    if breakdown is not None:
        breakdown.totals.clear()
        callbacks.append(CountAfterWarmup(breakdown, warmup))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, log_every_n_steps=50,
    )
    start = time.perf_counter()
    trainer.fit(module, data)
    wall = (time.perf_counter() - start) / steps
    parts: dict[str, float] = {}
    if breakdown is not None:
        breakdown.counting = False
        parts = {label: breakdown.totals.get(label, 0.0) / (steps - warmup) for label in Breakdown.LABELS}
        parts["step"] = statistics.mean(timer.times[warmup:])
    return statistics.median(timer.times[warmup:]), wall, parts


def print_breakdown(parts: dict[tuple[str, str], list[dict[str, float]]], derivative: str) -> None:
    """Per-step milliseconds of each part (medians over the repetitions), the rest, and SQP-Adam's floor."""
    med: dict[str, dict[str, float]] = {}
    for method in ("sqp_adam", "adam_unc"):
        runs = parts[(method, derivative)]
        med[method] = {label: statistics.median(run[label] for run in runs) for label in runs[0]}
        m = med[method]
        top = ("objective", "constraints", "jacobian", "backward", "optimizer step", "logging")
        rest = m["step"] - sum(m[label] + (m["corrections: constraints"] if label == "constraints" else 0.0)
                               for label in top) + m["corrections: constraints"]
        print(f"  {method} breakdown (ms per step, mean step {1e3 * m['step']:.2f}): " + ", ".join(
            f"{label} {1e3 * m[label]:.3f}" for label in top)
              + f"; of the optimizer step: corrections {1e3 * m['corrections']:.3f} (their constraints "
              f"{1e3 * m['corrections: constraints']:.3f}); rest (step owner, Lightning) {1e3 * rest:.3f}")
    sqp, adam = med["sqp_adam"], med["adam_unc"]
    floor = adam["step"] + sqp["jacobian"] + sqp["corrections: constraints"]
    own = sqp["optimizer step"] - sqp["corrections"]
    print(f"  SQP-Adam floor given its Jacobian and corrections: Adam(unc) step {1e3 * adam['step']:.2f} + "
          f"Jacobian {1e3 * sqp['jacobian']:.2f} + corrections' constraints {1e3 * sqp['corrections: constraints']:.2f}"
          f" = {1e3 * floor:.2f} ms ({floor / adam['step']:.2f}x Adam(unc)); SQP-Adam's own step (without the "
          f"corrections) {1e3 * own:.3f} ms against Adam's {1e3 * adam['optimizer step']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["spring", "chemistry"], choices=["spring", "chemistry"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--derivatives", nargs="+", default=["taylor"], choices=["taylor", "forward", "reverse"],
                        help="chemistry: how du/dt is computed (each is timed; the task's `derivative` option)")
    parser.add_argument("--breakdown", action="store_true", help="also print where a step's time goes")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; torch {torch.__version__}")
    breakdown = None
    if args.breakdown:
        breakdown = Breakdown()
        breakdown.install()

    for task in args.tasks:
        derivatives = args.derivatives if task == "chemistry" else ["-"]
        variants = [(method, d) for d in derivatives for method in ("sqp_adam", "adam_unc")]
        steps: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        walls: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        parts: dict[tuple[str, str], list[dict[str, float]]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for method, derivative in variants:  # interleaved
                step, wall, part = time_fit(task, method, derivative, args.steps, args.warmup, args.threads,
                                            breakdown)
                steps[(method, derivative)].append(step)
                walls[(method, derivative)].append(wall)
                parts[(method, derivative)].append(part)
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
            if breakdown is not None:
                print_breakdown(parts, derivative)
        for other in derivatives[1:]:
            for method in ("sqp_adam", "adam_unc"):
                ratios = [a / b for a, b in zip(steps[(method, other)], steps[(method, derivatives[0])])]
                print(f"  ratio {other} / {derivatives[0]} du/dt, {method}: step {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
