"""Test error against the number of imposed points m on the 2D Poisson task (issue 28, part 4).

Each run: ``configs/poisson/recommended/sqp_adam.yaml`` (SQP-Adam, the package's defaults) with m imposed
points, half PDE (interior) and half boundary, for ``--steps`` steps; recorded: the final ``val/rel_l2``
against the exact solution, max |c| of the imposed points, the residual at the held-out check points, the
numerical rank of J, and the time. Resumable: the records in ``--out`` (JSON) are kept and finished runs
skipped; each record is written as it comes.

    python benchmarks/poisson_m_sweep.py --m 10,50,200,1000 --seeds 0,1,2 --steps 3000 \
        [--hidden 20 --depth 2] --out docs/figures/poisson_m_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from machine import cpu_model  # noqa: E402

from lit_constrained.cli.fit import ConstrainedCLI  # noqa: E402

CONFIG = "configs/poisson/recommended/sqp_adam.yaml"


def run(m: int, seed: int, steps: int, hidden: int, depth: int, extra: list[str]) -> dict[str, Any]:
    pde, boundary = m - m // 2, m // 2
    args = ["--config", CONFIG, "--seed_everything", str(seed), "--trainer.max_steps", str(steps),
            "--trainer.max_epochs", str(10 * steps), "--trainer.enable_checkpointing", "false",
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.val_check_interval", str(10 * steps), "--trainer.log_every_n_steps", "50",
            "--model.init_args.hidden", str(hidden), "--model.init_args.depth", str(depth),
            "--data.init_args.n_pde_imposed", str(pde), "--data.init_args.n_boundary_imposed", str(boundary),
            *extra]
    cli = ConstrainedCLI(args=args, run=False)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    seconds = time.perf_counter() - start
    metrics = cli.trainer.validate(cli.model, cli.datamodule, verbose=False)[0]
    n = sum(p.numel() for p in cli.model.parameters())
    diagnostics = cli.trainer.optimizers[0].diagnostics
    return {
        "m": m, "pde": pde, "boundary": boundary, "seed": seed, "steps": steps, "hidden": hidden, "depth": depth,
        "n": n, "extra": extra, "rel_l2": float(metrics["val/rel_l2"]),
        "violation_val": float(metrics.get("Violation/val", float("nan"))),
        "residual_val": float(metrics.get("residual/val", float("nan"))),
        "rank": float(diagnostics.get("rank", float("nan"))),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", default="10,50,200,1000")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--extra", default="", help="more CLI options, space-separated (e.g. an optimizer setting)")
    parser.add_argument("--out", default="docs/figures/poisson_m_sweep.json")
    options = parser.parse_args()
    harness.quiet()
    torch.set_num_threads(1)
    out = Path(options.out)
    records = json.loads(out.read_text())["runs"] if out.exists() else []
    extra = options.extra.split()
    for m in (int(v) for v in options.m.split(",")):
        for seed in (int(v) for v in options.seeds.split(",")):
            key = (m, seed, options.steps, options.hidden, options.depth, extra)
            if any((r["m"], r["seed"], r["steps"], r["hidden"], r["depth"], r["extra"]) == key for r in records):
                continue
            record = run(m, seed, options.steps, options.hidden, options.depth, extra)
            records.append(record)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"cpu": cpu_model(), "threads": 1, "runs": records}, indent=1))
            print(f"m {m:5d} (n {record['n']}) seed {seed}: rel L2 {record['rel_l2']:.3g}  max|c| imposed "
                  f"{record['violation_val']:.2g}  held-out residual {record['residual_val']:.2g}  rank "
                  f"{record['rank']:.0f}  {record['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
