r"""The module's defaults measured on every shipped PDE task: c and J in float64 or in the network's dtype
(``constraint_dtype``), and the default lr decay (``lr_decay``: cosine, linear or none).

Each task is its ``configs/<task>/recommended/sqp_adam.yaml`` (SQP-Adam) with the config's own lr
scheduler left out, so the module's default decay applies, trained ``--steps`` steps (or the config's
length if shorter) from the config's seed, once per variant:

* ``float64+cosine``: the defaults (``constraint_dtype="float64"``, ``lr_decay="cosine"``);
* ``native+cosine``: c and J in float32;
* ``float64+linear`` / ``float64+none``: the other decays; ``native+none``: the previous defaults.

Recorded per run: the task's test error (its first evaluation metric, e.g. ``rel_l2``), max |c| of the
imposed rows at the end, and the CPU time. Records: one JSON line per run in ``--out`` (default
``benchmarks/results/defaults/runs.jsonl``), appended as each finishes; a restart skips the runs there::

    nice -n 10 python benchmarks/defaults.py --steps 1000 &        # resumable
    python benchmarks/defaults.py --report                         # the table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import quiet  # noqa: E402
from machine import cpu_model  # noqa: E402

TASKS = ("poisson", "burgers", "obstacle", "pinnacle_poisson", "pinnacle_burgers", "pinnacle_wave", "pinnacle_heat")
VARIANTS = {
    "float64+cosine": {"constraint_dtype": "float64", "lr_decay": "cosine"},
    "native+cosine": {"constraint_dtype": "native", "lr_decay": "cosine"},
    "float64+linear": {"constraint_dtype": "float64", "lr_decay": "linear"},
    "float64+none": {"constraint_dtype": "float64", "lr_decay": "none"},
    "native+none": {"constraint_dtype": "native", "lr_decay": "none"},
}
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "defaults" / "runs.jsonl"


def config_of(task: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT / "configs" / task / "recommended" / "sqp_adam.yaml").read_text())


def config_steps(config: dict[str, Any]) -> int:
    trainer = config.get("trainer", {})
    return int(trainer.get("max_steps") or -1) if int(trainer.get("max_steps") or -1) > 0 else int(trainer["max_epochs"])


def build(task: str, variant: str, overrides: dict[str, Any] | None = None) -> tuple[Any, Any, int]:
    """The task (seeded as its config), its data, and the config's seed, for ``variant``."""
    import lightning.pytorch as pl

    from lit_constrained.class_spec import import_class

    config = config_of(task)
    seed = int(config.get("seed_everything", 0))
    model_args = {k: v for k, v in config["model"]["init_args"].items() if k != "lr_scheduler"}
    model_args.update(VARIANTS[variant])
    model_args.update(overrides or {})
    data_args = dict(config["data"].get("init_args") or {})
    pl.seed_everything(seed, verbose=False)
    data = import_class(config["data"]["class_path"])(**data_args)
    model = import_class(config["model"]["class_path"])(**model_args)
    return model, data, seed


def figures(model: Any, data: Any) -> dict[str, float]:
    """The task's evaluation metrics on its validation batch and max |c| of its imposed rows."""
    data.setup("validate")
    batch = next(iter(data.val_dataloader()))
    batch = model.prepare_batch(batch)
    metrics = {name: float(value) for name, value in model.evaluation_metrics(batch, "val").items()}
    data.setup("fit")
    train = model.prepare_batch(next(iter(data.train_dataloader())))
    c = model.constraints(train)
    metrics["max_imposed"] = float(c.detach().abs().max()) if c is not None and c.numel() else float("nan")
    return metrics


def run_one(task: str, variant: str, steps: int) -> dict[str, Any]:
    import lightning.pytorch as pl

    model, data, seed = build(task, variant)
    steps = min(steps, config_steps(config_of(task)))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0)
    start = time.process_time()
    trainer.fit(model, data)
    cpu = time.process_time() - start
    return {"task": task, "variant": variant, "steps": steps, "seed": seed, "cpu_s": round(cpu, 1),
            "cpu": cpu_model(), "torch": torch.__version__, **figures(model, data)}


def load(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []


def report(records: list[dict[str, Any]]) -> str:
    rows = ["| task | steps | variant | test error | max imposed c | CPU s |", "|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (TASKS.index(r["task"]) if r["task"] in TASKS else 99, r["steps"],
                                             list(VARIANTS).index(r["variant"]))):
        error = next((v for k, v in r.items() if k in ("rel_l2", "mse", "test_mse", "l2")), None)
        error = next((v for k, v in r.items() if k not in ("max_imposed", "cpu_s", "steps", "seed")
                      and isinstance(v, float)), None) if error is None else error
        rows.append(f"| {r['task']} | {r['steps']} | {r['variant']} | {error:.3g} | {r['max_imposed']:.2e} | "
                    f"{r['cpu_s']:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args(argv)
    if args.report:
        print(report(load(args.out)))
        return 0
    quiet()
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        for variant in args.variants:
            done = {(r["task"], r["variant"], r["steps"]) for r in load(args.out)}
            steps = min(args.steps, config_steps(config_of(task)))
            if (task, variant, steps) in done:
                continue
            record = run_one(task, variant, steps)
            with args.out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
