"""``lit-constrained compare``: the paper's optimizer comparison as a resumable, parallel grid of runs.

Example (the paper's spring grid at this harness's default budget; a few minutes on 2 CPU cores)::

    lit-constrained compare --task spring
    lit-constrained compare --task spring --rho paper,full --max-epochs 2000
    lit-constrained compare --task curve --methods sqp_adam,adam_unc --lrs 0.01 --full-seeds 1

Each run is ``configs/<task>/<method>.yaml`` (else ``configs/<task>/paper/<method>.yaml``; the reverse
with ``--paper-configs``) with the run's overrides (lr, rho, seed, batch mode,
epochs), trained by ``lit-constrained fit`` in a worker process. Outputs go to ``results/<task>/``:
``metrics.csv`` (tidy, per epoch), ``results.json``, ``loss.png``, ``test_error.png``,
``violation.png``, ``table.md``, the TensorBoard runs ``tensorboard/compare/<task>/<run>``, the run
configs (``configs/``), logs (``logs/``) and result files (``runs/``: a finished run is skipped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .grid import METHODS, TASKS, RunSpec, build_grid, lr_text, parse_rho, task_grid

__all__ = ["main", "build_grid", "RunSpec", "METHODS", "TASKS"]


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    from .runner import available_cores

    p = argparse.ArgumentParser(
        prog="lit-constrained compare",
        description=(
            "Run the paper's optimizer comparison for a task (methods x rho x lr x batch mode x seed) "
            "and write a CSV/JSON of per-epoch objective, test error and constraint violation, figures "
            "and a markdown table. Finished runs are skipped."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--task", required=True, help=f"task folder under --config-dir (paper grids: {', '.join(TASKS)})")
    p.add_argument("--methods", type=_names, default=list(METHODS), help="comma-separated method keys")
    p.add_argument("--lrs", type=_floats, default=None, help="comma-separated learning rates (default: the paper's two)")
    p.add_argument("--modes", type=_names, default=["full", "minibatch"], help="batch modes: full, minibatch")
    p.add_argument("--rho", type=_names, default=["paper"],
                   help="rho variants of the constrained methods: paper (the task's published rho), full, or numbers")
    p.add_argument("--full-seeds", type=int, default=1, help="seeds per full-batch setting")
    p.add_argument("--minibatch-seeds", type=int, default=5, help="seeds per mini-batch setting")
    p.add_argument("--seed-offset", type=int, default=0, help="first seed")
    p.add_argument("--max-epochs", type=int, default=None, help="epoch budget per run (default: per task)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="validate (objective, test error) every N epochs (default: max(1, max_epochs // 100))")
    p.add_argument("--config-dir", type=Path, default=Path("configs"), help="folder of <task>/<method>.yaml")
    p.add_argument("--paper-configs", action="store_true",
                   help="take <task>/paper/<method>.yaml before <task>/<method>.yaml (e.g. the paper's data sizes)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: results/<task>)")
    p.add_argument("--jobs", type=int, default=available_cores(), help="runs in parallel (worker processes)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    p.add_argument("--isolate", action="store_true", help="a fresh process per run (default: workers are reused)")
    p.add_argument("--report-only", action="store_true", help="only rewrite CSV/JSON/figures/table from results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``lit-constrained compare``; returns 0, or 1 when some runs failed."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from .report import write_report
    from .runner import available_cores, run_grid

    grid = task_grid(args.task)
    try:
        rho_variants = [parse_rho(r) for r in args.rho]
        runs = build_grid(
            task=args.task,
            methods=args.methods,
            lrs=args.lrs if args.lrs is not None else list(grid.lrs),
            modes=args.modes,
            rho_variants=rho_variants,
            full_seeds=args.full_seeds,
            minibatch_seeds=args.minibatch_seeds,
            max_epochs=args.max_epochs if args.max_epochs is not None else grid.max_epochs,
            seed_offset=args.seed_offset,
        )
        eval_every = args.eval_every if args.eval_every is not None else max(1, runs[0].max_epochs // 100)
        if eval_every < 1:
            raise ValueError(f"--eval-every must be >= 1, got {eval_every}.")
    except ValueError as error:
        parser().error(str(error))
    out = args.out if args.out is not None else Path("results") / args.task
    threads = args.threads if args.threads is not None else max(1, available_cores() // max(1, args.jobs))
    print(
        f"compare {args.task}: {len(runs)} runs ({', '.join(args.methods)}; lr {', '.join(map(lr_text, sorted({r.lr for r in runs}, reverse=True)))}; "
        f"{runs[0].max_epochs} epochs), {args.jobs} parallel x {threads} thread(s) -> {out}",
        file=sys.stderr,
    )
    failed: dict[str, str] = {}
    if not args.report_only:
        outcome = run_grid(
            runs, args.config_dir, out, args.jobs, threads, eval_every, grid.test_metric,
            isolate=args.isolate, progress=not args.no_progress, prefer_paper=args.paper_configs,
        )
        failed = outcome.failed
        print(f"{len(outcome.finished)} run(s) done, {len(outcome.skipped)} skipped, {len(failed)} failed",
              file=sys.stderr)
    paths = write_report(runs, out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    table = paths["table"].read_text()
    print(table)
    return 1 if failed else 0
