r"""Learning-rate sweep: does a model-based step size (MoMo) widen the range of good learning rates, with
and without hard constraints? (issue 18)

For each task, method, lr and seed: train (Lightning Trainer, one process, CPU, logger off, one torch
thread) for a fixed number of optimizer steps at a constant lr, full batch, then record the final test
error (the task's validation metric against the exact solution: ``val/mse`` for curve and spring,
``val/rel_l2`` for Burgers), max |c| over the constraints of the first training batch at the start and at
the end. A run whose step fails on a non-finite value counts as error = inf.

Methods (package defaults except the lr): Adam(unc) (``torch.optim.Adam``, eps = 1e-7), MoMo-Adam(unc)
(f* = 0), SQP-Adam(con) (``rho="full"``), SQP-MoMo-Adam(con) with the exact D-norm prox
(``geometry="adam"``, f* = 0, ``rho="full"``) and SQP-MoMo-Adam(con) in SQP-Adam's Euclidean geometry
(``geometry="euclidean"``).

Per task and method the table gives the best mean (over seeds) final test error over the lrs, the lr where
it occurs, the width of the good-lr range (largest / smallest lr of the contiguous stretch of lrs around
the best whose mean error is within ``--tolerance``, 2x, of the best) and max |c_end| / max |c_0| at the
best lr (worst seed). The verdict checks the issue's goal per constrained MoMo method against SQP-Adam:
range >= 10x wider, best error within 1.5x, max |c_end| <= 1e-4 max |c_0|. One figure: mean final test
error against the lr, one panel per task.

    python -m lit_constrained.compare.sweep --tasks curve --steps curve=300 --json sweep.json --figure fig.png
    python -m lit_constrained.compare.sweep --report sweep.json --figure fig.png   # from saved records

Entry point for the CLI: :func:`main` (``main(argv: list[str] | None = None) -> int``). The records file is
resumable: a (task, method, lr, seed, steps) already in it is skipped, and it is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from pathlib import Path
from typing import Any

import torch

from .records import write_json
from .runner import exit_with_parent

METHODS: dict[str, str] = {
    "adam_unc": "Adam(unc)",
    "momo_adam_unc": "MoMo-Adam(unc)",
    "sqp_adam": "SQP-Adam(con)",
    "sqp_momo_adam": "SQP-MoMo-Adam(con)",
    "sqp_momo_adam_euclidean": "SQP-MoMo-Adam(con), Euclidean",
}
"""Method key -> label, in table order."""

TASKS = ("curve", "spring", "burgers")
RECOMMENDED_STEPS = {"curve": 300, "spring": 5000, "burgers": 1000}
"""Full-batch optimizer steps of the shipped configs (configs/<task>/*.yaml): the recommended budget."""

DEFAULT_LRS = [10 ** (e / 2) for e in range(-10, 1)]
"""1e-5 ... 1 by factors of sqrt(10) (11 values)."""

GOAL_RANGE_RATIO = 10.0
GOAL_ERROR_RATIO = 1.5
GOAL_VIOLATION_RATIO = 1e-4


def make_optimizer(method: str, lr: float) -> Any:
    """The optimizer factory (a partial of the class) of a method at lr."""
    from lit_constrained.optim import MoMoAdam, SQPAdam
    from lit_constrained.optim.experimental import SQPMoMoAdam

    if method == "adam_unc":
        return partial(torch.optim.Adam, lr=lr, betas=(0.9, 0.999), eps=1e-7)
    if method == "momo_adam_unc":
        return partial(MoMoAdam, lr=lr, lower_bound=0.0)
    if method == "sqp_adam":
        return partial(SQPAdam, lr=lr, rho="full")
    if method == "sqp_momo_adam":
        return partial(SQPMoMoAdam, lr=lr, lower_bound=0.0, rho="full", geometry="adam")
    if method == "sqp_momo_adam_euclidean":
        return partial(SQPMoMoAdam, lr=lr, lower_bound=0.0, rho="full", geometry="euclidean")
    raise ValueError(f"Unknown method {method!r}; choose from {list(METHODS)}.")


def make_task(task: str, optimizer: Any, seed: int) -> tuple[Any, Any, str]:
    """(module, datamodule, metric name) at the shipped configs' sizes, full batch."""
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
    raise ValueError(f"Unknown task {task!r}; choose from {list(TASKS)}.")


def _max_violation(module: Any, batch: Any) -> float:
    with torch.enable_grad():
        c = module.constraints(batch)
    return float(c.detach().abs().max()) if c is not None and c.numel() else 0.0


def _first_batch(module: Any, data: Any) -> Any:
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    dtype = next(module.parameters()).dtype
    return torch.utils._pytree.tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, batch
    )


def run_one(task: str, method: str, lr: float, seed: int, steps: int) -> dict[str, Any]:
    """Train one (task, method, lr, seed) for ``steps`` optimizer steps; its record."""
    import lightning as L

    torch.set_num_threads(1)
    L.seed_everything(seed, verbose=False)
    module, data, metric = make_task(task, make_optimizer(method, lr), seed)
    batch = _first_batch(module, data)
    c0 = _max_violation(module, batch)
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
    c_end = _max_violation(module, batch)
    if not math.isfinite(error) or not math.isfinite(c_end):
        error = math.inf
    return {"task": task, "method": method, "lr": lr, "seed": seed, "steps": steps, "error": error,
            "c0": c0, "c_end": c_end, "status": status, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------- the summary


def mean_errors(runs: list[dict], task: str, method: str) -> dict[float, float]:
    """lr -> mean final test error over seeds (inf if any seed failed), in increasing lr."""
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
    if not lrs:
        raise ValueError("No runs to summarize.")
    best_i = min(range(len(lrs)), key=lambda i: errors[lrs[i]])
    best = errors[lrs[best_i]]
    lo = hi = best_i
    while lo > 0 and errors[lrs[lo - 1]] <= tolerance * best:
        lo -= 1
    while hi < len(lrs) - 1 and errors[lrs[hi + 1]] <= tolerance * best:
        hi += 1
    return best, lrs[best_i], lrs[lo], lrs[hi]


def summary(runs: list[dict], tolerance: float) -> list[dict[str, Any]]:
    """One row per (task, method) present: best, at_lr, lo, hi, width, violation_ratio (None if unconstrained),
    seeds, steps."""
    rows = []
    for task in dict.fromkeys(r["task"] for r in runs):
        for method in METHODS:
            mine = [r for r in runs if r["task"] == task and r["method"] == method]
            if not mine:
                continue
            best, at, lo, hi = good_range(mean_errors(runs, task, method), tolerance)
            ratios = [r["c_end"] / r["c0"] for r in mine if r["lr"] == at and r["c0"] > 0]
            constrained = method.startswith("sqp")
            rows.append({"task": task, "method": method, "best": best, "at_lr": at, "lo": lo, "hi": hi,
                         "width": hi / lo, "violation_ratio": max(ratios) if ratios and constrained else None,
                         "seeds": len({r["seed"] for r in mine}), "steps": sorted({r["steps"] for r in mine})})
    return rows


def report(runs: list[dict], tolerance: float) -> str:
    """The markdown table of :func:`summary`."""
    lines = [f"| task | steps | method | best mean test error | at lr | good-lr range (within {tolerance:g}x) "
             "| width | max abs c_end / max abs c_0 at best lr |",
             "|---|---|---|---|---|---|---|---|"]
    for row in summary(runs, tolerance):
        ratio = "(unconstrained)" if row["violation_ratio"] is None else f"{row['violation_ratio']:.1e}"
        steps = ",".join(str(s) for s in row["steps"])
        lines.append(f"| {row['task']} | {steps} | {METHODS[row['method']]} | {row['best']:.3e} | {row['at_lr']:.1e} "
                     f"| {row['lo']:.1e} .. {row['hi']:.1e} | {row['width']:.3g}x | {ratio} |")
    return "\n".join(lines)


def per_lr_table(runs: list[dict], task: str) -> str:
    """Mean final test error per lr (rows) and method (columns) of one task."""
    methods = [m for m in METHODS if any(r["task"] == task and r["method"] == m for r in runs)]
    errors = {m: mean_errors(runs, task, m) for m in methods}
    lrs = sorted({lr for e in errors.values() for lr in e})
    lines = [f"| {task}: lr | " + " | ".join(METHODS[m] for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for lr in lrs:
        cells = [f"{errors[m][lr]:.2e}" if lr in errors[m] else "-" for m in methods]
        lines.append(f"| {lr:.1e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(runs: list[dict], tolerance: float) -> str:
    """The issue's goal, per constrained MoMo method and task, against SQP-Adam(con)."""
    rows = {(r["task"], r["method"]): r for r in summary(runs, tolerance)}
    lines = []
    for method in ("sqp_momo_adam", "sqp_momo_adam_euclidean"):
        met_tasks = []
        for task in dict.fromkeys(r["task"] for r in runs):
            ours, base = rows.get((task, method)), rows.get((task, "sqp_adam"))
            if ours is None or base is None:
                continue
            range_ok = ours["width"] >= GOAL_RANGE_RATIO * base["width"]
            error_ok = ours["best"] <= GOAL_ERROR_RATIO * base["best"]
            ratio = ours["violation_ratio"]
            feasible = ratio is not None and ratio <= GOAL_VIOLATION_RATIO
            if range_ok and error_ok and feasible:
                met_tasks.append(task)
            lines.append(f"- {task}, {METHODS[method]}: range {ours['width']:.3g}x vs SQP-Adam {base['width']:.3g}x "
                         f"({'ok' if range_ok else 'missed'}); best {ours['best']:.2e} = "
                         f"{ours['best'] / base['best']:.2f}x SQP-Adam's ({'ok' if error_ok else 'missed'}); "
                         f"max|c| ratio {ratio:.1e} ({'ok' if feasible else 'missed'})"
                         if ratio is not None else f"- {task}, {METHODS[method]}: no constraint record")
        if any(method == m for _, m in rows):
            lines.append(f"- {METHODS[method]}: goal met on {len(met_tasks)} task(s) {met_tasks} "
                         f"(needs 2): {'MET' if len(met_tasks) >= 2 else 'MISSED'}")
    return "\n".join(lines)


def figure(runs: list[dict], path: str | Path) -> None:
    """Mean final test error against lr, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        steps = sorted({r["steps"] for r in runs if r["task"] == task})
        for method, label in METHODS.items():
            errors = mean_errors(runs, task, method)
            if errors:
                lrs = list(errors)
                ax.plot(lrs, [errors[lr] if math.isfinite(errors[lr]) else float("nan") for lr in lrs],
                        marker="o", ms=3, label=label, ls="--" if "unc" in method else "-")
        ax.set(xscale="log", yscale="log", xlabel="lr (cap for the MoMo methods)", ylabel="mean final test error",
               title=f"{task} ({','.join(map(str, steps))} steps)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- the command


def parse_steps(items: Sequence[str]) -> dict[str, int]:
    """``["curve=300", "spring=500"]`` (or one number for every task) -> task -> steps."""
    out: dict[str, int] = {}
    for item in items:
        task, sep, value = item.rpartition("=")
        try:
            steps = int(value)
        except ValueError:
            raise ValueError(f"Invalid --steps {item!r}: TASK=STEPS (e.g. spring=500) or one number.") from None
        if steps < 1:
            raise ValueError(f"Invalid --steps {item!r}: the steps must be >= 1.")
        if sep:
            if task not in TASKS:
                raise ValueError(f"Invalid --steps {item!r}: unknown task {task!r}; choose from {list(TASKS)}.")
            out[task] = steps
        else:
            out.update({t: steps for t in TASKS})
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lit_constrained.compare.sweep", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", nargs="+", type=float, default=DEFAULT_LRS, help="default: 1e-5 .. 1 by sqrt(10)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", nargs="+", default=[],
                        help="optimizer steps per run: TASK=STEPS and/or one number for all; default: the "
                             f"recommended budget {RECOMMENDED_STEPS}")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (processes, one thread each)")
    parser.add_argument("--tolerance", type=float, default=2.0, help="good-lr range: within this factor of the best")
    parser.add_argument("--json", default=None, help="the records file (resumed and rewritten after every run)")
    parser.add_argument("--report", default=None, help="only summarize this records file (no training)")
    parser.add_argument("--figure", default=None, help="write the figure here")
    return parser


def _load(path: str | Path | None) -> list[dict]:
    if path is None or not Path(path).exists():
        return []
    return json.loads(Path(path).read_text())["runs"]


def _save(path: str | Path, runs: list[dict]) -> None:
    write_json(path, {"runs": runs}, indent=0)


def sweep(tasks: Sequence[str], methods: Sequence[str], lrs: Sequence[float], seeds: Sequence[int],
          steps: dict[str, int], *, workers: int = 1, json_path: str | Path | None = None,
          runs: list[dict] | None = None, echo: bool = True) -> list[dict]:
    """Run every (task, method, lr, seed) not yet in ``runs`` (or the records file); all the records."""
    runs = list(runs if runs is not None else _load(json_path))
    done = {(r["task"], r["method"], r["lr"], r["seed"], r["steps"]) for r in runs}
    todo = [(task, method, lr, seed, steps.get(task, RECOMMENDED_STEPS[task]))
            for task in tasks for seed in seeds for lr in lrs for method in methods]
    todo = [job for job in todo if job not in done]

    def record(r: dict) -> None:
        runs.append(r)
        if echo:
            print(f"{r['task']:8s} {METHODS[r['method']]:31s} lr={r['lr']:.1e} seed={r['seed']} "
                  f"{r['seconds']:6.1f}s error={r['error']:.3e} |c| {r['c0']:.1e} -> {r['c_end']:.1e} "
                  f"{r['status']}", flush=True)
        if json_path:  # after every run: an interrupted sweep keeps what it did
            _save(json_path, runs)

    if workers <= 1:
        for job in todo:
            record(run_one(*job))
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
            for future in as_completed([pool.submit(run_one, *job) for job in todo]):
                record(future.result())
    return runs


def main(argv: list[str] | None = None) -> int:
    """``python -m lit_constrained.compare.sweep [options]``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        steps = parse_steps(args.steps)
    except ValueError as error:
        build_parser().error(str(error))
    if args.report:
        runs = _load(args.report)
        if not runs:
            build_parser().error(f"--report {args.report}: no records there.")
    else:
        runs = sweep(args.tasks, args.methods, args.lrs, args.seeds, steps, workers=args.workers,
                     json_path=args.json)
    print(report(runs, args.tolerance))
    for task in dict.fromkeys(r["task"] for r in runs):
        print(f"\n{per_lr_table(runs, task)}")
    print(verdict(runs, args.tolerance))
    if args.figure:
        figure(runs, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
