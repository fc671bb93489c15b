"""A training step against the number of imposed points m: SQP-Adam / Adam(unc), the Jacobian's share,
peak memory, and the "Adam(unc) + one float32 J J^T" baseline (issue 28's targets).

Tasks (full batch; the package's :class:`~lit_constrained.stepping.TrainingStepper` in a bare loop,
no Lightning):

* ``chemistry``: n = 8 964 parameters, 100 initial conditions = 6 400 rows, ``ChemistryData(
  n_constraints=m)`` (the mass balance w^T du/dt at m training rows), m = 10 ... 3 000;
* ``burgers``: n = 10 625, 10 initial conditions = 10 240 rows, the PDE residual (second-order input
  derivatives u_xx) at m rows, m = 1 000.

Per (task, m), timed in ONE process, interleaved, the order rotated every round (adam, sqp, JJt;
sqp, JJt, adam; ...: whatever follows a step pays for its freed memory equally), medians:

* ``adam``: a step with ``torch.optim.Adam(lr=5e-4)`` (Adam(unc): the constraints are not imposed);
* ``sqp``: a step with ``SQPAdam(lr=5e-4, rho="full")`` (objective, c, J, backward, the optimizer's
  m x m algebra, update and post-step corrections, with its defaults);
* ``J``: of which the Jacobian (``task.constraint_jacobian``, timed inside those steps: the per-point
  engine for these tasks);
* ``JJt``: one float32 product J J^T of J's shape (m x n), the baseline's algebra;
* ``J general`` (m <= ``--general-up-to``): the general autograd Jacobian of the same c, for comparison.

Ratios: ``sqp / adam`` (targets: <= 1.3 at m = 100, <= 10 at m = 1 000) and ``sqp / (adam + JJt)``
(target: <= 2 at m >= 300). ``algebra and rest`` = sqp - adam - J (the optimizer's m x m work and
update beyond Adam's: the part being rewritten separately).

Peak memory: every (task, m, optimizer) runs ``--memory-steps`` steps in a FRESH process (the peak
RSS, ``VmHWM`` of /proc/self/status, only grows within a process, and starts anew at exec); ``peak RSS above Adam(unc)`` = SQP-Adam's peak - Adam's
peak, against the bytes of J (m n float32; target: <= 4 x J). Usage (from the repository root)::

    python benchmarks/bench_scale_m.py [--ms 10 100 300 1000 3000] [--pde-ms 1000] [--repeats 7]
        [--threads 1] [--out docs/figures/bench_scale_m.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import quiet, repeated  # noqa: E402  (benchmarks/harness.py)
from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)

from lit_constrained.optim import SQPAdam, constraint_jacobian  # noqa: E402
from lit_constrained.jacobians import numel_real  # noqa: E402
from lit_constrained.stepping import StepServices, TrainingStepper  # noqa: E402

LR = 5e-4
TARGETS = {"ratio_at_100": 1.3, "ratio_at_1000": 10.0, "ratio_to_baseline_from_300": 2.0, "rss_per_J_bytes": 4.0}


def make_case(task: str, m: int) -> tuple[Any, Any, dict]:
    """(task class, its data's full training batch, the task's init kwargs) for ``task`` at m rows."""
    if task == "chemistry":
        from lit_constrained.tasks.chemistry import Chemistry, ChemistryData

        data = ChemistryData(batch_mode="full", n_ic=100, cache_dir=None, n_constraints=m)
        data.setup("fit")
        return Chemistry, next(iter(data.train_dataloader())), {}
    if task == "burgers":
        from lit_constrained.tasks.burgers import Burgers, BurgersData

        data = BurgersData(batch_mode="full", cache_dir=None, n_constraints=m)
        data.setup("fit")
        return Burgers, next(iter(data.train_dataloader())), {}
    raise ValueError(f"unknown task {task!r}")


def peak_rss_mb() -> float:
    """This process's peak resident set (``VmHWM``, MB): unlike ``ru_maxrss`` it does not count the
    parent's pages a forked child held before its exec."""
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def rotated_medians(runners: dict[str, Any], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each runner over ``repeats`` rounds, one call each per round, the order
    rotated by one every round (each runner follows each other equally often)."""
    names = list(runners)
    for name in names:
        runners[name](warmup)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            runners[name](1)
            times[name].append(time.perf_counter() - start)
    return times


class Stepping:
    """One task model, its optimizer and a TrainingStepper: ``step()`` is one training step; the
    seconds of the task's ``constraint_jacobian`` inside each step go to ``jacobian_seconds``."""

    def __init__(self, cls: Any, batch: Any, kwargs: dict, optimizer: str) -> None:
        torch.manual_seed(0)
        self.model = cls(**kwargs)
        params = list(self.model.parameters())
        if optimizer == "sqp":
            self.optimizer = SQPAdam(params, lr=LR, rho="full")
        else:
            self.optimizer = torch.optim.Adam(params, lr=LR)
        self.batch = batch
        self.stepper = TrainingStepper()
        self.services = StepServices(optimizer=self.optimizer, optimizer_step=self.optimizer.step,
                                     backward=lambda loss: loss.backward())
        self.jacobian_seconds: list[float] = []
        timed = self.model.constraint_jacobian

        def timed_jacobian(*args: Any, **kwargs: Any) -> torch.Tensor:
            start = time.perf_counter()
            J = timed(*args, **kwargs)
            self.jacobian_seconds.append(time.perf_counter() - start)
            return J

        self.model.constraint_jacobian = timed_jacobian  # an instance attribute: this model only

    def step(self) -> None:
        self.stepper.step(self.model, self.batch, self.services)

    def jacobian(self) -> torch.Tensor:
        """c and J as the step computes them (the task's constraint_jacobian)."""
        batch = self.model.prepare_batch(self.batch)
        c = self.model.constraints(batch)
        return self.model.constraint_jacobian(batch, c, list(self.model.parameters()))

    def general_jacobian(self) -> torch.Tensor:
        batch = self.model.prepare_batch(self.batch)
        return constraint_jacobian(self.model.constraints(batch), list(self.model.parameters()))


def memory_probe(task: str, m: int, optimizer: str, steps: int) -> dict[str, float]:
    """Peak RSS (MB) of a fresh process after setup and after ``steps`` steps with ``optimizer``."""
    cls, batch, kwargs = make_case(task, m)
    run = Stepping(cls, batch, kwargs, optimizer)
    setup_mb = peak_rss_mb()
    for _ in range(steps):
        run.step()
    return {"setup_peak_mb": setup_mb, "peak_mb": peak_rss_mb()}


def probe_in_fresh_process(task: str, m: int, optimizer: str, steps: int, threads: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--memory-probe", task, str(m), optimizer, "--memory-steps", str(steps),
               "--threads", str(threads)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def time_case(task: str, m: int, repeats: int, general_up_to: int) -> dict[str, Any]:
    cls, batch, kwargs = make_case(task, m)
    adam = Stepping(cls, batch, kwargs, "adam")
    sqp = Stepping(cls, batch, kwargs, "sqp")
    n = numel_real(sqp.model.parameters())
    J32 = sqp.jacobian().detach().to(torch.float32).contiguous()
    runners = {
        "adam": repeated(adam.step),
        "sqp": repeated(sqp.step),
        "JJt": repeated(lambda: torch.mm(J32, J32.T)),
    }
    if m <= general_up_to:
        runners["J general"] = repeated(sqp.general_jacobian)
    start = time.perf_counter()
    sqp.jacobian_seconds.clear()
    times = rotated_medians(runners, repeats)
    times["J"] = sqp.jacobian_seconds[-repeats:]  # the timed steps' (the warm-up's and the probe's left out)
    medians = {k: statistics.median(v) for k, v in times.items()}
    paths = sorted(set(sqp.model.pointwise_jacobian.paths.values())) or ["small part: one ordinary graph"]
    out: dict[str, Any] = {
        "task": task, "m": m, "n": n, "rows": int(next(v for v in batch.values() if torch.is_tensor(v)).shape[0]),
        "repeats": repeats, "pointwise_paths": paths,
        "ms": {k: 1e3 * v for k, v in medians.items()},
        "J_bytes_float32": 4 * m * n,
        "seconds_timing": time.perf_counter() - start,
    }
    ms = out["ms"]
    out["ms"]["algebra and rest"] = ms["sqp"] - ms["adam"] - ms["J"]
    out["ratio_sqp_to_adam"] = ms["sqp"] / ms["adam"]
    out["ratio_sqp_to_adam_plus_JJt"] = ms["sqp"] / (ms["adam"] + ms["JJt"])
    out["ratio_J_to_adam"] = ms["J"] / ms["adam"]
    return out


def verdicts(case: dict[str, Any]) -> list[str]:
    """The issue's targets that apply to this case, each with its measured value."""
    m, lines = case["m"], []
    if m == 100:
        lines.append(f"sqp/adam {case['ratio_sqp_to_adam']:.2f} <= {TARGETS['ratio_at_100']}: "
                     f"{case['ratio_sqp_to_adam'] <= TARGETS['ratio_at_100']}")
    if m == 1000:
        lines.append(f"sqp/adam {case['ratio_sqp_to_adam']:.2f} <= {TARGETS['ratio_at_1000']}: "
                     f"{case['ratio_sqp_to_adam'] <= TARGETS['ratio_at_1000']}")
    if m >= 300:
        value = case["ratio_sqp_to_adam_plus_JJt"]
        lines.append(f"sqp/(adam + JJt) {value:.2f} <= {TARGETS['ratio_to_baseline_from_300']}: "
                     f"{value <= TARGETS['ratio_to_baseline_from_300']}")
    if "rss_above_adam_mb" in case:
        per_J = case["rss_above_adam_mb"] * 2**20 / case["J_bytes_float32"]
        lines.append(f"peak RSS above Adam {per_J:.2f} x J <= {TARGETS['rss_per_J_bytes']}: "
                     f"{per_J <= TARGETS['rss_per_J_bytes']}")
    return lines


def print_case(case: dict[str, Any]) -> None:
    ms = case["ms"]
    general = f"  J general {ms['J general']:.1f}" if "J general" in ms else ""
    print(f"{case['task']:9s} m={case['m']:5d} n={case['n']}: adam {ms['adam']:.1f} ms  sqp {ms['sqp']:.1f} ms "
          f"(x{case['ratio_sqp_to_adam']:.2f}; x{case['ratio_sqp_to_adam_plus_JJt']:.2f} of adam+JJt)  "
          f"J {ms['J']:.1f}  JJt {ms['JJt']:.1f}  algebra and rest {ms['algebra and rest']:.1f}{general}  "
          f"J {case['J_bytes_float32'] / 2**20:.1f} MB", flush=True)
    if "rss_above_adam_mb" in case:
        print(f"          peak RSS: adam {case['rss_adam_mb']:.0f} MB, sqp {case['rss_sqp_mb']:.0f} MB, "
              f"above adam {case['rss_above_adam_mb']:.0f} MB", flush=True)
    for line in verdicts(case):
        print(f"          target {line}", flush=True)


def git_revision() -> str:
    """The commit measured, with ``+dirty`` when the working tree differs from it (or "unknown")."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", type=int, nargs="*", default=[10, 100, 300, 1000, 3000], help="chemistry m values")
    parser.add_argument("--pde-ms", type=int, nargs="*", default=[1000], help="burgers m values")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (3 from m = 3000 on)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--general-up-to", type=int, default=300, help="also time the general J up to this m")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-RSS probes")
    parser.add_argument("--out", default=None, help="write the figures as JSON here (rewritten after every case)")
    parser.add_argument("--memory-probe", nargs=3, metavar=("TASK", "M", "OPTIMIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        task, m, optimizer = args.memory_probe
        print(json.dumps(memory_probe(task, int(m), optimizer, args.memory_steps)))
        return
    report: dict[str, Any] = {
        "cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__, "python": platform.python_version(),
        "lr": LR, "targets": TARGETS, "command": " ".join(sys.argv), "git": git_revision(), "cases": [],
    }
    print(f"CPU: {report['cpu']}, {args.threads} thread(s), torch {torch.__version__}", flush=True)
    # the slowest last (m = 3 000), so that a long run has written every other case first
    cases = ([("chemistry", m) for m in args.ms if m < 3000] + [("burgers", m) for m in args.pde_ms]
             + [("chemistry", m) for m in args.ms if m >= 3000])
    for task, m in cases:
        repeats = args.repeats if m < 3000 else min(args.repeats, 3)
        case = time_case(task, m, repeats, args.general_up_to)
        if not args.no_memory:
            adam = probe_in_fresh_process(task, m, "adam", args.memory_steps, args.threads)
            sqp = probe_in_fresh_process(task, m, "sqp", args.memory_steps, args.threads)
            case.update(rss_adam_mb=adam["peak_mb"], rss_sqp_mb=sqp["peak_mb"],
                        rss_above_adam_mb=sqp["peak_mb"] - adam["peak_mb"])
        case["verdicts"] = verdicts(case)
        report["cases"].append(case)
        print_case(case)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
