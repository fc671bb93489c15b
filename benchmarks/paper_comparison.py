"""Run a task's comparison grid at the paper's budget in the background, committing the run records as it goes.

The grid (``lit-constrained compare``, one worker process, one torch thread) writes its run records
and report to ``docs/compare/<task>/`` (committed: small JSON records, tables, figures) and its
configs and logs to ``results/compare/<task>/`` (git-ignored). Runs have no TensorBoard logger
(``--tensorboard`` adds it): rendering the task's prediction figure at every validation costs about as
much as the training on the spring task. Every
``--commit-every`` minutes and at the end the report is redrawn from the records and
``docs/compare/<task>/`` is committed (nothing else), so a session that ends mid-grid loses at most
the runs in flight; running the same command again skips every recorded run. Stopping the driver
(``kill``, Ctrl-C) stops the grid and its workers.

The grid runs the committed code (``git archive HEAD`` into ``results/compare/code-<commit>/``), not
the working tree, which other engineers may be editing; ``--working-tree`` runs the working tree.

    nohup python benchmarks/paper_comparison.py --task spring --rho paper,full > /dev/null 2>&1 &
    python benchmarks/paper_comparison.py --task spring --report-only      # redraw and commit, no runs
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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

    records = ROOT / "docs" / "compare" / args.task
    work = ROOT / "results" / "compare" / args.task
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "driver.log"
    code = ROOT if args.working_tree else snapshot(ROOT / "results" / "compare")
    command = [sys.executable, "-m", "lit_constrained.compare", "--task", args.task, "--rho", args.rho,
               "--out", str(records), "--work-dir", str(work), "--jobs", "1", "--threads", "1", "--no-progress",
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
        if not args.no_commit:
            done = len(list((records / "runs").glob("*.json")))
            commit_records(records, f"compare records: {args.task}, {done} run records ({note})", log_path)

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
