"""The paper's Burgers comparison (2601.11795 section 5.3) at the embedded size, one seed.

Four methods (SQP-Adam(con), SQP-HeavyBall(con), Adam(con), Adam(unc)) at the paper's two learning
rates (1e-3, 5e-4), rho = 1, h = 1, betas = (0.9, 0.999), beta = 0.9, eps = 1e-7; optionally
the SQP methods again with ``rho = "full"`` (rho = 1 / lr). Each run trains the same seeded network
with Lightning for ``--epochs`` epochs, then reports the final full-batch training objective, the
constraint violation max |c| at the m = 10 constraint rows, and the test relative L2 error on the
held-out initial conditions (``trainer.test``).

    python benchmarks/burgers_comparison.py [--epochs 1000] [--batch-mode full] [--n-train 10] [--rho-full]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from harness import quiet  # benchmarks/harness.py (scripts run from benchmarks/)
from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from lit_constrained.tasks.burgers import Burgers, BurgersData
from lit_constrained.batch import cast_floats


def make_optimizer(method: str, lr: float, rho: Any) -> Callable[..., torch.optim.Optimizer]:
    """The method's optimizer factory (a functools.partial: the module stores it as class path + init args)."""
    if method == "SQP-Adam(con)":
        return functools.partial(SQPAdam, lr=lr, betas=(0.9, 0.999), eps=1e-7, rho=rho, h=1.0)
    if method == "SQP-HeavyBall(con)":
        return functools.partial(SQPHeavyBall, lr=lr, beta=0.9, rho=rho, h=1.0)
    if method == "Adam(con)":
        return functools.partial(AdamCon, lr=lr, betas=(0.9, 0.999), eps=1e-7)
    if method == "Adam(unc)":
        return functools.partial(torch.optim.Adam, lr=lr, betas=(0.9, 0.999), eps=1e-7)
    raise ValueError(method)


def run(method: str, lr: float, rho: Any, data: BurgersData, epochs: int, threads: int, seed: int) -> dict[str, float]:
    L.seed_everything(seed, verbose=False)
    task = Burgers(optimizer=make_optimizer(method, lr, rho), num_threads=threads)
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(task, data)
    seconds = time.perf_counter() - start
    test = trainer.test(task, data, verbose=False)[0]
    full = BurgersData(**{**data.hparams, "batch_mode": "full"})
    full.setup("fit")
    batch = cast_floats(next(iter(full.train_dataloader())), task.dtype)
    with torch.enable_grad():
        objective = task.objective(batch).item()
        violation = task.constraints(batch).abs().max().item()
    return {"objective": objective, "violation": violation, "rel_l2": test["test/rel_l2"], "seconds": seconds,
            "steps": trainer.global_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-mode", choices=["full", "minibatch"], default="full")
    parser.add_argument("--n-train", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 5e-4])
    parser.add_argument("--rho-full", action="store_true", help="also run the SQP methods with rho = 1/lr")
    args = parser.parse_args()
    quiet()

    data = BurgersData(batch_mode=args.batch_mode, n_train=args.n_train, n_val=1, n_test=args.n_test,
                       seed=args.seed, cache_dir=None)
    data.setup("fit")
    runs: list[tuple[str, Any]] = [("SQP-Adam(con)", 1.0), ("SQP-HeavyBall(con)", 1.0), ("Adam(con)", None),
                                   ("Adam(unc)", None)]
    if args.rho_full:
        runs += [("SQP-Adam(con)", "full"), ("SQP-HeavyBall(con)", "full")]
    print(f"Burgers, {args.n_train} training ICs, {args.n_test} test ICs, {args.batch_mode} batch, "
          f"{args.epochs} epochs, seed {args.seed}, threads {args.threads}")
    print("| method | rho | lr | final objective | max abs c | test rel. L2 | steps | time (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for lr in args.lrs:
        for method, rho in runs:
            out = run(method, lr, rho, data, args.epochs, args.threads, args.seed)
            print(f"| {method} | {'-' if rho is None else rho} | {lr:g} | {out['objective']:.3e} | "
                  f"{out['violation']:.2e} | {out['rel_l2']:.3f} | {out['steps']} | {out['seconds']:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
