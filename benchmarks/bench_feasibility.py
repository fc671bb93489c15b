"""Feasibility at every step with the defaults: max |c| of the imposed constraints at each step (before its
update, i.e. after the previous step and its post-step corrections), for the shipped tasks' recommended
configs, with the corrections off (``max_corrections = 0``) and on (the default), interleaved runs.

Reported per run: the start, the worst max |c| after step 50 (absolute and relative to the start), the
end, the mean corrections per step and the mean step time (the corrections' cost is the difference).
Target (issue 28): worst after step 50 <= max(3e-6 x start, 1e-6), or the float32 floor (measured).

    python benchmarks/bench_feasibility.py [--steps 1000] [--tasks spring,chemistry] [--out FILE.json]

``--poisson 25,100``: the Poisson task (configs/poisson/recommended/sqp_adam.yaml) with N PDE + N boundary
points imposed, c and J evaluated natively (float32) and in float64 (``constraint_dtype``; docs/float32.md),
interleaved per N: the worst max |c| after step 50 and the end against the float32 evaluation floor at the
final weights (max |c32 - c64|, the same weights) and the weights' one-ulp floor, val/rel_l2; then the
cost, a training step (objective, c, J, backward, the optimizer's step with its corrections) and c + J alone
with each dtype, interleaved blocks in one process, medians::

    python benchmarks/bench_feasibility.py --poisson 25,100 --steps 3000 [--hidden 20 --depth 2] \
        --out docs/figures/float32_poisson.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from machine import cpu_model  # noqa: E402

from lit_constrained.cli.fit import ConstrainedCLI  # noqa: E402

CONFIGS = {
    "spring": "configs/spring/recommended/sqp_adam.yaml",
    "spring-minibatch": "configs/spring/recommended/sqp_adam.yaml",
    "chemistry": "configs/chemistry/recommended/sqp_adam.yaml",
    "chemistry-minibatch": "configs/chemistry/recommended/sqp_adam.yaml",
    "burgers": "configs/burgers/recommended/sqp_adam.yaml",
    "burgers-minibatch": "configs/burgers/recommended/sqp_adam.yaml",
    "darcy": "configs/darcy/recommended/sqp_adam.yaml",
    "darcy-full": "configs/darcy/recommended/sqp_adam.yaml",
    "poisson": "configs/poisson/recommended/sqp_adam.yaml",
}
MINIBATCH = {"spring-minibatch", "chemistry-minibatch", "burgers-minibatch"}
FULL_BATCH = {"darcy-full"}
"""Darcy's recommended config is mini-batch (20 % of the samples a step): the max |c| a step sees is then of
a batch never imposed before; ``darcy-full`` imposes the same constraints at every step."""


class ViolationRecorder(pl.Callback):
    """max |c| the step saw (``module.last_step``), its duration and the optimizer's corrections."""

    def __init__(self) -> None:
        self.violations: list[float] = []
        self.times: list[float] = []
        self.corrections: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        self.times.append(time.perf_counter() - self._start)
        c = pl_module.last_step.constraints
        self.violations.append(float(c.abs().max()))
        optimizer = trainer.optimizers[0]
        self.corrections.append(float(optimizer.diagnostics.get("corrections", float("nan"))))


def float32_floor(model: Any, datamodule: Any) -> tuple[float, str]:
    """(floor, how): max |c32 - c64| at the final weights, the rounding noise of the float32 constraints
    themselves (the same network and batch evaluated in float64), below which no step can push max |c|; for
    a network that does not run in float64 as a whole (Darcy's FNO) :func:`one_ulp_floor` instead."""
    batch = next(iter(datamodule.train_dataloader()))
    saved = getattr(model, "constraint_dtype", None)
    if saved is not None:  # a task that evaluates c in float64 (Poisson): the floor of its float32 c
        model.constraint_dtype = "native"
    c32 = model.constraints(model.prepare_batch(batch)).detach().double()
    if saved is not None:
        model.constraint_dtype = saved
    model.double()
    try:
        c64 = model.constraints(model.prepare_batch(batch)).detach()
    except RuntimeError:
        c64 = None
    finally:
        model.float()
    if c64 is None:
        return one_ulp_floor(model, batch), "one ulp"
    return float((c32 - c64).abs().max()), "c32 - c64"


def one_ulp_floor(model: Any, batch: Any, draws: int = 5) -> float:
    """The median over ``draws`` of max |c(x') - c(x)|, x' every weight moved by one ulp in a random
    direction: what the float32 weights themselves resolve (the rounding of any update, and the new rounding
    pattern of the evaluation at other weights). After 500 steps of the recommended configs: Darcy 1.3e-4
    (the same residuals evaluated per sample instead of batched differ by 1.5e-4); Burgers 3.8e-6 and
    chemistry 9.5e-7, against max |c32 - c64| = 3.2e-6 and 1.1e-6 there."""
    prepared = model.prepare_batch(batch)
    params = [p for p in model.parameters()]
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(0)
    changes = []
    with torch.no_grad():
        c0 = model.constraints(prepared).detach()
        for _ in range(draws):
            for p, x in zip(params, saved):
                real = torch.view_as_real(x) if x.is_complex() else x
                sign = torch.randint(0, 2, real.shape, generator=generator).to(real.dtype) * 2 - 1
                moved = torch.nextafter(real, real + sign)  # one ulp toward +-inf
                p.copy_(torch.view_as_complex(moved) if x.is_complex() else moved)
            changes.append(float((model.constraints(prepared).detach() - c0).abs().max()))
        for p, x in zip(params, saved):
            p.copy_(x)
    return statistics.median(changes)


def run(task: str, steps: int, max_corrections: int) -> dict[str, Any]:
    args = ["--config", CONFIGS[task], "--trainer.max_steps", str(steps), "--trainer.max_epochs", "100000",
            "--trainer.enable_checkpointing", "false", "--trainer.logger", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.val_check_interval", str(10 * steps),
            "--model.init_args.optimizer.init_args.max_corrections", str(max_corrections)]
    if task in MINIBATCH:
        args += ["--data.init_args.batch_mode", "minibatch"]
    if task in FULL_BATCH:
        args += ["--data.init_args.batch_mode", "full"]
    cli = ConstrainedCLI(args=args, run=False)
    recorder = ViolationRecorder()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, cli.datamodule)
    floor, floor_kind = float32_floor(cli.model, cli.datamodule)
    v = recorder.violations
    start = v[0]
    worst = max(v[50:]) if len(v) > 50 else float("nan")
    return {
        "task": task, "max_corrections": max_corrections, "steps": len(v), "start": start,
        "worst_after_50": worst, "worst_relative": worst / start, "end": v[-1],
        "target": max(3e-6 * start, 1e-6), "float32_floor": floor, "float32_floor_kind": floor_kind,
        "corrections_per_step": statistics.fmean(recorder.corrections[1:]) if max_corrections else 0.0,
        "step_ms": 1e3 * statistics.median(recorder.times[5:]),
    }


POISSON_TARGET = 1e-5
"""Issue 39: the imposed max |c| at the end <= 1e-5, or within 3x of the float32 evaluation floor."""


def poisson_run(points: int, constraint_dtype: str, steps: int, hidden: int, depth: int) -> dict[str, Any]:
    """One Poisson fit with ``points`` PDE + ``points`` boundary points imposed, c and J in
    ``constraint_dtype``; the floors at its final weights (constraint_precision's functions)."""
    from lit_constrained.module_parts.constraint_precision import evaluation_floor, weight_floor

    args = ["--config", CONFIGS["poisson"], "--trainer.max_steps", str(steps), "--trainer.max_epochs", str(10 * steps),
            "--trainer.enable_checkpointing", "false", "--trainer.logger", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.val_check_interval", str(10 * steps),
            "--trainer.log_every_n_steps", "50",
            "--model.init_args.hidden", str(hidden), "--model.init_args.depth", str(depth),
            "--model.init_args.constraint_dtype", constraint_dtype,
            "--data.init_args.n_pde_imposed", str(points), "--data.init_args.n_boundary_imposed", str(points)]
    cli = ConstrainedCLI(args=args, run=False)
    recorder = ViolationRecorder()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, cli.datamodule)
    model = cli.model
    batch = model.prepare_batch(next(iter(cli.datamodule.train_dataloader())))
    end = float(model.constraints(batch).detach().abs().max())  # c as the task imposes it
    model.constraint_dtype = "native"
    native_end = float(model.constraints(batch).detach().abs().max())
    floor = evaluation_floor(model, batch)  # max |c32 - c64| at the final weights
    model.constraint_dtype = "float64"
    weights = weight_floor(model, batch)  # c64 moved by one ulp of every weight
    model.constraint_dtype = constraint_dtype
    rel_l2 = float(cli.trainer.validate(model, cli.datamodule, verbose=False)[0]["val/rel_l2"])
    v = recorder.violations
    worst = max(v[50:]) if len(v) > 50 else float("nan")
    bound = max(POISSON_TARGET, 3 * floor)
    return {
        "points": points, "constraint_dtype": constraint_dtype, "hidden": hidden, "depth": depth, "steps": len(v),
        "start": v[0], "worst_after_50": worst, "end": end, "end_native_c": native_end,
        "float32_floor": floor, "weight_floor": weights, "rel_l2": rel_l2,
        "end_target": bound, "end_met": end <= bound, "every_step_met": worst <= 3 * floor,
        "corrections_per_logged_step": statistics.fmean([x for x in recorder.corrections[1:] if x == x] or [0.0]),
        "median_after_50": statistics.median(v[50:]) if len(v) > 50 else float("nan"),
        "last_100": [min(v[-100:]), max(v[-100:])],  # (the per-step list stays out of docs/: its size)
    }


def poisson_step_cost(points: int, hidden: int, depth: int, repeats: int = 9, block: int = 10,
                      warmup: int = 60) -> dict[str, float]:
    """Median seconds of a training step and of c + J alone, native against float64 c and J, the two
    models (same seed, weights and points) timed in interleaved blocks after ``warmup`` steps each."""
    import lightning.pytorch as lightning

    from lit_constrained.optim import SQPAdam
    from lit_constrained.tasks.poisson import Poisson, PoissonData

    steps, evaluations = {}, {}
    for dtype in ("native", "float64"):
        lightning.seed_everything(0, verbose=False)
        model = Poisson(hidden=hidden, depth=depth, constraint_dtype=dtype)
        data = PoissonData(batch_mode="full", n_pde=400, n_boundary=100, n_pde_imposed=points,
                           n_boundary_imposed=points)
        batch = model.prepare_batch(next(iter(data.train_dataloader())))
        params = list(model.parameters())
        optimizer = SQPAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-7, h=1.0, rho="full")

        def c_and_j(model: Any = model, batch: Any = batch, params: list = params) -> tuple[Any, Any]:
            c = model.constraints(batch)
            return c, model.constraint_jacobian(batch, c, params)

        def step(model: Any = model, batch: Any = batch, optimizer: Any = optimizer, c_and_j: Any = c_and_j) -> None:
            optimizer.zero_grad()
            f = model.objective(batch)
            c, J = c_and_j()
            f.backward()
            closure = lambda: model.constraints(batch).detach().reshape(-1)  # noqa: E731
            optimizer.step(constraints=c.detach(), jacobian=J, constraint_closure=closure)

        harness.repeated(step)(warmup)
        steps[dtype] = harness.repeated(step)
        evaluations[dtype] = harness.repeated(c_and_j)
    step_s = harness.interleaved_medians(steps, repeats, block)
    eval_s = harness.interleaved_medians(evaluations, repeats, block)
    return {"points": points, "step_ms_native": 1e3 * step_s["native"], "step_ms_float64": 1e3 * step_s["float64"],
            "step_ratio": step_s["float64"] / step_s["native"], "c_and_j_ms_native": 1e3 * eval_s["native"],
            "c_and_j_ms_float64": 1e3 * eval_s["float64"], "c_and_j_ratio": eval_s["float64"] / eval_s["native"]}


def poisson_main(options: argparse.Namespace) -> None:
    counts = [int(v) for v in options.poisson.split(",")]
    out = Path(options.out) if options.out else None
    result: dict[str, Any] = {"cpu": cpu_model(), "threads": 1, "steps": options.steps, "rows": [], "cost": []}
    if out is not None and out.exists():  # resumable: finished runs are kept
        result = json.loads(out.read_text())
    done = {(r["points"], r["constraint_dtype"], r["hidden"], r["depth"], r["steps"]) for r in result["rows"]}
    for points in counts:
        for dtype in ("native", "float64"):  # interleaved per N
            if (points, dtype, options.hidden, options.depth, options.steps) in done:
                continue
            row = poisson_run(points, dtype, options.steps, options.hidden, options.depth)
            result["rows"].append(row)
            if out is not None:
                out.write_text(json.dumps(result, indent=1))
            print(f"poisson {points}+{points} c,J {dtype:7s}: start {row['start']:.3g}  worst after 50 "
                  f"{row['worst_after_50']:.3g}  end {row['end']:.3g} (float32 c there {row['end_native_c']:.3g})  "
                  f"float32 floor {row['float32_floor']:.2g}, one-ulp floor {row['weight_floor']:.2g}  end <= "
                  f"{row['end_target']:.2g}: {row['end_met']}; every step after 50 <= 3 x floor: "
                  f"{row['every_step_met']}  rel_l2 {row['rel_l2']:.3g}", flush=True)
    for points in counts:
        cost = poisson_step_cost(points, options.hidden, options.depth)
        result["cost"] = [c for c in result["cost"] if c["points"] != points] + [cost]
        if out is not None:
            out.write_text(json.dumps(result, indent=1))
        print(f"poisson {points}+{points} cost float64 / native: training step {cost['step_ms_float64']:.2f} / "
              f"{cost['step_ms_native']:.2f} ms = {cost['step_ratio']:.2f}x; c + J {cost['c_and_j_ms_float64']:.2f} / "
              f"{cost['c_and_j_ms_native']:.2f} ms = {cost['c_and_j_ratio']:.2f}x", flush=True)
    print(f"CPU: {cpu_model()}, 1 thread")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--tasks", default="spring,spring-minibatch,chemistry,chemistry-minibatch,burgers")
    parser.add_argument("--out", default=None)
    parser.add_argument("--poisson", default=None, help="N,N,...: the Poisson precision study (see above)")
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--depth", type=int, default=2)
    options = parser.parse_args()
    harness.quiet()
    torch.set_num_threads(1)
    if options.poisson:
        poisson_main(options)
        return
    rows = []
    for task in options.tasks.split(","):
        for corrections in (0, 3):  # interleaved per task: off, on
            row = run(task, options.steps, corrections)
            rows.append(row)
            if options.out:  # (written as the rows come: a long run keeps what it measured)
                Path(options.out).write_text(json.dumps({"cpu": cpu_model(), "threads": 1, "steps": options.steps,
                                                         "rows": rows}, indent=1))
            print(f"{task:20s} corrections<={corrections}: start {row['start']:.3g}  worst after 50 "
                  f"{row['worst_after_50']:.3g} ({row['worst_relative']:.2g} x start; target "
                  f"{row['target']:.2g}; float32 floor {row['float32_floor']:.2g})  end {row['end']:.3g}  corrections/step "
                  f"{row['corrections_per_step']:.2f}  step {row['step_ms']:.2f} ms", flush=True)
    result = {"cpu": cpu_model(), "threads": 1, "steps": options.steps, "rows": rows}
    if options.out:
        Path(options.out).write_text(json.dumps(result, indent=1))
    print(f"CPU: {cpu_model()}, 1 thread")


if __name__ == "__main__":
    main()
