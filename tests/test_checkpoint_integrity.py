"""Checkpoints that are not trained on silently when damaged: the content hash, clear read errors, safe writes.

Corruption is made as the issue did: bytes flipped inside the saved file (64 in the weights, 10 in
Adam's second moment), found by their values in the file, then both a resume (``trainer.fit(ckpt_path=)``)
and ``load_from_checkpoint`` must refuse it, naming the file and what differs.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from lit_constrained.callbacks.integrity import CheckpointIntegrity, disk_full, write_failure
from lit_constrained.checkpoint_integrity import (
    INTEGRITY_KEY,
    CheckpointCorruptedError,
    CheckpointReadError,
    CheckpointWriteError,
    IntegrityCheckpointIO,
    content_digests,
    read_checkpoint,
    verify_content_hash,
)
from lit_constrained import ConstrainedModule
from lit_constrained.hints import SetupError
from lit_constrained.module_parts.checkpoint_trust import CheckpointMismatchError
from lit_constrained.tasks.curve import CurveData, CurveFit
from tests.helpers.lightning import quiet_trainer

CONFIG = Path(__file__).resolve().parents[1] / "configs/curve/sqp_adam.yaml"


def _model() -> CurveFit:
    return CurveFit(hidden=8, optimizer=functools.partial(torch.optim.Adam, lr=1e-2))


def _data() -> CurveData:
    return CurveData(num_samples=16, batch_size=16)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last.ckpt of a 3-step fit with a ModelCheckpoint (what a run writes)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    directory = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    trainer = quiet_trainer(max_steps=3, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0)])
    trainer.fit(_model(), _data())
    return directory / "last.ckpt"


def _copy(saved: Path, tmp_path: Path, name: str = "copy.ckpt") -> Path:
    target = tmp_path / name
    target.write_bytes(saved.read_bytes())
    return target


def test_every_tensor_and_section_has_its_own_sha256(saved: Path) -> None:
    checkpoint = torch.load(saved, weights_only=True)
    stored = checkpoint[INTEGRITY_KEY]
    assert stored["algorithm"] == "sha256"
    weight = checkpoint["state_dict"]["net.0.weight"]
    # independently: SHA-256 of the dtype, the shape and the raw bytes
    expected = hashlib.sha256(f"{weight.dtype}{tuple(weight.shape)}".encode() + weight.numpy().tobytes()).hexdigest()
    assert stored["digests"]["state_dict/net.0.weight"] == expected
    exp_avg_sq = [k for k in stored["digests"] if k.startswith("optimizer_states/0/state/") and k.endswith("exp_avg_sq")]
    assert exp_avg_sq and {"epoch", "loops", "hyper_parameters", "state_dict"} <= set(stored["digests"])
    assert verify_content_hash(checkpoint, str(saved)) is True
    assert content_digests(checkpoint) == dict(stored["digests"])  # the entry itself is not hashed


def _flip(path: Path, tensor: torch.Tensor, count: int) -> None:
    """Flip ``count`` bytes of ``tensor``'s storage inside the saved file (found by its bytes)."""
    data = bytearray(path.read_bytes())
    raw = tensor.contiguous().numpy().tobytes()
    offset = data.find(raw)
    assert offset >= 0 and data.find(raw, offset + 1) < 0, "the tensor's bytes are not unique in the file"
    for index in range(offset, offset + min(count, len(raw))):
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def corrupted(saved: Path, tmp_path: Path) -> Path:
    """A copy of ``saved`` with 64 bytes flipped in the first weight and 10 in Adam's second moment."""
    target = _copy(saved, tmp_path, "corrupted.ckpt")
    checkpoint = torch.load(saved, weights_only=True)
    _flip(target, checkpoint["state_dict"]["net.0.weight"], 64)
    second_moment = next(s["exp_avg_sq"] for s in checkpoint["optimizer_states"][0]["state"].values())
    _flip(target, second_moment, 10)
    return target


def test_a_corrupted_checkpoint_is_refused_by_resume_and_by_load_from_checkpoint(corrupted: Path) -> None:
    torch.load(corrupted, weights_only=True)  # torch itself reads it without a word
    with pytest.raises(CheckpointCorruptedError) as resume:
        quiet_trainer(max_steps=5, limit_val_batches=0).fit(_model(), _data(), ckpt_path=corrupted)
    with pytest.raises(CheckpointCorruptedError) as load:
        CurveFit.load_from_checkpoint(corrupted)
    for raised in (resume, load):
        message = str(raised.value)
        assert str(corrupted) in message and "state_dict/net.0.weight" in message and "exp_avg_sq" in message
        assert "\n" not in message
        assert len(raised.value.differing) == 2  # exactly the two tensors touched


@pytest.fixture(scope="module")
def cli_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last.ckpt of a 3-step ``lit-constrained fit`` of the curve config (SQP-Adam, the CLI's checkpoint)."""
    from lit_constrained.cli.fit import main

    root = tmp_path_factory.mktemp("cli")
    main(["fit", "--config", str(CONFIG), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.max_steps", "3", "--trainer.default_root_dir", str(root)])
    return root / "checkpoints" / "last.ckpt"


def test_a_corrupted_checkpoint_is_refused_by_the_command_line(
    cli_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from lit_constrained.cli.fit import main

    corrupted = _copy(cli_saved, tmp_path, "last.ckpt")
    checkpoint = torch.load(cli_saved, weights_only=True)
    _flip(corrupted, checkpoint["state_dict"]["net.0.weight"], 64)
    second_moment = next(s["second_moment"] for s in checkpoint["optimizer_states"][0]["state"].values()
                         if "second_moment" in s)  # SQP-Adam's moment (the first parameter's entry)
    _flip(corrupted, second_moment, 10)
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", str(CONFIG), "--ckpt_path", str(corrupted), "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "5",
              "--trainer.default_root_dir", str(tmp_path)])
    assert raised.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lit-constrained fit: error: {corrupted} does not match"), lines
    assert str(corrupted) in lines[0]
    assert "state_dict/net.0.weight" in lines[0] and "optimizer_states/0/state/0/second_moment" in lines[0]


def test_an_intact_checkpoint_resumes_and_loads(saved: Path) -> None:
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0)
    trainer.fit(_model(), _data(), ckpt_path=saved)
    assert trainer.global_step == 5
    loaded = CurveFit.load_from_checkpoint(saved)
    expected = torch.load(saved, weights_only=True)["state_dict"]["net.0.weight"]
    assert torch.equal(loaded.state_dict()["net.0.weight"], expected)


def test_a_checkpoint_without_a_hash_loads_with_a_one_line_note(
    saved: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = torch.load(saved, weights_only=True)
    del checkpoint[INTEGRITY_KEY]  # as plain Lightning writes it
    torch.save(checkpoint, tmp_path / "plain.ckpt")
    with caplog.at_level(logging.INFO):
        CurveFit.load_from_checkpoint(tmp_path / "plain.ckpt")
        quiet_trainer(max_steps=4, limit_val_batches=0).fit(_model(), _data(), ckpt_path=tmp_path / "plain.ckpt")
    notes = [r.getMessage() for r in caplog.records if "no content hash" in r.getMessage()]
    assert len(notes) == 2 and all(str(tmp_path / "plain.ckpt") in n and "\n" not in n for n in notes)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "directory"])
def test_an_unreadable_file_is_one_line_naming_it(damage: str, saved: Path, tmp_path: Path) -> None:
    target = tmp_path / "bad.ckpt"
    content = saved.read_bytes()
    if damage == "directory":
        target.mkdir()
    else:
        target.write_bytes({"empty": b"", "truncated": content[: len(content) // 2],
                            "garbage": bytes(range(256)) * 4}[damage])
    expected = {"empty": "is empty (0 bytes)", "truncated": "is truncated", "garbage": "is not a checkpoint",
                "directory": "is a directory"}[damage]
    for attempt in (
        lambda: quiet_trainer(max_steps=4, limit_val_batches=0).fit(_model(), _data(), ckpt_path=target),
        lambda: CurveFit.load_from_checkpoint(target),
        lambda: read_checkpoint(target, weights_only=True, map_location="cpu", mmap=True),  # the --ckpt_path read
    ):
        with pytest.raises(CheckpointReadError) as raised:
            attempt()
        message = str(raised.value)
        assert message.startswith(f"Checkpoint {target} ") and expected in message and "\n" not in message


def test_a_full_disk_names_the_file_and_keeps_the_previous_checkpoint(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lit_constrained.checkpoint_integrity as integrity

    target = _copy(saved, tmp_path, "last.ckpt")
    before = target.read_bytes()
    checkpoint = torch.load(saved, weights_only=True)

    def full_disk(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
        handle.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(integrity.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError) as raised:
        IntegrityCheckpointIO().save_checkpoint(checkpoint, target)
    message = str(raised.value)
    assert f"Could not write the checkpoint {target}: No space left on device (ENOSPC)" in message
    assert "The previous last.ckpt is unchanged" in message and "Free some space" in message
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert disk_full(raised.value)


def test_a_full_disk_seen_by_the_logger_is_named_as_such(capsys: pytest.CaptureFixture) -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise ValueError("\n you tried to log 0.03 which is currently not supported.")  # Lightning's TB logger
    except ValueError as error:
        logged = error
    trainer = quiet_trainer(max_steps=1)
    CheckpointIntegrity().on_exception(trainer, None, logged)  # type: ignore[arg-type]
    line = capsys.readouterr().err.strip()
    assert line.startswith("lit-constrained: the disk is full") and "you tried to log" in line and "\n" not in line
    CheckpointIntegrity().on_exception(trainer, None, ValueError("other"))  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""


# -- a checkpoint of another task or of other shapes (issue 37, item 13) ------------------------------

SPRING_CONFIG = Path(__file__).resolve().parents[1] / "configs/spring/sqp_adam.yaml"


class Elsewhere(ConstrainedModule):
    """Another task on the curve data (not a CurveFit): a linear model with one anchor."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.line = torch.nn.Linear(1, 1)

    def objective(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return (self.line(x) - y).pow(2).mean()

    def constraints(self, batch: Any) -> torch.Tensor:
        return self.line(torch.zeros(1, 1)).reshape(-1)


def test_a_checkpoint_of_another_task_is_refused_before_restoring_by_fit_and_load(saved: Path) -> None:
    """``trainer.fit(ckpt_path=)`` and ``load_from_checkpoint``: one line naming the file and both classes."""
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0)
    with pytest.raises(CheckpointMismatchError) as resumed:
        trainer.fit(Elsewhere(optimizer=functools.partial(torch.optim.Adam, lr=1e-2)), _data(), ckpt_path=saved)
    assert trainer.global_step == 0  # nothing trained
    with pytest.raises(CheckpointMismatchError) as loaded:
        Elsewhere.load_from_checkpoint(saved)
    for raised in (resumed, loaded):
        message = str(raised.value)
        assert f"{saved} is a checkpoint of lit_constrained.tasks.curve.CurveFit, not of {__name__}.Elsewhere" in message
        assert "\n" not in message
    assert isinstance(resumed.value, SetupError)  # the command line prints it as one line, exit 2


def test_a_checkpoint_of_other_parameter_shapes_is_refused_before_restoring(saved: Path) -> None:
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0)
    with pytest.raises(CheckpointMismatchError) as raised:  # saved: hidden=8
        trainer.fit(CurveFit(hidden=4, optimizer=functools.partial(torch.optim.Adam, lr=1e-2)), _data(), ckpt_path=saved)
    message = str(raised.value)
    assert str(saved) in message and "lit_constrained.tasks.curve.CurveFit" in message
    assert "net.0.weight (8, 1) in the checkpoint, (4, 1) in the module" in message and "\n" not in message
    assert trainer.global_step == 0


def test_the_command_line_refuses_another_tasks_checkpoint_in_one_line(
    cli_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A spring config resumed from the curve run's checkpoint: refused before LightningCLI puts the
    checkpoint's class in place of the config's (it trained CurveFit on the spring data: KeyError)."""
    from lit_constrained.cli.fit import main

    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", str(SPRING_CONFIG), "--ckpt_path", str(cli_saved), "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2",
              "--trainer.default_root_dir", str(tmp_path)])
    assert raised.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lit-constrained fit: error: "), captured.err
    assert (f"{cli_saved} is a checkpoint of lit_constrained.tasks.curve.CurveFit, not of "
            "lit_constrained.tasks.spring.Spring (the config's model)") in lines[0]
    assert "Restored all states" not in captured.out + captured.err


# -- the trusted-class check on every route, --ckpt_path last included (issue 37, item 15) --------------


def _plant_untrusted_last(directory: Path, source: Path, module_name: str) -> Path:
    """``directory/last.ckpt``: ``source`` with its optimizer renamed ``<module_name>.Evil`` and its content
    hash recomputed (a re-hashed file passes the hash); the module, on sys.path, writes ``imported`` if
    it is ever imported."""
    from lit_constrained.checkpoint_integrity import with_content_hash

    (directory / f"{module_name}.py").write_text(
        f"from pathlib import Path\nPath({str(directory / 'imported')!r}).write_text('ran')\n"
        "import torch\nclass Evil(torch.optim.SGD):\n    pass\n"
    )
    checkpoint = torch.load(source, weights_only=True)
    checkpoint["hyper_parameters"]["optimizer"] = {"class_path": f"{module_name}.Evil", "init_args": {"lr": 0.1}}
    torch.save(with_content_hash(checkpoint), directory / "last.ckpt")
    return directory / "last.ckpt"


def test_ckpt_path_last_gets_the_trusted_class_check(saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint
    from lit_constrained.class_spec import UntrustedClassPathError

    planted = _plant_untrusted_last(tmp_path, saved, "h37_last_payload")
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = quiet_trainer(max_steps=5, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[CrashSafeCheckpoint(dirpath=str(tmp_path))])
    with pytest.raises(UntrustedClassPathError, match="h37_last_payload.Evil") as raised:
        trainer.fit(_model(), _data(), ckpt_path="last")
    assert str(planted) in str(raised.value)
    assert trainer.global_step == 0 and not (tmp_path / "imported").exists() and "h37_last_payload" not in sys.modules


def test_the_command_lines_ckpt_path_last_gets_the_trusted_class_check(
    cli_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from lit_constrained.cli.fit import main

    (tmp_path / "checkpoints").mkdir()
    planted = _plant_untrusted_last(tmp_path / "checkpoints", cli_saved, "h37_cli_last_payload")
    monkeypatch.syspath_prepend(str(tmp_path / "checkpoints"))
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", str(CONFIG), "--ckpt_path", "last", "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "5",
              "--trainer.default_root_dir", str(tmp_path)])
    assert raised.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "h37_cli_last_payload.Evil" in lines[0] and str(planted) in lines[0], lines
    assert not (tmp_path / "checkpoints" / "imported").exists() and "h37_cli_last_payload" not in sys.modules


# -- a save killed midway: its temporary file is removed when the run resumes (issue 37, item 16) -------


def test_a_resume_removes_the_temporary_file_of_a_save_killed_midway(saved: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint

    _copy(saved, tmp_path, "last.ckpt")
    ready = tmp_path.parent / f"{tmp_path.name}.ready"
    writer = (  # a save through write_atomic that is killed after half the file is written
        "import time, sys\nfrom pathlib import Path\nfrom lit_constrained.io import write_atomic\n"
        "def half(tmp):\n    tmp.write_bytes(b'PK\\x03\\x04 half a checkpoint')\n"
        f"    Path({str(ready)!r}).touch()\n    time.sleep(120)\n"
        f"write_atomic(Path({str(tmp_path / 'last.ckpt')!r}), half)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", writer])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the writer did not start"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    (left,) = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert left.startswith(f".last.ckpt.{process.pid}.")
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, enable_checkpointing=True,
                            callbacks=[CrashSafeCheckpoint(dirpath=str(tmp_path), every_n_steps=1)])
    trainer.fit(_model(), _data(), ckpt_path="last")
    assert trainer.global_step == 4
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # the resumed run's own saves left none


# -- a run directory that turns read-only mid-run: the package's one line first (issue 37, item 17) -----


_MONKEYPATCH: dict[str, Any] = {}  # the running test's monkeypatch, for a ReadOnlyFrom the command line builds


class ReadOnlyFrom(pl.Callback):
    """From the end of step ``step`` on, every write of TensorBoard's event files fails as on a file system
    remounted read-only (``OSError(EROFS)`` from the file that TensorBoard's writer thread appends to)."""

    def __init__(self, step: int = 3, monkeypatch: Any = None) -> None:
        self.step, self.monkeypatch = step, monkeypatch if monkeypatch is not None else _MONKEYPATCH["current"]

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        from tensorboard.compat.tensorflow_stub.io import gfile

        def read_only(fs: Any, filename: Any, *args: Any, **kwargs: Any) -> None:
            raise OSError(errno.EROFS, "Read-only file system", filename)

        self.monkeypatch.setattr(gfile.LocalFileSystem, "append", read_only)
        for logger in trainer.loggers:  # what TensorBoard does every flush_secs, now
            logger.experiment.flush()


def test_a_read_only_log_directory_is_one_line_first_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path), name="run", version=0)
    trainer = quiet_trainer(max_steps=30, limit_val_batches=0, logger=logger, log_every_n_steps=1,
                            callbacks=[ReadOnlyFrom(3, monkeypatch)])
    with pytest.raises(Exception) as raised:
        trainer.fit(_model(), _data())
    assert write_failure(raised.value) is not None and write_failure(raised.value).errno == errno.EROFS
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("lit-constrained: ")]
    assert ours == [ours[0]], err  # one line
    assert f"the run cannot write to {tmp_path / 'run' / 'version_0'}: Read-only file system (EROFS)" in ours[0]
    assert "Exception in thread" not in err and "Traceback" not in err  # the writer thread's traceback replaced


def test_the_command_line_ends_a_read_only_run_with_that_line_and_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from lit_constrained.cli.fit import main

    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    monkeypatch.setitem(_MONKEYPATCH, "current", monkeypatch)
    with pytest.raises(SystemExit) as raised:
        main(["fit", "--config", str(CONFIG), "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "30",
              "--trainer.default_root_dir", str(tmp_path), f"--trainer.callbacks+={__name__}.ReadOnlyFrom"])
    assert raised.value.code == 1
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("lit-constrained: ")]
    assert len(ours) == 1 and "Read-only file system (EROFS)" in ours[0] and str(tmp_path) in ours[0], err
    assert "checkpoints go to" in ours[0] and "Traceback" not in err and "you tried to log" not in err


@pytest.mark.skipif(sys.platform != "linux", reason="a private mount namespace (unshare -m) is Linux's")
def test_a_file_system_remounted_read_only_mid_run_is_one_line(tmp_path: Path) -> None:
    """The real thing: ``lit-constrained fit`` on a tmpfs remounted read-only at step 5 (a private mount
    namespace; skipped where this process may not create one)."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "sh", "-c", f"mount -t tmpfs none {tmp_path}"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m / mount tmpfs refused)")
    mount = tmp_path / "mnt"
    mount.mkdir()
    (tmp_path / "remount.py").write_text(
        "import subprocess\nimport lightning.pytorch as pl\n"
        "class RemountReadOnlyAt(pl.Callback):\n"
        "    def on_train_batch_end(self, trainer, *args):\n"
        "        if trainer.global_step == 5:\n"
        f"            subprocess.run(['mount', '-o', 'remount,ro', {str(mount)!r}], check=True)\n"
    )
    script = (f"mount -t tmpfs none {mount} && cd {tmp_path} && exec lit-constrained fit --config {CONFIG} "
              f"--trainer.max_steps 200 --trainer.default_root_dir {mount}/run "
              "--trainer.callbacks+=remount.RemountReadOnlyAt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("lit-constrained: ")]
    assert len(ours) == 1 and "Read-only file system (EROFS)" in ours[0] and f"{mount}/run" in ours[0], done.stderr
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr


def test_the_writer_threads_hook_and_on_exception_racing_print_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorBoard's writer thread stores its OSError before it re-raises it, so the main thread may raise the
    same error (on_exception) while the thread's excepthook reports it: the two must print one line."""
    import threading
    import time

    from lit_constrained.callbacks import integrity

    printed: list[str] = []

    def slow_say(line: str, error: Any) -> None:
        time.sleep(0.05)  # wide window: the other reporter arrives while this one prints
        printed.append(line)

    monkeypatch.setattr(integrity, "print", lambda line, **kwargs: slow_say(line, None), raising=False)
    monkeypatch.setattr(integrity, "_SAID", {})
    error = OSError(errno.EROFS, "Read-only file system", "/nowhere/events.out")
    reporters = [threading.Thread(target=integrity._say, args=(f"line {i}", error)) for i in range(4)]
    for thread in reporters:
        thread.start()
    for thread in reporters:
        thread.join(timeout=10)
    assert len(printed) == 1, printed
