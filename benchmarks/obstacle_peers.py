r"""The 1D obstacle problem (issue 36 item 4): SQP-Adam with inequality rows against Cooper's Lagrangian and
augmented Lagrangian formulations and a penalty PINN, side by side.

The problem is the package's ``obstacle`` task (:mod:`lit_constrained.tasks.obstacle`): minimize the
Dirichlet energy :math:`\tfrac12\int_{-1}^1 u'^2` (Gauss-Legendre quadrature, 256 nodes) with
:math:`u(\pm1) = 0` and :math:`u \ge \psi = 0.5 - x^2` at the 63 equispaced imposed points; the same
network (1 -> 32 x 2 tanh -> 1, float64, one seed, copied into every run), the same points, full batch,
the same number of steps and the same primal schedule for every run (Adam-type steps with lr 1e-2 decaying
linearly to 1e-4: ``LinearLR(1, 0.01)``, the task's recommended SQP-Adam settings). The runs, in one
process and in lockstep (step k of every run in turn, so load on the shared machine hits all alike):

* ``SQP-Adam``: :class:`~lit_constrained.optim.SQPAdam` (rho = full, rcond 1e-12) through the optimizer
  contract, ``step(constraints=c, jacobian=J, inequalities=g, inequality_jacobian=G,
  constraint_closure=...)`` with c = u(+-1), g = psi - u at the imposed points and J, G by
  ``torch.func.jacrev`` (what the task's module hands it in a fit);
* ``Cooper Lagrangian (dual lr e)``: Cooper's ``Lagrangian`` formulation, ``SimultaneousOptimizer``
  (primal Adam on the Lagrangian's gradient, dual SGD ascent with lr e on the multipliers of the 2
  equalities and the 63 inequalities, projected to >= 0 by Cooper);
* ``Cooper augmented Lagrangian (rho r)``: Cooper's ``AugmentedLagrangian`` formulation (penalty
  coefficient r, fixed), ``AlternatingPrimalDualOptimizer`` (the primal step, then the multipliers at the
  new point), dual SGD with lr r: the method of multipliers' update :math:`\lambda \leftarrow [\lambda + r
  g]_+`;
* ``penalty PINN (w)``: Adam on :math:`E(u) + w \left(\sum_j \mathrm{relu}(\psi - u)^2(x_j) + \sum_\pm
  u(\pm1)^2\right)` for two weights w.

Printed per run: the median seconds per step (everything the step needs: objective, rows, Jacobians,
backward, optimizer), the first step after which the violation :math:`V_k = \max(\max_\pm |u(\pm1)|,
\max_j \max(\psi - u, 0)(x_j))` at the imposed points is at most 1e-4 of its start :math:`V_0`
(``steps to 1e-4``), whether it rises back above that afterwards (the number of later steps above it and
the largest later V), the end V, the relative L2 error on the 2001-node test grid and the contact
interval's error in grid spacings (the task's metrics).

    pip install cooper-optim     # Cooper 1.0.1 was measured; without it the Cooper runs are skipped
    python benchmarks/obstacle_peers.py [--steps 4000] [--json benchmarks/results/obstacle_peers.json]
Measured figures, with the commands: docs/inequalities.md ("Benchmarks (the optimizer side)").
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lit_constrained.optim import SQPAdam  # noqa: E402
from lit_constrained.tasks.obstacle import Obstacle, contact_interval  # noqa: E402
from lit_constrained.tasks.obstacle_data import contact_half_width, obstacle_points  # noqa: E402
from machine import cpu_model  # noqa: E402

F64 = torch.float64
THRESHOLD = 1e-4
"""The violation target, relative to the violation at the initial weights."""
LR, END_FACTOR = 1e-2, 0.01
COOPER_DUAL_LRS = (1e-2, 1e-1)
COOPER_PENALTIES = (10.0, 100.0)
PENALTY_WEIGHTS = (1e2, 1e4)


def batch(points: dict[str, Any]) -> dict[str, Tensor]:
    return {key: torch.as_tensor(value, dtype=F64) for key, value in points.items()}


def rows_of(task: Obstacle, data: dict[str, Tensor]) -> Callable[[dict[str, Tensor]], Tensor]:
    """params -> [u(+-1); psi - u(x_j)] (c then g), for torch.func."""
    x_bc, x_ob = data["x_bc"], data["x_obstacle"]
    psi = task.psi(x_ob)

    def rows(params: dict[str, Tensor]) -> Tensor:
        u = torch.func.functional_call(task.net, params, (torch.cat([x_bc, x_ob]),))[:, 0]
        return torch.cat([u[:2], psi - u[2:]])

    return rows


def violation(task: Obstacle, data: dict[str, Tensor]) -> float:
    """V = max(max |u(+-1)|, max max(psi - u, 0)) at the imposed points."""
    with torch.no_grad():
        return max(float(task(data["x_bc"]).abs().max()), float((-task.gap(data["x_obstacle"])).clamp_min(0).max()))


def flat_jacobian(rows: Callable[[dict[str, Tensor]], Tensor], task: Obstacle) -> tuple[Tensor, Tensor]:
    """(rows, d rows / d params) with the params flattened in ``task.parameters()`` order."""
    params = {name: p.detach() for name, p in task.net.named_parameters()}
    jac = torch.func.jacrev(rows)(params)
    values = rows(params).detach()
    return values, torch.cat([jac[name].reshape(values.numel(), -1) for name in params], dim=1)


@dataclass
class Method:
    """One run: its task (own weights), one step, and its record."""

    name: str
    task: Obstacle
    step: Callable[[], None]
    violations: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    note: str = ""


def sqp_adam(task: Obstacle, data: dict[str, Tensor], steps: int) -> Method:
    opt = SQPAdam(task.parameters(), lr=LR, rho="full", rcond=1e-12)
    schedule = torch.optim.lr_scheduler.LinearLR(opt, 1.0, END_FACTOR, total_iters=steps)
    rows = rows_of(task, data)

    def closure() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            r = rows({name: p for name, p in task.net.named_parameters()})
        return r[:2], r[2:]

    def step() -> None:
        opt.zero_grad()
        task.objective(data).backward()
        r, jac = flat_jacobian(rows, task)
        opt.step(constraints=r[:2], jacobian=jac[:2], inequalities=r[2:], inequality_jacobian=jac[2:],
                 constraint_closure=closure)
        schedule.step()

    return Method("SQP-Adam (inequality rows)", task, step, note=f"lr {LR} -> {LR * END_FACTOR}, rho full")


def penalty_pinn(task: Obstacle, data: dict[str, Tensor], steps: int, weight: float) -> Method:
    opt = torch.optim.Adam(task.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LinearLR(opt, 1.0, END_FACTOR, total_iters=steps)

    def step() -> None:
        opt.zero_grad()
        below = (-task.gap(data["x_obstacle"])).clamp_min(0)
        loss = task.objective(data) + weight * (below.pow(2).sum() + task(data["x_bc"]).pow(2).sum())
        loss.backward()
        opt.step()
        schedule.step()

    return Method(f"penalty PINN (w = {weight:g})", task, step, note="Adam on E + w (relu(psi - u)^2 + u(+-1)^2)")


def cooper_method(task: Obstacle, data: dict[str, Tensor], steps: int, augmented: bool, value: float) -> Method:
    """Cooper's Lagrangian (dual lr ``value``) or augmented Lagrangian (penalty ``value``) formulation."""
    import cooper

    formulation = cooper.formulations.AugmentedLagrangian if augmented else cooper.formulations.Lagrangian
    p = data["x_obstacle"].shape[0]

    def constraint(kind: Any, count: int) -> Any:
        kwargs: dict[str, Any] = {"multiplier": cooper.multipliers.DenseMultiplier(num_constraints=count, dtype=F64)}
        if augmented:
            kwargs["penalty_coefficient"] = cooper.penalty_coefficients.DensePenaltyCoefficient(
                torch.full((count,), value, dtype=F64))
        return cooper.Constraint(kind, formulation_type=formulation, **kwargs)

    class ObstacleCMP(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.boundary = constraint(cooper.ConstraintType.EQUALITY, 2)
            self.obstacle = constraint(cooper.ConstraintType.INEQUALITY, p)

        def compute_violations(self) -> cooper.CMPState:
            observed = {
                self.boundary: cooper.ConstraintState(violation=task(data["x_bc"])),
                self.obstacle: cooper.ConstraintState(violation=-task.gap(data["x_obstacle"])),  # psi - u <= 0
            }
            return cooper.CMPState(observed_constraints=observed)

        def compute_cmp_state(self) -> cooper.CMPState:
            state = self.compute_violations()
            return cooper.CMPState(loss=task.objective(data), observed_constraints=state.observed_constraints)

    cmp = ObstacleCMP()
    primal = torch.optim.Adam(task.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LinearLR(primal, 1.0, END_FACTOR, total_iters=steps)
    dual = torch.optim.SGD(cmp.dual_parameters(), lr=value, maximize=True)
    if augmented:
        optimizer = cooper.optim.AlternatingPrimalDualOptimizer(cmp=cmp, primal_optimizers=primal,
                                                                dual_optimizers=dual)
    else:
        optimizer = cooper.optim.SimultaneousOptimizer(cmp=cmp, primal_optimizers=primal, dual_optimizers=dual)

    def step() -> None:
        if augmented:
            optimizer.roll(compute_cmp_state_kwargs={}, compute_violations_kwargs={})
        else:
            optimizer.roll(compute_cmp_state_kwargs={})
        schedule.step()

    if augmented:
        return Method(f"Cooper augmented Lagrangian (rho = {value:g})", task, step,
                      note=f"AlternatingPrimalDual, penalty {value:g} fixed, dual SGD lr {value:g}")
    return Method(f"Cooper Lagrangian (dual lr {value:g})", task, step, note=f"Simultaneous GDA, dual SGD lr {value:g}")


def summary(method: Method, v0: float, data: dict[str, Tensor], spacing: float, a: float) -> dict[str, Any]:
    target = THRESHOLD * v0
    reached = next((k for k, v in enumerate(method.violations, start=1) if v <= target), None)
    later = method.violations[reached:] if reached is not None else []
    above = sum(v > target for v in later)
    task = method.task
    with torch.no_grad():
        u = task(data["x_test"])
        rel = float((u - data["u_test"]).norm() / data["u_test"].norm())
        x_ob = data["x_obstacle"]
        left, right = contact_interval(x_ob[:, 0], task.gap(x_ob), task.curvature * (spacing / 2) ** 2)
    contact = max(abs(left + a), abs(right - a)) / spacing
    return {
        "method": method.name, "note": method.note,
        "seconds_per_step": statistics.median(method.seconds),
        "steps_to_threshold": reached,
        "later_steps_above": above if reached is not None else None,
        "later_max_violation": max(later) if later else None,
        "end_violation": method.violations[-1],
        "violation_at": {str(k): method.violations[k - 1] for k in (1, 10, 50, 100, 500, 1000)
                         if k <= len(method.violations)},
        "rel_l2": rel, "contact_spacings": contact,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report-every", type=int, default=100, help="progress line and JSON every k steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    data = batch(obstacle_points())
    torch.manual_seed(args.seed)
    base = Obstacle(dtype="float64")
    v0 = violation(base, data)
    spacing = float(data["x_obstacle"][1, 0] - data["x_obstacle"][0, 0])
    a = contact_half_width()

    def fresh() -> Obstacle:
        return copy.deepcopy(base)

    methods = [sqp_adam(fresh(), data, args.steps)]
    has_cooper = importlib.util.find_spec("cooper") is not None
    if has_cooper:
        methods += [cooper_method(fresh(), data, args.steps, False, lr) for lr in COOPER_DUAL_LRS]
        methods += [cooper_method(fresh(), data, args.steps, True, rho) for rho in COOPER_PENALTIES]
    methods += [penalty_pinn(fresh(), data, args.steps, w) for w in PENALTY_WEIGHTS]
    cooper_version = importlib.metadata.version("cooper-optim") if has_cooper else None

    def write(rows: list[dict[str, Any]], done: int) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                                             "cooper": cooper_version, "steps": done, "of_steps": args.steps,
                                             "seed": args.seed, "initial_violation": v0, "runs": rows}, indent=1) + "\n")

    for k in range(1, args.steps + 1):
        for method in methods:
            start = time.perf_counter()
            method.step()
            method.seconds.append(time.perf_counter() - start)
            method.violations.append(violation(method.task, data))
        if args.report_every and k % args.report_every == 0 and k < args.steps:
            write([summary(method, v0, data, spacing, a) for method in methods], k)
            print(f"step {k}: " + ", ".join(f"{m.name} V {m.violations[-1]:.1e}" for m in methods), flush=True)
    rows = [summary(method, v0, data, spacing, a) for method in methods]
    print(f"CPU: {cpu_model()} ({args.threads} thread(s)); torch {torch.__version__}; cooper "
          f"{cooper_version or 'not installed (pip install cooper-optim)'}; float64, {args.steps} steps, seed "
          f"{args.seed}; V_0 = {v0:.3e}, target V <= {THRESHOLD:g} V_0 = {THRESHOLD * v0:.2e}")
    head = (f"{'method':38} {'ms/step':>8} {'steps to 1e-4':>13} {'later above':>11} {'later max V':>11} "
            f"{'end V':>9} {'rel L2':>9} {'contact':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        reached = "never" if r["steps_to_threshold"] is None else str(r["steps_to_threshold"])
        above = "-" if r["later_steps_above"] is None else str(r["later_steps_above"])
        later = "-" if r["later_max_violation"] is None else f"{r['later_max_violation']:.2e}"
        print(f"{r['method']:38} {r['seconds_per_step'] * 1e3:8.2f} {reached:>13} {above:>11} {later:>11} "
              f"{r['end_violation']:9.2e} {r['rel_l2']:9.2e} {r['contact_spacings']:8.2f}")
    print("(contact: the contact interval's error in grid spacings; later above / later max V: the steps after "
          "the first hit whose V is above the target, and their largest V)")
    write(rows, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
