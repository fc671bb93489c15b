"""Float32 accuracy of one constrained step over many problem instances (issue 13's accuracy targets).

For J = U diag(sigma) V^T (m x n, sigma log-spaced from 1 to 1 / cond, random orthonormal U, V), random
c and gradient g (J, c, g in float32; every violation is measured in float64 with that J), float32
parameters at 0, one step with lr 0.1 and rho = 1 gives x = lr d; reported is
||J d + c|| / ||c|| (float64 products), per optimizer and cond(J): the worst and the median over the
instances, next to the float32 floor: the same optimizer's float64 step rounded to float32. Also
||J P w|| / ||w|| of ``NullSpace.project`` (sigma_max = 1). Instances: J seeds 0..K-1 with gradient seeds
1..K, and J seed 0 with gradient seeds 1..6 (the tests' instance is the first)::

    python benchmarks/float32_accuracy.py [--instances 12] [--n 100000] [--m 10] [--conds 1e2,1e3,1e4,1e5]
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from lit_constrained.optim import AdamCon, NullSpace, SQPAdam, SQPHeavyBall
from machine import cpu_model  # benchmarks/machine.py

F64 = torch.float64
OPTIMIZERS = {"SQPAdam": SQPAdam, "SQPHeavyBall": SQPHeavyBall, "AdamCon": AdamCon}


def svd_jacobian(m: int, n: int, cond: float, seed: int) -> torch.Tensor:
    """The float32 J the optimizers are given (as in tests/optim/test_sqp.py), returned in float64."""
    gen = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    sigma = torch.logspace(0, -math.log10(cond), m, dtype=F64)
    return ((U * sigma) @ V.T).float().to(F64)


def step(name: str, J: torch.Tensor, c: torch.Tensor, g: torch.Tensor, lr: float = 0.1) -> torch.Tensor:
    """d = (x after one step from 0) / lr, in J's dtype."""
    x = torch.nn.Parameter(torch.zeros(J.shape[1], dtype=J.dtype))
    opt = OPTIMIZERS[name]([x], lr=lr, rho=1.0)
    x.grad = g
    opt.step(constraints=c, jacobian=J)
    return x.detach() / lr


def relative_violation(J64: torch.Tensor, d: torch.Tensor, c64: torch.Tensor) -> float:
    return ((J64 @ d.to(F64) + c64).norm() / c64.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=12)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--conds", default="1e2,1e3,1e4,1e5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs = [(s, s + 1) for s in range(args.instances)] + [(0, s) for s in range(2, 7)]
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; n = {args.n}, m = {args.m}, {len(pairs)} instances")
    for cond in (float(v) for v in args.conds.split(",")):
        problems = []
        for j_seed, g_seed in pairs:
            J64 = svd_jacobian(args.m, args.n, cond, j_seed)
            gen = torch.Generator().manual_seed(g_seed)
            c, g = torch.randn(args.m, generator=gen), torch.randn(args.n, generator=gen)
            problems.append((J64, c, g))
        for name in OPTIMIZERS:
            errors, floors = [], []
            for J64, c, g in problems:
                errors.append(relative_violation(J64, step(name, J64.float(), c, g), c.double()))
                exact = step(name, J64, c.double(), g.double())
                floors.append(relative_violation(J64, exact.float(), c.double()))
            print(f"cond(J) = {cond:.0e}  {name:12s} ||J d + c|| / ||c||: worst {max(errors):.2e}, median "
                  f"{statistics.median(errors):.2e}  | float64 step rounded to float32: worst {max(floors):.2e}")
        projections = []
        for (J64, _, _), (j_seed, _) in zip(problems, pairs):
            w = torch.randn(args.n, generator=torch.Generator().manual_seed(j_seed + 4))
            p = NullSpace.from_jacobian(J64.float()).project(w)
            projections.append(((J64 @ p.to(F64)).norm() / w.norm()).item())
        print(f"cond(J) = {cond:.0e}  NullSpace.project ||J P w|| / ||w||: worst {max(projections):.2e}")


if __name__ == "__main__":
    main()
