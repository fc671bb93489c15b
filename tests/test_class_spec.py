"""The allowlist: nothing a checkpoint names is imported unless trusted, whatever the form of the name.

Each crafted checkpoint names a module that, if imported, writes a marker file at import time; the
module is on ``sys.path``, so only the check stands between the checkpoint and its code.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_constrained.checkpoint_integrity import INTEGRITY_KEY
from lit_constrained.class_spec import (
    TRUSTED_MODULES,
    UntrustedClassPathError,
    check_checkpoint_names,
    check_trusted,
    importable_names_in,
    looks_importable,
)
from lit_constrained.tasks.curve import CurveData, CurveFit
from tests.helpers.lightning import quiet_trainer

CONFIG = Path(__file__).resolve().parents[1] / "configs/curve/sqp_adam.yaml"


def test_every_importable_string_is_found_under_any_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "payload_mod.py").write_text("")
    (tmp_path / "plain_dir").mkdir()  # a namespace package with no submodule "npz"
    monkeypatch.syspath_prepend(str(tmp_path))
    data = {
        "optimizer": "payload_mod.Thing",  # a plain string for a class argument
        "nested": {"inner": [{"class_path": "payload_mod.Other"}]},
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
        "file": "plain_dir.npz", "path": "a/b.c", "number": "1.5e-3", "words": "not a.path", "absent": "no_such_mod_x.Y",
    }
    assert list(importable_names_in(data)) == [
        ("optimizer", "payload_mod.Thing"),
        ("nested.inner[0].class_path", "payload_mod.Other"),
        ("_instantiator", "lightning.pytorch.cli.instantiate_module"),
    ]
    assert looks_importable("torch.optim.Adam") and not looks_importable("Adam")


def test_the_error_names_the_key_the_file_and_the_allowlist() -> None:
    with pytest.raises(UntrustedClassPathError) as raised:
        check_trusted({"optimizer": {"class_path": "os.path.join"}}, TRUSTED_MODULES, source="run.ckpt")
    message = str(raised.value)
    assert "'os.path.join' at optimizer.class_path" in message and "run.ckpt" in message
    assert "lit_constrained, torch, lightning, pytorch_lightning" in message and "trusted_modules=['os']" in message
    check_trusted({"optimizer": {"class_path": "torch.optim.Adam"}, "dtype": "float64"}, TRUSTED_MODULES)  # fine


def _payload(tmp_path: Path, name: str) -> Path:
    """A module ``name`` in ``tmp_path`` that writes ``tmp_path / 'imported'`` when imported; the marker path."""
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "import torch\nclass Thing(torch.optim.SGD):\n    pass\ndef instantiate(cls, kwargs):\n    return cls(**kwargs)\n"
    )
    return marker


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real checkpoint of a 1-step CurveFit run, as loaded (weights_only)."""
    directory = tmp_path_factory.mktemp("saved")
    model = CurveFit(hidden=4, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(model, CurveData(num_samples=8, batch_size=8))
    model.trainer.save_checkpoint(directory / "ok.ckpt")
    return torch.load(directory / "ok.ckpt", weights_only=True)


CLI_SAVED = {"_instantiator": "lightning.pytorch.cli.instantiate_module", "_class_path": "lit_constrained.tasks.curve.CurveFit"}
"""What a LightningCLI run adds to the hyper-parameters: load_from_checkpoint then rebuilds through jsonargparse."""

FORMS = {
    "plain string": lambda hp, name: hp.update(CLI_SAVED, optimizer=f"{name}.Thing"),
    "nested dict": lambda hp, name: hp.__setitem__("optimizer", {"class_path": "torch.optim.SGD",
                                                                 "init_args": {"foreach": {"class_path": f"{name}.Thing"}}}),
    "_instantiator": lambda hp, name: hp.__setitem__("_instantiator", f"{name}.instantiate"),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_load_from_checkpoint_imports_no_untrusted_name(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_checkpoint: dict[str, Any]
) -> None:
    name = f"payload_{form.strip('_').replace(' ', '_')}"
    marker = _payload(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = {k: v for k, v in saved_checkpoint.items() if k != INTEGRITY_KEY}  # a crafted file carries no hash
    checkpoint["hyper_parameters"] = dict(checkpoint["hyper_parameters"])
    FORMS[form](checkpoint["hyper_parameters"], name)
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    with pytest.raises(UntrustedClassPathError) as raised:
        CurveFit.load_from_checkpoint(tmp_path / "crafted.ckpt")
    assert not marker.exists() and name not in sys.modules
    message = str(raised.value)
    assert str(tmp_path / "crafted.ckpt") in message and "hyper_parameters." in message and name in message
    assert "trusted modules (lit_constrained, torch, lightning, pytorch_lightning, lit_constrained.tasks.curve)" in message


def test_datamodule_hyper_parameters_are_checked_too(saved_checkpoint: dict[str, Any]) -> None:
    with pytest.raises(UntrustedClassPathError, match=r"datamodule_hyper_parameters\.sampler"):
        check_checkpoint_names({**saved_checkpoint, "datamodule_hyper_parameters": {"sampler": "os.path.join"}},
                               TRUSTED_MODULES)


def test_ckpt_path_on_the_command_line_imports_no_plain_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_checkpoint: dict[str, Any], capsys: pytest.CaptureFixture
) -> None:
    from lit_constrained.cli.fit import main

    marker = _payload(tmp_path, "payload_cli_plain")
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = {k: v for k, v in saved_checkpoint.items() if k != INTEGRITY_KEY}
    checkpoint["hyper_parameters"] = {**checkpoint["hyper_parameters"], **CLI_SAVED, "optimizer": "payload_cli_plain.Thing"}
    torch.save(checkpoint, tmp_path / "crafted.ckpt")
    monkeypatch.setattr(sys, "argv", ["lit-constrained"])
    with pytest.raises(SystemExit) as raised:  # UntrustedClassPathError, printed as one line
        main(["fit", "--config", str(CONFIG), "--ckpt_path", str(tmp_path / "crafted.ckpt"), "--trainer.logger",
              "false", "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2"])
    assert raised.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "'payload_cli_plain.Thing' at hyper_parameters.optimizer" in lines[0], lines
    assert not marker.exists() and "payload_cli_plain" not in sys.modules
