"""Cost of the constraint Jacobian J = dc/dx against one gradient of the objective, on the tasks' networks.

For the spring (m = 3; full batch of 30 collocation points) and the chemistry network (m = 10; 100
initial conditions = 6 400 rows, full batch and a 20 % mini-batch), all timed in the same process,
interleaved, medians:

* ``grad f``: forward of the objective and ``torch.autograd.grad(f, params)`` (one backward pass),
* ``J batched``: forward of c and :func:`lit_constrained.optim.constraint_jacobian` with
  ``method="batched"`` (one vmapped backward over the m rows),
* ``J loop``: the same with ``method="loop"`` (m backward passes),

and the derivative alone (f and c computed once outside the timing, graphs retained): ``bwd f``,
``bwd J batched``, ``bwd J loop``. Ratios are against ``grad f`` / ``bwd f``. Usage::

    python benchmarks/bench_jacobian.py [--repeats 30] [--block 5] [--threads 1] [--tasks spring,chemistry]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from harness import interleaved_medians, repeated  # benchmarks/harness.py (scripts run from benchmarks/)
from lit_constrained.optim import constraint_jacobian
from lit_constrained.batch import cast_floats


def spring_case(minibatch: bool) -> tuple[Any, Any]:
    from lit_constrained.tasks.spring import Spring, SpringData

    torch.manual_seed(0)
    data = SpringData(batch_mode="minibatch" if minibatch else "full")
    data.setup()
    model = Spring()
    batch = next(iter(data.train_dataloader()))
    return model, cast_floats(batch, model.dtype)


def chemistry_case(minibatch: bool) -> tuple[Any, Any]:
    from lit_constrained.tasks.chemistry import Chemistry, ChemistryData

    torch.manual_seed(0)
    data = ChemistryData(batch_mode="minibatch" if minibatch else "full", n_ic=100, cache_dir=None)
    data.setup()
    model = Chemistry()
    batch = next(iter(data.train_dataloader()))
    return model, cast_floats(batch, model.dtype)


CASES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "spring (full, 30 pts)": lambda: spring_case(False),
    "chemistry (full, 6400 rows)": lambda: chemistry_case(False),
    "chemistry (mini-batch 20 %, 1280 rows)": lambda: chemistry_case(True),
}


def runners(model: Any, batch: Any) -> dict[str, Callable[[], object]]:
    params = [p for p in model.parameters() if p.requires_grad]
    f_graph = model.objective(batch)
    c_graph = model.constraints(batch)

    def grad_f() -> object:
        return torch.autograd.grad(model.objective(batch), params, allow_unused=True)

    def jac(method: str) -> Callable[[], object]:
        return lambda: constraint_jacobian(model.constraints(batch), params, method=method)

    def bwd_f() -> object:
        return torch.autograd.grad(f_graph, params, retain_graph=True, allow_unused=True)

    def bwd_jac(method: str) -> Callable[[], object]:
        return lambda: constraint_jacobian(c_graph, params, method=method)

    return {
        "grad f": grad_f, "J batched": jac("batched"), "J loop": jac("loop"),
        "bwd f": bwd_f, "bwd J batched": bwd_jac("batched"), "bwd J loop": bwd_jac("loop"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", default="spring,chemistry", help="comma-separated: spring, chemistry")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = [t.strip() for t in args.tasks.split(",")]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.repeats} interleaved blocks of "
          f"{args.block} calls, medians; ratios against grad f (forward+backward) and bwd f (backward only)")
    for label, make in CASES.items():
        if not any(label.startswith(t) for t in wanted):
            continue
        model, batch = make()
        n = sum(p.numel() for p in model.parameters())
        m = model.constraints(batch).numel()
        fns = runners(model, batch)
        med = interleaved_medians({k: repeated(f) for k, f in fns.items()}, args.repeats, args.block, warmup=2)
        print(f"{label}: n = {n:,d}, m = {m}")
        for group, base in (("grad f", "J batched", "J loop"), "grad f"), (("bwd f", "bwd J batched", "bwd J loop"), "bwd f"):
            print("    " + "  ".join(f"{name} {1e3 * med[name]:8.3f} ms ({med[name] / med[base]:5.2f}x)" for name in group))


if __name__ == "__main__":
    main()
