"""Float32 accuracy of one constrained step over many problem instances (issue 13's accuracy targets).

For J = U diag(sigma) V^T (m x n, sigma log-spaced from 1 to 1 / cond, random orthonormal U, V), random
c and gradient g (J, c, g in float32; every violation is measured in float64 with that J), float32
parameters at 0, one step with lr 0.1 and rho = 1 gives x = lr d; reported is
||J d + c|| / ||c|| (float64 products), per optimizer and cond(J): the worst and the median over the
instances, next to the float32 floor: the same optimizer's float64 step rounded to float32. Also
||J P w|| / ||w|| of ``NullSpace.project`` (sigma_max = 1). Instances: J seeds 0..K-1 with gradient seeds
1..K, and J seed 0 with gradient seeds 1..6 (the tests' instance is the first)::

    python benchmarks/float32_accuracy.py [--instances 12] [--n 100000] [--m 10] [--conds 1e2,1e3,1e4,1e5]

``--poisson N``: why float32 constraints stall on a PDE (docs/float32.md). The Poisson task (its recommended
SQP-Adam, N PDE + N boundary points imposed) trained ``--steps`` steps by a plain loop of the module's own
step (objective, c, J, backward, ``SQPAdam.step`` with the corrections; the same numbers as the CLI run),
c and J in ``--constraint-dtype``; per step: max |c| the step sees, the normal and whole step's norms, the
corrections and step halvings, cond(J J^T). At the final weights: the float32 evaluation floor
max |c32 - c64|, J32 against J64 and their singular values, the noise of c along the left singular
vectors, one Gauss-Newton step and six Newton iterations (fresh J) per rcond, from float32 or float64 c
and J::

    python benchmarks/float32_accuracy.py --poisson 25 --steps 3000 [--constraint-dtype native] [--rcond 1e-7]
        [--max-corrections 3] [--out FILE.json]
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


# ---------------------------------------------------------------------------- the Poisson study
def poisson_model(points: int, constraint_dtype: str, hidden: int = 20, depth: int = 2) -> tuple:
    """(model, batch as the task sees it, data) of the recommended Poisson run (seed 0, full batch)."""
    import lightning.pytorch as pl

    from lit_constrained.tasks.poisson import Poisson, PoissonData

    pl.seed_everything(0, verbose=False)
    model = Poisson(hidden=hidden, depth=depth, constraint_dtype=constraint_dtype)
    data = PoissonData(batch_mode="full", n_pde=400, n_boundary=100, n_pde_imposed=points, n_boundary_imposed=points)
    data.setup("fit")
    return model, model.prepare_batch(next(iter(data.train_dataloader()))), data


def c_and_j(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.enable_grad():
        c = model.constraints(batch)
        return c.detach().reshape(-1), model.constraint_jacobian(batch, c, list(model.parameters())).detach()


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(F64) for p in model.parameters()])


def set_flat(model, x: torch.Tensor) -> None:
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(x[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()


def gauss_newton(J: torch.Tensor, c: torch.Tensor, rcond: float) -> tuple[torch.Tensor, int]:
    """-J^+ c in float64 by a truncated SVD (singular values below rcond x the largest dropped) and the rank."""
    U, S, Vh = torch.linalg.svd(J.to(F64), full_matrices=False)
    keep = S > rcond * S[0]
    return -(Vh[keep].T @ ((U[:, keep].T @ c.to(F64)) / S[keep])), int(keep.sum())


def poisson_trace(points: int, steps: int, constraint_dtype: str, hidden: int, depth: int,
                  rcond: float = 1e-7, max_corrections: int = 3) -> tuple:
    """Train as the module does and record every step (see the module docstring)."""
    import lit_constrained.optim.corrections as corrections
    from lit_constrained.optim import SQPAdam

    model, batch, data = poisson_model(points, constraint_dtype, hidden, depth)
    params = list(model.parameters())
    optimizer = SQPAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7, h=1.0, rho="full", rcond=rcond,
                        max_corrections=max_corrections)

    def closure() -> torch.Tensor:  # c at the updated weights, as the module's step hands it over
        with torch.enable_grad():
            return model.constraints(batch).detach().reshape(-1)

    evaluations: list[float] = []
    original = corrections.evaluated_constraints

    def counted(evaluate, m):  # every max |c| the corrections evaluate
        c = original(evaluate, m)
        evaluations.append(float(c.abs().max()))
        return c

    corrections.evaluated_constraints = counted
    rows = []
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            f = model.objective(batch)
            with torch.enable_grad():
                c = model.constraints(batch)
                J = model.constraint_jacobian(batch, c, params)
            f.backward()
            evaluations.clear()
            optimizer.step(constraints=c.detach(), jacobian=J, diagnostics=True, constraint_closure=closure)
            d = optimizer.diagnostics
            rows.append({"c": float(c.detach().abs().max()), "after_step": evaluations[0] if evaluations else math.nan,
                         "corrections": float(d.get("corrections", 0.0)),
                         "step_fraction": float(d.get("step_fraction", 1.0)),
                         "normal": float(d["normal_step_norm"]), "step": float(d["step_norm"]),
                         "gram_condition": float(d["gram_condition"]), "rank": int(d["rank"])})
    finally:
        corrections.evaluated_constraints = original
    return model, batch, data, rows


def poisson_at_weights(model, batch) -> dict:
    """The analysis at the model's weights (see the module docstring)."""
    import copy

    twin = copy.deepcopy(model).double()  # the same weights in float64
    saved, model.constraint_dtype = model.constraint_dtype, "native"
    c32, J32 = c_and_j(model, batch)  # the float32 evaluation
    model.constraint_dtype = saved
    c64, J64 = c_and_j(twin, {k: v.to(F64) for k, v in batch.items()})
    S32, S64 = torch.linalg.svdvals(J32.to(F64)), torch.linalg.svdvals(J64)
    U = torch.linalg.svd(J64, full_matrices=False)[0]
    out = {"floor": float((c32.to(F64) - c64).abs().max()), "max_c32": float(c32.abs().max()),
           "max_c64": float(c64.abs().max()), "J_relative_error": float((J32.to(F64) - J64).norm() / J64.norm()),
           "singular_values_64": S64.tolist(), "singular_values_32": S32.tolist(),
           "c64_along_u": (U.T @ c64).abs().tolist(), "noise_along_u": (U.T @ (c32.to(F64) - c64)).abs().tolist(),
           "gauss_newton": [], "newton": []}
    x0 = flat(model)
    for rcond in (1e-10, 1e-7, 1e-6, 1e-5, 1e-4):
        step64, rank64 = gauss_newton(J64, c64, rcond)
        set_flat(twin, x0 + step64)
        after64 = float(c_and_j(twin, {k: v.to(F64) for k, v in batch.items()})[0].abs().max())
        step32, rank32 = gauss_newton(J32, c32, rcond)
        set_flat(twin, x0 + step32)
        direction = float(c_and_j(twin, {k: v.to(F64) for k, v in batch.items()})[0].abs().max())
        set_flat(twin, x0)
        out["gauss_newton"].append({"rcond": rcond, "rank64": rank64, "norm64": float(step64.norm()), "after64": after64,
                                    "rank32": rank32, "norm32": float(step32.norm()), "after32_in_float64": direction})
    for evaluation, rcond in (("float64", 1e-7), ("native", 1e-7), ("native", 1e-6), ("native", 1e-5), ("float64", 1e-5)):
        trial = copy.deepcopy(model)  # float32 weights, c and J evaluated as ``evaluation``
        trial.constraint_dtype = evaluation
        history = []
        for _ in range(6):
            c, J = c_and_j(trial, batch)
            history.append(float(c.abs().max()))
            set_flat(trial, flat(trial) + gauss_newton(J, c, rcond)[0])
        out["newton"].append({"c_and_j": evaluation, "rcond": rcond, "max_c": history})
    return out


def poisson_main(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    print(f"CPU: {cpu_model()}; torch {torch.__version__}; Poisson {args.poisson} + {args.poisson} imposed, "
          f"{args.hidden} x {args.depth}, c and J {args.constraint_dtype}, {args.steps} steps")
    model, batch, _, rows = poisson_trace(args.poisson, args.steps, args.constraint_dtype, args.hidden, args.depth,
                                         args.rcond, args.max_corrections)
    later = rows[50:]
    seen = [r["c"] for r in later]
    print(f"after step 50: max |c| the step sees median {statistics.median(seen):.2e}, worst {max(seen):.2e}; "
          f"last 100 steps {min(seen[-100:]):.2e} .. {max(seen[-100:]):.2e}; right after the step (before corrections) "
          f"median {statistics.median([r['after_step'] for r in later]):.2e}")
    print(f"  normal step median {statistics.median([r['normal'] for r in later]):.2e}, whole step "
          f"{statistics.median([r['step'] for r in later]):.2e}; corrections a step {statistics.fmean([r['corrections'] for r in later]):.2f}, "
          f"halved steps {sum(r['step_fraction'] < 1 for r in later)} of {len(later)}; cond(J J^T) median "
          f"{statistics.median([r['gram_condition'] for r in later]):.2e}")
    at = poisson_at_weights(model, batch)
    S64, S32 = at["singular_values_64"], at["singular_values_32"]
    print(f"final weights: max |c32| {at['max_c32']:.2e}, max |c64| {at['max_c64']:.2e}, floor max |c32 - c64| "
          f"{at['floor']:.2e}; ||J32 - J64|| / ||J64|| {at['J_relative_error']:.2e}; sigma 64: max {S64[0]:.3g} min "
          f"{S64[-1]:.3g} (32: {S32[-1]:.3g}), cond(J) {S64[0] / S64[-1]:.3g}")
    last = slice(-7, None)
    print("  |u_i^T c64| (7 smallest sigma): " + " ".join(f"{v:.1e}" for v in at["c64_along_u"][last])
          + "; |u_i^T (c32 - c64)|: " + " ".join(f"{v:.1e}" for v in at["noise_along_u"][last]))
    for g in at["gauss_newton"]:
        print(f"  one Gauss-Newton step, rcond {g['rcond']:.0e}: float64 rank {g['rank64']} |d| {g['norm64']:.2e} -> "
              f"max |c64| {g['after64']:.2e}; from float32 c, J: rank {g['rank32']} |d| {g['norm32']:.2e} -> "
              f"{g['after32_in_float64']:.2e}")
    for n in at["newton"]:
        print(f"  Newton (fresh J, float32 weights), c and J {n['c_and_j']}, rcond {n['rcond']:.0e}: "
              + " ".join(f"{v:.2e}" for v in n["max_c"]))
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_model(), "args": vars(args), "steps": rows, "final": at}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=12)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--conds", default="1e2,1e3,1e4,1e5")
    parser.add_argument("--poisson", type=int, default=None, help="N: the Poisson study (see above)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--constraint-dtype", default="native", choices=("native", "float64"))
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--rcond", type=float, default=1e-7, help="the optimizer's rcond in the Poisson study")
    parser.add_argument("--max-corrections", type=int, default=3, help="the optimizer's, in the Poisson study")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.poisson:
        poisson_main(args)
        return
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
