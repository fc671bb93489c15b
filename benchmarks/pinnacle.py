r"""PINNacle's problems (Burgers1d-C, Poisson2d-C, Wave1d-C, Heat2d-MS): plain Adam, the recommended
hard-constrained configuration and L-BFGS, on the same network, initial weights and points.

Every variant trains the task of :mod:`lit_constrained.tasks.pinnacle` (PINNacle's 100 x 5 tanh PINN
and its loss, the sum of the conditions' mean squared residuals), built from the same seed (so the same
initial weights: their hash is recorded) on the same points (the task's data module, one seed):

* ``adam``: PINNacle's vanilla PINN, ``torch.optim.Adam`` (lr 1e-3), nothing imposed;
* ``auto``: ``configs/pinnacle_<problem>/sqp_adam.yaml``, the package's defaults and nothing chosen per
  problem: SQP-Adam (lr 1e-3, rho full) with the module's default lr decay over ``--steps`` and every
  condition imposed at points the module chooses from the objective's (``imposed_count: auto``);
* ``recommended``: ``configs/pinnacle_<problem>/recommended/sqp_adam.yaml``'s optimizer, lr scheduler
  (if the config has one; its horizon, ``T_max`` or ``total_iters``, stretched to ``--steps``) and
  imposed points (SQP-Adam, lr 1e-3, rho full);
* ``adam_steps``: ``adam`` run for ``--steps`` steps only (the equal-steps comparison without waiting for
  the recommended run's CPU time);
* ``sqp<N>`` (the sweep of the imposed points): the recommended optimizer with N / 2 PDE points and
  N / 2 boundary (and initial) points imposed; ``sqp<P>+<B>+<I>``: P PDE, B boundary and I initial
  points (Poisson2d-C: ``sqp<P>+<B>``);
* ``<variant>@cos`` (not ``lbfgs``): ``variant`` with its lr annealed by a cosine to 1 % over ``--steps``;
  ``<variant>@const``: a constrained variant with a constant lr (the config's scheduler left out, the
  module's default decay off); ``recommended`` and ``sqp<N>`` keep their config's schedule, a constant lr
  where it names none (as they were swept);
* ``lbfgs``: ``torch.optim.LBFGS`` (lr 1, strong-Wolfe line search, history 50), one iteration a step,
  from the same weights (a plain loop on the task's objective: the package's module steps one
  optimizer call per batch with no closure to re-evaluate); a step that does not move (the line search
  gives up on a direction that is not a descent direction) starts the history again (counted in the
  record's ``restarts``);

``--fourier-features K`` builds every variant's network with
:class:`~lit_constrained.physics.features.FourierFeatures` of K frequencies over the problem's box in
front (the task's ``fourier_features``; default the tasks' own, 5; recorded in the record and its key
when not 0; 0: PINNacle's network, the one of every record from before the option).

Equal steps AND equal CPU time: the recommended (and/or auto) run goes first; ``adam`` and ``lbfgs`` then
run until both ``--steps`` steps and the longer of those runs' CPU time in ``--out`` (``time.process_time``,
the evaluations left out) are reached. Every ``--every`` steps the test error is recorded with the CPU time so far, so one
run gives both comparisons: at equal steps (the record at ``--steps``) and at equal CPU time (the last
record within the recommended run's CPU time).

Records: one JSON line per run in ``--out`` (default ``benchmarks/results/pinnacle/runs.jsonl``),
appended as each run finishes; a restart skips the runs already there (same problem, variant, steps,
points, seed and Fourier features). A run in progress leaves a snapshot every ``--snapshot-every`` steps (its Lightning
checkpoint, or L-BFGS's model and optimizer state, and the trajectory and CPU time so far, under
``<out>.partial/``); a restart continues it from there, so a 20 000-step run survives being stopped::

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/pinnacle.py --steps 2000 &      # resumable
    python benchmarks/pinnacle.py --report [RECORDS ...]                               # the table

``--report`` prints the table from the records (nothing is trained).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import quiet  # noqa: E402
from machine import cpu_model  # noqa: E402

from lit_constrained.tasks.pinnacle_common import DEFAULT_FOURIER_FEATURES  # noqa: E402

PROBLEMS = ("poisson", "burgers", "wave", "heat")
PINNACLE_NAMES = {"burgers": "Burgers1d-C", "poisson": "Poisson2d-C", "wave": "Wave1d-C", "heat": "Heat2d-MS"}
VARIANTS = ("recommended", "adam", "adam_steps", "lbfgs")
ORDER = ("n_pde", "n_boundary", "n_initial")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pinnacle" / "runs.jsonl"


def recommended(problem: str) -> dict[str, Any]:
    """The optimizer, the lr scheduler (None: a constant lr) and the data arguments of
    ``configs/pinnacle_<problem>/recommended/sqp_adam.yaml``."""
    import yaml

    config = yaml.safe_load((ROOT / "configs" / f"pinnacle_{problem}" / "recommended" / "sqp_adam.yaml").read_text())
    model = config["model"]["init_args"]
    return {"optimizer": model["optimizer"], "lr_scheduler": model.get("lr_scheduler"), "data": config["data"]["init_args"]}


def classes(problem: str) -> tuple[type, Callable[..., Any]]:
    """The problem's task class and its data (PinnacleData of that problem)."""
    from lit_constrained.tasks import pinnacle

    return getattr(pinnacle, f"{problem.capitalize()}Pinnacle"), functools.partial(pinnacle.PinnacleData, problem)


def imposed_counts(problem: str, variant: str) -> dict[str, int]:
    """The imposed points of ``variant``: the recommended config's; none for adam / lbfgs; for ``sqp<N>``
    (the sweep) N / 2 PDE points and N / 2 boundary (Poisson) or boundary + initial points (a quarter each);
    for ``sqp<P>+<B>+<I>`` P PDE, B boundary and I initial points (Poisson: ``sqp<P>+<B>``)."""
    config = {k: v for k, v in recommended(problem)["data"].items() if k.endswith("_imposed")}
    if variant == "recommended":
        return config
    if variant == "auto" or not variant.startswith("sqp"):
        return {k: 0 for k in config}
    if "+" in variant:  # sqp<P>+<B>[+<I>]: the counts themselves, in the order of ORDER
        counts = [int(n) for n in variant[3:].split("+")]
        if len(counts) != len(config):
            raise SystemExit(f"{variant}: {problem} imposes {len(config)} conditions ({', '.join(sorted(config))})")
        return {f"{name}_imposed": n for name, n in zip(ORDER, counts)}
    n = int(variant[3:])
    counts = {"n_pde_imposed": n // 2}
    if problem == "poisson":
        counts["n_boundary_imposed"] = n - n // 2
    else:
        counts["n_boundary_imposed"] = (n - n // 2) // 2
        counts["n_initial_imposed"] = n - n // 2 - counts["n_boundary_imposed"]
    return counts


#: the scheduler arguments that are the run's length in steps (stretched to ``--steps``)
HORIZONS = ("T_max", "total_iters")


def split_variant(variant: str) -> tuple[str, str]:
    """``variant``'s base and its lr suffix (``""``, ``"cos"`` or ``"const"``)."""
    base, _, suffix = variant.partition("@")
    if suffix not in ("", "cos", "const"):
        raise SystemExit(f"{variant}: the lr suffix is @cos or @const, not @{suffix}")
    return base, suffix


def is_constrained(base: str) -> bool:
    """Whether the variant ``base`` is the recommended optimizer with points imposed."""
    return base in ("recommended", "auto") or base.startswith("sqp")


def lr_schedule(variant: str, steps: int, lr: float, spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The scheduler of ``variant`` (stepped after every optimizer step; None: a constant lr).
    ``@cos``: cosine annealing of the optimizer's ``lr`` over the ``steps`` steps to 1 % of it
    (``CosineAnnealingLR``); ``@const``: none; otherwise a constrained variant takes ``spec`` (the
    recommended config's scheduler, or None) with its horizon (:data:`HORIZONS`) set to ``steps``, and
    Adam none."""
    base, suffix = split_variant(variant)
    if suffix == "cos":
        return {"class_path": "torch.optim.lr_scheduler.CosineAnnealingLR", "init_args": {"T_max": steps, "eta_min": lr / 100}}
    if suffix == "const" or not is_constrained(base) or spec is None or base == "auto":
        return None
    args = {k: steps if k in HORIZONS else v for k, v in spec.get("init_args", {}).items()}
    return {"class_path": spec["class_path"], "init_args": args}


def build(problem: str, variant: str, points: dict[str, int], seed: int, steps: int,
          fourier_features: int = DEFAULT_FOURIER_FEATURES) -> tuple[Any, Any]:
    """The task (seeded: the same initial weights for every variant) and its data for ``variant``
    (``fourier_features``: the task's argument, 0 PINNacle's network)."""
    task_cls, data_cls = classes(problem)
    rec = recommended(problem)
    base, suffix = split_variant(variant)
    if base == "lbfgs" and suffix:
        raise SystemExit(f"{variant}: the L-BFGS loop takes no lr schedule")
    if suffix == "const" and not is_constrained(base):
        raise SystemExit(f"{variant}: {base} has a constant lr already")
    data = data_cls(**points, **imposed_counts(problem, base), seed=seed)
    optimizer = rec["optimizer"] if is_constrained(base) else {"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}}
    torch.manual_seed(seed)
    scheduler = lr_schedule(variant, steps, optimizer["init_args"]["lr"], rec["lr_scheduler"])
    extra: dict[str, Any] = {"imposed_count": "auto"} if base == "auto" else {}
    extra["fourier_features"] = fourier_features
    if suffix == "const" or (is_constrained(base) and scheduler is None and base != "auto"):
        extra["lr_decay"] = "none"  # a constant lr, as the variant names (the module's default would decay it)
    model = task_cls(optimizer=optimizer, lr_scheduler=scheduler, num_threads=1, **extra)
    return model, data


def weights_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.net.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


class Snapshot:
    """A run's state on disk mid-way: ``<key hash>.ckpt`` (the Lightning checkpoint, or L-BFGS's model and
    optimizer state) and ``<key hash>.json`` (the trajectory and the CPU time so far). Written ckpt first,
    each by a rename, so a ``.json`` always names a complete ``.ckpt`` of its step."""

    def __init__(self, directory: Path, key: str, every: int) -> None:
        self.every = every  # 0: none written (one left by an earlier run is still continued)
        name = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.ckpt = directory / f"{name}.ckpt"
        self.meta = directory / f"{name}.json"

    def saved(self) -> dict[str, Any] | None:
        """The last snapshot's trajectory, CPU time and step, if one is complete."""
        if not self.meta.exists() or not self.ckpt.exists():
            return None
        return json.loads(self.meta.read_text())

    def due(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    def write(self, save_ckpt: Any, trajectory: list[list[float]], cpu: float, step: int,
              lbfgs: dict[str, Any]) -> None:
        self.ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt.with_suffix(".ckpt.tmp")
        save_ckpt(tmp)
        os.replace(tmp, self.ckpt)
        tmp_meta = self.meta.with_suffix(".json.tmp")
        tmp_meta.write_text(json.dumps({"step": step, "cpu": cpu, "trajectory": trajectory, "lbfgs": lbfgs}))
        os.replace(tmp_meta, self.meta)

    def remove(self) -> None:
        for path in (self.ckpt, self.meta):
            path.unlink(missing_ok=True)


class Recorder:
    """The test error and CPU time (evaluations and snapshots left out) every ``every`` steps, and the
    stop rule. ``resumed`` (a snapshot's) continues its trajectory and CPU time."""

    def __init__(self, model: Any, batch: dict[str, torch.Tensor], every: int, steps: int, cpu_budget: float,
                 resumed: dict[str, Any] | None = None) -> None:
        self.model, self.batch, self.every = model, batch, every
        self.steps, self.cpu_budget = steps, cpu_budget
        self.trajectory: list[list[float]] = list(resumed["trajectory"]) if resumed else []
        self.offset = resumed["cpu"] if resumed else 0.0
        self.excluded = 0.0
        # L-BFGS's history restarts and the loss before its last step (for the stall check)
        self.lbfgs: dict[str, Any] = dict(resumed["lbfgs"]) if resumed else {"restarts": 0, "previous": None}
        self.start = time.process_time()
        if not resumed:
            self.record(0)

    def cpu(self) -> float:
        return self.offset + time.process_time() - self.start - self.excluded

    def record(self, step: int) -> None:
        cpu = self.cpu()
        begin = time.process_time()
        with torch.no_grad():
            rel = float(self.model.evaluation_metrics(self.batch, "val")["rel_l2"])
        self.trajectory.append([step, round(cpu, 3), rel])
        self.excluded += time.process_time() - begin

    def snapshot(self, snapshot: Snapshot, save_ckpt: Any, step: int) -> None:
        """Write ``snapshot`` at ``step``, its own CPU time left out."""
        cpu = self.cpu()
        begin = time.process_time()
        snapshot.write(save_ckpt, self.trajectory, cpu, step, self.lbfgs)
        self.excluded += time.process_time() - begin

    def done(self, step: int) -> bool:
        return step >= self.steps and self.cpu() >= self.cpu_budget


def lightning_run(model: Any, data: Any, recorder_args: dict[str, Any], snapshot: Snapshot,
                  resumed: dict[str, Any] | None) -> Recorder:
    import lightning.pytorch as pl

    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    state: dict[str, Recorder] = {}

    class Hook(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            state["rec"] = Recorder(model, batch, **recorder_args, resumed=resumed)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            rec, step = state["rec"], trainer.global_step
            if step % rec.every == 0 or rec.done(step):
                rec.record(step)
            if rec.done(step):
                trainer.should_stop = True
            elif snapshot.due(step):
                rec.snapshot(snapshot, trainer.save_checkpoint, step)

    steps = recorder_args["steps"]
    # a run timed against another's CPU time may go past --steps; otherwise the Trainer's length is the run's
    # (the module's default lr decay follows it)
    trainer = pl.Trainer(max_steps=steps * 50 if recorder_args["cpu_budget"] else steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[Hook()])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(model, data, ckpt_path=str(snapshot.ckpt) if resumed else None)
    return state["rec"]


def lbfgs_run(model: Any, data: Any, recorder_args: dict[str, Any], snapshot: Snapshot,
              resumed: dict[str, Any] | None) -> Recorder:
    data.setup()
    train = model.prepare_batch(next(iter(data.train_dataloader())))
    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    torch.set_num_threads(1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=1, history_size=50,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model.objective(train)
        loss.backward()
        return loss

    def save(path: Path) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    step = 0
    if resumed:
        saved = torch.load(snapshot.ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = resumed["step"]
    rec = Recorder(model, batch, **recorder_args, resumed=resumed)
    while not rec.done(step):
        loss = optimizer.step(closure)
        step += 1
        if float(loss) == rec.lbfgs["previous"]:
            # step() returns the loss before its step, so an unchanged one means the previous step did not
            # move: its line search gave t = 0 on a direction that is not a descent direction, and with
            # s = y = 0 the history stays, so every later step would stop the same way; start the history
            # again (the next step is a scaled steepest-descent step)
            optimizer.state.clear()
            rec.lbfgs["restarts"] += 1
        rec.lbfgs["previous"] = float(loss)
        if step % rec.every == 0 or rec.done(step):
            rec.record(step)
        if not torch.isfinite(loss):
            rec.record(step)
            break
        if snapshot.due(step) and not rec.done(step):
            rec.snapshot(snapshot, save, step)
    return rec


def final_figures(model: Any, data: Any) -> dict[str, float]:
    """max |c| at the recommended run's imposed points (0 rows: NaN) and max |residual| at the check points."""
    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    c = model.constraints(batch)
    with torch.no_grad():
        held = model.validation_constraints(batch)
    return {"max_imposed": float(c.detach().abs().max()) if c is not None else float("nan"),
            "max_held_out": float(held.abs().max())}


def run_key(problem: str, variant: str, steps: int, points: dict[str, int], seed: int,
            fourier_features: int = 0) -> str:
    key: dict[str, Any] = {"problem": problem, "variant": variant, "steps": steps, "points": points, "seed": seed}
    if fourier_features:  # (the records of PINNacle's network keep their keys)
        key["fourier_features"] = fourier_features
    return json.dumps(key, sort_keys=True)


def fourier_features_of(record: dict[str, Any]) -> int:
    """The record's ``--fourier-features`` (0: PINNacle's network, and every record from before the option)."""
    return int(record.get("fourier_features", 0))


def load(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def points_for(problem: str, n_pde: int | None, n_boundary: int | None, n_initial: int | None) -> dict[str, int]:
    """The objective's point counts: those given, else the recommended config's (Heat2d-MS: 2 048 initial
    points, the others 256)."""
    config = recommended(problem)["data"]
    given = {"n_pde": n_pde, "n_boundary": n_boundary, "n_initial": n_initial}
    names = ("n_pde", "n_boundary") if problem == "poisson" else ORDER
    return {name: config[name] if given[name] is None else given[name] for name in names}


def code_version() -> str:
    """The commit the package's code is from: ``$PINNACLE_CODE`` (an exported tree), else git's HEAD."""
    import os
    import subprocess

    if os.environ.get("PINNACLE_CODE"):
        return os.environ["PINNACLE_CODE"]
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_one(problem: str, variant: str, steps: int, points: dict[str, int], seed: int, every: int,
            cpu_budget: float, snapshot: Snapshot, fourier_features: int = DEFAULT_FOURIER_FEATURES) -> dict[str, Any]:
    model, data = build(problem, variant, points, seed, steps, fourier_features)
    record: dict[str, Any] = {"code": code_version(), "torch": torch.__version__, "problem": problem, "pinnacle": PINNACLE_NAMES[problem], "variant": variant,
                              "steps": steps, "points": points, "seed": seed, "weights": weights_hash(model),
                              "optimizer": model.hparams["optimizer"] if variant != "lbfgs" else
                              {"class_path": "torch.optim.LBFGS", "init_args": {"lr": 1.0, "history_size": 50,
                                                                                "line_search_fn": "strong_wolfe"}},
                              "imposed": {k: data.hparams[k] for k in data.hparams if k.endswith("_imposed")},
                              "lr_scheduler": model.hparams.get("lr_scheduler"), "cpu": cpu_model()}
    if fourier_features:
        record["fourier_features"] = fourier_features
    args = {"every": every, "steps": steps, "cpu_budget": cpu_budget}
    wall = time.perf_counter()
    resumed = snapshot.saved()  # read once: the run continues from it
    if resumed:
        print(f"{problem} {variant}: continuing from the snapshot at step {resumed['step']}", flush=True)
    run = lbfgs_run if variant == "lbfgs" else lightning_run
    rec = run(model, data, args, snapshot, resumed)
    record["wall_s"] = round(time.perf_counter() - wall, 1)  # this process's part of the run
    record["trajectory"] = rec.trajectory
    if variant == "lbfgs":
        record["restarts"] = rec.lbfgs["restarts"]
    record |= final_figures(model, data)
    if getattr(model, "row_choice", None) is not None and model.row_choice.chosen:
        record["chosen"] = {name: list(points) for name, points in model.row_choice.rows().items()}
    return record


def at_steps(record: dict[str, Any], steps: int) -> list[float] | None:
    rows = [row for row in record["trajectory"] if row[0] <= steps]
    return rows[-1] if rows else None


def at_cpu(record: dict[str, Any], cpu: float) -> list[float] | None:
    rows = [row for row in record["trajectory"] if row[1] <= cpu * 1.02]
    return rows[-1] if rows else None


def imposed_text(record: dict[str, Any]) -> str:
    """The points a constrained run imposed: the fixed counts' sum, or the automatic choice per part
    (its last choice: points of the pool)."""
    chosen = record.get("chosen")
    if chosen:
        return " + ".join(f"{name} {count}/{pool}" for name, (count, pool) in chosen.items())
    return str(sum(record["imposed"].values()))


def report(records: list[dict[str, Any]]) -> str:
    """The table: per problem, steps, points and seed, each variant's rel. L2 at equal steps and at the
    recommended run's CPU time."""
    lines = ["| problem | steps | points (pde/bc/ic) | seed | variant | rel. L2 at equal steps | CPU s to those steps "
             "| rel. L2 at equal CPU time (steps reached) | Adam at this run's CPU time (steps) "
             "| max imposed c / held-out residual |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int, str, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        group = (r["problem"], r["steps"], json.dumps(r["points"], sort_keys=True), r["seed"], fourier_features_of(r))
        groups.setdefault(group, {})[r["variant"]] = r
    for (problem, steps, points, seed, features), runs in groups.items():
        rec = runs.get("recommended")
        budget = rec["trajectory"][-1][1] if rec else None
        pts = "/".join(str(v) for k, v in sorted(json.loads(points).items(), key=lambda kv: ORDER.index(kv[0])))
        sweep = sorted(v for v in runs if v not in VARIANTS)  # the sweep points and the @cos / @const variants
        for variant in (*VARIANTS, *sweep):
            r = runs.get(variant)
            if r is None:
                continue
            s = at_steps(r, steps)
            reached = budget is not None and r["trajectory"][-1][1] >= 0.98 * budget
            c = at_cpu(r, budget) if reached else None
            name = variant if not is_constrained(split_variant(variant)[0]) else f"{variant} ({imposed_text(r)} imposed)"
            name += f", Fourier features K = {features}" if features else ""
            equal_time = f"{c[2]:.2e} ({int(c[0])})" if c else "-"
            adam = runs.get("adam")
            own = r["trajectory"][-1][1]
            a = at_cpu(adam, own) if adam is not None and variant != "adam" and adam["trajectory"][-1][1] >= 0.98 * own else None
            against = f"{a[2]:.2e} ({int(a[0])})" if a else "-"
            lines.append(f"| {PINNACLE_NAMES[problem]} | {steps} | {pts} | {seed} | {name} | {s[2]:.2e} | {s[1]:.0f} | "
                         f"{equal_time} | {against} | {r['max_imposed']:.1e} / {r['max_held_out']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="recommended, adam, adam_steps, lbfgs, sqp<N> or sqp<P>+<B>[+<I>] (a sweep point)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--n-pde", type=int, default=None, help="default: the recommended config's (1 024)")
    parser.add_argument("--n-boundary", type=int, default=None, help="default: the recommended config's (256)")
    parser.add_argument("--n-initial", type=int, default=None,
                        help="default: the recommended config's (256; Heat2d-MS 2 048)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fourier-features", type=int, default=DEFAULT_FOURIER_FEATURES, metavar="K",
                        help="the tasks' fourier_features (K frequencies over the domain's box; default the "
                             f"tasks' own, {DEFAULT_FOURIER_FEATURES}; 0: PINNacle's network)")
    parser.add_argument("--every", type=int, default=100, help="record the test error every N steps")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--snapshot-every", type=int, default=500,
                        help="write a run's snapshot every N steps under <out>.partial/ (0: none); a restart continues it")
    parser.add_argument("--variant-major", action="store_true",
                        help="run every problem's first variant before any problem's second (default: problem by problem)")
    parser.add_argument("--report", nargs="*", type=Path, default=None, metavar="RECORDS",
                        help="print the table of the records (--out, or these files; a later record of the same "
                             "run replaces an earlier one) and exit")
    args = parser.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    if args.report is not None:
        print(report([r for path in (args.report or [args.out]) for r in load(path)]))
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    problems, variants = args.problems.split(","), args.variants.split(",")
    if args.variant_major:  # every problem's first variant, then every problem's second, ...
        queue = [(problem, variant) for variant in variants for problem in problems]
    else:
        queue = [(problem, variant) for problem in problems for variant in variants]
    for problem, variant in queue:
        points = points_for(problem, args.n_pde, args.n_boundary, args.n_initial)
        base, suffix = split_variant(variant)
        if base.startswith("sqp") and not suffix and imposed_counts(problem, base) == imposed_counts(problem, "recommended"):
            print(f"{problem} {variant}: the recommended configuration's points, skipped", flush=True)
            continue
        records = load(args.out)
        done = {run_key(r["problem"], r["variant"], r["steps"], r["points"], r["seed"], fourier_features_of(r))
                for r in records}
        key = run_key(problem, variant, args.steps, points, args.seed, args.fourier_features)
        if key in done:
            print(f"{problem} {variant}: recorded already, skipped", flush=True)
            continue
        budget = max([r["trajectory"][-1][1] for r in records if r["variant"] in ("recommended", "auto") and
                      (r["problem"], r["steps"], r["points"], r["seed"], fourier_features_of(r))
                      == (problem, args.steps, points, args.seed, args.fourier_features)], default=0.0)
        timed_against = variant in ("adam", "lbfgs")
        snapshot = Snapshot(args.out.with_name(args.out.name + ".partial"), key, args.snapshot_every)
        record = run_one(problem, variant, args.steps, points, args.seed, args.every,
                         budget if timed_against else 0.0, snapshot, args.fourier_features)
        with args.out.open("a") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
        snapshot.remove()
        last = record["trajectory"][-1]
        print(f"{problem} {variant}: rel. L2 {last[2]:.3e} after {int(last[0])} steps, {last[1]:.0f} CPU s",
              flush=True)
    print(report(load(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
