"""Issue 18's measurements. The lr sweep's logic lives in :mod:`lit_constrained.compare.sweep`:

    python benchmarks/sqp_momo_sweep.py --tasks curve --steps curve=300 --json sweep.json
    (the same as: python -m lit_constrained.compare.sweep ...)

plus the step-by-step difference between SQP-MoMo-Adam's two geometries (docs/sqp_momo.md):

    python benchmarks/sqp_momo_sweep.py geometry-difference [--lr 1e-2] [--steps 100]

trains the curve task (seed 0, full batch, f* = 0) with ``geometry="euclidean"`` and, at every step, takes
the exact D-norm step (``geometry="adam"``) from a copy of the same optimizer state and parameters; it
prints the median/min/max over the steps of ||dx_E - dx_D|| / ||dx_D||, cos(dx_E, dx_D) and tau_E / tau_D.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch

from lit_constrained.compare.sweep import main as sweep_main


def geometry_difference(lr: float, steps: int) -> dict[str, list[float]]:
    from lit_constrained.optim import constraint_jacobian
    from lit_constrained.optim.experimental import SQPMoMoAdam
    from lit_constrained.tasks.curve import CurveData, CurveFit

    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = CurveFit(num_threads=1)
    data = CurveData(seed=0)
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    params = list(module.parameters())
    opt = SQPMoMoAdam(params, lr=lr, lower_bound=0.0, geometry="euclidean")

    def evaluate() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for p in params:
            p.grad = None
        loss = module.objective(batch)
        loss.backward()
        c = module.constraints(batch)
        return loss.detach(), c.detach(), constraint_jacobian(c, params)

    def take(optimizer: SQPMoMoAdam, start: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
        loss, c, J = evaluate()
        optimizer.step(lambda: loss, constraints=c, jacobian=J, diagnostics=True)
        delta = torch.cat([(p.detach() - a).reshape(-1) for p, a in zip(params, start)])
        return delta, float(optimizer.diagnostics["tau"])

    out: dict[str, list[float]] = {"||dx_E - dx_D|| / ||dx_D||": [], "cos(dx_E, dx_D)": [], "tau_E / tau_D": []}
    for _ in range(steps):
        start = [p.detach().clone() for p in params]
        other = SQPMoMoAdam(params, lr=lr, lower_bound=0.0)
        other.load_state_dict(copy.deepcopy(opt.state_dict()))
        other.param_groups[0]["geometry"] = "adam"  # load_state_dict restored the saved group's geometry
        d_dnorm, tau_dnorm = take(other, start)
        with torch.no_grad():
            for p, a in zip(params, start):
                p.copy_(a)
        d_euclid, tau_euclid = take(opt, start)
        out["||dx_E - dx_D|| / ||dx_D||"].append(float((d_euclid - d_dnorm).norm() / d_dnorm.norm()))
        out["cos(dx_E, dx_D)"].append(float(torch.dot(d_euclid, d_dnorm) / (d_euclid.norm() * d_dnorm.norm())))
        out["tau_E / tau_D"].append(tau_euclid / tau_dnorm if tau_dnorm > 0 else float("inf"))
    return out


def main(argv: list[str]) -> int:
    if argv[:1] != ["geometry-difference"]:
        return sweep_main(argv)
    parser = argparse.ArgumentParser(prog="sqp_momo_sweep.py geometry-difference")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv[1:])
    for name, values in geometry_difference(args.lr, args.steps).items():
        print(f"{name:28s} median {statistics.median(values):.3g}  min {min(values):.3g}  max {max(values):.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
