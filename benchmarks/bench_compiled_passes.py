"""``torch.compile`` of the SQP step's passes over J against the eager kernels the package runs.

Two candidates, each timed against its eager counterpart in the same process (interleaved blocks,
medians; ``benchmarks/harness.py``), float32, one thread, J Gaussian (m x n):

* ``gram``: the first pass, G = sum_b J_b J_b^T (float32 products over 512-column blocks, the blocks summed
  in float64) with J g, written as elementwise products and sums that Inductor can fuse into one loop
  nest over J, against :func:`~lit_constrained.optim.linalg.gram.scaled_gram` (a ``bmm`` of the blocks and
  a GEMV);
* ``passes``: the projected gradient, the moments and J w of SQP-Adam's direction, u = s (g - J^T y),
  r <- lerp(r, u, 0.1), v <- 0.999 v + 0.01 u^2, w = r / sqrt(v + eps), J w: one compiled graph (its
  elementwise passes fused) against the same ops eagerly.

Printed per case: the compile time of the first call (``dynamic=False``: one compile per shape), the
compiled result's error against the eager one, the median times and compiled / eager. Usage::

    python benchmarks/bench_compiled_passes.py [--cases 1e5:10,1e6:10,1e6:50] [--repeats 9] [--block 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import Tensor

from lit_constrained.optim.linalg.gram import GRAM_BLOCK, gram_partials_shape, scaled_gram
from harness import interleaved_medians  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py

SIZES = {"1e5": 90_753, "1e6": 1_034_753}
"""n of bench_optimizer_step.py's two MLPs."""


def fused_gram(J: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """(G, J v) as the eager blocked Gram forms them (float32 products over ``GRAM_BLOCK`` columns, float64
    sums over the blocks), in elementwise form for Inductor."""
    m, n = J.shape
    blocks = n // GRAM_BLOCK
    full = blocks * GRAM_BLOCK
    Jb = J[:, :full].view(m, blocks, GRAM_BLOCK)
    G = (Jb.unsqueeze(1) * Jb.unsqueeze(0)).sum(-1).sum(-1, dtype=torch.float64)
    Jv = (Jb * v[:full].view(1, blocks, GRAM_BLOCK)).sum(-1).sum(-1, dtype=torch.float64)
    rest = J[:, full:]
    return G + (rest @ rest.T).double(), Jv + (rest @ v[full:]).double()


def direction_passes(J: Tensor, g: Tensor, y: Tensor, r: Tensor, s: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """SQP-Adam's passes between the Gram and the merged step (see the module docstring)."""
    u = torch.addmv(g, J.T, y, beta=scale, alpha=-scale)
    r.lerp_(u, 0.1)
    s.mul_(0.999).addcmul_(u, u, value=0.01)
    w = torch.div(r, torch.add(s, 1e-8).sqrt_())
    return w, (J @ w).double()


def candidates(n: int, m: int) -> dict[str, tuple[Callable[[], object], Callable[[], object], float, float]]:
    """name -> (eager run, compiled run, compile seconds, relative error of the compiled result)."""
    gen = torch.Generator().manual_seed(0)
    J, v = torch.randn(m, n, generator=gen), torch.randn(n, generator=gen)
    y = torch.randn(m, generator=gen)
    partials = torch.empty(gram_partials_shape((m, n)))
    out: dict[str, tuple[Callable[[], object], Callable[[], object], float, float]] = {}

    start = time.perf_counter()
    gram = torch.compile(fused_gram, dynamic=False)
    G, _ = gram(J, v)
    seconds = time.perf_counter() - start
    reference = scaled_gram(J, None, partials, v=v)[0]
    out["gram"] = (lambda: scaled_gram(J, None, partials, v=v), lambda: gram(J, v), seconds,
                   float((G - reference).norm() / reference.norm()))

    r, s = torch.zeros(n), torch.ones(n)
    rc, sc = r.clone(), s.clone()
    start = time.perf_counter()
    passes = torch.compile(direction_passes, dynamic=False)
    wc, _ = passes(J, v, y, rc, sc, 0.5)
    seconds = time.perf_counter() - start
    we, _ = direction_passes(J, v, y, r, s, 0.5)
    out["passes"] = (lambda: direction_passes(J, v, y, r, s, 0.5), lambda: passes(J, v, y, rc, sc, 0.5), seconds,
                     float((wc - we).norm() / we.norm()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="1e5:10,1e6:10,1e6:50", help="comma-separated size:m pairs")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--block", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, threads 1, {args.repeats} interleaved blocks of "
          f"{args.block} calls, medians")
    for case in args.cases.split(","):
        label, m_text = case.strip().split(":")
        n, m = SIZES[label], int(m_text)
        for name, (eager, compiled, seconds, error) in candidates(n, m).items():
            med = interleaved_medians({"eager": lambda steps, f=eager: [f() for _ in range(steps)],
                                       "compiled": lambda steps, f=compiled: [f() for _ in range(steps)]},
                                      args.repeats, args.block, warmup=1)
            print(f"n = {n:>9,d}, m = {m:>3d}, {name:<6s}: compile {seconds:5.1f} s, error {error:.1e}, eager "
                  f"{1e3 * med['eager']:8.2f} ms, compiled {1e3 * med['compiled']:8.2f} ms, "
                  f"compiled / eager {med['compiled'] / med['eager']:.2f}", flush=True)


if __name__ == "__main__":
    main()
