"""Cost of one ``optimizer.step()``: SQP-Adam, SQP-HeavyBall and Adam(con) against ``torch.optim.Adam(foreach=True)``.

Parameter sets of MLPs with ~1e5 and ~1e6 parameters, fixed random gradients, m = 10 and 50 constraints
with a fixed random Jacobian J (float32, as the training step produces it) and random c. The optimizers
are timed in the same process, interleaved (one block of steps each, in turn, repeated), and the
medians are compared. A second table times the pieces of the SQP step on the same J, to show what
bounds it: the float64 copy of J, the Gram GEMM J J^T, one matrix-vector pass over J (J w or J^T y)
in float64 and in float32 (the floor for any method that reads J), and Adam's own step. Usage::

    python benchmarks/bench_optimizer_step.py [--repeats 15] [--block 5] [--threads 1] [--device cpu]
        [--sizes 1e5,1e6] [--ms 10,50]

Prints, per (n, m), the median time per step of each optimizer and its ratio to Adam.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall

SIZES: dict[str, list[int]] = {
    "1e5": [32, 256, 256, 64, 1],  # 90,753 parameters
    "1e6": [64, 768, 768, 512, 1],  # 1,034,753 parameters
}
NAMES = ["Adam(foreach)", "SQPAdam", "SQPHeavyBall", "AdamCon"]


def mlp_parameters(widths: list[int], device: torch.device) -> list[nn.Parameter]:
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    return [nn.Parameter(p.detach().to(device)) for layer in layers for p in layer.parameters()]


def problem(widths: list[int], m: int, device: torch.device) -> tuple[list[nn.Parameter], torch.Tensor, torch.Tensor]:
    """Parameters with fixed random gradients, random c (m,) and J (m, n) in float32."""
    params = mlp_parameters(widths, device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    n = sum(p.numel() for p in params)
    c = torch.randn(m, generator=gen).to(device)
    J = torch.randn(m, n, generator=gen).to(device)
    return params, c, J


def make_runner(name: str, widths: list[int], m: int, device: torch.device) -> Callable[[int], None]:
    params, c, J = problem(widths, m, device)
    if name == "Adam(foreach)":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=1e-6, foreach=True)

        def run(steps: int) -> None:
            for _ in range(steps):
                opt.step()

        return run
    # a tiny lr keeps the weights (and so the work) essentially fixed over the repeats
    if name == "SQPAdam":
        opt = SQPAdam(params, lr=1e-6)
    elif name == "SQPHeavyBall":
        opt = SQPHeavyBall(params, lr=1e-6)
    elif name == "AdamCon":
        opt = AdamCon(params, lr=1e-6)
    else:
        raise ValueError(name)

    def run_constrained(steps: int) -> None:
        for _ in range(steps):
            opt.step(constraints=c, jacobian=J)

    return run_constrained


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(runners: dict[str, Callable[[int], None]], repeats: int, block: int, device: torch.device) -> dict[str, float]:
    """Median seconds per call of each runner, timed in interleaved blocks."""
    for run in runners.values():  # warm-up (allocations, first-step state)
        run(2)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            sync(device)
            start = time.perf_counter()
            run(block)
            sync(device)
            times[name].append((time.perf_counter() - start) / block)
    return {name: statistics.median(t) for name, t in times.items()}


def pieces(widths: list[int], m: int, device: torch.device) -> dict[str, Callable[[int], None]]:
    """The building blocks of the SQP step, each a runner."""
    params, c, J = problem(widths, m, device)
    J64 = J.double()
    n = J.shape[1]
    w = torch.randn(n, dtype=torch.float64, device=device)
    y = torch.randn(m, dtype=torch.float64, device=device)
    w32, y32 = w.float(), y.float()
    adam = torch.optim.Adam(params, lr=1e-6, foreach=True)

    def repeat(fn: Callable[[], object]) -> Callable[[int], None]:
        def run(steps: int) -> None:
            for _ in range(steps):
                fn()

        return run

    return {
        "Adam step": repeat(adam.step),
        "J -> float64": repeat(lambda: J.to(torch.float64)),
        "Gram J J^T (f64)": repeat(lambda: J64 @ J64.T),
        "J w (f64)": repeat(lambda: J64 @ w),
        "J^T y (f64)": repeat(lambda: J64.T @ y),
        "J [w1 w2] (f64)": repeat(lambda: J64 @ torch.stack([w, w], dim=1)),
        # the floor of any method that must read J: one float32 pass
        "J w (f32)": repeat(lambda: J @ w32),
        "J^T y (f32)": repeat(lambda: J.T @ y32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="1e5,1e6", help="comma-separated keys of SIZES")
    parser.add_argument("--ms", default="10,50", help="comma-separated numbers of constraints")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [s.strip() for s in args.sizes.split(",")]
    ms = [int(s) for s in args.ms.split(",")]
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved blocks of {args.block} steps, medians; ratio = time / Adam(foreach)")
    for label in sizes:
        widths = SIZES[label]
        n = sum(p.numel() for p in mlp_parameters(widths, torch.device("cpu")))
        for m in ms:
            med = interleaved({name: make_runner(name, widths, m, device) for name in NAMES}, args.repeats,
                              args.block, device)
            base = med["Adam(foreach)"]
            print(f"n = {n:>9,d}, m = {m:>3d}:  " + "  ".join(
                f"{name} {1e3 * t:8.3f} ms ({t / base:5.2f}x)" for name, t in med.items()
            ))
            parts = interleaved(pieces(widths, m, device), args.repeats, args.block, device)
            base = parts["Adam step"]
            print("    pieces:  " + "  ".join(f"{name} {1e3 * t:7.3f} ms ({t / base:5.2f}x)" for name, t in parts.items()))


if __name__ == "__main__":
    main()
