r"""Cost of a step with inequality rows against the equality step (issue 36's cost targets).

For a float32 parameter set of n parameters (the MLPs of ``bench_optimizer_step.py``: ~1e5 and ~1e6),
m = 10 equality rows and p inequality rows (p = 10 and 50), fixed random inputs (J, G Gaussian,
cond ~ 1: no refinement step in any variant; fixed gradients, the same in all variants), four SQP-Adam steps are timed in the
same process, interleaved (one block of steps each, in turn, repeated; medians):

* ``eq m``: ``step(constraints=c, jacobian=J)``, the equality step with m rows;
* ``ineq p inactive``: the same plus ``inequalities=g, inequality_jacobian=G`` with every row far
  inside its bound (g = -1e3: none is ever active);
* ``ineq p active``: the same rows with g = 0 (every row on its bound) and an objective gradient that
  pushes into every row (:math:`\nabla f = -G^T 1` + 10% noise: positive multipliers, as an obstacle the
  solution touches): the active set is all p rows at every step (checked), each step after the first
  starts warm from it;
* ``eq m+p``: the equality step with the m + p rows [J; G], [c; g] (the same linear algebra size).

Targets: ``ineq p inactive`` <= 1.1x ``eq m``; ``ineq p active`` <= 1.3x ``eq m+p``. The first step of
each (cold: factorizations, the dual solve for the active rows, buffers) is not timed; it is printed
apart (one measurement, not a median).

    python benchmarks/bench_inequality_cost.py [--repeats 11] [--block 3] [--threads 1]
        [--cases 1e5:10,1e5:50,1e6:10,1e6:50] [--optimizer SQPAdam] [--json PATH]
Measured figures, with the commands: docs/inequalities.md ("Benchmarks (the optimizer side)").
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lit_constrained.optim import SQPAdam, SQPHeavyBall  # noqa: E402
from bench_optimizer_step import SIZES, mlp_parameters  # noqa: E402
from harness import interleaved_medians  # noqa: E402
from machine import cpu_model  # noqa: E402

M = 10
INACTIVE_VALUE = -1e3
ACTIVE_VALUE = 0.0
TARGET_INACTIVE = 1.1
TARGET_ACTIVE = 1.3
OPTIMIZERS = {"SQPAdam": SQPAdam, "SQPHeavyBall": SQPHeavyBall}


def make_runner(kind: str, widths: list[int], J: Tensor, c: Tensor, G: Tensor, grads: list[Tensor],
                opt_cls: type, lr: float) -> tuple[Callable[[int], None], Callable[[], list[int]]]:
    """A runner of k steps of one variant on its own copy of the parameters (same initial values and
    gradients for all), and a function returning the last step's active set."""
    torch.manual_seed(0)
    params = mlp_parameters(widths)
    for p, grad in zip(params, grads):
        p.grad = grad
    opt = opt_cls(params, lr=lr)
    p = G.shape[0]
    if kind == "eq m":
        kwargs = {"constraints": c, "jacobian": J}
    elif kind == "eq m+p":
        kwargs = {"constraints": torch.cat([c, torch.full((p,), ACTIVE_VALUE)]), "jacobian": torch.cat([J, G])}
    else:
        value = INACTIVE_VALUE if kind.endswith("inactive") else ACTIVE_VALUE
        kwargs = {"constraints": c, "jacobian": J, "inequalities": torch.full((p,), value),
                  "inequality_jacobian": G}

    def run(k: int) -> None:
        for _ in range(k):
            opt.step(**kwargs)

    def active() -> list[int]:
        return [int(i) for i in torch.as_tensor(getattr(opt, "active_set", [])).tolist()]

    return run, active


def case(size: str, p: int, repeats: int, block: int, opt_name: str, lr: float) -> dict[str, object]:
    widths = SIZES[size]
    torch.manual_seed(1)
    params = mlp_parameters(widths)
    n = sum(q.numel() for q in params)
    gen = torch.Generator().manual_seed(2)
    J = torch.randn(M, n, generator=gen) / n**0.5
    G = torch.randn(p, n, generator=gen) / n**0.5
    c = torch.randn(M, generator=gen) * 1e-3
    # the objective pushes into every inequality row (grad f = -G^T 1 + noise): held rows have positive
    # multipliers, as an obstacle the solution touches; the same gradients in all four variants
    flat = -(G.T @ torch.ones(p)) + 0.1 * torch.randn(n, generator=gen) / n**0.5
    grads = [chunk.reshape(q.shape).clone() for chunk, q in zip(flat.split([q.numel() for q in params]), params)]
    kinds = ["eq m", f"ineq {p} inactive", f"ineq {p} active", "eq m+p"]
    runners, actives, first = {}, {}, {}
    for kind in kinds:
        run, active = make_runner(kind, widths, J, c, G, grads, OPTIMIZERS[opt_name], lr)
        start = time.perf_counter()
        run(1)
        first[kind] = time.perf_counter() - start
        runners[kind], actives[kind] = run, active
    medians = interleaved_medians(runners, repeats=repeats, block=block, warmup=2)
    inactive, active = actives[kinds[1]](), actives[kinds[2]]()
    if inactive or active != list(range(p)):
        raise RuntimeError(f"n = {n}, p = {p}: active sets {inactive} (want none) and {active} (want all {p})")
    return {
        "n": n, "m": M, "p": p, "optimizer": opt_name, "medians_s": medians, "first_step_s": first,
        "inactive_ratio": medians[kinds[1]] / medians["eq m"],
        "active_ratio": medians[kinds[2]] / medians["eq m+p"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", default="1e5:10,1e5:50,1e6:10,1e6:50", help="size:p,... (size 1e5 or 1e6)")
    parser.add_argument("--optimizer", default="SQPAdam", choices=list(OPTIMIZERS))
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()} ({args.threads} thread(s)); torch {torch.__version__}, python "
          f"{platform.python_version()}; float32; {args.optimizer}; medians of {args.repeats} interleaved "
          f"blocks of {args.block} steps")
    results = []
    ok = True
    for item in args.cases.split(","):
        size, p = item.split(":")
        r = case(size, int(p), args.repeats, args.block, args.optimizer, args.lr)
        results.append(r)
        med, first = r["medians_s"], r["first_step_s"]
        print(f"\nn = {r['n']:,}, m = {M}, p = {r['p']}")
        for kind, seconds in med.items():
            print(f"  {kind:18} {seconds * 1e3:9.2f} ms/step   (first step {first[kind] * 1e3:8.2f} ms)")
        inactive_ok = r["inactive_ratio"] <= TARGET_INACTIVE
        active_ok = r["active_ratio"] <= TARGET_ACTIVE
        ok = ok and inactive_ok and active_ok
        print(f"  p inactive / eq m   = {r['inactive_ratio']:.3f}  (target <= {TARGET_INACTIVE}: "
              f"{'met' if inactive_ok else 'MISSED'})")
        print(f"  p active / eq m+p   = {r['active_ratio']:.3f}  (target <= {TARGET_ACTIVE}: "
              f"{'met' if active_ok else 'MISSED'})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                                         "cases": results}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
