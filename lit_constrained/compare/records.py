"""A comparison run's record: the file ``<out>/runs/<run>.json`` and the numbers in it.

The record is the run's proof of completion (the harness skips runs whose record exists with the same
config fingerprint) and is kept small: the per-epoch history is kept at the validated
epochs (plus the first and last; at most :data:`MAX_RECORDS`), as columns of numbers rounded to 7
significant digits; the summary (:func:`summarize`) is computed from the full history. Files are
written atomically with the :mod:`json` module (:func:`write_json`); nothing here imports torch or
Lightning, so the report can be redrawn from the records without them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..io import write_atomic
from .grid import RunSpec


def write_json(path: str | Path, payload: Any, indent: int | None = 1) -> None:
    """Write JSON atomically (a temporary file, then rename): readers never see half a file."""
    text = json.dumps(payload, indent=indent, allow_nan=True)
    write_atomic(path, lambda tmp: tmp.write_text(text))


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
