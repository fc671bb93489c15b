r"""PINNacle's inverse problems (PInv, HInv): the recommended hard-constrained configuration against plain
Adam (PINNacle's vanilla PINN: the data misfit in the loss, nothing imposed), same networks, initial
weights and points, at equal steps and at equal CPU time.

Every variant trains the task of :mod:`lit_constrained.tasks.pinnacle_inverse` (two 5 x 50 tanh networks,
u and a; PINNacle's loss: PDE + data misfit + a's boundary values), built from the same seed (the records
hold the initial weights' hash) on the same points (the data module of one seed):

* ``recommended``: ``configs/pinnacle_<problem>/recommended/sqp_adam.yaml``'s optimizer and imposed points
  (SQP-Adam, lr 1e-3, rho full; the package's default cosine lr decay over ``--steps``): the PDE (a
  inside it), a's boundary values and the band |u - d| <= k sigma held exactly;
* ``band``: ``recommended/sqp_adam_band.yaml``: the same with the band |u - d| <= k sigma imposed too at
  50 observations (the two one-sided parts);
* ``auto``: the package's defaults: the recommended config's optimizer (SQP-Adam, lr 1e-3, rho full) with
  ``imposed_count: auto`` (the PDE and a's boundary values at points the module chooses from the
  objective's own, as many as its cost budget affords; no band) and the module's default lr decay (the
  config's ``lr_decay: none`` of HInv is not taken);
* ``adam``: ``torch.optim.Adam`` (lr 1e-3, constant, PINNacle's), nothing imposed, run until both
  ``--steps`` steps and the longest constrained run's CPU time are reached (so one run gives both comparisons).

Recorded every ``--every`` steps: the CPU time so far (``time.process_time``, the evaluations and
snapshots left out), ``rel_l2_u``, ``rel_l2_a`` and PINNacle's ``rel_l2`` (u and a stacked) on the test
grid, and max |r| of the PDE at the recommended config's imposed points. For the constrained runs also
after EVERY step: max |c| of its ``pde`` rows, of its ``coef`` rows and the band's largest violation
(``per_step``), for the target "the PDE rows held at tolerance at every step after step 50".

Records: one JSON line per run in ``--out`` (default ``benchmarks/results/pinnacle_inverse/<problem>.jsonl``),
appended when a run ends; a restart skips the runs recorded (same problem, variant, steps, seed) and
continues a run in progress from its snapshot (``<out>.partial/``, every ``--snapshot-every`` steps)::

    nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/pinnacle_inverse.py --problems pinv --steps 2000 &  # resumable
    python benchmarks/pinnacle_inverse.py --report                                                       # the table
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import quiet  # noqa: E402
from machine import cpu_model  # noqa: E402

PROBLEMS = ("pinv", "hinv")
NAMES = {"pinv": "PInv", "hinv": "HInv"}
VARIANTS = ("recommended", "band", "auto", "adam")
#: the config of each constrained variant (``auto``: the recommended config's optimizer, the points chosen)
CONFIGS = {"recommended": "sqp_adam.yaml", "band": "sqp_adam_band.yaml", "auto": "sqp_adam.yaml"}
RESULTS = ROOT / "benchmarks" / "results" / "pinnacle_inverse"
PARTS = ("pde", "coef", "band_upper", "band_lower")


def config(problem: str, variant: str = "recommended") -> dict[str, Any]:
    import yaml

    path = ROOT / "configs" / f"pinnacle_{problem}" / "recommended" / CONFIGS.get(variant, "sqp_adam.yaml")
    return yaml.safe_load(path.read_text())


def build(problem: str, variant: str, seed: int) -> tuple[Any, Any, Any]:
    """The task (seeded: the same initial weights for both variants), its data, and the recommended config's
    data (its imposed points: where every variant's PDE residual is measured)."""
    from lit_constrained.tasks import pinnacle_inverse

    spec = config(problem, variant)
    task_cls = getattr(pinnacle_inverse, spec["model"]["class_path"].rsplit(".", 1)[1])
    data_cls = getattr(pinnacle_inverse, spec["data"]["class_path"].rsplit(".", 1)[1])
    data_args = {**spec["data"]["init_args"], "seed": seed}
    measured = data_cls(**{**config(problem)["data"]["init_args"], "seed": seed})
    extra = {k: v for k, v in spec["model"]["init_args"].items() if k not in ("optimizer", "num_threads")}
    nothing_imposed = {**data_args, **{k: 0 for k in data_args if k.endswith("_imposed")}}
    if variant == "auto":
        data, optimizer = data_cls(**nothing_imposed), spec["model"]["init_args"]["optimizer"]
        extra = {"band_k": extra.get("band_k", 5.0), "imposed_count": "auto"}  # the module's defaults otherwise
    elif variant in CONFIGS:
        data, optimizer = data_cls(**data_args), spec["model"]["init_args"]["optimizer"]
    else:
        data = data_cls(**nothing_imposed)
        optimizer = {"class_path": "torch.optim.Adam", "init_args": {"lr": 1e-3}}
    torch.manual_seed(seed)
    model = task_cls(optimizer=optimizer, num_threads=1, **extra)
    return model, data, measured


def weights_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def part_maxima(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """max |c| of the ``pde`` and ``coef`` parts and the band's largest violation, max(u - d - k sigma,
    d - u - k sigma, 0), at ``batch``'s imposed points, as the task imposes them (``model.constraints``:
    float64 at float32 weights)."""
    parts = model.imposed(batch) or {}
    c = model.constraints(batch)
    out, offset = {}, 0
    for name in PARTS:
        if name not in parts:
            continue
        chosen = model.row_choice.rows().get(name) if parts[name].count is not None else None
        n = chosen[0] if chosen else len(parts[name].points)  # a counted part: its chosen points
        rows = c[offset:offset + n].detach()
        offset += n
        if name == "band_upper":
            out["band"] = max(out.get("band", 0.0), float(rows.clamp_min(0).max()))
        elif name == "band_lower":
            out["band"] = max(out.get("band", 0.0), float((-rows).clamp_min(0).max()))
        else:
            out[name] = float(rows.abs().max())
    return out


class Recorder:
    """The metrics every ``every`` steps (and per step for a constrained run), CPU time, the stop rule."""

    def __init__(self, model: Any, batch: dict[str, torch.Tensor], measured: dict[str, torch.Tensor], every: int,
                 steps: int, cpu_budget: float, per_step: bool, resumed: dict[str, Any] | None) -> None:
        self.model, self.batch, self.measured, self.every = model, batch, measured, every
        self.steps, self.cpu_budget, self.per_step = steps, cpu_budget, per_step
        self.trajectory: list[list[float]] = list(resumed["trajectory"]) if resumed else []
        self.steps_record: list[list[float]] = list(resumed["per_step"]) if resumed else []
        self.offset = resumed["cpu"] if resumed else 0.0
        self.excluded = 0.0
        self.start = time.process_time()
        if not resumed:
            self.record(0)
            self.record_step(0)

    def cpu(self) -> float:
        return self.offset + time.process_time() - self.start - self.excluded

    def record(self, step: int) -> None:
        cpu = self.cpu()
        begin = time.process_time()
        metrics = self.model.evaluation_metrics(self.batch, "val")
        pde = float(self.model.pde_residual(self.measured["x_pde_imposed"]).detach().abs().max())
        self.trajectory.append([step, round(cpu, 3), float(metrics["rel_l2_u"]), float(metrics["rel_l2_a"]),
                                float(metrics["rel_l2"]), pde])
        self.excluded += time.process_time() - begin

    def record_step(self, step: int) -> None:
        if not self.per_step:
            return
        begin = time.process_time()
        m = part_maxima(self.model, self.measured)
        self.steps_record.append([step, m.get("pde", float("nan")), m.get("coef", float("nan")), m.get("band", 0.0)])
        self.excluded += time.process_time() - begin

    def done(self, step: int) -> bool:
        return step >= self.steps and self.cpu() >= self.cpu_budget


def snapshot_paths(out: Path, key: str) -> tuple[Path, Path]:
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    directory = out.with_name(out.name + ".partial")
    return directory / f"{name}.ckpt", directory / f"{name}.json"


def train(model: Any, data: Any, measured_data: Any, args: dict[str, Any], out: Path, key: str,
          snapshot_every: int) -> Recorder:
    """Lightning's fit of ``model`` with the recorder's callback; a snapshot every ``snapshot_every`` steps."""
    import lightning.pytorch as pl

    batch = model.prepare_batch(next(iter(data.val_dataloader())))
    measured = model.prepare_batch(next(iter(measured_data.train_dataloader())))
    ckpt, meta = snapshot_paths(out, key)
    resumed = json.loads(meta.read_text()) if meta.exists() and ckpt.exists() else None
    if resumed:
        print(f"{key}: continuing from the snapshot at step {resumed['step']}", flush=True)
    state: dict[str, Recorder] = {}

    class Hook(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            state["rec"] = Recorder(model, batch, measured, **args, resumed=resumed)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *rest: Any) -> None:
            rec, step = state["rec"], trainer.global_step
            rec.record_step(step)
            if step % rec.every == 0 or rec.done(step):
                rec.record(step)
            if rec.done(step):
                trainer.should_stop = True
            elif snapshot_every and step % snapshot_every == 0:
                cpu = rec.cpu()
                begin = time.process_time()
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                trainer.save_checkpoint(ckpt.with_suffix(".tmp"))
                os.replace(ckpt.with_suffix(".tmp"), ckpt)
                meta.with_suffix(".tmp").write_text(json.dumps(
                    {"step": step, "cpu": cpu, "trajectory": rec.trajectory, "per_step": rec.steps_record}))
                os.replace(meta.with_suffix(".tmp"), meta)
                rec.excluded += time.process_time() - begin

    # the constrained run's own length (the default cosine decay ends there); Adam's is open-ended (CPU budget)
    max_steps = args["steps"] if args["per_step"] else args["steps"] * 50
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[Hook()])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(model, data, ckpt_path=str(ckpt) if resumed else None)
    for path in (ckpt, meta):
        path.unlink(missing_ok=True)
    return state["rec"]


def code_version() -> str:
    if os.environ.get("PINNACLE_CODE"):
        return os.environ["PINNACLE_CODE"]
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_key(problem: str, variant: str, steps: int, seed: int) -> str:
    return json.dumps({"problem": problem, "variant": variant, "steps": steps, "seed": seed}, sort_keys=True)


def load(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def run_one(problem: str, variant: str, steps: int, seed: int, every: int, cpu_budget: float, out: Path,
            snapshot_every: int) -> dict[str, Any]:
    model, data, measured = build(problem, variant, seed)
    record: dict[str, Any] = {
        "code": code_version(), "torch": torch.__version__, "cpu": cpu_model(), "problem": problem,
        "pinnacle": NAMES[problem], "variant": variant, "steps": steps, "seed": seed, "weights": weights_hash(model),
        "optimizer": model.hparams["optimizer"], "band_k": model.band_k,
        "imposed": {k: data.hparams[k] for k in data.hparams if k.endswith("_imposed")},
        "points": {k: data.hparams[k] for k in ("n_pde", "n_coef")},
        "trajectory_columns": ["step", "cpu_s", "rel_l2_u", "rel_l2_a", "rel_l2", "max_pde_at_imposed"],
    }
    args = {"every": every, "steps": steps, "cpu_budget": cpu_budget, "per_step": variant in CONFIGS}
    wall = time.perf_counter()
    rec = train(model, data, measured, args, out, run_key(problem, variant, steps, seed), snapshot_every)
    record["wall_s"] = round(time.perf_counter() - wall, 1)
    record["trajectory"] = rec.trajectory
    if model.row_choice.chosen:
        record["chosen"] = {name: points for name, (points, _) in model.row_choice.rows().items()}
    if rec.steps_record:
        record["per_step_columns"] = ["step", "max_pde", "max_coef", "max_band_violation"]
        record["per_step"] = rec.steps_record
    return record


def after(record: dict[str, Any], step: int) -> float:
    """The largest max |c| of the pde rows after ``step`` (NaN without per-step records)."""
    rows = [r[1] for r in record.get("per_step", []) if r[0] > step]
    return max(rows) if rows else float("nan")


def report(records: list[dict[str, Any]]) -> str:
    lines = ["| problem | steps | seed | variant | rel. L2 u / a / both at equal steps | CPU s | "
             "Adam's rel. L2 u / a / both at this run's CPU time (steps) | max PDE residual at the imposed points, end | "
             "worst pde max abs c after step 50 |", "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["problem"], r["steps"], r["seed"]), {})[r["variant"]] = r
    for (problem, steps, seed), runs in groups.items():
        adam = runs.get("adam")
        for variant in VARIANTS:
            r = runs.get(variant)
            if r is None:
                continue
            s = [row for row in r["trajectory"] if row[0] <= steps][-1]
            c = [row for row in adam["trajectory"] if row[1] <= s[1] * 1.02] if adam and variant != "adam" else []
            eq = f"{c[-1][2]:.2e} / {c[-1][3]:.2e} / {c[-1][4]:.2e} ({int(c[-1][0])})" if c else "-"
            name = variant if variant not in CONFIGS else (
                f"auto ({', '.join(f'{k} {v}' for k, v in r['chosen'].items())} points)" if variant == "auto" and "chosen" in r
                else f"{variant} ({sum(r['imposed'].values())} points imposed)")
            worst = after(r, 50)
            lines.append(f"| {NAMES[problem]} | {steps} | {seed} | {name} | {s[2]:.2e} / {s[3]:.2e} / {s[4]:.2e} | "
                         f"{s[1]:.0f} | {eq} | {r['trajectory'][-1][5]:.1e} | "
                         f"{'-' if worst != worst else f'{worst:.1e}'} |")
    return "\n".join(lines)


def noise_floor() -> list[str]:
    """What the noise leaves to any estimate of u from the observations: the relative L2 error on the test
    grid of the least-squares fit of the 2 500 noisy values on p functions that contain the exact u
    (PInv: sin(j pi x) sin(k pi y), j, k <= K; HInv: the exact shape e^-t sin(pi x) sin(pi y), p = 1,
    and sin(j pi x) sin(k pi y) t^l, j, k <= K, l < 3), beside sigma sqrt(p / N) / rms(u), its expected value."""
    import numpy as np

    from lit_constrained.tasks.pinnacle_inverse_data import hinv_points, pinv_points

    def sines(p: np.ndarray, k: int, powers: int = 1) -> np.ndarray:
        return np.stack([np.sin(i * np.pi * p[:, 0]) * np.sin(j * np.pi * p[:, 1]) * p[:, -1] ** l
                         for i in range(1, k + 1) for j in range(1, k + 1) for l in range(powers)], 1)

    def exact_shape(p: np.ndarray) -> np.ndarray:
        return (np.exp(-p[:, 2]) * np.sin(np.pi * p[:, 0]) * np.sin(np.pi * p[:, 1]))[:, None]

    lines = []
    for name, arrays, bases in (
            ("PInv", pinv_points(), [(f"sines K={k}", lambda p, k=k: sines(p, k)) for k in (1, 2, 3, 4)]),
            ("HInv", hinv_points(), [("exact shape", exact_shape)] +
             [(f"sines K={k} x t^l, l<3", lambda p, k=k: sines(p, k, 3)) for k in (2, 3)])):
        x, d, xt, ut = arrays["x_obs"], arrays["d_obs"], arrays["x_test"], arrays["u_test"]
        for label, basis in bases:
            coef, *_ = np.linalg.lstsq(basis(x), d, rcond=None)
            error = np.linalg.norm(basis(xt) @ coef - ut) / np.linalg.norm(ut)
            p = basis(x).shape[1]
            expected = 0.1 * np.sqrt(p / len(d)) / np.sqrt((ut**2).mean())
            lines.append(f"{name} {label} (p = {p}): rel. L2 u {error:.2e} (sigma sqrt(p/N) / rms u: {expected:.2e})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=100, help="record the test errors every N steps")
    parser.add_argument("--out", type=Path, default=None, help="default: <results>/<problem>.jsonl")
    parser.add_argument("--snapshot-every", type=int, default=250, help="0: none")
    parser.add_argument("--report", action="store_true", help="print the table of the records and exit")
    parser.add_argument("--floor", action="store_true", help="print what the noise leaves to a least-squares fit of u")
    args = parser.parse_args(argv)
    quiet()
    torch.set_num_threads(1)
    if args.floor:
        print("\n".join(noise_floor()))
        return 0
    problems = args.problems.split(",")
    outs = {problem: args.out or RESULTS / f"{problem}.jsonl" for problem in problems}
    if args.report:
        print(report([r for out in dict.fromkeys(outs.values()) for r in load(out)]))
        return 0
    for problem in problems:
        args.out = outs[problem]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for variant in args.variants.split(","):
            key = run_key(problem, variant, args.steps, args.seed)
            records = load(args.out)
            if key in {run_key(r["problem"], r["variant"], r["steps"], r["seed"]) for r in records}:
                print(f"{problem} {variant}: recorded already, skipped", flush=True)
                continue
            budget = max((r["trajectory"][-1][1] for r in records if r["variant"] in CONFIGS and
                          (r["problem"], r["steps"], r["seed"]) == (problem, args.steps, args.seed)), default=0.0)
            if variant == "adam" and not budget:
                print(f"{problem} adam: no constrained run recorded yet, so no CPU budget; runs to --steps", flush=True)
            record = run_one(problem, variant, args.steps, args.seed, args.every, budget if variant == "adam" else 0.0,
                             args.out, args.snapshot_every)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            last = record["trajectory"][-1]
            print(f"{problem} {variant}: rel. L2 u {last[2]:.3e}, a {last[3]:.3e} after {int(last[0])} steps, "
                  f"{last[1]:.0f} CPU s", flush=True)
    print(report([r for out in dict.fromkeys(outs.values()) for r in load(out)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
