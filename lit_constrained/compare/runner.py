"""Run the grid: skip finished runs, execute the rest in parallel worker processes, show progress.

Workers are separate processes (``spawn``), ``jobs`` at a time, each with ``threads`` torch threads.
Runs start in :func:`~lit_constrained.compare.grid.execution_order` (full batch first, then the
mini-batch runs seed by seed), so a grid stopped early has comparable partial results.
A worker imports the package once and then runs grid points one after another (``isolate=True``
gives every run a fresh process instead). Each run's result file is written when it finishes, so an
interrupted comparison resumes where it stopped. A worker ends itself when the process that started it
is gone (killed, say, at the end of a session): its run in flight leaves no result file and is run again
next time, instead of training on unseen in the background.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .configs import fingerprint, run_config
from .grid import Budget, RunSpec, execution_order
from .records import result_path
from .worker import execute


@dataclass
class GridOutcome:
    """What :func:`run_grid` did."""

    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def exit_with_parent(parent_pid: int, poll_seconds: float = 1.0) -> None:
    """Start a daemon thread that ends this process (exit status 1) once ``parent_pid`` is no longer its parent.

    A worker pool's initializer: when the parent dies, the worker is re-parented (``os.getppid()``
    changes) and would otherwise finish its run, and any it already holds, unobserved.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def is_finished(spec: RunSpec, out_dir: Path, expected_fingerprint: str) -> bool:
    """A result file for this run exists, with the same config fingerprint."""
    try:
        result = json.loads(result_path(out_dir, spec).read_text())
    except (OSError, ValueError):
        return False
    return bool(result) and result.get("fingerprint") == expected_fingerprint and result.get("status") in ("ok", "diverged")


def run_grid(
    runs: list[RunSpec],
    config_dir: Path,
    out_dir: Path,
    jobs: int,
    threads: int,
    eval_every: int,
    test_metric: str,
    isolate: bool = False,
    progress: bool = True,
    prefer_paper: bool = False,
    work_dir: Path | None = None,
    budget: Budget | None = None,
    tensorboard: bool = True,
) -> GridOutcome:
    """Execute every unfinished run of ``runs``; returns which finished, were skipped or failed.

    Result files go to ``out_dir/runs``; configs, logs and TensorBoard events to ``work_dir``
    (default ``out_dir``).
    """
    if jobs < 1 or threads < 1:
        raise ValueError(f"--jobs and --threads must be >= 1, got {jobs} and {threads}.")
    outcome = GridOutcome()
    todo: list[RunSpec] = []
    work_dir = out_dir if work_dir is None else work_dir
    for spec in execution_order(runs):
        expected = fingerprint(run_config(spec, config_dir, work_dir, threads, eval_every, prefer_paper))
        if is_finished(spec, out_dir, expected):
            outcome.skipped.append(spec.name)
        else:
            todo.append(spec)
    if not todo:
        return outcome

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"compare {runs[0].task}", unit="run", disable=not progress, file=sys.stderr)
    if outcome.skipped:
        bar.write(f"{len(outcome.skipped)} finished run(s) skipped (result files in {out_dir / 'runs'})")
    context = multiprocessing.get_context("spawn")
    workers = min(jobs, len(todo))
    with ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1 if isolate else None,
                             initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {
            pool.submit(execute, spec.to_dict(), str(config_dir), str(out_dir), threads, eval_every, test_metric,
                        prefer_paper, str(work_dir), budget.to_dict() if budget is not None else None,
                        tensorboard): spec
            for spec in todo
        }
        for future in as_completed(futures):
            spec = futures[future]
            try:
                result = future.result()
            except Exception as error:  # noqa: BLE001 (reported, the grid goes on)
                outcome.failed[spec.name] = f"{type(error).__name__}: {error}"
                bar.write(f"FAILED {spec.name}: {type(error).__name__}: {error} (log: {work_dir / 'logs' / spec.name}.log)")
            else:
                outcome.finished.append(spec.name)
                summary = result.get("summary", {})
                bar.set_postfix_str(f"{spec.name}: f={summary.get('objective', float('nan')):.3g}", refresh=False)
            bar.update(1)
    bar.close()
    return outcome
