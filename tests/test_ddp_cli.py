"""DDP as a user runs it: the real ``lit-constrained fit`` on 2 CPU processes (gloo), by Lightning's
launcher and by torchrun, with every default of the README's config.

Each scenario is a few subprocess runs shared by its tests (module-scoped fixtures), each with a hard
timeout (a hang fails, the run's whole session is killed):

* the README's command (full batch), uninterrupted: it trains to ``max_steps`` on 2 ranks;
* the same, SIGTERM to rank 1 mid-run, then ``--ckpt_path last``: every rank stops, one ``last.ckpt``,
  exit status 1, the stopped step's metrics logged, and the resumed run ends bit-identical to the
  uninterrupted one (weights and optimizer state of both ranks, every logged training metric);
* mini-batch (3 batches per epoch and rank), uninterrupted; with a user's own ``ModelCheckpoint``
  (``--trainer.callbacks+=``) and SIGTERM to rank 0 (the launching process), resumed from its
  ``last.ckpt``; under torchrun, Ctrl+C (SIGINT to the whole process group: the agent and both
  workers) and a resume with a user's ``ModelCheckpoint`` added: both end bit-identical to the
  uninterrupted mini-batch run of Lightning's launcher;
* SIGKILL of the launching process while rank 1 waits outside any collective: rank 1 ends by itself
  (LauncherWatchdog).

A signal is sent while every rank waits at the end of step ``PAUSE`` (tests.helpers.cli_runs.PauseAt):
it is noted before training goes on, and the ranks stop at their next agreed check, by step
2 PAUSE + 1 (the check interval at most doubles from one check to the next).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.cli_runs import (
    README_CONFIG,
    FinalState,
    PauseAt,
    Run,
    callback,
    same_state,
    scalars,
    start,
    wait_all_ended,
)

pytestmark = pytest.mark.ddp

MAX_STEPS = 50  # past the stop (at most 2 PAUSE + 1 = 41) and the user checkpoint at step 50
PAUSE = 20
RUN_TIMEOUT = 240.0  # seconds: a run that has not ended by then hangs
STOP_TIMEOUT = 60.0  # seconds from the signal to every rank's end: a run still alive by then hangs (no speed bound)
README_RUN = ["--config", README_CONFIG, "--trainer.max_steps", str(MAX_STEPS)]
MINIBATCH_RUN = [*README_RUN, "--data.init_args.batch_mode", "minibatch", "--data.init_args.batch_fraction", "0.2"]
TRAIN_METRICS = ("Objective/train", "Violation/train")
STOP_LINE = re.compile(r"lit-constrained: (SIGTERM|SIGINT) received: stopped after step (\d+), saved (\S+);")


def user_checkpoint(directory: str) -> str:
    return callback("lightning.pytorch.callbacks.ModelCheckpoint", dirpath=directory, every_n_train_steps=50,
                    save_top_k=-1)


def fit(workdir: Path, args: list[str], name: str, launcher: str = "lightning") -> dict[str, Any]:
    """An uninterrupted run; its exit status, final states (rank 0, rank 1) and output."""
    run = start(workdir, [*args, callback(FinalState, directory=str(workdir / f"final_{name}"))], launcher, name)
    code = run.wait(RUN_TIMEOUT)
    return {"code": code, "run": run, "final": final_states(workdir / f"final_{name}"), "workdir": workdir}


def final_states(directory: Path) -> list[dict[str, Any]]:
    return [torch.load(directory / f"rank{r}.pt", weights_only=False) for r in (0, 1)
            if (directory / f"rank{r}.pt").exists()]


def stop(workdir: Path, args: list[str], signum: int, target: str, launcher: str = "lightning") -> dict[str, Any]:
    """A run signalled while every rank waits after step PAUSE: ``target`` is "rank0", "rank1", "agent"
    (torchrun's) or "group" (every process, as a terminal's Ctrl+C)."""
    pause = workdir / "pause"
    run = start(workdir, [*args, callback(PauseAt, step=PAUSE, directory=str(pause))], launcher, "stopped")
    pids = run.rank_pids(pause)
    if target == "group":
        os.killpg(run.process.pid, signum)
    else:
        os.kill({"rank0": pids[0], "rank1": pids[1], "agent": run.process.pid}[target], signum)
    (pause / "go").write_text("")
    code = run.wait(STOP_TIMEOUT)
    wait_all_ended(pids, STOP_TIMEOUT)
    lasts = {str(p.resolve()): torch.load(p, weights_only=False)["global_step"] for p in workdir.rglob("last*.ckpt")}
    return {"code": code, "run": run, "workdir": workdir, "lasts": lasts}


def stop_line(run: Run) -> tuple[str, int, Path]:
    found = STOP_LINE.findall(run.stderr)
    assert len(found) == 1, f"expected one stop line from rank 0, got {found}:\n{run.stderr[-3000:]}"
    name, step, path = found[0]
    return name, int(step), Path(path)


def assert_last_checkpoint(stopped: dict[str, Any], expected_dir: Path) -> int:
    """The stopped run left one ``last.ckpt``, in ``expected_dir``, holding the stopped step."""
    _, step, path = stop_line(stopped["run"])
    assert PAUSE <= step <= 2 * PAUSE + 1
    assert str(path.resolve()) == str(expected_dir.resolve() / "last.ckpt")
    assert stopped["lasts"] == {str(path.resolve()): step}, stopped["lasts"]
    return step


def assert_resumed_equals(reference: dict[str, Any], resumed: dict[str, Any]) -> None:
    assert resumed["code"] == 0, resumed["run"].stderr[-3000:]
    assert len(reference["final"]) == len(resumed["final"]) == 2
    for rank in (0, 1):
        same_state(reference["final"][rank], resumed["final"][rank], f"rank {rank}")


def assert_metrics_continue(reference: dict[str, Any], stopped: dict[str, Any], stop_step: int) -> None:
    """The stopped run logged every step up to the stopped one (logger step = global step - 1), the
    resumed run the rest; each value as the uninterrupted run logged it."""
    for tag in TRAIN_METRICS:
        expected = scalars(reference["workdir"] / "lightning_logs", tag)
        assert sorted(expected) == list(range(MAX_STEPS)), tag
        before = scalars(stopped["workdir"] / "lightning_logs" / "spring" / "SQPAdam" / "version_000", tag)
        assert max(before) == stop_step - 1, f"{tag}: the stopped step {stop_step} was not logged"
        after = scalars(stopped["workdir"] / "lightning_logs" / "spring" / "SQPAdam" / "version_001", tag)
        assert min(after) == stop_step, f"{tag}: the resumed run does not start at step {stop_step}"
        assert {**before, **after} == expected, tag


# --------------------------------------------------------------------------- the README's command


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("readme")
    runs = {"reference": fit(root / "reference", README_RUN, "reference")}
    runs["stopped"] = stop(root / "stopped", README_RUN, signal.SIGTERM, "rank1")
    runs["resumed"] = fit(root / "stopped", [*README_RUN, "--ckpt_path", "last"], "resumed")
    return runs


def test_readme_command_trains_to_the_end_on_two_ranks(readme: dict[str, dict[str, Any]]) -> None:
    reference = readme["reference"]
    assert reference["code"] == 0, reference["run"].stderr[-3000:]
    assert "Starting with 2 processes" in reference["run"].stderr
    states = reference["final"]
    assert [s["global_step"] for s in states] == [MAX_STEPS, MAX_STEPS]
    same_state(states[0], states[1], "rank 0 vs rank 1")  # replicas stay identical
    last = reference["workdir"] / "lightning_logs" / "spring" / "SQPAdam" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == MAX_STEPS


def test_sigterm_to_rank_1_stops_every_rank_with_one_checkpoint(readme: dict[str, dict[str, Any]]) -> None:
    stopped = readme["stopped"]
    assert stopped["code"] == 1, stopped["run"].stderr[-3000:]
    assert "lit-constrained (rank 1): SIGTERM received" in stopped["run"].stderr
    assert_last_checkpoint(stopped, stopped["workdir"] / "lightning_logs" / "spring" / "SQPAdam" / "checkpoints")


def test_resume_after_sigterm_is_bit_identical_and_logs_every_step(readme: dict[str, dict[str, Any]]) -> None:
    assert_resumed_equals(readme["reference"], readme["resumed"])
    _, step, _ = stop_line(readme["stopped"]["run"])
    assert_metrics_continue(readme["reference"], readme["stopped"], step)


# --------------------------------------------------------------------------- mini-batch, a user's checkpoint, torchrun


@pytest.fixture(scope="module")
def minibatch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("minibatch")
    runs = {"reference": fit(root / "reference", MINIBATCH_RUN, "reference")}
    own = [*MINIBATCH_RUN, user_checkpoint("user_ckpt")]
    runs["stopped"] = stop(root / "own", own, signal.SIGTERM, "rank0")
    runs["resumed"] = fit(root / "own", [*own, "--ckpt_path", "user_ckpt/last.ckpt"], "resumed")
    return runs


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("torchrun")
    runs = {"stopped": stop(root, MINIBATCH_RUN, signal.SIGINT, "group", launcher="torchrun")}
    last = "lightning_logs/spring/SQPAdam/checkpoints/last.ckpt"
    resumed_args = [*MINIBATCH_RUN, user_checkpoint("user_ckpt"), "--ckpt_path", last]
    runs["resumed"] = fit(root, resumed_args, "resumed", launcher="torchrun")
    return runs


def test_a_users_model_checkpoint_keeps_the_signal_handling(minibatch: dict[str, dict[str, Any]]) -> None:
    """SIGTERM to the launching process (rank 0) with a user's ModelCheckpoint: last.ckpt in its
    directory, exit status 1 (it was: exit 0, nothing saved)."""
    stopped = minibatch["stopped"]
    assert stopped["code"] == 1, stopped["run"].stderr[-3000:]
    assert_last_checkpoint(stopped, stopped["workdir"] / "user_ckpt")


def test_minibatch_resume_from_the_users_checkpoint_is_bit_identical(minibatch: dict[str, dict[str, Any]]) -> None:
    assert minibatch["reference"]["code"] == 0, minibatch["reference"]["run"].stderr[-3000:]
    assert_resumed_equals(minibatch["reference"], minibatch["resumed"])
    _, step, _ = stop_line(minibatch["stopped"]["run"])
    assert_metrics_continue(minibatch["reference"], minibatch["stopped"], step)
    assert list((minibatch["stopped"]["workdir"] / "user_ckpt").glob(f"epoch=*-step={MAX_STEPS}.ckpt"))


def test_torchrun_ctrl_c_stops_and_resumes_bit_identically(
    torchrun: dict[str, dict[str, Any]], minibatch: dict[str, dict[str, Any]]
) -> None:
    """Ctrl+C under torchrun: each worker gets SIGINT twice (terminal and agent), one stop; the
    resumed run (a user's ModelCheckpoint added) equals Lightning's launcher's uninterrupted run."""
    stopped = torchrun["stopped"]
    assert stopped["code"] != 0, stopped["run"].stderr[-3000:]
    name, step, _ = stop_line(stopped["run"])
    assert name == "SIGINT"
    assert_last_checkpoint(stopped, stopped["workdir"] / "lightning_logs" / "spring" / "SQPAdam" / "checkpoints")
    # the agent's repeat is not a second Ctrl+C
    assert "KeyboardInterrupt" not in stopped["run"].stderr, stopped["run"].stderr[-3000:]
    assert_resumed_equals(minibatch["reference"], torchrun["resumed"])
    user_files = sorted(p.name for p in (stopped["workdir"] / "user_ckpt").glob("*.ckpt"))
    assert user_files and all("step=" in p for p in user_files), user_files


# --------------------------------------------------------------------------- SIGKILL


def test_sigkill_of_the_launching_process_ends_the_other_rank(tmp_path: Path) -> None:
    """Rank 1 waits outside any collective (in PauseAt) when rank 0 is SIGKILLed: nothing else would end it
    before PauseAt's own 120 s (the hang guard, STOP_TIMEOUT, is shorter); the watchdog ends it, saying why
    (its grace on a clock: tests/callbacks/test_signals.py)."""
    pause = tmp_path / "pause"
    run = start(tmp_path, [*README_RUN, callback(PauseAt, step=PAUSE, directory=str(pause))])
    pids = run.rank_pids(pause)
    os.kill(pids[0], signal.SIGKILL)
    run.wait(STOP_TIMEOUT)
    wait_all_ended(pids[1:], STOP_TIMEOUT)
    assert "the launching process" in run.stderr and "ending this rank too" in run.stderr, run.stderr[-2000:]
