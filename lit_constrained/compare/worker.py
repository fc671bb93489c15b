"""One comparison run, executed in a worker process: write its config, train it, save its record.

The run is trained by :func:`lit_constrained.cli.fit.run_fit` (what ``lit-constrained fit --config
<run>.yaml`` does) in the calling process; its record ``<out>/runs/<run>.json``
(:mod:`~lit_constrained.compare.records`) is written when it finishes. The run's config, log and
TensorBoard events go to a separate work folder. A run that stops on a non-finite objective,
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
from .records import history_columns, history_from_columns, result_path, summarize, thin_history, write_json


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
    from lit_constrained.cli.fit import run_fit  # the fit layer (torch, Lightning, the tasks): only in the worker

    start = time.perf_counter()
    error: BaseException | None = None
    with redirect_output(log_path):
        try:
            run_fit(["--config", str(config_path)])
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
