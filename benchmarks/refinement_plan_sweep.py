"""Is each refinement step of the plan needed? The merged step's linearized error against m, n, cond(J) and the
shape of the spectrum, after k = 0, 1, ..., plan refinements (``optim.linalg.refinement.RefinementPlan``).

float32 J = U diag(sigma) V^T (random orthonormal U, V) for n in {2e4, 2e5}, m in {5, 10, 40}, cond(J) in
{10, 1e2, 1e3, 1e4, 1e5} (cases the plan sends to the exact Gram are skipped) and three spectra: ``log``
(sigma log-spaced from 1 to 1 / cond), ``one_small`` (one singular value 1 / cond) and ``half`` (half of
them 1 / cond); c random, or ``small`` (along the smallest left singular vector, plus 1e-3 of noise). The error
of the normal step (a = 0) is ||J delta + U_r U_r^T c|| / ||U_r U_r^T c||, against a float64 SVD; the plan
targets ``TARGET_ERROR`` (1e-6). Prints, per cond(J), the worst error with one refinement fewer than the plan
and with the plan, and writes every case to ``benchmarks/results/refinement_plan_sweep.json``::

    python benchmarks/refinement_plan_sweep.py
"""

from __future__ import annotations

import collections
import itertools
import json
import math
from pathlib import Path

import torch

from lit_constrained.optim.linalg.gram import gram
from lit_constrained.optim.linalg.gram_factor import GramFactor
from lit_constrained.optim.linalg.merged_step import merged_step
from lit_constrained.optim.linalg.refinement import RefinementPlan, refinement_counts

F64 = torch.float64
SPECTRA = ("log", "one_small", "half")


def svd_jacobian(m: int, n: int, cond: float, spectrum: str, gen: torch.Generator) -> torch.Tensor:
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=F64))
    if spectrum == "log":
        sigma = torch.logspace(0, -math.log10(cond), m, dtype=F64)
    else:
        sigma = torch.ones(m, dtype=F64)
        sigma[-1 if spectrum == "one_small" else m // 2:] = 1.0 / cond
    return ((U * sigma) @ V.T).float().contiguous()


def case(n: int, m: int, cond: float, spectrum: str, direction: str, gen: torch.Generator) -> dict | None:
    """The normal step's error after 0 ... plan refinements (None when the plan takes the exact Gram)."""
    J = svd_jacobian(m, n, cond, spectrum, gen)
    factor = GramFactor.from_gram(gram(J))
    plan = RefinementPlan.decode(tuple(refinement_counts(factor, n, J.dtype).tolist()), m)
    if plan.exact_gram:
        return None
    J64 = J.to(F64)
    U = torch.linalg.svd(J64, full_matrices=False)[0]
    c = torch.randn(m, generator=gen, dtype=F64)
    if direction == "small":
        c = U[:, -1] + 1e-3 * c
    target = -(U @ (U.T @ c))
    errors = []
    for k in range(plan.steps + 1):
        delta = merged_step(J, factor, None, 0.0, c, k, torch.empty(n), exact=plan.exact_residual)
        errors.append(float((J64 @ delta.to(F64) - target).norm() / target.norm()))
    return dict(n=n, m=m, cond=cond, spectrum=spectrum, c=direction, plan=plan.steps,
                exact_residual=plan.exact_residual, errors=errors)


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows = [row for values in itertools.product([20_000, 200_000], [5, 10, 40], [10, 1e2, 1e3, 1e4, 1e5], SPECTRA,
                                                ["random", "small"])
            if (row := case(*values, gen)) is not None]
    out = Path(__file__).resolve().parent / "results" / "refinement_plan_sweep.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    worst: dict[float, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        if row["plan"]:
            entry = worst[row["cond"]]
            entry[0] = max(entry[0], row["errors"][-2])
            entry[1] = max(entry[1], row["errors"][-1])
            entry[2] += 1
    for cond, (fewer, planned, count) in sorted(worst.items()):
        print(f"cond(J) {cond:g}: {count:.0f} cases refined; worst error with one refinement fewer than the plan "
              f"{fewer:.1e}, with the plan {planned:.1e}")


if __name__ == "__main__":
    main()
