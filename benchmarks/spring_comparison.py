"""The paper's spring comparison (2601.11795 section 5.1, Figure 1) with this package.

Trains the spring task (Lightning Trainer, one process, CPU, as ``lit-constrained fit`` would) with
SQP-Adam(con), SQP-HeavyBall(con), Adam(con) and Adam(unc) at the paper's hyper-parameters
(betas = (0.9, 0.999), beta = 0.9, eps = 1e-7, rho = 1, h = 1) for each learning rate and seed, and
reports, at every ``--report-every`` epochs and at the end: the objective on all training points,
the test MSE against the exact solution (500 points), the max |residual| at the 3 constraint points
and at all 30 collocation points.

    python benchmarks/spring_comparison.py                       # full batch, lr 5e-4 and 1e-4, seed 0
    python benchmarks/spring_comparison.py --batch-mode minibatch --seeds 0 1 2 3 4
    python benchmarks/spring_comparison.py --methods sqp_adam --rho full --epochs 5000

Prints a table (mean and std over seeds when there are several) and optionally writes all curves as
JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lit_constrained.optim import AdamCon, MoMoAdam, SQPAdam, SQPHeavyBall
from lit_constrained.tasks.spring import Spring, SpringData

METHODS: dict[str, str] = {
    "sqp_adam": "SQP-Adam(con)",
    "sqp_heavyball": "SQP-HeavyBall(con)",
    "adam_con": "Adam(con)",
    "adam_unc": "Adam(unc)",
    "momo_adam": "MoMo-Adam(unc)",
}


def make_optimizer(method: str, lr: float, rho: float | str) -> Any:
    if method == "sqp_adam":
        return partial(SQPAdam, lr=lr, betas=(0.9, 0.999), eps=1e-7, rho=rho, h=1.0)
    if method == "sqp_heavyball":
        return partial(SQPHeavyBall, lr=lr, beta=0.9, rho=rho, h=1.0)
    if method == "adam_con":
        return partial(AdamCon, lr=lr, betas=(0.9, 0.999), eps=1e-7, rho=rho)
    if method == "adam_unc":
        return partial(torch.optim.Adam, lr=lr, betas=(0.9, 0.999), eps=1e-7)
    if method == "momo_adam":
        return partial(MoMoAdam, lr=lr, lower_bound=0.0)
    raise ValueError(f"unknown method {method!r}; choose from {sorted(METHODS)}")


class Recorder(Callback):
    """At each validation: epoch, objective on all training points, test MSE, violations."""

    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, module: Spring) -> None:
        if trainer.sanity_checking:
            return
        with torch.enable_grad():
            batch = {k: v.to(module.dtype) for k, v in self.batch.items()}
            constraints = module.constraints(batch).detach().abs().max()
        metrics = trainer.callback_metrics
        self.rows.append(
            {
                "epoch": trainer.current_epoch + 1,
                "objective": float(metrics["Objective/val"]),
                "test_mse": float(metrics["val/mse"]),
                "violation_constraints": float(constraints),
                "violation_all": float(metrics["residual/val"]),
            }
        )


def run(method: str, lr: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    L.seed_everything(seed, verbose=False)
    data = SpringData(batch_mode=args.batch_mode, batch_fraction=0.5)
    rho = args.rho if args.rho == "full" else float(args.rho)
    task = Spring(optimizer=make_optimizer(method, lr, rho), num_threads=args.threads)
    recorder = Recorder(next(iter(data.val_dataloader())))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        check_val_every_n_epoch=args.report_every,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    start = time.perf_counter()
    trainer.fit(task, data)
    return {"method": method, "lr": lr, "seed": seed, "seconds": time.perf_counter() - start,
            "curve": recorder.rows}


def summarize(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3e}"
    return f"{statistics.mean(values):.3e} ± {statistics.stdev(values):.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["sqp_adam", "sqp_heavyball", "adam_con", "adam_unc"],
                        choices=sorted(METHODS))
    parser.add_argument("--lrs", nargs="+", type=float, default=[5e-4, 1e-4])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--batch-mode", choices=["full", "minibatch"], default="full")
    parser.add_argument("--epochs", type=int, default=10000)
    parser.add_argument("--report-every", type=int, default=1000)
    parser.add_argument("--rho", default="1.0", help="normal-step scale of the constrained methods, or 'full'")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write every run's curve to this JSON file")
    args = parser.parse_args()
    if args.epochs % args.report_every:
        parser.error("--epochs must be a multiple of --report-every (the last report is the final one)")

    results = []
    for lr in args.lrs:
        for method in args.methods:
            for seed in args.seeds:
                result = run(method, lr, seed, args)
                final = result["curve"][-1]
                print(f"{METHODS[method]:20s} lr={lr:.0e} seed={seed} {result['seconds']:6.1f}s  "
                      f"objective={final['objective']:.3e} test_mse={final['test_mse']:.3e} "
                      f"|c|max={final['violation_constraints']:.3e}", flush=True)
                results.append(result)

    print(f"\nSpring, {args.batch_mode} batch, {args.epochs} epochs, rho={args.rho}, seeds {args.seeds}")
    checkpoints = sorted({row["epoch"] for r in results for row in r["curve"]})
    shown = [e for e in checkpoints if e in (args.epochs // 2, args.epochs)]
    for epoch in shown:
        print(f"\nepoch {epoch}")
        print(f"{'method':20s} {'lr':>7s}  {'objective':>22s} {'test MSE':>22s} {'max|c| (3 pts)':>22s}")
        for lr in args.lrs:
            for method in args.methods:
                rows = [row for r in results if r["method"] == method and r["lr"] == lr
                        for row in r["curve"] if row["epoch"] == epoch]
                print(f"{METHODS[method]:20s} {lr:7.0e}  {summarize([r['objective'] for r in rows]):>22s} "
                      f"{summarize([r['test_mse'] for r in rows]):>22s} "
                      f"{summarize([r['violation_constraints'] for r in rows]):>22s}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "runs": results}, handle, indent=1)


if __name__ == "__main__":
    main()
