"""README's "A new task" section, run as a new user would: its files written to an empty directory,
trained through the console script from there (no PYTHONPATH), then loaded back in Python."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def code_blocks(section: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the section."""
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def console_command() -> list[str]:
    script = shutil.which("lit-constrained")
    return [script] if script else [sys.executable, "-m", "lit_constrained.console"]


def test_readme_new_task_trains_from_its_directory_and_loads_back(tmp_path, monkeypatch):
    blocks = code_blocks(readme_section("A new task"))
    files = {body.splitlines()[0][2:].strip(): body for lang, body in blocks if body.startswith("# ") and
             body.splitlines()[0].endswith((".py", ".yaml"))}
    assert set(files) == {"exp_fit.py", "exp_fit.yaml"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    config_bytes = (tmp_path / "exp_fit.yaml").read_bytes()
    commands = [line for lang, body in blocks if lang == "bash" for line in body.splitlines()]
    assert commands == ["lit-constrained fit --config exp_fit.yaml"]

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        console_command() + commands[0].split()[1:], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    # the summary: max |c| of the imposed constraints reduced at least 1e4-fold from the start
    line = next(x for x in out.splitlines() if x.strip().startswith("max |c|"))
    start, end = float(line.split()[2]), float(line.split("->")[1].split()[0])
    assert end <= 1e-4 * start, line
    assert "steps        300 in" in out and "Objective/val" in out or "val/" in out
    # nothing the user wrote is touched; the resolved config lies in the run's log directory
    assert (tmp_path / "exp_fit.yaml").read_bytes() == config_bytes
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["exp_fit.py", "exp_fit.yaml"]
    assert list((tmp_path / "lightning_logs").rglob("config.yaml"))
    # no warning caused by the package, and a log that a file can hold (no progress-bar redraws)
    package_warnings = [x for x in run.stderr.splitlines() if "Warning" in x and "lit_constrained" in x]
    assert not package_warnings, package_warnings
    assert "log_every_n_steps" not in run.stderr and len(out.splitlines()) < 60 and "\r" not in out

    # README's Python block, with `path` from the summary's checkpoint line
    path = next(x for x in out.splitlines() if x.strip().startswith("checkpoint")).split(None, 1)[1].strip()
    assert Path(path).is_file(), path
    python_after = next(body for lang, body in blocks if lang == "python" and body.startswith("# after training"))
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace = {"path": path}
    exec(compile(python_after, "README.md", "exec"), namespace)
    model = namespace["model"]
    assert float(model.constraints(None).detach().abs().max()) <= 1e-4 * start
    assert abs(float(model(torch.tensor([[0.5]])).detach()) - float(torch.exp(torch.tensor(-0.5)))) < 0.05
    sys.modules.pop("exp_fit", None)


def test_readme_never_advises_unsafe_loading():
    text = (ROOT / "README.md").read_text()
    assert "weights_only=False" not in text and "weights_only false" not in text


def test_readme_first_lines_set_up_and_test():
    lines = (ROOT / "README.md").read_text().splitlines()
    first_block = lines[lines.index("```bash") + 1 : lines.index("```")]
    assert first_block[0].startswith(("pip install", "python -m venv")) and "lit-constrained fit --config" in first_block[0]
    assert "download.pytorch.org/whl/cpu" in first_block[0]  # PyTorch's CPU build on any Linux machine
    assert first_block[1] == 'python -m pytest -q -m "not slow"'
