"""Cost of one ``optimizer.step()``: MoMo-Adam and MoMo against ``torch.optim.Adam(foreach=True)``.

Parameter sets of MLPs with ~1e5 and ~1e6 parameters; fixed random gradients and a fixed loss value.
The optimizers are timed in the same process, interleaved (one block of steps each, in turn, repeated),
and the medians are compared. MoMo's steps are the non-diagnostic ones (``step(closure)``, no host sync).
Usage::

    python benchmarks/bench_momo.py [--repeats 30] [--block 10] [--threads 1] [--device cpu] [--sizes 1e5 1e6]

Prints the CPU model, then per size the median time per step of each optimizer and its ratio to Adam
(the issue's bound: MoMoAdam / Adam(foreach) <= 1.3 at n = 1e6).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from lit_constrained.optim.momo import MoMo, MoMoAdam
from harness import interleaved_medians  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py

SIZES: dict[str, list[int]] = {
    "1e5": [32, 256, 256, 64, 1],  # 90,753 parameters
    "1e6": [64, 768, 768, 512, 1],  # 1,034,753 parameters
}


def mlp_parameters(widths: list[int], device: torch.device) -> list[nn.Parameter]:
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    params = [p for layer in layers for p in layer.parameters()]
    return [nn.Parameter(p.detach().to(device)) for p in params]


def make_runner(name: str, widths: list[int], device: torch.device) -> Callable[[int], None]:
    params = mlp_parameters(widths, device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    loss = torch.tensor(1.0, device=device)
    if name == "Adam(foreach)":
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=1e-3, foreach=True)
    elif name == "MoMoAdam":
        opt = MoMoAdam(params, lr=1e-3)
    elif name == "MoMo":
        opt = MoMo(params, lr=1e-3)
    else:
        raise ValueError(name)

    def run(steps: int) -> None:
        for _ in range(steps):
            opt.step(lambda: loss)

    return run




def bench(widths: list[int], repeats: int, block: int, device: torch.device) -> dict[str, float]:
    names = ["Adam(foreach)", "MoMoAdam", "MoMo"]
    runners = {name: make_runner(name, widths, device) for name in names}
    # warm-up: allocations, first-step state
    return interleaved_medians(runners, repeats, block, warmup=3, device=device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"CPU: {cpu_model()}")
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved blocks of {args.block} steps, medians")
    for label in args.sizes:
        widths = SIZES[label]
        n = sum(p.numel() for p in mlp_parameters(widths, torch.device("cpu")))
        med = bench(widths, args.repeats, args.block, device)
        base = med["Adam(foreach)"]
        print(f"n = {n:>9,d} ({label}):  " + "  ".join(
            f"{name} {1e6 * t:8.1f} us ({t / base:4.2f}x)" for name, t in med.items()
        ))


if __name__ == "__main__":
    main()
