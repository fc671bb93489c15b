"""Whole training steps on an accelerator: SQP-Adam(con) against Adam(unc), per task.

For each task (embedded sizes; Darcy also at the paper's size), a Trainer fit of ``--steps`` steps
per optimizer on ``--accelerator`` (default gpu), the optimizers interleaved over ``--rounds``
(A, B, A, B, ...). A step is timed from ``on_train_batch_start`` to ``on_train_batch_end`` with a
device synchronize at both ends (objective, constraints, Jacobian, backward, collective, optimizer
step, logging); the first ``--warmup`` steps of each fit are dropped. Prints the median step time of
each optimizer and the ratio SQP-Adam / Adam(unc) per task (the paper's authors report 2.2x / 2.3x /
1.4x / 3.0x for spring / chemistry / Burgers / Darcy on their GPU).

    python benchmarks/bench_gpu_steps.py [--accelerator gpu] [--steps 40] [--rounds 3] [--tasks ...]
    python benchmarks/bench_gpu_steps.py --optimizer-only [--sizes 1e5 1e6] [--ms 10 50]

``--optimizer-only`` times ``optimizer.step()`` alone instead (the constrained optimizers against
torch Adam(foreach), random gradient, c and J, on the device).
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import lightning.pytorch as pl
import torch

from harness import StepTimer, interleaved_medians, quiet, repeated  # benchmarks/harness.py
from lit_constrained.optim import SQPAdam


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "SQP-Adam(con)": functools.partial(SQPAdam, lr=1e-4),
    "Adam(unc)": functools.partial(torch.optim.Adam, lr=1e-4),
}


def make(task: str, optimizer: Callable[..., torch.optim.Optimizer]) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    from lit_constrained import tasks

    if task == "spring":
        return tasks.Spring(optimizer=optimizer), tasks.SpringData()
    if task == "chemistry":
        return tasks.Chemistry(optimizer=optimizer), tasks.ChemistryData()
    if task == "burgers":
        return tasks.Burgers(optimizer=optimizer), tasks.BurgersData()
    if task in ("darcy", "darcy_paper"):
        modes = (16, 16) if task == "darcy_paper" else (8, 8)
        return (tasks.Darcy(n_modes=modes, optimizer=optimizer),
                tasks.DarcyData(batch_mode="minibatch"))
    raise ValueError(f"unknown task {task!r}")


def median_step(task: str, name: str, accelerator: str, steps: int, warmup: int) -> float:
    pl.seed_everything(0, verbose=False)
    module, data = make(task, OPTIMIZERS[name])
    timer = StepTimer()
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_steps=steps + warmup, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer], log_every_n_steps=50)
    trainer.fit(module, datamodule=data)
    return statistics.median(timer.times[warmup:])


def optimizer_steps(device: torch.device, sizes: list[int], ms: list[int], repeats: int, block: int) -> None:
    """``optimizer.step()`` alone on ``device``: the constrained optimizers against torch Adam (foreach)
    on n parameters (one flat tensor split in 10 layers), random gradient, c and a random J (m x n,
    float32), interleaved blocks of ``block`` steps, ``repeats`` times, medians."""
    from lit_constrained.optim import AdamCon, SQPHeavyBall

    makers: dict[str, Callable[..., torch.optim.Optimizer]] = {
        "torch Adam": functools.partial(torch.optim.Adam, lr=1e-6, foreach=True),
        "SQP-Adam": functools.partial(SQPAdam, lr=1e-6),
        "SQP-HeavyBall": functools.partial(SQPHeavyBall, lr=1e-6),
        "Adam(con)": functools.partial(AdamCon, lr=1e-6),
    }
    print("| n | m | " + " | ".join(f"{k} ms" for k in makers) + " | SQP-Adam / Adam |")
    print("|---|---|" + "---|" * (len(makers) + 1))
    for n in sizes:
        for m in ms:
            gen = torch.Generator().manual_seed(0)
            runners = {}
            for name, make_opt in makers.items():
                params = [torch.nn.Parameter(torch.randn(n // 10, generator=gen).to(device)) for _ in range(10)]
                for p in params:
                    p.grad = torch.randn(p.shape, generator=gen).to(device)
                c = torch.randn(m, generator=gen).to(device)
                J = torch.randn(m, 10 * (n // 10), generator=gen).to(device)
                opt = make_opt(params)
                requires = getattr(opt, "requires", frozenset())
                kwargs = {k: v for k, v in (("constraints", c), ("jacobian", J)) if k in requires}
                runners[name] = repeated(functools.partial(opt.step, **kwargs))
            medians = interleaved_medians(runners, repeats, block, warmup=block, device=device)
            print(f"| {n:.0e} | {m} | " + " | ".join(f"{1e3 * medians[k]:.3f}" for k in makers)
                  + f" | {medians['SQP-Adam'] / medians['torch Adam']:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizer-only", action="store_true",
                        help="time optimizer.step() alone (n = --sizes, m = --ms) instead of the task steps")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6])
    parser.add_argument("--ms", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--tasks", nargs="+", default=["spring", "chemistry", "burgers", "darcy", "darcy_paper"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    quiet()
    device = torch.cuda.get_device_name(0) if args.accelerator == "gpu" and torch.cuda.is_available() else args.accelerator
    if args.optimizer_only:
        torch_device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
        print(f"device: {device}; torch {torch.__version__}; optimizer.step() alone, {args.rounds * 5} blocks of 5 steps")
        optimizer_steps(torch_device, [int(n) for n in args.sizes], args.ms, repeats=args.rounds * 5, block=5)
        return
    print(f"device: {device}; torch {torch.__version__}; {args.rounds} interleaved rounds of {args.steps} steps")
    print("| task | SQP-Adam(con) ms/step | Adam(unc) ms/step | ratio (median of rounds) |")
    print("|---|---|---|---|")
    for task in args.tasks:
        times: dict[str, list[float]] = {name: [] for name in OPTIMIZERS}
        ratios = []
        for _ in range(args.rounds):
            for name in OPTIMIZERS:
                times[name].append(median_step(task, name, args.accelerator, args.steps, args.warmup))
            ratios.append(times["SQP-Adam(con)"][-1] / times["Adam(unc)"][-1])
        print(f"| {task} | {1e3 * statistics.median(times['SQP-Adam(con)']):.2f} | "
              f"{1e3 * statistics.median(times['Adam(unc)']):.2f} | {statistics.median(ratios):.2f}x |", flush=True)


if __name__ == "__main__":
    main()
