"""Cost of one ``optimizer.step()``: SQP-Adam, SQP-HeavyBall and Adam(con) against ``torch.optim.Adam(foreach=True)``.

Parameter sets of MLPs with ~1e5 and ~1e6 float32 parameters, fixed random gradients, m = 10 and 50
constraints with a fixed float32 Jacobian J and random c. Two kinds of J: ``random`` (Gaussian entries,
cond(J J^T) ~ 1: no iterative refinement is needed) and ``trained`` (J = U diag(sigma) V^T with
cond(J J^T) = 3e4, the conditioning the issue measured on the spring task at initialization: one
refinement step, as in real training). The optimizers are timed in the same process, interleaved (one
block of steps each, in turn, repeated), and the medians are compared. Usage::

    python benchmarks/bench_optimizer_step.py [--repeats 11] [--block 3] [--threads 1]
        [--cases 1e6:10,1e5:10,1e6:50] [--jacobians random,trained]

Prints the CPU model, then per case the median time per step of each optimizer, its ratio to Adam (and
to SQP-Adam), and a traffic model: bytes moved per step by Adam (read p, g, m, v; write p, m, v: 28 n)
and by SQP-Adam (its passes over J plus its n-vector traffic), next to the "3-read limit" (J read three
times, the data dependencies' minimum, plus Adam-like vector traffic).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
from torch import nn

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from harness import interleaved_medians  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py

SIZES: dict[str, list[int]] = {
    "1e5": [32, 256, 256, 64, 1],  # 90,753 parameters
    "1e6": [64, 768, 768, 512, 1],  # 1,034,753 parameters
}
NAMES = ["Adam(foreach)", "SQPAdam", "SQPHeavyBall", "AdamCon"]
TRAINED_GRAM_CONDITION = 3.3e4




def mlp_parameters(widths: list[int]) -> list[nn.Parameter]:
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    return [nn.Parameter(p.detach().clone()) for layer in layers for p in layer.parameters()]


def jacobian(m: int, n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.randn(m, n, generator=gen)
    # J = U diag(sigma) V^T, sigma log-spaced over sqrt(cond(G)); V from a QR of an (n, m) Gaussian
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen))
    sigma = torch.logspace(0, -0.5 * math.log10(TRAINED_GRAM_CONDITION), m)
    return ((U * sigma) @ V.T).contiguous()


def problem(widths: list[int], m: int, kind: str) -> tuple[list[nn.Parameter], torch.Tensor, torch.Tensor]:
    params = mlp_parameters(widths)
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    n = sum(p.numel() for p in params)
    return params, torch.randn(m, generator=gen), jacobian(m, n, kind, gen)


def make_runner(name: str, widths: list[int], m: int, kind: str) -> Callable[[int], None]:
    params, c, J = problem(widths, m, kind)
    if name == "Adam(foreach)":
        adam = torch.optim.Adam(params, lr=1e-6, foreach=True)

        def run(steps: int) -> None:
            for _ in range(steps):
                adam.step()

        return run
    # a tiny lr keeps the weights (and so the work) essentially fixed over the repeats
    opt = {"SQPAdam": SQPAdam, "SQPHeavyBall": SQPHeavyBall, "AdamCon": AdamCon}[name](params, lr=1e-6)

    def run_constrained(steps: int) -> None:
        for _ in range(steps):
            opt.step(constraints=c, jacobian=J)

    run_constrained.optimizer = opt  # type: ignore[attr-defined]
    return run_constrained


def traffic(n: int, m: int, refinements: int) -> dict[str, float]:
    """Bytes moved per step (float32 model): Adam; SQP-Adam as implemented; the 3-read limit."""
    adam = 28.0 * n
    # J reads: Gram, J g, J^T y_g (writes u), J w, J^T z (writes delta), 2 per refinement (the exact
    # residual converts J chunk-wise in cache); n-vectors: gather g (r+w), r, s (r+w each), w (3 r + w),
    # x += delta (r+w) and the J^T passes' vector operands: ~18 n-vector transfers
    sqp = 4.0 * m * n * (5 + 2 * refinements) + 4.0 * 18 * n
    limit = 4.0 * m * n * 3 + adam
    return {"Adam": adam, "SQPAdam": sqp, "3-read limit": limit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", default="1e6:10,1e5:10,1e6:50", help="comma-separated size:m pairs")
    parser.add_argument("--jacobians", default="random,trained", help="random and/or trained")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved blocks of {args.block} steps, medians; ratio = time / Adam(foreach)")
    for case in args.cases.split(","):
        label, m_text = case.strip().split(":")
        widths, m = SIZES[label], int(m_text)
        n = sum(p.numel() for p in mlp_parameters(widths))
        for kind in [k.strip() for k in args.jacobians.split(",")]:
            runners = {name: make_runner(name, widths, m, kind) for name in NAMES}
            med = interleaved_medians(runners, args.repeats, args.block, warmup=2)  # warm-up: allocations, state
            base, sqp = med["Adam(foreach)"], med["SQPAdam"]
            opt = runners["SQPAdam"].optimizer  # type: ignore[attr-defined]
            opt.step(constraints=torch.zeros(m), jacobian=problem(widths, m, kind)[2], diagnostics=True)
            k = int(opt.diagnostics["refinements"])
            print(f"n = {n:>9,d}, m = {m:>3d}, J {kind:<7s} (refinements {k}): " + "  ".join(
                f"{name} {1e3 * t:8.2f} ms ({t / base:5.2f}x)" for name, t in med.items()
            ) + f"  | HeavyBall/SQPAdam {med['SQPHeavyBall'] / sqp:4.2f}, AdamCon/SQPAdam {med['AdamCon'] / sqp:4.2f}")
            moved = traffic(n, m, k)
            print("    bytes per step (model): " + "  ".join(
                f"{name} {value / 1e6:7.1f} MB ({value / moved['Adam']:5.2f}x Adam)" for name, value in moved.items()
            ))


if __name__ == "__main__":
    main()
