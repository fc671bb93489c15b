r"""Hock-Schittkowski problems with inequalities and bounds through the optimizer's inequality rows.

Each problem (``tests/helpers/hs_inequality.py``: HS21, HS35, HS43, HS71, HS76 from the published
collection) is solved by SQP-Adam and SQP-HeavyBall through the optimizer contract alone: x is one
float64 parameter, the gradient of f from ``backward``, c and g evaluated at x, J and G from
``torch.func.jacrev``, then

    opt.step(constraints=c, jacobian=J, inequalities=g, inequality_jacobian=G)

for 4 000 steps with a linearly decaying lr (``LambdaLR``: lr_k = lr (1 - k / steps)). Printed per run:
:math:`\|x - x^*\|_\infty` against the published solution, the largest violation at the end
(max(max |c|, max(g, 0))), :math:`f - f^*`, the active rows at the end against x*'s, and the first
step after which :math:`\|x - x^*\|_\infty \le 10^{-6}` holds to the end. The targets (issue 36):
:math:`\|x - x^*\|_\infty \le 10^{-6}` and the inequality rows violated by at most 1e-8 at the end.

    python benchmarks/hock_schittkowski.py [--steps 4000] [--problems HS21 HS35] [--json PATH]
        [--corrections]   # pass constraint_closure (c, g): the post-step corrections

The hyperparameters per (problem, optimizer) are in ``SETTINGS`` (defaults unless a problem needs
another; the table prints them).
Measured figures, with the commands: docs/inequalities.md ("Benchmarks (the optimizer side)").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_constrained.optim import SQPAdam, SQPHeavyBall  # noqa: E402
from tests.helpers.hs_inequality import BY_NAME, PROBLEMS, InequalityProblem  # noqa: E402

F64 = torch.float64
TARGET_X = 1e-6
TARGET_VIOLATION = 1e-8
OPTIMIZERS = {"SQPAdam": SQPAdam, "SQPHeavyBall": SQPHeavyBall}
DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "SQPAdam": {"lr": 0.1},
    "SQPHeavyBall": {"lr": 0.1, "momentum": 0.9},
}
SETTINGS: dict[tuple[str, str], dict[str, Any]] = {}
"""Per (problem, optimizer) overrides of ``DEFAULT_SETTINGS`` (none needed so far)."""


def settings(problem: str, optimizer: str) -> dict[str, Any]:
    return {**DEFAULT_SETTINGS[optimizer], **SETTINGS.get((problem, optimizer), {})}


@dataclass
class Run:
    """One run's outcome."""

    problem: str
    optimizer: str
    hyperparameters: dict[str, Any]
    steps: int
    x: list[float]
    error: float
    violation: float
    inequality_violation: float
    objective_gap: float
    active: list[int]
    expected_active: list[int]
    reached_at: int | None
    """The first step k after which ||x - x*||_inf <= TARGET_X held at every later step (None: never)."""
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error <= TARGET_X and self.inequality_violation <= TARGET_VIOLATION and self.violation <= TARGET_VIOLATION


def rows_and_jacobian(rows: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    """(r(x), dr/dx) for the rows r of x, detached (the Jacobian by ``torch.func.jacrev``)."""
    z = x.detach()
    return rows(z).detach(), torch.func.jacrev(rows)(z).detach()


def evaluate(problem: InequalityProblem, x: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor, Tensor]:
    """c, J (None for m = 0), g, G at x."""
    c = J = None
    if problem.equalities is not None:
        c, J = rows_and_jacobian(problem.equalities, x)
    g, G = rows_and_jacobian(problem.inequalities, x)
    return c, J, g, G


def violation(problem: InequalityProblem, x: Tensor) -> tuple[float, float]:
    """(max(max |c|, max(g, 0)), max(g, 0)) at x."""
    with torch.no_grad():
        g = float(problem.inequalities(x).max().clamp_min(0.0))
        c = float(problem.equalities(x).abs().max()) if problem.equalities is not None else 0.0
    return max(c, g), g


def solve(problem: InequalityProblem, optimizer: str, steps: int, corrections: bool = False,
          hyperparameters: dict[str, Any] | None = None) -> Run:
    """``steps`` steps of ``optimizer`` on ``problem`` from its x0 with lr decaying linearly to 0."""
    hyper = hyperparameters if hyperparameters is not None else settings(problem.name, optimizer)
    x = torch.nn.Parameter(torch.tensor(problem.x0, dtype=F64))
    opt = OPTIMIZERS[optimizer]([x], **hyper)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / steps)
    solution = torch.tensor(problem.solution, dtype=F64)
    closure = None
    if corrections:
        def closure() -> tuple[Tensor, Tensor]:
            with torch.no_grad():
                c = problem.equalities(x) if problem.equalities is not None else torch.zeros(0, dtype=F64)
                return c, problem.inequalities(x)
    last_miss = 0
    caught: list[str] = []
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(1, steps + 1):
            opt.zero_grad()
            problem.objective(x).backward()
            c, J, g, G = evaluate(problem, x)
            opt.step(constraints=c, jacobian=J, inequalities=g, inequality_jacobian=G,
                     constraint_closure=closure)
            schedule.step()
            if float((x.detach() - solution).abs().max()) > TARGET_X:
                last_miss = k
    seconds = time.perf_counter() - start
    caught = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in seen})
    with torch.no_grad():
        g_end = problem.inequalities(x)
        active = [i for i, value in enumerate(g_end.tolist()) if value >= -1e-8]
        gap = float(problem.objective(x)) - problem.value
    total, inequality = violation(problem, x)
    error = float((x.detach() - solution).abs().max())
    return Run(problem.name, optimizer, hyper, steps, x.detach().tolist(), error, total, inequality, gap,
               active, list(problem.active), None if last_miss == steps else last_miss, seconds, caught)


def table(runs: list[Run]) -> str:
    head = (f"{'problem':8} {'optimizer':13} {'hyperparameters':28} {'|x-x*|_inf':>11} {'max viol.':>10} "
            f"{'f - f*':>10} {'active (x*)':>16} {'<=1e-6 from':>11} {'steps':>6} {'s':>6}  target")
    lines = [head, "-" * len(head)]
    for r in runs:
        hyper = ", ".join(f"{k}={v}" for k, v in r.hyperparameters.items())
        reached = "never" if r.reached_at is None else str(r.reached_at)
        active = f"{r.active} ({list(r.expected_active)})"
        lines.append(
            f"{r.problem:8} {r.optimizer:13} {hyper:28} {r.error:11.2e} {r.violation:10.1e} {r.objective_gap:10.1e} "
            f"{active:>16} {reached:>11} {r.steps:6d} {r.seconds:6.1f}  {'met' if r.passed else 'MISSED'}"
        )
    return "\n".join(lines)


def source_version() -> str:
    """The commit of lit_constrained/optim (and "+ uncommitted changes" when its files differ from it)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", "lit_constrained/optim"], cwd=root,
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "lit_constrained/optim"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return commit + (" + uncommitted changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--problems", nargs="*", default=[p.name for p in PROBLEMS], choices=sorted(BY_NAME))
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    parser.add_argument("--corrections", action="store_true", help="pass constraint_closure returning (c, g)")
    parser.add_argument("--json", type=Path, help="write the runs to this file")
    parser.add_argument("--set", default=None, help='hyperparameters as JSON, replacing SETTINGS (e.g. \'{"lr": 0.01}\')')
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, float64, {args.steps} steps, lr_k = lr (1 - k/steps), "
          f"corrections {'on' if args.corrections else 'off'}; targets |x - x*|_inf <= {TARGET_X:g}, "
          f"violation <= {TARGET_VIOLATION:g}; optim at {source_version()}", flush=True)
    runs = []
    for name in args.problems:
        for optimizer in args.optimizers:
            hyper = {**settings(name, optimizer), **json.loads(args.set)} if args.set else None
            runs.append(solve(BY_NAME[name], optimizer, args.steps, args.corrections, hyper))
            print(table(runs[-1:]).splitlines()[-1], flush=True)
    print(table(runs))
    for r in runs:
        for w in r.warnings:
            print(f"  {r.problem} {r.optimizer}: {w}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1) + "\n")
    return 0 if all(r.passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
