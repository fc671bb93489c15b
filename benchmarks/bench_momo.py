"""Cost of one ``optimizer.step()``: MoMo-Adam and MoMo against ``torch.optim.Adam(foreach=True)``, and the
memory-traffic bound of MoMo-Adam's step timed in the same process.

Parameter sets of MLPs with ~1e5 and ~1e6 parameters (float32); fixed random gradients and a fixed loss
value. Everything is timed in the same process, interleaved (one block of steps each, in turn, repeated),
and the medians are compared. MoMo's steps are the non-diagnostic ones (``step(closure)``, no host sync).
Usage::

    python benchmarks/bench_momo.py [--repeats 30] [--block 10] [--threads 1] [--device cpu] [--sizes 1e5 1e6]

Prints the CPU model, then per size the median time per step of each row and its ratio to Adam(foreach)
(issue 31's target: MoMoAdam / Adam(foreach) <= 1.2 at n = 1e5 and n = 1e6).

The rows:

* ``Adam(foreach)``: the baseline. torch's multi-tensor Adam moves 18 n-vectors per step (lerp of m: 3,
  v * beta2: 2, v + g g: 3, sqrt(v) into a new tensor: 2, / sqrt(c2): 2, + eps: 2, x + s m / denom: 4).
* ``MoMoAdam``: the default (``fused=None``): 17 n-vectors (zero the workspace: 1; torch's fused Adam
  kernel forming d, v and -D^-1 d on it: 4 reads, 3 writes; the dots <g, x>, <d, x>, <d, D^-1 d>: 6;
  x + tau D^-1 d: 3).
* ``MoMoAdam(fused=False)``: the multi-tensor reference ops (24 n-vectors).
* ``MoMo``: SGD-M with the MoMo step (no second moment).
* ``bound``: the least traffic of MoMo-Adam's step as specified (algorithms.md section 6). tau needs three
  sums over the new d and D (<g, x>, <d, x>, ||d||^2_{D^-1}) before any x can move, so the step is at
  least two passes: (1) read x, g, d, v, write d, v and D^-1 d (7 n-vectors; the sums on the fly), (2) read
  x and D^-1 d, write x (3): 10 n-vectors, against 7 for Adam in one pass. Timed as the two torch kernels
  that move exactly these bytes with the same arithmetic: ``torch._fused_adam_`` on (w, g, d, v) (w read in
  place of x) and ``torch._foreach_add_(x, w)``.
* ``Adam(fused)``: torch's one-pass Adam (7 n-vectors), for scale.
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

BASELINE = "Adam(foreach)"
ROWS = [BASELINE, "MoMoAdam", "MoMoAdam(fused=False)", "MoMo", "bound", "Adam(fused)"]


def mlp_parameters(widths: list[int], device: torch.device) -> list[nn.Parameter]:
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    params = [p for layer in layers for p in layer.parameters()]
    return [nn.Parameter(p.detach().to(device)) for p in params]


def with_gradients(widths: list[int], device: torch.device) -> list[nn.Parameter]:
    params = mlp_parameters(widths, device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    return params


def make_runner(name: str, widths: list[int], device: torch.device) -> Callable[[int], None]:
    params = with_gradients(widths, device)
    if name == "bound":
        return bound_runner(params)
    loss = torch.tensor(1.0, device=device)
    if name == BASELINE:
        opt: torch.optim.Optimizer = torch.optim.Adam(params, lr=1e-3, foreach=True)
    elif name == "Adam(fused)":
        opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    elif name == "MoMoAdam":
        opt = MoMoAdam(params, lr=1e-3)
    elif name == "MoMoAdam(fused=False)":
        opt = MoMoAdam(params, lr=1e-3, fused=False)
    elif name == "MoMo":
        opt = MoMo(params, lr=1e-3)
    else:
        raise ValueError(name)

    def run(steps: int) -> None:
        for _ in range(steps):
            opt.step(lambda: loss)

    return run


def bound_runner(params: list[nn.Parameter]) -> Callable[[int], None]:
    """The two passes of the traffic bound (see the module docstring), on tensors of the parameters' sizes."""
    xs = [p.detach() for p in params]
    grads = [p.grad for p in params]
    work, exp_avgs, exp_avg_sqs = ([torch.zeros_like(x) for x in xs] for _ in range(3))
    count = torch.tensor(1.0, device=xs[0].device)

    def run(steps: int) -> None:
        for _ in range(steps):
            # pass 1: read w (for x), g, d, v; write d, v, w
            torch._fused_adam_(work, grads, exp_avgs, exp_avg_sqs, [], [count] * len(work), lr=1e-30, beta1=0.9,
                               beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
            # pass 2: read x, w; write x
            torch._foreach_add_(xs, work, alpha=1e-30)

    return run


def bench(widths: list[int], repeats: int, block: int, device: torch.device) -> dict[str, float]:
    runners = {name: make_runner(name, widths, device) for name in ROWS}
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
    print(f"torch {torch.__version__}, device {device}, float32, threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved blocks of {args.block} steps, medians")
    for label in args.sizes:
        widths = SIZES[label]
        n = sum(p.numel() for p in mlp_parameters(widths, torch.device("cpu")))
        med = bench(widths, args.repeats, args.block, device)
        base = med[BASELINE]
        print(f"n = {n:,d} ({label}):")
        for name, t in med.items():
            print(f"  {name:22s} {1e6 * t:9.1f} us  {t / base:5.2f}x")


if __name__ == "__main__":
    main()
