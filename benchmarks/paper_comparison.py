"""Run a task's comparison grid at the paper's budget in the background, committing its report as it goes.

The grid (``lit-constrained compare``, one worker process, one torch thread) writes its run records,
report, configs and logs to ``results/compare/<task>/`` (git-ignored: the JSON run records stay out of
the repository). Runs have no TensorBoard logger (``--tensorboard`` adds it): rendering the task's
prediction figure at every validation costs about as much as the training on the spring task. Every
``--commit-every`` minutes and at the end the report is redrawn from the records and its reference part
goes to ``docs/compare/<task>/``: ``table.md``, ``verdict.md`` and ``runs.csv`` (one line of final
values per run, :func:`write_runs_csv`), which alone are committed. Running the same command again
skips every recorded run. Stopping the driver (``kill``, Ctrl-C) stops the grid and its workers.

The grid runs the committed code (``git archive HEAD`` into ``results/compare/code-<commit>/``), not
the working tree, which other engineers may be editing; ``--working-tree`` runs the working tree.

    nohup python benchmarks/paper_comparison.py --task spring --rho paper,full > /dev/null 2>&1 &
    python benchmarks/paper_comparison.py --task spring --report-only      # redraw and commit, no runs
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: The columns of ``runs.csv``: the run's grid coordinates, then its final values (``summary``).
RUN_COLUMNS = ("name", "label", "method", "rho_variant", "rho", "lr", "mode", "seed", "max_epochs", "status")
SUMMARY_COLUMNS = ("epochs", "steps", "objective", "train_objective", "test_error", "violation_max",
                   "val_violation_max", "time_per_step_s")


def _number(value: float) -> str:
    """A whole number as such (epochs, steps), any other to 4 significant digits."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def write_runs_csv(runs_dir: Path, csv_path: Path) -> int:
    """One line per run record of ``runs_dir`` (``*.json``, sorted by name): :data:`RUN_COLUMNS` and the
    summary's :data:`SUMMARY_COLUMNS` (empty where a record lacks one; whole numbers as such, others to 4
    significant digits).
    Returns the number of runs written."""
    rows = []
    for path in sorted(runs_dir.glob("*.json")):
        record = json.loads(path.read_text())
        spec, summary = record.get("spec", {}), record.get("summary", {})
        row = {"name": record.get("name", path.stem), "label": record.get("label", ""),
               "status": record.get("status", ""), **{k: spec.get(k, "") for k in RUN_COLUMNS[2:-1]}}
        for key in SUMMARY_COLUMNS:
            value = summary.get(key)
            row[key] = "" if value is None else _number(float(value))
        rows.append(row)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*RUN_COLUMNS, *SUMMARY_COLUMNS], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def publish(work: Path, reference: Path) -> int:
    """Copy the report's reference part from ``work`` to ``reference``: ``table.md``, ``verdict.md`` and
    ``runs.csv`` (from ``work/runs``). Returns the number of runs."""
    reference.mkdir(parents=True, exist_ok=True)
    for name in ("table.md", "verdict.md"):
        if (work / name).is_file():
            shutil.copyfile(work / name, reference / name)
    return write_runs_csv(work / "runs", reference / "runs.csv")


def log(path: Path, message: str) -> None:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    with open(path, "a") as handle:
        handle.write(f"{stamp} {message}\n")


def snapshot(target_root: Path) -> Path:
    """The committed tree of HEAD, extracted once into ``target_root/code-<commit>``."""
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    target = target_root / f"code-{commit}"
    if not (target / "lit_constrained").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def commit_records(records: Path, message: str, log_path: Path, attempts: int = 30) -> None:
    """``git add`` and commit ``records`` only (retrying while another commit holds the index lock)."""
    relative = str(records.relative_to(ROOT))
    for _ in range(attempts):
        added = subprocess.run(["git", "add", "--", relative], cwd=ROOT, capture_output=True, text=True)
        if added.returncode == 0:
            staged = subprocess.run(["git", "diff", "--cached", "--quiet", "--", relative], cwd=ROOT)
            if staged.returncode == 0:
                log(log_path, "commit: nothing new")
                return
            done = subprocess.run(["git", "commit", "-q", "-m", message, "--", relative], cwd=ROOT,
                                  capture_output=True, text=True)
            if done.returncode == 0:
                log(log_path, f"committed: {message}")
                return
            error = done.stderr
        else:
            error = added.stderr
        if "index.lock" not in error:
            log(log_path, f"commit failed: {error.strip()}")
            return
        time.sleep(5)
    log(log_path, "commit failed: the index stayed locked")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True)
    p.add_argument("--rho", default="paper,full", help="rho variants (compare --rho)")
    p.add_argument("--budget-fraction", type=float, default=None, help="compare --budget-fraction (default 1)")
    p.add_argument("--commit-every", type=float, default=20.0, help="minutes between commits of the records")
    p.add_argument("--no-commit", action="store_true", help="only run and redraw; commit nothing")
    p.add_argument("--report-only", action="store_true", help="redraw the report from the records (and commit)")
    p.add_argument("--working-tree", action="store_true", help="run the working tree instead of HEAD's code")
    p.add_argument("--tensorboard", action="store_true", help="a TensorBoard logger per run (slower)")
    args, extra = p.parse_known_args(argv)

    records = ROOT / "docs" / "compare" / args.task  # the committed reference part of the report
    work = ROOT / "results" / "compare" / args.task  # records, report, configs and logs (git-ignored)
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "driver.log"
    code = ROOT if args.working_tree else snapshot(ROOT / "results" / "compare")
    command = [sys.executable, "-m", "lit_constrained.compare", "--task", args.task, "--rho", args.rho,
               "--out", str(work), "--work-dir", str(work), "--jobs", "1", "--threads", "1", "--no-progress",
               *(["--budget-fraction", str(args.budget_fraction)] if args.budget_fraction is not None else []),
               *([] if args.tensorboard else ["--no-tensorboard"]),
               *extra]
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}

    def redraw_and_commit(note: str) -> None:
        report = subprocess.run([*command, "--report-only"], cwd=code, env=env, capture_output=True, text=True)
        if report.returncode != 0:
            log(log_path, f"report failed: {report.stderr[-2000:]}")
            return
        header = next((line for line in report.stdout.splitlines() if line.startswith("# ")), "")
        log(log_path, f"report: {header}")
        done = publish(work, records)
        if not args.no_commit:
            commit_records(records, f"compare records: {args.task}, {done} runs ({note})", log_path)

    log(log_path, f"start: {' '.join(command)} (code: {code})")
    if args.report_only:
        redraw_and_commit("report only")
        return 0
    with open(work / "compare.log", "a") as output:
        process = subprocess.Popen(command, cwd=code, env=env, stdout=output, stderr=subprocess.STDOUT)
        # a stopped driver (kill, Ctrl-C) stops the grid: compare's workers end with their parent
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        try:
            last = time.monotonic()
            while process.poll() is None:
                time.sleep(10)
                if time.monotonic() - last >= 60 * args.commit_every:
                    redraw_and_commit("grid running")
                    last = time.monotonic()
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait()
                log(log_path, "driver stopped: grid terminated (the runs in flight are run again next time)")
    log(log_path, f"grid exited with {process.returncode}")
    redraw_and_commit("grid finished" if process.returncode == 0 else f"grid exited with {process.returncode}")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
