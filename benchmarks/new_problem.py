r"""A PDE none of the configs was tuned on, written from the README's public API only: the package's
defaults (``count="auto"`` on every imposed part) against plain Adam at equal CPU time.

**The problem** (Helmholtz2d-Hole, a manufactured solution, so the reference is closed-form):

.. math::

    \Delta u + k^2 u = f \ \text{in}\ \Omega = [-1, 1]^2 \setminus D, \qquad
    u = u^* \ \text{on the square's sides}, \qquad \partial u / \partial n = \partial u^* / \partial n
    \ \text{on the circle}\ \partial D,

D the disk of radius 0.35 centred at (0.3, 0.2) (off centre: no symmetry), k = 4, n the domain's outward
normal (on the circle it points into the hole, :math:`n = -(x - x_D)/r_D`), and

.. math::

    u^*(x, y) = \sin(2\pi x)\cos(\pi y) + \tfrac15 e^{x + y}, \qquad
    f = (k^2 - 5\pi^2)\sin(2\pi x)\cos(\pi y) + \tfrac15 (2 + k^2)\, e^{x + y}

(:math:`\Delta \sin(2\pi x)\cos(\pi y) = -5\pi^2 \sin(2\pi x)\cos(\pi y)`,
:math:`\Delta e^{x + y} = 2 e^{x + y}`; tests/test_new_problem.py checks f against autograd's Laplacian of
:math:`u^*`). :math:`k^2 = 16` is not :math:`5\pi^2`, so neither term is resonant.

**The task** (:class:`HelmholtzHole`, as a user writes it: ``ConstrainedModule``, ``Imposed`` and
``lit_constrained.physics``' ``Box``, ``Disk``, ``-``, ``laplacian`` and the domain's ``dirichlet`` /
``neumann`` parts): PINNacle's vanilla PINN (a 100 x 5 tanh MLP, float32) and its loss, the sum of the
three conditions' mean squared residuals at the objective's points: 1 024 interior points and 256 boundary
points by arc length (201 on the sides, 55 on the circle: lengths 8 and 0.7 pi), Latin hypercube, seeded.
Each condition is also imposed, ``count="auto"``, its pool the objective's own points. Nothing else is
named: the optimizer is the module's default (SQP-Adam with its class defaults), the lr decays by the
module's default over the run, c and J are evaluated in the default ``constraint_dtype``. The test error
is the relative L2 error on the grid nodes (101 x 101 over the square) that lie in Omega.

**The runs** (the machinery of ``benchmarks/pinnacle.py``: its recorder, snapshots and Lightning loop):

* ``auto``: the task above, ``--steps`` (2 000) steps;
* ``adam``: the same task, seed, initial weights (their hash is recorded) and points with nothing imposed,
  ``torch.optim.Adam`` (lr 1e-3, constant), run until both ``--steps`` steps and the auto run's CPU time
  (``time.process_time``, the evaluations left out) are reached.

The test error is recorded with the CPU time every ``--every`` steps, so "Adam at the auto run's CPU time"
is read off Adam's curve (its last record within 2 % of the auto run's CPU time)::

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/new_problem.py --seeds 0,1 &   # resumable
    python benchmarks/new_problem.py --report                                       # the table

Records: ``benchmarks/results/new_problem/runs.jsonl`` (one JSON line per run, appended as it ends); the
table and what it says: ``benchmarks/results/new_problem.md``.

**Result** (Intel(R) Xeon(R) Processor, 2 cores shared with other runs, one thread a run, code db828ab):

(the runs of seeds 0 and 1 are under way; the table follows when they end)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))

from lit_constrained import ConstrainedModule, Imposed  # noqa: E402
from lit_constrained.physics import Box, Disk, laplacian  # noqa: E402
from lit_constrained.tasks.common import mlp  # noqa: E402

NAME = "Helmholtz2d-Hole"
WAVENUMBER = 4.0
SQUARE = Box((-1.0, -1.0), (1.0, 1.0))
HOLE_CENTER, HOLE_RADIUS = (0.3, 0.2), 0.35
HOLE = Disk(HOLE_CENTER, HOLE_RADIUS)
DOMAIN = SQUARE - HOLE
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "new_problem" / "runs.jsonl"
VARIANTS = ("auto", "adam")


def exact(x: Tensor) -> Tensor:
    r""":math:`u^*(x, y) = \sin(2\pi x)\cos(\pi y) + e^{x + y}/5` at the points x (N, 2); returns (N,)."""
    return torch.sin(2 * math.pi * x[:, 0]) * torch.cos(math.pi * x[:, 1]) + 0.2 * torch.exp(x[:, 0] + x[:, 1])


def exact_gradient(x: Tensor) -> Tensor:
    r""":math:`\nabla u^*` at the points x (N, 2); returns (N, 2)."""
    a, b = 2 * math.pi * x[:, 0], math.pi * x[:, 1]
    e = 0.2 * torch.exp(x[:, 0] + x[:, 1])
    return torch.stack([2 * math.pi * torch.cos(a) * torch.cos(b) + e, -math.pi * torch.sin(a) * torch.sin(b) + e], 1)


def source(x: Tensor) -> Tensor:
    r""":math:`f = \Delta u^* + k^2 u^* = (k^2 - 5\pi^2)\sin(2\pi x)\cos(\pi y) + (2 + k^2) e^{x + y}/5`."""
    k2 = WAVENUMBER**2
    wave = torch.sin(2 * math.pi * x[:, 0]) * torch.cos(math.pi * x[:, 1])
    return (k2 - 5 * math.pi**2) * wave + 0.2 * (2 + k2) * torch.exp(x[:, 0] + x[:, 1])


def hole_flux(x: Tensor) -> Tensor:
    r""":math:`\partial u^*/\partial n = \nabla u^* \cdot n` on the circle, n the domain's outward normal."""
    return (exact_gradient(x) * DOMAIN.normal(x)).sum(1)


def boundary_split(n: int) -> tuple[int, int]:
    """n boundary points by arc length: (on the square's sides, on the circle)."""
    sides = round(n * SQUARE.boundary_measure / (SQUARE.boundary_measure + HOLE.boundary_measure))
    return sides, n - sides


class HelmholtzHole(ConstrainedModule):
    r""":math:`\Delta u + k^2 u = f` on the square minus a disk, u = u* on the sides, du/dn = du*/dn on the
    circle (the module docstring), PINNacle's PINN and loss; every condition imposed with ``count="auto"``
    (``impose=False``: nothing imposed, plain training of the same loss).

    Args:
        hidden, depth: the tanh MLP's width and hidden layers (PINNacle: 100 x 5).
        n_pde, n_boundary: the objective's interior and boundary points (the imposed parts' pools).
        n_check: held-out points (interior, and boundary split as n_boundary) for the final residuals.
        seed: the points' seed (held-out: seed + 2). impose: impose the conditions (``count="auto"``).
        **kwargs: ConstrainedModule's (optimizer, lr_scheduler, num_threads, ...).
    """

    def __init__(self, hidden: int = 100, depth: int = 5, n_pde: int = 1024, n_boundary: int = 256,
                 n_check: int = 256, seed: int = 0, impose: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = mlp(2, hidden, depth, 1)
        self.impose = impose
        self.register_buffer("x_pde", DOMAIN.interior(n_pde, "lhs", seed, torch.float32))
        self.register_buffer("x_pde_check", DOMAIN.interior(n_check, "lhs", seed + 2, torch.float32))
        self.sides, self.circle = self.boundary_parts(n_boundary, seed, "auto" if impose else None)
        self.check_parts = self.boundary_parts(n_check, seed + 2, None)

    def boundary_parts(self, n: int, seed: int, count: str | None) -> tuple[Imposed, Imposed]:
        """u = u* at the sides' share of n boundary points, du/dn = du*/dn at the circle's."""
        n_sides, n_circle = boundary_split(n)
        sides = DOMAIN.dirichlet(self.u, n_sides, value=exact, on=SQUARE, method="lhs", seed=seed,
                                 dtype=torch.float32, count=count)
        circle = DOMAIN.neumann(self.u, n_circle, value=hole_flux, on=HOLE, method="lhs", seed=seed,
                                dtype=torch.float32, count=count)
        return sides, circle

    def u(self, x: Tensor) -> Tensor:
        return self.net(x)[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.u(x)

    def pde_residual(self, x: Tensor) -> Tensor:
        """Delta u + k^2 u - f at the points x (N, 2)."""
        return laplacian(self.u, x) + WAVENUMBER**2 * self.u(x) - source(x)

    def objective(self, batch: Any) -> Tensor:
        """PINNacle's loss: the sum of the three conditions' mean squared residuals."""
        return (self.pde_residual(self.x_pde).pow(2).mean() + self.sides.values().pow(2).mean()
                + self.circle.values().pow(2).mean())

    def imposed(self, batch: Any) -> dict[str, Imposed] | None:
        if not self.impose:
            return None
        return {"pde": Imposed(self.pde_residual, self.x_pde, count="auto"), "sides": self.sides.to(self.device),
                "circle": self.circle.to(self.device)}

    def validation_constraints(self, batch: Any) -> Tensor:
        """The three residuals at the held-out points, concatenated."""
        sides, circle = self.check_parts
        return torch.cat([self.pde_residual(self.x_pde_check), sides.values(), circle.values()])

    def evaluation_metrics(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        with torch.no_grad():
            error = self(batch["x_test"]) - batch["u_test"]
            return {"rel_l2": error.norm() / batch["u_test"].norm()}


class HelmholtzHoleData(pl.LightningDataModule):
    """The test set: the nodes of a 101 x 101 grid over the square that lie in Omega, and u* there (float32).
    The task holds its own points; a training batch is a placeholder (full batch: one step per epoch)."""

    def __init__(self, points_per_axis: int = 101) -> None:
        super().__init__()
        grid = SQUARE.grid(points_per_axis)
        x = grid[DOMAIN.contains(grid)]
        self.test_batch = {"x_test": x.float(), "u_test": exact(x).float()}

    def train_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader([self.test_batch], batch_size=None)


def build(variant: str, seed: int) -> HelmholtzHole:
    """The task of ``variant``: ``auto`` names nothing (the defaults); ``adam`` imposes nothing and steps
    ``torch.optim.Adam`` (lr 1e-3). Seeded: the same initial weights for both."""
    torch.manual_seed(seed)
    if variant == "auto":
        return HelmholtzHole(seed=seed, num_threads=1)
    return HelmholtzHole(seed=seed, impose=False, num_threads=1,
                         optimizer={"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}})


def run_one(variant: str, steps: int, seed: int, every: int, cpu_budget: float, snapshot_every: int,
            out: Path) -> dict[str, Any]:
    from machine import cpu_model
    from pinnacle import Snapshot, code_version, final_figures, lightning_run, weights_hash

    model, data = build(variant, seed), HelmholtzHoleData()
    key = json.dumps({"problem": NAME, "variant": variant, "steps": steps, "seed": seed}, sort_keys=True)
    snapshot = Snapshot(out.with_name(out.name + ".partial"), key, snapshot_every)
    record: dict[str, Any] = {"code": code_version(), "torch": torch.__version__, "problem": NAME,
                              "variant": variant, "steps": steps, "seed": seed, "weights": weights_hash(model),
                              "optimizer": model.hparams.get("optimizer"), "cpu": cpu_model()}
    resumed = snapshot.saved()
    if resumed:
        print(f"{variant} seed {seed}: continuing from the snapshot at step {resumed['step']}", flush=True)
    wall = time.perf_counter()
    rec = lightning_run(model, data, {"every": every, "steps": steps, "cpu_budget": cpu_budget}, snapshot, resumed)
    record["wall_s"] = round(time.perf_counter() - wall, 1)
    record["trajectory"] = rec.trajectory
    record |= final_figures(model, data)
    if model.row_choice.chosen:
        record["chosen"] = {name: list(points) for name, points in model.row_choice.rows().items()}
    snapshot.remove()
    return record


def report(records: list[dict[str, Any]]) -> str:
    """Per seed: the auto run's rel. L2 at --steps and its CPU time, Adam's at that CPU time and at --steps."""
    from pinnacle import at_cpu, at_steps

    lines = ["| seed | auto: rel. L2 at 2 000 steps (rows imposed: last choice / pool) | auto CPU s "
             "| Adam at the auto run's CPU time (steps) | Adam at 2 000 steps (CPU s) | auto / Adam at equal CPU "
             "| max imposed c / held-out residual (auto) |", "|---|---|---|---|---|---|---|"]
    runs = {(r["seed"], r["variant"], r["steps"]): r for r in records}
    for (seed, variant, steps), auto in sorted(runs.items()):
        adam = runs.get((seed, "adam", steps))
        if variant != "auto" or adam is None:
            continue
        if adam["weights"] != auto["weights"]:
            raise SystemExit(f"seed {seed}: the two runs start from different weights")
        end = auto["trajectory"][-1]
        chosen = ", ".join(f"{name} {k}/{pool}" for name, (k, pool) in auto["chosen"].items())
        a = at_cpu(adam, end[1])
        s = at_steps(adam, steps)
        lines.append(f"| {seed} | {end[2]:.3g} ({chosen}) | {end[1]:.0f} | {a[2]:.3g} ({int(a[0])}) "
                     f"| {s[2]:.3g} ({s[1]:.0f}) | {end[2] / a[2]:.2f} | {auto['max_imposed']:.1e} / "
                     f"{auto['max_held_out']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="record the test error every N steps")
    parser.add_argument("--snapshot-every", type=int, default=500)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", nargs="*", type=Path, default=None, metavar="RECORDS",
                        help="print the table of --out (or of these files; a later record of the same run "
                             "replaces an earlier one) and exit")
    args = parser.parse_args(argv)
    from harness import quiet
    from pinnacle import load

    quiet()
    torch.set_num_threads(1)
    if args.report is not None:
        print(report([r for path in (args.report or [args.out]) for r in load(path)]))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for variant in args.variants.split(","):
            records = load(args.out)
            if any((r["variant"], r["steps"], r["seed"]) == (variant, args.steps, seed) for r in records):
                print(f"{variant} seed {seed}: recorded already, skipped", flush=True)
                continue
            budget = 0.0
            if variant == "adam":
                auto = [r for r in records if (r["variant"], r["steps"], r["seed"]) == ("auto", args.steps, seed)]
                if not auto:
                    raise SystemExit(f"adam seed {seed}: run auto first (Adam runs to its CPU time)")
                budget = auto[-1]["trajectory"][-1][1]
            record = run_one(variant, args.steps, seed, args.every, budget, args.snapshot_every, args.out)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            last = record["trajectory"][-1]
            print(f"{variant} seed {seed}: rel. L2 {last[2]:.3e} after {int(last[0])} steps, {last[1]:.0f} CPU s",
                  flush=True)
    print(report(load(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
