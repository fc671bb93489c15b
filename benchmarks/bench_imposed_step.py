r"""The cost of an imposed step against the same task's unconstrained Adam step (issue 46's target: an
auto step at most 3x), on the four PINNacle tasks, interleaved in one process.

For each problem two copies of the task (same seed, 1 024 / 256 / 256 points): plain ``torch.optim.Adam``
(nothing imposed) and the package's defaults with ``imposed_count="auto"`` (SQP-Adam, c and J in
float64, the points chosen by the module, re-chosen every 100 steps as in a run). Each is fitted
``--warmup`` steps first (410: the auto one past the re-choices that correct and settle its cost model,
100, 200 and 300, so its counts are the ones a run keeps); then their training steps are timed
alternately (A, B, A, B, ...; ``time.perf_counter`` around ``training_step``) and the medians compared.
Printed per problem: the medians, their ratio and the rows imposed::

    python benchmarks/bench_imposed_step.py --repeats 21
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import quiet  # noqa: E402
from machine import cpu_model  # noqa: E402

PROBLEMS = ("poisson", "burgers", "wave", "heat")


def fitted(problem: str, auto: bool, warmup: int) -> tuple[Any, Any]:
    """The task after ``warmup`` steps, and its training batch."""
    import lightning.pytorch as pl

    from lit_constrained.tasks import pinnacle

    name = problem.capitalize()
    task_cls = getattr(pinnacle, f"{name}Pinnacle")
    initial = {"n_initial": 256, "n_initial_imposed": 0} if problem != "poisson" else {}
    data = pinnacle.PinnacleData(problem, n_pde=1024, n_boundary=256, n_pde_imposed=0, n_boundary_imposed=0, **initial)
    torch.manual_seed(0)
    if auto:
        model = task_cls(imposed_count="auto", num_threads=1)
    else:
        model = task_cls(optimizer={"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}}, num_threads=1)
    trainer = pl.Trainer(max_steps=warmup, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(model, data)
    data.setup("fit")
    return model, next(iter(data.train_dataloader()))


def timed_step(model: Any, batch: Any) -> float:
    start = time.perf_counter()
    model.training_step(batch, 0)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=410)
    args = parser.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}, torch {torch.__version__}, 1 thread")
    print("| problem | Adam step (ms) | auto step (ms) | ratio | rows imposed (points of pool) |")
    print("|---|---|---|---|---|")
    for problem in args.problems:
        adam, adam_batch = fitted(problem, False, args.warmup)
        auto, auto_batch = fitted(problem, True, args.warmup)
        a, b = [], []
        for _ in range(args.repeats):
            a.append(timed_step(adam, adam_batch))
            b.append(timed_step(auto, auto_batch))
        ma, mb = statistics.median(a), statistics.median(b)
        rows = ", ".join(f"{name} {n}/{pool}" for name, (n, pool) in auto.row_choice.rows().items())
        print(f"| {problem} | {1e3 * ma:.0f} | {1e3 * mb:.0f} | {mb / ma:.2f} | {rows} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
