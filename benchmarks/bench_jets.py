"""The per-point Jacobian of the PINNacle tasks' PDE residuals through a jet against nested ``jvp``.

Each task's 100 x 5 tanh MLP in float64 (as c and J are evaluated by default), its PDE residual at N
random points, J by the ``"func"`` path (``vmap`` of ``jacrev`` over points): once with the task's
``jet`` (:mod:`lit_constrained.physics.jets`, the default), once with the same weights in a subclass
without one (the operators' nested ``jvp`` / ``jacfwd(jacrev)``). Interleaved blocks in one process,
medians; the two Jacobians are compared too. Usage::

    python benchmarks/bench_jets.py [--points 16,96] [--repeats 7] [--block 3]
"""

from __future__ import annotations

import argparse

import torch

from harness import interleaved_medians, repeated  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py
from lit_constrained.jacobians import pointwise_jacobian
from lit_constrained.tasks.pinnacle import PINNACLE_NAMES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="16,96")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{cpu_model()}, one thread, torch {torch.__version__}")
    print("| task | N | J through the jet (ms) | nested jvp (ms) | ratio | max |J_jet - J_nested| / max |J| |")
    print("|---|---|---|---|---|---|")
    for name, task_class in PINNACLE_NAMES.items():
        torch.manual_seed(0)
        task = task_class(dtype="float64")
        plain = type(f"{task_class.__name__}WithoutJet", (task_class,), {"jet": None})(dtype="float64")
        plain.load_state_dict(task.state_dict())
        for n in (int(v) for v in args.points.split(",")):
            x = torch.rand(n, task.input_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
            runs = {
                kind: (lambda m=module: pointwise_jacobian(m, list(m.parameters()), m.pde_residual, x, path="func"))
                for kind, module in (("jet", task), ("nested", plain))
            }
            error = (runs["jet"]() - runs["nested"]()).abs().max() / runs["nested"]().abs().max()
            times = interleaved_medians({k: repeated(f) for k, f in runs.items()}, args.repeats, args.block, warmup=1)
            print(f"| {name} | {n} | {1e3 * times['jet']:.1f} | {1e3 * times['nested']:.1f} | "
                  f"{times['nested'] / times['jet']:.1f}x | {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
