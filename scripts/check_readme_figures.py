#!/usr/bin/env python
"""The README's figures of its first fit, checked against a fresh run.

Runs the README's command, ``lit-constrained fit --config configs/spring/recommended/sqp_adam.yaml``, in
an empty working directory (so the run is a first run: its own log directory and checkpoint), reads the
fit summary and the run's TensorBoard events, and compares every figure the README states about that run
(:data:`FIGURES`: where in the README, what it is, its tolerance) with the fresh value::

    python scripts/check_readme_figures.py                 # a fresh run (about 2 minutes on 2 cores)
    python scripts/check_readme_figures.py --work-dir DIR --reuse   # DIR's earlier run, if there is one
    python scripts/check_readme_figures.py --ddp           # also the "Scaling out" command: 2 CPU processes

``--ddp`` also runs the README's multi-process command, read from its "Scaling out" section (the
first ``lit-constrained fit`` line there, which must run on the CPU: ``--trainer.accelerator cpu
--trainer.devices 2 --trainer.strategy ddp``), and checks the figures the README states about that run
(:data:`DDP_FIGURES`) with the same tolerances.

Prints one line a figure (README, fresh, tolerance, ok) and exits with status 1 if any figure is out of
its tolerance or missing from the README. The tolerances: the values at step 0 (before any update, the
seeded initial network) to 0.1 %; figures at round-off level (max |c| of the imposed constraints at the
end, float32) within 3x and the objective and MSE at the end within 2x, since another CPU's float32
arithmetic moves them; the residual over all collocation points within 25 %; the wall time within 3x
(machine and load). A README value is also accepted within half a unit of its last printed digit.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["fit", "--config", str(ROOT / "configs/spring/recommended/sqp_adam.yaml")]
NUMBER = r"([0-9][0-9.]*(?:e[-+]?[0-9]+)?)"


@dataclass(frozen=True)
class Figure:
    """A figure of the README: ``pattern`` finds it (its one group is the value), ``fresh`` names the
    fresh value it is compared with, ``kind`` the tolerance: ``"start"`` (0.1 %), ``"factor:<k>"``
    (within a factor k), ``"relative:<r>"``."""

    name: str
    pattern: str
    fresh: str
    kind: str


FIGURES: tuple[Figure, ...] = (
    # the opening paragraph
    Figure("wall time", rf"5000 steps in {NUMBER} s", "seconds", "factor:3"),
    Figure("max |c| at the start", rf"max \|c\| of the 3 imposed constraints {NUMBER} at the start", "c_start", "start"),
    Figure("max |c| at the end", rf"at the start -> {NUMBER} at the end", "c_end", "factor:3"),
    Figure("max |c| end / start", rf"at the end \(x {NUMBER}", "c_ratio", "factor:3"),
    Figure("Violation/val at the end", rf"`Violation/val` {NUMBER}\)", "Violation/val", "factor:3"),
    Figure("val/mse at the end", rf"validation MSE {NUMBER} \(`val/mse`\)", "val/mse", "factor:2"),
    Figure("residual/val at the end", rf"of which only 3 are imposed, {NUMBER} \(`residual/val`", "residual/val", "relative:0.25"),
    # the Monitoring section (the screenshots' run)
    Figure("Objective/train at step 0", rf"`Objective/train` {NUMBER} ->", "Objective/train@0", "start"),
    Figure("Objective/train at the end", rf"`Objective/train` \S+ -> {NUMBER}", "Objective/train", "factor:2"),
    Figure("Violation/train at step 0", rf"`Violation/train` {NUMBER} ->", "Violation/train@0", "start"),
    Figure("Violation/train at the end", rf"`Violation/train` \S+ -> {NUMBER}", "Violation/train", "factor:3"),
    Figure("residual/val at step 0", rf"collocation points {NUMBER} ->", "residual/val@0", "start"),
    Figure("residual/val at the end (Monitoring)", rf"collocation points \S+ -> {NUMBER}", "residual/val", "relative:0.25"),
    Figure("val/mse at step 0", rf"`val/mse` {NUMBER} ->", "val/mse@0", "start"),
    Figure("val/mse at the end (Monitoring)", rf"`val/mse` \S+ -> {NUMBER}", "val/mse", "factor:2"),
    Figure("Log10/Violation/train at the end (its data table)", rf"the final values \(-{NUMBER} for", "-Log10/Violation/train",
           "relative:0.05"),
)


DDP_FIGURES: tuple[Figure, ...] = (
    Figure("DDP steps", rf"2 processes: {NUMBER} steps in", "steps", "relative:0"),
    Figure("DDP wall time", rf"2 processes: \S+ steps in {NUMBER} s", "seconds", "factor:3"),
    Figure("DDP max |c| at the start", rf"2 processes: .*? max \|c\| {NUMBER} at the start", "c_start", "start"),
    Figure("DDP max |c| at the end", rf"2 processes: .*? at the start -> {NUMBER} at the end", "c_end", "factor:3"),
    Figure("DDP val/mse at the end", rf"2 processes: .*? validation MSE {NUMBER}", "val/mse", "factor:2"),
)
DDP_SETTINGS = ("--trainer.accelerator cpu", "--trainer.devices 2", "--trainer.strategy ddp")


def readme_ddp_command(readme_text: str) -> list[str]:
    """The README's multi-process command: the first ``lit-constrained fit`` line of a bash block of its
    "Scaling out" section, as arguments after ``lit-constrained``; it must name the CPU settings."""
    start = readme_text.index("\n## Scaling out\n")
    end = readme_text.find("\n## ", start + 1)
    section = readme_text[start : end if end != -1 else None]
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith("lit-constrained fit "):
                missing = [setting for setting in DDP_SETTINGS if setting not in line]
                if missing:
                    raise SystemExit(f"the README's DDP command lacks {missing}: {line}")
                arguments = line.split()[1:]
                # the README's paths are relative to the repository root; the run goes in its own directory
                return [str(ROOT / arg) if previous == "--config" else arg
                        for previous, arg in zip(["", *arguments], arguments)]
    raise SystemExit("no `lit-constrained fit` line in a bash block of the README's 'Scaling out' section")


def console() -> list[str]:
    script = shutil.which("lit-constrained")
    return [script] if script else [sys.executable, "-m", "lit_constrained.cli"]


def fresh_run(work_dir: Path, reuse: bool, command: list[str] = COMMAND) -> str:
    """The fit's output (its summary), from a run of ``command`` in ``work_dir`` (made now unless
    ``reuse`` finds one)."""
    output = work_dir / "fit_output.txt"
    if reuse and output.is_file():
        return output.read_text()
    if (work_dir / "lightning_logs").exists():
        shutil.rmtree(work_dir / "lightning_logs")
    run = subprocess.run(console() + command, cwd=work_dir, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise SystemExit(f"the fit failed (status {run.returncode}):\n{run.stderr[-3000:]}")
    output.write_text(run.stdout)
    return run.stdout


def summary_values(out: str) -> dict[str, float]:
    """Figures of the fit summary: wall time, max |c| start / end / ratio, the validation figures."""
    values: dict[str, float] = {}
    steps = re.search(r"steps\s+([0-9]+) in ([0-9.]+) s", out)
    if steps:
        values["steps"], values["seconds"] = float(steps.group(1)), float(steps.group(2))
    c = re.search(r"max \|c\|\s+(\S+) at the start -> (\S+) at the end \(x (\S+)\)", out)
    if c:
        values["c_start"], values["c_end"], values["c_ratio"] = map(float, c.groups())
    for key in ("Violation/val", "residual/val", "val/mse", "Objective/val"):
        found = re.search(rf"^\s+{re.escape(key)}\s+(\S+)", out, flags=re.M)
        if found:
            values[key] = float(found.group(1))
    return values


def event_values(work_dir: Path) -> dict[str, float]:
    """Step-0 and last values of the headline tags, from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = {p.parent for p in (work_dir / "lightning_logs").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    values: dict[str, float] = {}
    for tag in ("Objective/train", "Violation/train", "residual/val", "val/mse"):
        series = events.Scalars(tag)
        values[f"{tag}@0"] = next(e.value for e in series if e.step == 0)
        values.setdefault(tag, series[-1].value)
    values["-Log10/Violation/train"] = -events.Scalars("Log10/Violation/train")[-1].value  # the README quotes -x
    return values


def printed_precision(text: str) -> float:
    """Half a unit of the last printed digit of ``text`` (e.g. "6.1e-5" -> 5e-7, "82" -> 0.5)."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def within(readme: str, fresh: float, kind: str) -> bool:
    value = float(readme)
    if abs(value - fresh) <= printed_precision(readme):
        return True
    if kind == "start":
        return abs(value - fresh) <= 1e-3 * abs(fresh)
    rule, _, amount = kind.partition(":")
    if rule == "factor":
        return value > 0 and fresh > 0 and max(value / fresh, fresh / value) <= float(amount)
    if rule == "relative":
        return abs(value - fresh) <= float(amount) * abs(fresh)
    raise ValueError(f"unknown tolerance {kind!r}")


def check(readme_text: str, fresh: dict[str, float], figures: tuple[Figure, ...] = FIGURES) -> list[str]:
    """One line a figure; the failures start with ``FAIL``."""
    text = " ".join(readme_text.split())  # README lines rewrapped: one space between words
    lines = []
    for figure in figures:
        found = re.search(figure.pattern, text)
        if found is None:
            lines.append(f"FAIL {figure.name}: not found in README (pattern {figure.pattern!r})")
            continue
        stated = found.group(1).rstrip(".")
        if figure.fresh not in fresh:
            lines.append(f"FAIL {figure.name}: README {stated}, no fresh value ({figure.fresh} not in the run)")
            continue
        value = fresh[figure.fresh]
        ok = within(stated, value, figure.kind)
        lines.append(f"{'ok  ' if ok else 'FAIL'} {figure.name}: README {stated}, fresh {value:.3g} ({figure.kind})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--work-dir", type=Path, default=None, help="where to run (default: a new temporary one)")
    parser.add_argument("--reuse", action="store_true", help="use the work dir's earlier run if it has one")
    parser.add_argument("--ddp", action="store_true", help="also run and check the 'Scaling out' command (2 CPU processes)")
    args = parser.parse_args(argv)
    readme_text = args.readme.read_text()
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        out = fresh_run(work_dir, args.reuse)
        fresh = {**event_values(work_dir), **summary_values(out)}
        lines = check(readme_text, fresh)
        if args.ddp:
            ddp_dir = work_dir / "ddp"
            ddp_dir.mkdir(exist_ok=True)
            ddp_out = fresh_run(ddp_dir, args.reuse, readme_ddp_command(readme_text))
            lines += check(readme_text, summary_values(ddp_out), DDP_FIGURES)
    print("\n".join(lines))
    failures = [line for line in lines if line.startswith("FAIL")]
    print(f"{len(lines) - len(failures)} of {len(lines)} README figures within tolerance of the fresh run")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
