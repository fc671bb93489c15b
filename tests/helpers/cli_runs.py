"""Runs of the real ``lit-constrained fit`` command on 2 CPU processes, for tests and measurements.

* :func:`start` launches ``lit-constrained fit ... --trainer.strategy ddp --trainer.devices 2
  --trainer.accelerator cpu`` (Lightning's launcher: the process started is rank 0, rank 1 its child)
  or the same under ``torchrun --standalone --nproc_per_node 2 -m lit_constrained.cli`` (the
  README's form), in its own session so that a hang is killed whole (:meth:`Run.wait` has a hard
  timeout).
* Callbacks a test adds on the command line (``--trainer.callbacks+=...``): :class:`PauseAt` holds every
  rank at the end of one step until the test says go (so a signal lands at a known point, and each
  rank tells its pid), :class:`FinalState` writes each rank's weights and optimizer state at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

REPO = Path(__file__).resolve().parents[2]
README_CONFIG = "configs/spring/recommended/sqp_adam.yaml"
DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
#: the environment variables of a launcher, which must not leak from the test process into a run
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                    "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


class PauseAt(pl.Callback):
    """At the end of step ``step`` every rank writes ``<directory>/rank<r>.json`` (its pid) and waits
    (at most ``timeout`` seconds) until ``<directory>/go`` exists."""

    def __init__(self, step: int, directory: str, timeout: float = 120.0) -> None:
        self.step, self.directory, self.timeout = int(step), Path(directory), float(timeout)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / f"rank{trainer.global_rank}.json"
        marker.write_text(json.dumps({"pid": os.getpid(), "step": trainer.global_step}))
        deadline = time.monotonic() + self.timeout
        while not (self.directory / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"PauseAt: no {self.directory / 'go'} after {self.timeout} s")
            time.sleep(0.01)


class FinalState(pl.Callback):
    """At the end of the fit each rank saves ``<directory>/rank<r>.pt``: weights, optimizer state, step."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {"model": pl_module.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
                 "global_step": trainer.global_step}
        torch.save(state, self.directory / f"rank{trainer.global_rank}.pt")


def callback(cls: type, **init_args: Any) -> str:
    """``--trainer.callbacks+=`` value naming a callback class of this module (or any class path)."""
    path = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
    return "--trainer.callbacks+=" + json.dumps({"class_path": path, "init_args": init_args})


@dataclass
class Run:
    """A launched run: its process (rank 0 or the torchrun agent), output files and timings."""

    process: subprocess.Popen
    workdir: Path
    name: str
    started: float
    ended: float | None = None

    @property
    def stdout(self) -> str:
        return (self.workdir / f"{self.name}.stdout.txt").read_text()

    @property
    def stderr(self) -> str:
        return (self.workdir / f"{self.name}.stderr.txt").read_text()

    def rank_pids(self, pause_dir: Path, timeout: float = 120.0) -> list[int]:
        """The pids of ranks 0 and 1, once both wait in :class:`PauseAt`."""
        deadline = time.monotonic() + timeout
        markers = [pause_dir / f"rank{r}.json" for r in (0, 1)]
        while not all(m.exists() and m.stat().st_size for m in markers):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the run never reached the pause (rc {self.process.returncode}):\n"
                                     f"{self.stderr[-3000:]}")
            time.sleep(0.01)
        return [int(json.loads(m.read_text())["pid"]) for m in markers]

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` seconds (then the whole session is killed and
        the test fails: a hang)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"lit-constrained did not end within {timeout} s (killed):\n{self.stderr[-3000:]}")
        self.ended = time.monotonic()
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return env


def command(launcher: str, args: list[str]) -> list[str]:
    """``lit-constrained fit <args>`` on 2 processes, by Lightning's launcher or by torchrun."""
    if launcher == "lightning":
        script = shutil.which("lit-constrained")
        base = [script] if script else [sys.executable, "-m", "lit_constrained.cli"]
        return [*base, "fit", *args, *DDP]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "lit_constrained.cli", "fit", *args, *DDP]
    raise ValueError(f"unknown launcher {launcher!r}")


def start(workdir: Path, args: list[str], launcher: str = "lightning", name: str = "run") -> Run:
    """Launch the run in ``workdir`` (its cwd: logs and checkpoints go there) with the repository's
    configs reachable as ``configs/...`` and this module's callbacks importable; its output goes to
    ``<name>.stdout.txt`` and ``<name>.stderr.txt`` there."""
    workdir.mkdir(parents=True, exist_ok=True)
    configs = workdir / "configs"
    if not configs.exists():
        configs.symlink_to(REPO / "configs")
    with (workdir / f"{name}.stdout.txt").open("w") as out, (workdir / f"{name}.stderr.txt").open("w") as err:
        process = subprocess.Popen(command(launcher, args), cwd=workdir, env=environment(), stdout=out, stderr=err,
                                   start_new_session=True)
    return Run(process, workdir, name, time.monotonic())


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, waiting for its parent to reap it, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_all_ended(pids: list[int], timeout: float) -> float:
    """Seconds until every pid has ended (raises AssertionError past ``timeout``)."""
    start_time = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - start_time > timeout:
            raise AssertionError(f"processes {[p for p in pids if alive(p)]} still alive after {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start_time


def same_state(a: Any, b: Any, where: str = "state") -> None:
    """Assert two nested states (tensors, dicts, lists, numbers) are bit-identical."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), (
            f"{where} differs (max |a - b| = {(a.double() - b.double()).abs().max().item():.3e})")
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def scalars(log_dir: Path, tag: str) -> dict[int, float]:
    """``tag``'s values by step from the TensorBoard event files under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[int, float] = {}
    for events in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            out.update({e.step: e.value for e in accumulator.Scalars(tag)})
    return out
