r"""PINA's Poisson problem with PINA's own PINN and with this package: the same MLP, steps, points and seed.

The problem is PINA's problem zoo ``Poisson2DSquareProblem``: :math:`\Delta u = 2\pi^2 \sin(\pi x)\sin(\pi y)`
on the unit square, u = 0 on its boundary, solved by :math:`u = -\sin(\pi x)\sin(\pi y)`. This package's
``poisson`` task is the same problem written as :math:`-\Delta u = f` (solution :math:`+\sin\sin`), so
PINA's network is compared through :math:`-u_{PINA}`: the relative L2 error and the residuals below do
not depend on that sign.

What is shared: the network (2 -> 20 x 2 tanh -> 1: PINA's ``FeedForward`` default, built once from the
seed and copied into both), the number of full-batch steps, the points (interior and boundary
collocation points from :func:`lit_constrained.tasks.poisson_data.poisson_points`; PINA trains on all of
them, this package minimizes the mean squared residuals at ``n_pde`` + ``n_boundary`` of them and
imposes the PDE at ``n_pde_imposed`` and u = 0 at ``n_boundary_imposed`` others), float32, one thread.

Runs: PINA's PINN (its ``PINN`` solver, default Adam, lr 1e-3, MSE of every condition); this package
with torch Adam (lr 1e-3, nothing imposed: the same PINN, as a control of the implementation); this
package with SQP-Adam (lr 1e-3, rho = full), the points imposed. Printed: the relative L2 error on a
51 x 51 grid, max |residual| at the imposed points and at held-out points (the interior and boundary
nodes of a 21 x 21 grid), and the training time (``trainer.fit``, seconds).

PINA is an optional extra, never a dependency of the package::

    pip install -e ".[peers]"        # or: pip install pina-mathlab
    python benchmarks/pinn_peers.py [--steps 3000] [--seed 0] [--threads 1]

Without PINA the script says how to install it and exits (status 0) after this package's runs, unless
``--require-pina``.

Measured (``python benchmarks/pinn_peers.py --steps 3000``, pina-mathlab 0.3.2.post2610, torch 2.13.0
CPU, AMD EPYC, 2 cores shared with other jobs, so the times vary up to 2.5x between two runs; the errors
repeat exactly): rel. L2 error PINA 1.47e-1, this package with Adam 1.58e-1, with SQP-Adam and 25 + 25
points imposed 5.50e-4; max |-Δu - f| at the held-out points 0.85, 0.66 and 0.11; time 47-119 s,
17-36 s and 47-64 s. With 12 + 12 points imposed: 1.09e-2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from lit_constrained.physics import laplacian  # noqa: E402
from lit_constrained.tasks.common import mlp  # noqa: E402
from lit_constrained.tasks.poisson_data import poisson_exact, poisson_forcing, poisson_points  # noqa: E402

INSTALL_PINA = 'PINA is not installed: pip install -e ".[peers]" (or pip install pina-mathlab), then rerun.'
Field = Callable[[Tensor], Tensor]


def measure(u_fn: Field, points: dict[str, Tensor]) -> dict[str, float]:
    """rel. L2 error on the test grid and max |residual| of -Δu = f and of u = 0, imposed and held out."""

    def pde(x: Tensor) -> float:
        return float((-laplacian(u_fn, x) - poisson_forcing(x)).detach().abs().max()) if len(x) else float("nan")

    def boundary(x: Tensor) -> float:
        return float(u_fn(x).detach().abs().max()) if len(x) else float("nan")

    u = u_fn(points["x_test"]).detach()
    exact = poisson_exact(points["x_test"])
    return {
        "rel_l2": float((u - exact).norm() / exact.norm()),
        "pde_imposed": pde(points["x_pde_imposed"]),
        "bc_imposed": boundary(points["x_bc_imposed"]),
        "pde_held_out": pde(points["x_pde_check"]),
        "bc_held_out": boundary(points["x_bc_check"]),
    }


def initial_network(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return mlp(2, 20, 2, 1)


def run_pina(points: dict[str, Tensor], steps: int, seed: int) -> tuple[dict[str, float], float]:
    """PINA's PINN on Poisson2DSquareProblem, trained on every point (interior and boundary)."""
    from pina import LabelTensor, Trainer
    from pina.model import FeedForward
    from pina.problem.zoo import Poisson2DSquareProblem

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from pina.solver import PINN
    # pina's trainer module puts filterwarnings("always", UserWarning) first when imported: ours again
    warnings.filterwarnings("ignore", message=r".*val_dataloader")  # PINA's solver: a validation_step, no val data

    problem = Poisson2DSquareProblem()
    interior = torch.cat([points["x_pde"], points["x_pde_imposed"]])
    edge = torch.cat([points["x_bc"], points["x_bc_imposed"]])
    problem.discretised_domains["D"] = LabelTensor(interior, labels=["x", "y"])
    problem.discretised_domains["boundary"] = LabelTensor(edge, labels=["x", "y"])
    model = FeedForward(input_dimensions=2, output_dimensions=1, inner_size=20, n_layers=2)
    model.model.load_state_dict(initial_network(seed).state_dict())  # the same Linear/Tanh stack, same weights
    solver = PINN(problem=problem, model=model)  # PINA's defaults: Adam, lr 1e-3, MSE of each condition
    trainer = Trainer(solver, batch_size=None, max_epochs=steps, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if trainer.global_step != steps:
        raise RuntimeError(f"PINA took {trainer.global_step} steps, expected {steps} (one full batch per epoch).")
    net = model.model.eval()
    return measure(lambda x: -net(x)[:, 0], points), seconds  # PINA's u is -sin sin: compare -u


def run_package(points_args: dict[str, Any], points: dict[str, Tensor], steps: int, seed: int,
                optimizer: dict[str, Any]) -> tuple[dict[str, float], float]:
    """This package's poisson task (the same points and initial weights), full batch."""
    import lightning.pytorch as pl

    from lit_constrained.tasks.poisson import Poisson, PoissonData

    model = Poisson(optimizer=optimizer, num_threads=torch.get_num_threads())
    model.net.load_state_dict(initial_network(seed).state_dict())
    data = PoissonData(**points_args)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the fit summary: the figures are printed below
        trainer.fit(model, data)
    seconds = time.perf_counter() - start
    if trainer.global_step != steps:
        raise RuntimeError(f"the package took {trainer.global_step} steps, expected {steps}.")
    return measure(model.eval(), points), seconds


COLUMNS = ("rel_l2", "pde_imposed", "bc_imposed", "pde_held_out", "bc_held_out")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-pde", type=int, default=400)
    parser.add_argument("--n-boundary", type=int, default=100)
    parser.add_argument("--n-pde-imposed", type=int, default=25)
    parser.add_argument("--n-boundary-imposed", type=int, default=25)
    parser.add_argument("--require-pina", action="store_true", help="exit with status 1 when PINA is missing")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module=r"(lightning|pina|torch)\b")
    warnings.filterwarnings("ignore", message=r".*val_dataloader")  # PINA's solver: a validation_step, no val data
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)  # "GPU available", tips: one table instead
    points_args = dict(n_pde=args.n_pde, n_boundary=args.n_boundary, n_pde_imposed=args.n_pde_imposed,
                       n_boundary_imposed=args.n_boundary_imposed, seed=args.seed)
    points = {k: torch.from_numpy(v).float() for k, v in poisson_points(**points_args).items()}
    has_pina = importlib.util.find_spec("pina") is not None
    if not has_pina:
        print(INSTALL_PINA)
        if args.require_pina:
            return 1

    runs: list[tuple[str, Callable[[], tuple[dict[str, float], float]]]] = []
    if has_pina:
        runs.append(("PINA PINN (Adam)", lambda: run_pina(points, args.steps, args.seed)))
    runs.append(("lit_constrained, Adam (nothing imposed)", lambda: run_package(
        points_args, points, args.steps, args.seed, {"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}})))
    runs.append((f"lit_constrained, SQP-Adam ({args.n_pde_imposed} + {args.n_boundary_imposed} imposed)",
                 lambda: run_package(points_args, points, args.steps, args.seed,
                                     {"class_path": "lit_constrained.optim.SQPAdam",
                                      "init_args": {"lr": 1e-3, "rho": "full"}})))
    print(f"Poisson2DSquareProblem, {args.steps} full-batch steps, seed {args.seed}, {args.threads} thread(s), "
          f"{args.n_pde + args.n_pde_imposed} interior + {args.n_boundary + args.n_boundary_imposed} boundary points, "
          "MLP 2-20-20-1 tanh, float32")
    print(f"{'run':48s} {'rel L2':>9s} {'PDE imp.':>9s} {'u imp.':>9s} {'PDE held':>9s} {'u held':>9s} {'time s':>8s}")
    for name, run in runs:
        figures, seconds = run()
        print(f"{name:48s} " + " ".join(f"{figures[c]:9.2e}" for c in COLUMNS) + f" {seconds:8.1f}", flush=True)
    print("PDE: max |-Δu - f|, u: max |u| on the boundary; imp.: at the imposed points (for the runs that impose "
          "nothing, the same points); held: at the 441 interior and 80 boundary nodes of a 21 x 21 grid.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
