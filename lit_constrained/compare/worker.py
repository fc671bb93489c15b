"""One comparison run, executed in a worker process: write its config, ``lit-constrained fit`` it, save the result.

The result file ``<out>/runs/<run>.json`` is the run's record of completion (the harness skips runs
whose file exists with the same config fingerprint). It is small enough to commit: the per-epoch
history is kept at the validated epochs (plus the first and last; at most :data:`MAX_RECORDS`), as
columns of numbers rounded to 7 significant digits; the summary is computed from the full history.
The run's config, log and TensorBoard events go to a separate work folder. A run that stops on a non-finite objective,
constraint or step (``FloatingPointError`` from the training step) is a finished run with status
``"diverged"`` and its history up to that epoch; any other error leaves no result file (the run is
retried next time) and is reported to the parent.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .configs import find_config, fingerprint, run_config
from .grid import RunSpec
from .recorder import write_json


#: The most per-epoch records a result file keeps.
MAX_RECORDS = 250


def result_path(out_dir: Path, spec: RunSpec) -> Path:
    return out_dir / "runs" / f"{spec.name}.json"


def thin_history(history: list[dict[str, float]], max_records: int = MAX_RECORDS) -> list[dict[str, float]]:
    """The records at validated epochs (with ``val_objective``) and the first and last epoch.

    When these are more than ``max_records``, evenly spaced ones of them (the first and last kept).
    """
    if not history:
        return []
    keep = [i for i, record in enumerate(history) if "val_objective" in record or i in (0, len(history) - 1)]
    if len(keep) > max_records:
        picks = {round(j * (len(keep) - 1) / (max_records - 1)) for j in range(max_records)}
        keep = [keep[j] for j in sorted(picks)]
    return [history[i] for i in keep]


def _round(value: float) -> float:
    return float(f"{value:.7g}") if math.isfinite(value) else value


def history_columns(history: list[dict[str, float]]) -> dict[str, list[float | None]]:
    """The history as columns (``None`` where an epoch lacks the value), numbers to 7 significant digits."""
    keys = list(dict.fromkeys(key for record in history for key in record))
    return {key: [(_round(float(r[key])) if key in r else None) for r in history] for key in keys}


def history_from_columns(columns: dict[str, list[float | None]]) -> list[dict[str, float]]:
    """The inverse of :func:`history_columns`."""
    length = max((len(v) for v in columns.values()), default=0)
    return [{key: values[i] for key, values in columns.items() if values[i] is not None} for i in range(length)]


def load_result(path: Path) -> dict[str, Any] | None:
    """A result file with its ``history`` as a list of per-epoch dicts; None if missing or unreadable."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if "history_columns" in result:
        result["history"] = history_from_columns(result.pop("history_columns"))
    return result


@contextlib.contextmanager
def redirect_output(log_path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def summarize(history: list[dict[str, float]], test_metric: str) -> dict[str, float]:
    """The final numbers (validation metrics: of the last validated epoch) and the mean time per step."""
    if not history:
        return {}
    last = history[-1]
    validated = [h for h in history if "val_objective" in h]
    last_val = validated[-1] if validated else {}
    times = [h["time_per_step_s"] for h in history if math.isfinite(h.get("time_per_step_s", math.nan))]
    steps = [h["step"] for h in history]
    # steps per epoch weight the per-epoch means
    counts = [steps[0]] + [b - a for a, b in zip(steps[:-1], steps[1:])]
    weighted = [t * c for t, c in zip(times, counts)] if len(times) == len(counts) else []
    return {
        "epochs": last["epoch"],
        "steps": last["step"],
        "validated_epoch": last_val.get("epoch", math.nan),
        "objective": last_val.get("val_objective", math.nan),
        "train_objective": last.get("train_objective", math.nan),
        "test_error": last_val.get(f"val_{test_metric}", math.nan),
        "violation_max": last.get("violation_max", math.nan),
        "val_violation_max": last_val.get("val_violation_max", math.nan),
        "time_per_step_s": (sum(weighted) / sum(counts)) if weighted and sum(counts) else math.nan,
    }


def execute(spec_data: dict[str, Any], config_dir: str, out_dir: str, threads: int, eval_every: int,
            test_metric: str, prefer_paper: bool = False, work_dir: str | None = None,
            budget: dict[str, Any] | None = None, tensorboard: bool = True) -> dict[str, Any]:
    """Run one grid point (in the calling process) and write its result file; returns the result.

    ``out_dir`` receives the result file (``runs/<run>.json``); ``work_dir`` (default ``out_dir``) the
    run's config, log, TensorBoard events and temporary history. ``budget`` (``Budget.to_dict()``)
    is stored in the result. ``tensorboard=False`` runs without a logger.
    """
    spec = RunSpec.from_dict(spec_data)
    out = Path(out_dir)
    work = Path(work_dir) if work_dir is not None else out
    config = run_config(spec, Path(config_dir), work, threads, eval_every, prefer_paper, tensorboard)
    source, _ = find_config(Path(config_dir), spec.task, spec.method, prefer_paper)
    config_path = work / "configs" / f"{spec.name}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    history_path = work / "runs" / f"{spec.name}.history.json"
    history_path.unlink(missing_ok=True)
    log_path = work / "logs" / f"{spec.name}.log"

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    set_threads(threads)
    from lit_constrained.cli import main as cli_main

    start = time.perf_counter()
    error: BaseException | None = None
    with redirect_output(log_path):
        try:
            cli_main(["fit", "--config", str(config_path)])
        except FloatingPointError as exc:  # the step's non-finite guard: a finished, diverged run
            error = exc
    wall = time.perf_counter() - start
    if not history_path.exists():
        raise RuntimeError(f"run {spec.name} wrote no history (see {log_path}).")
    recorded = json.loads(history_path.read_text())
    history = recorded["history"]
    result = {
        "spec": spec.to_dict(),
        "name": spec.name,
        "label": spec.label,
        "fingerprint": fingerprint(config),
        "config": str(config_path),
        "source_config": str(source),
        "budget": budget,
        "eval_every": eval_every,
        "status": "ok" if error is None else "diverged",
        "error": None if error is None else f"{type(error).__name__}: {error}",
        "test_metric": test_metric,
        "threads": threads,
        "wall_seconds": wall,
        "fit_seconds": recorded.get("fit_seconds", math.nan),
        "summary": summarize(history, test_metric),
        "history_columns": history_columns(thin_history(history)),
    }
    write_json(result_path(out, spec), result, indent=None)
    history_path.unlink(missing_ok=True)
    result["history"] = history_from_columns(result.pop("history_columns"))
    return result
