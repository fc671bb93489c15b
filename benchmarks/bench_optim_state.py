"""The step time of every optimizer class of ``lit_constrained.optim`` in two source trees, interleaved.

Written for the state convention (optim/state.py): the hard-constrained optimizers keep per-parameter
views of their flat vectors and check them every step, an identity test per parameter and vector, so the
cases have many parameter tensors and cheap steps, where that bookkeeping weighs most.

    mkdir /tmp/orig && git archive <commit> lit_constrained | tar -x -C /tmp/orig
    python benchmarks/bench_optim_state.py /tmp/orig .        # ratio = second tree / first tree

Each round runs one subprocess per tree (alternating which goes first); a subprocess times ``STEPS`` steps
per case after ``WARMUP`` and reports the least of ``REPEATS`` per-step means of the process's CPU time
(``time.process_time``: the time spent waiting for a core on a shared machine does not count; torch on one
thread). The table gives, per case,
the median over rounds of each tree and their ratio.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = int(os.environ.get("ROUNDS", 6))
WARMUP = 20
STEPS = 100
REPEATS = 5


def _child() -> None:
    import torch

    from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall
    from lit_constrained.optim.experimental import SQPMoMoAdam

    torch.set_num_threads(1)
    constrained = (SQPHeavyBall, SQPAdam, AdamCon, SQPMoMoAdam)
    results = {}
    for width, layers, m in [(8, 8, 4), (64, 8, 32)]:
        torch.manual_seed(0)
        shapes = [(width, width)] * layers + [(width,)] * layers  # 2 * layers parameter tensors
        for cls in (SQPHeavyBall, SQPAdam, AdamCon, SQPMoMoAdam, MoMo, MoMoAdam, ConstantStepAdam):
            params = [torch.nn.Parameter(torch.randn(shape) * 0.1) for shape in shapes]
            n = sum(p.numel() for p in params)
            kwargs = {"lr": 1e-3} if cls in (ConstantStepAdam, SQPAdam, AdamCon, SQPHeavyBall) else {}
            opt = cls(params, **kwargs)
            J = torch.randn(m, n)
            c = torch.randn(m) * 1e-3
            for p in params:
                p.grad = torch.randn_like(p)
            loss = torch.tensor(1.0)

            def step() -> None:
                if cls in constrained:
                    opt.step(lambda: loss, constraints=c, jacobian=J)
                else:
                    opt.step(lambda: loss)

            for _ in range(WARMUP):
                step()
            means = []
            for _ in range(REPEATS):
                start = time.process_time()
                for _ in range(STEPS):
                    step()
                means.append((time.process_time() - start) / STEPS)
            results[f"{cls.__name__} P={len(shapes)} n={n} m={m if cls in constrained else 0}"] = min(means)
    print(json.dumps(results))


def _run(tree: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(first: str, second: str) -> None:
    times: dict[str, tuple[list[float], list[float]]] = {}
    for round_ in range(ROUNDS):
        order = [(0, first), (1, second)] if round_ % 2 == 0 else [(1, second), (0, first)]
        for index, tree in order:
            for case, value in _run(tree).items():
                times.setdefault(case, ([], []))[index].append(value)
    print(f"| case | {first} (us/step) | {second} (us/step) | ratio |\n|---|---|---|---|")
    ratios = []
    for case, (a, b) in times.items():
        ta, tb = statistics.median(a), statistics.median(b)
        ratios.append(tb / ta)
        print(f"| {case} | {ta * 1e6:.1f} | {tb * 1e6:.1f} | {tb / ta:.3f} |")
    print(f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.3f} ({ROUNDS} interleaved rounds)")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
    elif len(sys.argv) == 3:
        main(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit(__doc__)
