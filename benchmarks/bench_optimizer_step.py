"""Cost of one ``optimizer.step()``: SQP-Adam, SQP-HeavyBall and Adam(con) against ``torch.optim.Adam(foreach=True)``,
and against SQP-Adam's own 3-read bound.

Parameter sets of MLPs with ~1e5 and ~1e6 float32 parameters, fixed random gradients, m = 10 and 50
constraints with a fixed float32 Jacobian J and random c. Kinds of J (``--jacobians``): ``cond:K``,
J = U diag(sigma) V^T with sigma log-spaced from 1 to 1/K (cond(J) = K; ``cond:10`` is the issue's
default problem, one refinement step; ``cond:1e3`` two, with float64-product residuals); ``random``
(Gaussian entries, cond(J J^T) ~ 1: no refinement); ``trained`` (cond(J J^T) = 3.3e4, the spring task's
at initialization). The optimizers are timed in the same process, interleaved (one block of steps each,
in turn, repeated), and the medians are compared. Usage::

    python benchmarks/bench_optimizer_step.py [--repeats 11] [--block 3] [--threads 1]
        [--cases 1e5:10,1e6:10] [--jacobians cond:10,cond:1e3] [--baseline DIR]

``--baseline DIR``: DIR holds a copy of an earlier ``lit_constrained/optim`` as the package ``DIR/<name>``
(e.g. ``cp -r lit_constrained/optim /tmp/before/old_optim`` before a change, then ``--baseline
/tmp/before/old_optim``): its SQPAdam, SQPHeavyBall and AdamCon are timed in the same rounds as today's
(``<name>/SQPAdam``, ...) and the ratio today / baseline is printed per optimizer.

Prints the CPU model, then per case the median time per step of each optimizer and its ratio to Adam,
and SQP-Adam against two timed floors (in the same interleaved rounds):

* ``3-read bound``: the passes over J that SQP-Adam's data dependencies need at the least, with the
  package's own kernels: the Gram matrix and J g (one pass: :func:`~lit_constrained.optim.linalg.gram.gram`
  and a GEMV), J w (a GEMV) and the merged step's ``a w - J^T z`` (one ``addmv``), plus Adam-like vector
  traffic (a ``torch.optim.Adam(foreach=True)`` step on the same parameter shapes). Refinement steps,
  the projected gradient's own pass (J^T y before the moments; a fused kernel could share J's read with
  J w) and the step's small m x m algebra are what SQP-Adam adds to it;
* ``3 J reads``: three streaming reads of J (``J.sum()``) plus the Adam step: the memory traffic alone,
  what the bound would cost if its Gram ran at the speed of a read of J.

and a traffic model: bytes moved per step by Adam (read p, g, m, v; write p, m, v: 28 n) and by the
3-read bound (12 m n + 28 n).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path
from collections.abc import Callable

import torch
from torch import nn

from lit_constrained.optim import AdamCon, SQPAdam, SQPHeavyBall
from lit_constrained.optim.linalg.gram import gram_partials_shape, scaled_gram
from harness import interleaved_medians  # benchmarks/harness.py (scripts run from benchmarks/)
from machine import cpu_model  # benchmarks/machine.py

SIZES: dict[str, list[int]] = {
    "1e5": [32, 256, 256, 64, 1],  # 90,753 parameters
    "1e6": [64, 768, 768, 512, 1],  # 1,034,753 parameters
}
NAMES = ["Adam(foreach)", "SQPAdam", "SQPHeavyBall", "AdamCon"]
FLOORS = ["3-read bound", "3 J reads"]
TRAINED_GRAM_CONDITION = 3.3e4


def mlp_parameters(widths: list[int]) -> list[nn.Parameter]:
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    return [nn.Parameter(p.detach().clone()) for layer in layers for p in layer.parameters()]


def jacobian(m: int, n: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """J of the given kind (see the module docstring)."""
    if kind == "random":
        return torch.randn(m, n, generator=gen)
    if kind == "trained":
        condition = math.sqrt(TRAINED_GRAM_CONDITION)
    elif kind.startswith("cond:"):
        condition = float(kind.split(":", 1)[1])
    else:
        raise ValueError(f"Unknown Jacobian kind {kind!r}: random, trained or cond:<cond(J)>.")
    # J = U diag(sigma) V^T, sigma log-spaced over cond(J); V from a QR of an (n, m) Gaussian
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen))
    sigma = torch.logspace(0, -math.log10(condition), m)
    return ((U * sigma) @ V.T).contiguous()


def problem(widths: list[int], m: int, kind: str) -> tuple[list[nn.Parameter], torch.Tensor, torch.Tensor]:
    params = mlp_parameters(widths)
    gen = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    n = sum(p.numel() for p in params)
    return params, torch.randn(m, generator=gen), jacobian(m, n, kind, gen)


def adam_runner(params: list[nn.Parameter]) -> Callable[[int], None]:
    adam = torch.optim.Adam(params, lr=1e-6, foreach=True)

    def run(steps: int) -> None:
        for _ in range(steps):
            adam.step()

    return run


def bound_runner(widths: list[int], m: int, kind: str) -> Callable[[int], None]:
    """SQP-Adam's 3-read bound: G and J g, J w, a w - J^T z, and an Adam step (module docstring)."""
    params, _, J = problem(widths, m, kind)
    adam = adam_runner(params)
    n = J.shape[1]
    gen = torch.Generator().manual_seed(1)
    g, w = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    z, out = torch.randn(m, generator=gen), torch.empty(n)
    partials = torch.empty(gram_partials_shape((m, n)))

    def run(steps: int) -> None:
        for _ in range(steps):
            scaled_gram(J, None, partials, v=g)
            torch.mv(J, w)
            torch.addmv(w, J.T, z, beta=1e-6, alpha=-1.0, out=out)
            adam(1)

    return run


def reads_runner(widths: list[int], m: int, kind: str) -> Callable[[int], None]:
    """Three streaming reads of J and an Adam step: the memory traffic of the 3-read bound."""
    params, _, J = problem(widths, m, kind)
    adam = adam_runner(params)

    def run(steps: int) -> None:
        for _ in range(steps):
            for _ in range(3):
                J.sum()
            adam(1)

    return run


BASELINE: dict[str, type] = {}
"""``--baseline``'s optimizers by name (empty without it)."""


def load_baseline(directory: str) -> None:
    """Import the package at ``directory`` (an earlier copy of lit_constrained/optim) into ``BASELINE``."""
    path = Path(directory).resolve()
    sys.path.insert(0, str(path.parent))
    module = importlib.import_module(path.name)
    BASELINE.update({name: getattr(module, name) for name in ("SQPAdam", "SQPHeavyBall", "AdamCon")})


def make_runner(name: str, widths: list[int], m: int, kind: str) -> Callable[[int], None]:
    if name == "3-read bound":
        return bound_runner(widths, m, kind)
    if name == "3 J reads":
        return reads_runner(widths, m, kind)
    params, c, J = problem(widths, m, kind)
    if name == "Adam(foreach)":
        return adam_runner(params)
    # a tiny lr keeps the weights (and so the work) essentially fixed over the repeats
    classes = {"SQPAdam": SQPAdam, "SQPHeavyBall": SQPHeavyBall, "AdamCon": AdamCon}
    baseline = name.startswith("baseline/")
    opt = (BASELINE if baseline else classes)[name.split("/", 1)[-1]](params, lr=1e-6)

    def run_constrained(steps: int) -> None:
        for _ in range(steps):
            opt.step(constraints=c, jacobian=J)

    run_constrained.optimizer = opt  # type: ignore[attr-defined]
    return run_constrained


def traffic(n: int, m: int) -> dict[str, float]:
    """Bytes moved per step (float32): Adam, and the 3-read bound (J read three times, Adam's vectors)."""
    adam = 28.0 * n
    return {"Adam": adam, "3-read bound": 4.0 * m * n * 3 + adam}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", default="1e5:10,1e6:10", help="comma-separated size:m pairs")
    parser.add_argument("--jacobians", default="cond:10,cond:1e3",
                        help="comma-separated kinds: random, trained, cond:<cond(J)>")
    parser.add_argument("--optimizers", default=",".join(NAMES), help=f"a subset of {','.join(NAMES)}")
    parser.add_argument("--baseline", default=None, help="a copy of an earlier lit_constrained/optim (see above)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.baseline:
        load_baseline(args.baseline)
    names = [name.strip() for name in args.optimizers.split(",")]
    if "Adam(foreach)" not in names or "SQPAdam" not in names:
        parser.error("--optimizers must include Adam(foreach) and SQPAdam (the ratios' references).")
    floors = list(FLOORS)
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{args.repeats} interleaved blocks of {args.block} steps, medians; ratio = time / Adam(foreach)")
    for case in args.cases.split(","):
        label, m_text = case.strip().split(":")
        widths, m = SIZES[label], int(m_text)
        n = sum(p.numel() for p in mlp_parameters(widths))
        for kind in [k.strip() for k in args.jacobians.split(",")]:
            compared = [f"baseline/{name}" for name in names if name in BASELINE]
            runners = {name: make_runner(name, widths, m, kind) for name in names + floors + compared}
            med = interleaved_medians(runners, args.repeats, args.block, warmup=2)  # warm-up: allocations, state
            base = med["Adam(foreach)"]
            opt = runners["SQPAdam"].optimizer  # type: ignore[attr-defined]
            opt.step(constraints=torch.zeros(m), jacobian=problem(widths, m, kind)[2], diagnostics=True)
            k = int(opt.diagnostics["refinements"])
            print(f"n = {n:>9,d}, m = {m:>3d}, J {kind:<8s} (refinements {k}): " + "  ".join(
                f"{name} {1e3 * med[name]:8.2f} ms ({med[name] / base:5.2f}x)" for name in names))
            step, bound = med["SQPAdam"], med["3-read bound"]
            print(f"    SQPAdam / 3-read bound {step / bound:5.2f}   (bound {1e3 * bound:.2f} ms = {bound / base:.2f}x Adam)")
            print(f"    3 J reads + Adam {1e3 * med['3 J reads']:.2f} ms = {med['3 J reads'] / base:.2f}x Adam")
            if compared:
                print("    today / baseline (same rounds): " + "  ".join(
                    f"{name.split('/', 1)[1]} {med[name.split('/', 1)[1]] / med[name]:.3f}" for name in compared))
            moved = traffic(n, m)
            print("    bytes per step (model): " + "  ".join(
                f"{name} {value / 1e6:7.1f} MB ({value / moved['Adam']:5.2f}x Adam)" for name, value in moved.items()
            ))


if __name__ == "__main__":
    main()
