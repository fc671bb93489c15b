"""Per-iteration time of SQP-Adam (and the other optimizers) against Adam(unc) on the Burgers task.

Each optimizer trains the embedded Burgers task (10 initial conditions, full batch = 10 240 rows per
step by default) for ``--steps`` Lightning training steps; a callback times every whole training
step (``on_train_batch_start`` -> ``on_train_batch_end``: objective, constraints, Jacobian, backward,
reduce, optimizer step, logging). The optimizers run interleaved in the same process, ``--repeats``
times, in a rotating order; the script prints the median step time of each and its ratio to Adam(unc).

    python benchmarks/bench_burgers.py [--steps 30] [--repeats 5] [--threads 1] [--batch-mode full]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import lightning as L
import torch

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from harness import StepTimer, quiet  # benchmarks/harness.py (scripts run from benchmarks/)
from lit_constrained.tasks.burgers import Burgers, BurgersData

# functools.partial, not lambdas: the module stores its optimizer as class path + init args
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam_unc": functools.partial(torch.optim.Adam, lr=1e-3, eps=1e-7),
    "sqp_adam": functools.partial(SQPAdam, lr=1e-3, rho=1.0),
    "sqp_heavyball": functools.partial(SQPHeavyBall, lr=1e-3, rho=1.0),
    "adam_con": functools.partial(AdamCon, lr=1e-3, eps=1e-7),
}


def time_steps(name: str, data: BurgersData, steps: int, threads: int, warmup: int) -> float:
    """Median seconds per training step of one short fit."""
    L.seed_everything(0, verbose=False)
    task = Burgers(optimizer=OPTIMIZERS[name], num_threads=threads)
    timer = StepTimer()
    trainer = L.Trainer(max_steps=steps + warmup, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer],
                        log_every_n_steps=50)
    trainer.fit(task, data)
    return statistics.median(timer.times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per fit")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each fit")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved fits per optimizer")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--n-train", type=int, default=10, help="training initial conditions (paper: 100)")
    parser.add_argument("--batch-mode", choices=["full", "minibatch"], default="full")
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    args = parser.parse_args()
    quiet()

    data = BurgersData(batch_mode=args.batch_mode, n_train=args.n_train, n_val=1, n_test=1, cache_dir=None)
    data.setup("fit")
    names = list(dict.fromkeys(["adam_unc", *args.optimizers]))
    results: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for name in order:
            results[name].append(time_steps(name, data, args.steps, args.threads, args.warmup))
    rows = len(data.tensors["train_u"])
    per_step = rows if args.batch_mode == "full" else int(round(rows * data.batch_fraction))
    print(f"Burgers, {args.n_train} ICs, batch_mode={args.batch_mode} ({per_step} rows/step), threads={args.threads}, "
          f"{args.repeats} x {args.steps} steps per optimizer (median of per-fit medians)")
    base = statistics.median(results["adam_unc"])
    for name in names:
        med = statistics.median(results[name])
        spread = ", ".join(f"{1e3 * t:.1f}" for t in results[name])
        print(f"  {name:14s} {1e3 * med:7.1f} ms/step   ratio vs adam_unc {med / base:5.2f}   (fits: {spread})")


if __name__ == "__main__":
    main()
