"""``lit-constrained compare``: the paper's optimizer comparison as a resumable, parallel grid of runs.

By default every task runs at the paper's problem size and budget: the configs in
``configs/<task>/paper/`` and their ``trainer.max_epochs`` (the paper's text states no epoch budget;
:data:`~lit_constrained.compare.grid.TASKS` says per task where the number comes from). A quick run
takes a fraction of it, and every output says which::

    lit-constrained compare --task spring --budget-fraction 0.05          # 500 of 10000 epochs (~10 min)
    lit-constrained compare --task spring --rho paper,full                # + the full normal step (hours)
    lit-constrained compare --task spring --embedded-configs --max-epochs 500
    lit-constrained compare --task curve --methods sqp_adam,adam_unc --lrs 0.01 --full-seeds 1

Each run is ``configs/<task>/paper/<method>.yaml`` (else ``configs/<task>/<method>.yaml``; the reverse
with ``--embedded-configs``) with the run's overrides (lr, rho, seed, batch mode, epochs), trained by
``lit-constrained fit`` in a worker process. Outputs go to ``--out`` (default ``results/<task>/``):
the run records ``runs/<run>.json`` (a finished run is skipped; kept out of the repository, whose
``docs/compare/<task>/`` holds only the report's tables and one ``runs.csv`` a task),
``metrics.csv`` (tidy, per epoch), ``results.json``, ``loss.png``, ``test_error.png``, ``violation.png``,
``table.md`` and ``verdict.md``; the run configs (``configs/``), logs (``logs/``) and TensorBoard runs
``tensorboard/compare/<task>/<run>`` go to ``--work-dir`` (default: ``--out``).

Layers: the ``lit-constrained`` console script (:mod:`lit_constrained.cli.console`) adds ``compare`` as a
subcommand with :func:`add_arguments` and calls :func:`run`; ``python -m lit_constrained.compare``
calls :func:`main`. Building the parser imports neither torch nor Lightning (``--help`` is instant);
each worker trains its run with :func:`lit_constrained.cli.fit.run_fit`. The fit layer never imports this
package.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .grid import METHODS, TASKS, Budget, RunSpec, build_grid, lr_text, parse_rho, resolve_budget, task_grid

__all__ = ["main", "run", "add_arguments", "parser", "build_grid", "resolve_budget", "Budget", "RunSpec", "METHODS",
           "TASKS"]

#: What ``lit-constrained compare`` does, in one line (the console's list of subcommands).
SUMMARY = "re-run the papers' comparisons (task x method x lr x seed)"

DESCRIPTION = (
    "Run the paper's optimizer comparison for a task (methods x rho x lr x batch mode x seed) "
    "and write a CSV/JSON of per-epoch objective, test error and constraint violation, figures "
    "and a markdown table. Finished runs are skipped."
)


def available_cores() -> int:
    """CPU cores this process may use (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    """The standalone parser of ``python -m lit_constrained.compare`` (the console script's ``compare``
    subcommand has the same arguments)."""
    p = argparse.ArgumentParser(prog="lit-constrained compare", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``lit-constrained compare`` (see :func:`run`)."""
    p.add_argument("--task", help=f"task folder under --config-dir (paper grids: {', '.join(TASKS)}); required "
                                  "unless --lr-sweep")
    p.add_argument("--methods", type=_names, default=list(METHODS), help="comma-separated method keys")
    p.add_argument("--lrs", type=_floats, default=None, help="comma-separated learning rates (default: the paper's two)")
    p.add_argument("--modes", type=_names, default=["full", "minibatch"], help="batch modes: full, minibatch")
    p.add_argument("--rho", type=_names, default=["paper"],
                   help="rho variants of the constrained methods: paper (the task's published rho), full, or numbers")
    p.add_argument("--full-seeds", type=int, default=1, help="seeds per full-batch setting")
    p.add_argument("--minibatch-seeds", type=int, default=5, help="seeds per mini-batch setting")
    p.add_argument("--seed-offset", type=int, default=0, help="first seed")
    p.add_argument("--budget-fraction", type=float, default=None,
                   help="epochs per run as a fraction of the paper configs' budget (default 1: the paper's budget)")
    p.add_argument("--max-epochs", type=int, default=None,
                   help="epochs per run (instead of --budget-fraction; the fraction is still reported)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="validate (objective, test error) every N epochs (default: max(1, max_epochs // 100))")
    p.add_argument("--config-dir", type=Path, default=Path("configs"), help="folder of <task>/<method>.yaml")
    p.add_argument("--embedded-configs", action="store_true",
                   help="take <task>/<method>.yaml (small, fast problem sizes) before <task>/paper/<method>.yaml "
                        "(the budget fraction is still of the paper configs' epochs)")
    p.add_argument("--paper-configs", action="store_true",
                   help="the paper's configs first (the default; kept for older command lines)")
    p.add_argument("--out", type=Path, default=None,
                   help="run records, CSV, JSON, figures and tables (default: results/<task>)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="run configs, logs and TensorBoard events (default: --out)")
    p.add_argument("--jobs", type=int, default=available_cores(), help="runs in parallel (worker processes)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    p.add_argument("--isolate", action="store_true", help="a fresh process per run (default: workers are reused)")
    p.add_argument("--report-only", action="store_true", help="only rewrite CSV/JSON/figures/table from results")
    p.add_argument("--no-tensorboard", action="store_true",
                   help="no TensorBoard logger per run (no event files, no prediction figure rendered at every "
                        "validation: faster long grids; the run records are the same)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--lr-sweep", nargs=argparse.REMAINDER, default=None, metavar="SWEEP_OPTIONS",
                   help="instead of a paper grid, the learning-rate sweep of SQP-MoMo (issue 18): every "
                        "argument after it goes to lit_constrained.compare.sweep (lit-constrained compare "
                        "--lr-sweep --help)")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the parser cannot say alone: ``--task`` is required unless ``--lr-sweep`` is given."""
    if args.task is None and args.lr_sweep is None:
        p.error("--task is required (or --lr-sweep for the learning-rate sweep).")


def main(argv: list[str] | None = None) -> int:
    """``python -m lit_constrained.compare <argv>``: parse, then :func:`run`; returns its exit status."""
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    check_arguments(p, args)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the comparison the parsed ``args`` (:func:`add_arguments`) describe: the grid's unfinished runs,
    then the report. Returns 0, or 1 when some runs failed."""
    if args.lr_sweep is not None:
        from .sweep import main as sweep_main

        return sweep_main(args.lr_sweep)
    from .configs import config_budget, find_config
    from .report import write_report
    from .runner import run_grid

    grid = task_grid(args.task)
    if args.embedded_configs and args.paper_configs:
        parser().error("--embedded-configs and --paper-configs exclude each other.")
    prefer_paper = not args.embedded_configs
    try:
        reference, source = config_budget(args.config_dir, args.task)  # the paper configs' epochs, always
        used, _ = find_config(args.config_dir, args.task, "sqp_adam", prefer_paper)
        size = "paper" if used.parent.name == "paper" else "embedded"
        budget = resolve_budget(reference, str(source), size, args.max_epochs, args.budget_fraction)
        rho_variants = [parse_rho(r) for r in args.rho]
        runs = build_grid(
            task=args.task,
            methods=args.methods,
            lrs=args.lrs if args.lrs is not None else list(grid.lrs),
            modes=args.modes,
            rho_variants=rho_variants,
            full_seeds=args.full_seeds,
            minibatch_seeds=args.minibatch_seeds,
            max_epochs=budget.epochs,
            seed_offset=args.seed_offset,
        )
        eval_every = args.eval_every if args.eval_every is not None else max(1, budget.epochs // 100)
        if eval_every < 1:
            raise ValueError(f"--eval-every must be >= 1, got {eval_every}.")
    except ValueError as error:
        parser().error(str(error))
    out = args.out if args.out is not None else Path("results") / args.task
    work = args.work_dir if args.work_dir is not None else out
    threads = args.threads if args.threads is not None else max(1, available_cores() // max(1, args.jobs))
    lrs = ", ".join(map(lr_text, sorted({r.lr for r in runs}, reverse=True)))
    print(
        f"compare {args.task}: {len(runs)} runs ({', '.join(args.methods)}; lr {lrs}); {budget.text}; "
        f"{args.jobs} parallel x {threads} thread(s) -> {out}",
        file=sys.stderr,
    )
    failed: dict[str, str] = {}
    if not args.report_only:
        outcome = run_grid(
            runs, args.config_dir, out, args.jobs, threads, eval_every, grid.test_metric,
            isolate=args.isolate, progress=not args.no_progress, prefer_paper=prefer_paper,
            work_dir=work, budget=budget, tensorboard=not args.no_tensorboard,
        )
        failed = outcome.failed
        print(f"{len(outcome.finished)} run(s) done, {len(outcome.skipped)} skipped, {len(failed)} failed",
              file=sys.stderr)
    paths = write_report(runs, out, budget)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(paths["table"].read_text())
    print(paths["verdict"].read_text())
    return 1 if failed else 0
