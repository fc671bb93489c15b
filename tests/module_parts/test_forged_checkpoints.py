"""A forged checkpoint imports nothing it names (issue 47, item 1).

A module in the working directory (it writes a marker file when imported) and a standard-library module
with an import side effect (``this`` prints the Zen of Python) are named at every key a checkpoint holds a
name (the task entry, the task's and the data's ``_class_path``, the optimizer's ``class_path``), with the
content hash recomputed, left stale and deleted, and the file given on every route: ``load_from_checkpoint``,
``trainer.fit/validate(ckpt_path=PATH)``, ``ckpt_path="last"``, and ``lit-constrained fit/validate
--ckpt_path PATH|last``. Each is refused (one line naming the file on the command line, exit status 2)
and the module is never imported.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_constrained.callbacks.checkpointing import CrashSafeCheckpoint
from lit_constrained.checkpoint_integrity import INTEGRITY_KEY, with_content_hash
from lit_constrained.class_spec import TASK_KEY
from lit_constrained.hints import SetupError
from lit_constrained.tasks.curve import CurveData, CurveFit
from tests.helpers.lightning import quiet_trainer

CONFIG = Path(__file__).resolve().parents[2] / "configs/curve/sqp_adam.yaml"
ZEN = "Beautiful is better than ugly"

KEYS = ("task", "model", "optimizer", "data")
HASHES = ("recomputed", "stale", "deleted")
MODULES = ("h47_forged_payload", "this")


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last.ckpt of a 2-step ``lit-constrained fit`` of the curve config."""
    from lit_constrained.cli.fit import main

    root = tmp_path_factory.mktemp("genuine")
    main(["fit", "--config", str(CONFIG), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root)])
    return root / "checkpoints" / "last.ckpt"


def forge(genuine: Path, target: Path, name: str, key: str, hashed: str) -> Path:
    """``genuine`` with ``name`` written at ``key``, its content hash ``hashed``, saved at ``target``."""
    checkpoint = torch.load(genuine, weights_only=True)
    if key == "task":
        checkpoint[TASK_KEY] = name
    elif key == "model":
        checkpoint["hyper_parameters"]["_class_path"] = name
    elif key == "optimizer":
        checkpoint["hyper_parameters"]["optimizer"] = {"class_path": name, "init_args": {"lr": 0.1}}
    else:
        checkpoint["datamodule_hyper_parameters"]["_class_path"] = name
    if hashed == "recomputed":
        checkpoint = with_content_hash(checkpoint)
    elif hashed == "deleted":
        del checkpoint[INTEGRITY_KEY]
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, target)
    return target


@pytest.fixture
def payload(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Callable[[str], bool]]:
    """A module name to forge and ``imported(captured_stdout)``: whether it was imported."""
    module = request.param
    monkeypatch.delitem(sys.modules, module, raising=False)
    marker = tmp_path / "imported"
    if module != "this":
        (tmp_path / f"{module}.py").write_text(
            f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\nclass Payload:\n    pass\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the command line puts the working directory on sys.path

    def imported(out: str) -> bool:
        return module in sys.modules or marker.exists() or ZEN in out

    return f"{module}.Payload", imported


def _python_routes(path: Path, directory: Path) -> dict[str, Callable[[], Any]]:
    def model() -> CurveFit:
        return CurveFit(hidden=8, optimizer=functools.partial(torch.optim.Adam, lr=1e-2))

    data = CurveData(num_samples=16, batch_size=16)
    return {
        "load_from_checkpoint": lambda: CurveFit.load_from_checkpoint(path),
        "fit PATH": lambda: quiet_trainer(max_steps=3, limit_val_batches=0).fit(model(), data, ckpt_path=path),
        "validate PATH": lambda: quiet_trainer().validate(model(), data, ckpt_path=path),
        "fit last": lambda: quiet_trainer(
            max_steps=3, limit_val_batches=0, enable_checkpointing=True,
            callbacks=[CrashSafeCheckpoint(dirpath=str(directory))],
        ).fit(model(), data, ckpt_path="last"),
    }


@pytest.mark.parametrize("payload", MODULES, indirect=True)
@pytest.mark.parametrize("hashed", HASHES)
@pytest.mark.parametrize("key", KEYS)
def test_python_routes_import_nothing_a_forged_checkpoint_names(
    payload: tuple[str, Callable[[str], bool]], key: str, hashed: str, genuine: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    name, imported = payload
    path = forge(genuine, tmp_path / "forged" / "last.ckpt", name, key, hashed)
    for route, attempt in _python_routes(path, path.parent).items():
        with pytest.raises(SetupError) as raised:
            attempt()
        assert str(path) in str(raised.value), (route, raised.value)
        assert not imported(capsys.readouterr().out), f"{route} imported {name} ({key}, hash {hashed})"


CLI_ROUTES = {
    "fit PATH": ("fit", "PATH"),
    "fit last": ("fit", "last"),
    "validate PATH": ("validate", "PATH"),
}


@pytest.mark.parametrize("payload", MODULES, indirect=True)
@pytest.mark.parametrize("hashed", HASHES)
@pytest.mark.parametrize("key", KEYS)
def test_the_command_line_imports_nothing_a_forged_checkpoint_names(
    payload: tuple[str, Callable[[str], bool]], key: str, hashed: str, genuine: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    from lit_constrained.cli.fit import main

    name, imported = payload
    root = tmp_path / "run"
    path = forge(genuine, root / "checkpoints" / "last.ckpt", name, key, hashed)
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    for route, (subcommand, given) in CLI_ROUTES.items():
        ckpt = str(path) if given == "PATH" else given
        extra = ["--trainer.max_steps", "3"] if subcommand == "fit" else []
        with pytest.raises(SystemExit) as raised:
            main([subcommand, "--config", str(CONFIG), "--ckpt_path", ckpt, "--trainer.logger", "false",
                  "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root), *extra])
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert raised.value.code == 2, (route, captured.err)
        assert len(lines) <= 3 and str(path) in lines[-1], (route, captured.err)
        assert not imported(captured.out + captured.err), f"{route} imported {name} ({key}, hash {hashed})"
