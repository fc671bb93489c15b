"""Learning-rate sweep: does MoMo's model-based step widen the range of good learning rates, with and
without hard constraints? (issue 18)

For each task, method, lr and seed: train (Lightning Trainer, one process, CPU, logger off) for a fixed
number of steps at a constant lr, then record the final test error (the task's validation metric against
the exact solution: ``val/mse`` for curve and spring, ``val/rel_l2`` for Burgers), the final max |c| over
the constraints of the first training batch and its initial value. A run whose step fails on a
non-finite value counts as error = inf.

Methods (all with the package defaults except the lr): Adam(unc) (``torch.optim.Adam``, eps = 1e-7),
MoMo-Adam(unc) (f* = 0), SQP-Adam(con) and SQP-MoMo-Adam(con) (f* = 0), the constrained ones with
``rho="full"``.

Per method the table gives: the best mean (over seeds) final test error over the lrs, the lr where it
occurs, and the width of its good-lr range: largest / smallest lr of the contiguous stretch of lrs around
the best one whose mean error is within ``--tolerance`` (2x) of the best; plus max |c_end| / max |c_0| at
the best lr. One figure: mean final test error against the lr, one panel per task.

    python benchmarks/sqp_momo_sweep.py --tasks curve --steps 300 --json sweep.json --figure docs/figures/x.png
    python benchmarks/sqp_momo_sweep.py --report sweep.json --figure ...     # table/figure from a saved sweep

The sweep of the issue: lrs 1e-5 to 1 by factors of sqrt(10) (``--lrs`` default), 3 seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch

METHODS: dict[str, str] = {
    "adam_unc": "Adam(unc)",
    "momo_adam_unc": "MoMo-Adam(unc)",
    "sqp_adam": "SQP-Adam(con)",
    "sqp_momo_adam": "SQP-MoMo-Adam(con)",
}
DEFAULT_LRS = [10 ** (e / 2) for e in range(-10, 1)]  # 1e-5 ... 1 by sqrt(10)


def make_optimizer(method: str, lr: float) -> Any:
    from lit_constrained.optim import MoMoAdam, SQPAdam, SQPMoMoAdam

    if method == "adam_unc":
        return partial(torch.optim.Adam, lr=lr, betas=(0.9, 0.999), eps=1e-7)
    if method == "momo_adam_unc":
        return partial(MoMoAdam, lr=lr, lower_bound=0.0)
    if method == "sqp_adam":
        return partial(SQPAdam, lr=lr, rho="full")
    if method == "sqp_momo_adam":
        return partial(SQPMoMoAdam, lr=lr, lower_bound=0.0, rho="full")
    raise ValueError(f"unknown method {method!r}; choose from {sorted(METHODS)}")


def make_task(task: str, optimizer: Any, seed: int) -> tuple[Any, Any, str]:
    """(module, datamodule, metric name) at the tasks' default sizes, full batch."""
    if task == "curve":
        from lit_constrained.tasks.curve import CurveData, CurveFit

        return CurveFit(optimizer=optimizer, num_threads=1), CurveData(seed=seed), "val/mse"
    if task == "spring":
        from lit_constrained.tasks.spring import Spring, SpringData

        return Spring(optimizer=optimizer, num_threads=1), SpringData(batch_mode="full"), "val/mse"
    if task == "burgers":
        from lit_constrained.tasks.burgers import Burgers, BurgersData

        data = BurgersData(batch_mode="full", batch_fraction=0.2, n_train=10)
        return Burgers(optimizer=optimizer, num_threads=1), data, "val/rel_l2"
    raise ValueError(f"unknown task {task!r}")


def max_violation(module: Any, batch: Any) -> float:
    with torch.enable_grad():
        c = module.constraints(batch)
    return float(c.detach().abs().max()) if c is not None and c.numel() else 0.0


def first_batch(module: Any, data: Any) -> Any:
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    dtype = next(module.parameters()).dtype
    return torch.utils._pytree.tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, batch
    )


def run(task: str, method: str, lr: float, seed: int, steps: int) -> dict[str, Any]:
    import lightning as L

    L.seed_everything(seed, verbose=False)
    module, data, metric = make_task(task, make_optimizer(method, lr), seed)
    batch = first_batch(module, data)
    c0 = max_violation(module, batch)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=-1, check_val_every_n_epoch=None,
        val_check_interval=steps, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    start = time.perf_counter()
    status = "ok"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data)
        error = float(trainer.callback_metrics[metric])
    except (FloatingPointError, ValueError) as failure:  # a non-finite objective / step
        status, error = f"diverged: {str(failure)[:80]}", math.inf
    c_end = max_violation(module, batch)
    if not math.isfinite(error) or not math.isfinite(c_end):
        error = math.inf
    return {"task": task, "method": method, "lr": lr, "seed": seed, "steps": steps, "error": error,
            "c0": c0, "c_end": c_end, "status": status, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------- the summary


def mean_errors(runs: list[dict], task: str, method: str) -> dict[float, float]:
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        if r["task"] == task and r["method"] == method:
            by_lr.setdefault(r["lr"], []).append(r["error"])
    return {lr: (statistics.fmean(v) if all(math.isfinite(e) for e in v) else math.inf)
            for lr, v in sorted(by_lr.items())}


def good_range(errors: dict[float, float], tolerance: float) -> tuple[float, float, float, float]:
    """(best error, best lr, smallest good lr, largest good lr): the contiguous stretch of lrs around the
    best whose mean error is <= tolerance x the best."""
    lrs = sorted(errors)
    best_i = min(range(len(lrs)), key=lambda i: errors[lrs[i]])
    best = errors[lrs[best_i]]
    lo = hi = best_i
    while lo > 0 and errors[lrs[lo - 1]] <= tolerance * best:
        lo -= 1
    while hi < len(lrs) - 1 and errors[lrs[hi + 1]] <= tolerance * best:
        hi += 1
    return best, lrs[best_i], lrs[lo], lrs[hi]


def report(runs: list[dict], tolerance: float) -> str:
    lines = ["| task | method | best mean test error | at lr | good-lr range (within "
             f"{tolerance:g}x) | width | max abs c_end / max abs c_0 at best lr |",
             "|---|---|---|---|---|---|---|"]
    for task in dict.fromkeys(r["task"] for r in runs):
        for method in METHODS:
            errors = mean_errors(runs, task, method)
            if not errors:
                continue
            best, at, lo, hi = good_range(errors, tolerance)
            ratios = [r["c_end"] / r["c0"] for r in runs if r["task"] == task and r["method"] == method
                      and r["lr"] == at and r["c0"] > 0]
            ratio = f"{max(ratios):.1e}" if ratios and method.startswith("sqp") else "(unconstrained)"
            lines.append(f"| {task} | {METHODS[method]} | {best:.3e} | {at:.1e} | {lo:.1e} .. {hi:.1e} | "
                         f"{hi / lo:.3g}x | {ratio} |")
    return "\n".join(lines)


def figure(runs: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method, label in METHODS.items():
            errors = mean_errors(runs, task, method)
            if errors:
                lrs = list(errors)
                ax.plot(lrs, [errors[lr] if math.isfinite(errors[lr]) else float("nan") for lr in lrs],
                        marker="o", label=label, ls="--" if "unc" in method else "-")
        ax.set(xscale="log", yscale="log", xlabel="lr", ylabel="mean final test error", title=task)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["curve", "spring", "burgers"],
                        choices=["curve", "spring", "burgers"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", nargs="+", type=float, default=DEFAULT_LRS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (the budget)")
    parser.add_argument("--tolerance", type=float, default=2.0)
    parser.add_argument("--json", default=None, help="write (append to) the runs to this JSON file")
    parser.add_argument("--report", default=None, help="only print the table / draw the figure of this JSON file")
    parser.add_argument("--figure", default=None)
    args = parser.parse_args()

    runs: list[dict] = []
    if args.report:
        runs = json.loads(Path(args.report).read_text())["runs"]
    else:
        torch.set_num_threads(1)
        if args.json and Path(args.json).exists():
            runs = json.loads(Path(args.json).read_text())["runs"]
        done = {(r["task"], r["method"], r["lr"], r["seed"], r["steps"]) for r in runs}
        for task in args.tasks:
            for seed in args.seeds:
                for lr in args.lrs:
                    for method in args.methods:
                        if (task, method, lr, seed, args.steps) in done:
                            continue
                        r = run(task, method, lr, seed, args.steps)
                        runs.append(r)
                        print(f"{task:8s} {METHODS[method]:20s} lr={lr:.1e} seed={seed} {r['seconds']:5.1f}s "
                              f"error={r['error']:.3e} |c| {r['c0']:.1e} -> {r['c_end']:.1e} {r['status']}",
                              flush=True)
                        if args.json:  # after every run: an interrupted sweep keeps what it did
                            Path(args.json).write_text(json.dumps({"runs": runs}, indent=0))
    print(report(runs, args.tolerance))
    if args.figure:
        figure(runs, args.figure)


if __name__ == "__main__":
    main()
