"""The lean install: neuraloperator is the optional [fno] extra, imported only when a Darcy network is built,
and nothing the package does not use (wandb, pytest) is loaded by importing it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("wandb", "neuralop", "pytest", "configmypy", "h5py", "tensorly")


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_importing_the_package_and_the_darcy_module_loads_no_extra():
    run = run_python(f"""
        import sys
        import lit_constrained, lit_constrained.cli, lit_constrained.tasks, lit_constrained.tasks.darcy
        import lit_constrained.physics
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout


def test_darcy_without_neuraloperator_fails_in_one_line_naming_the_extra():
    run = run_python("""
        import sys
        sys.modules["neuralop"] = None  # as if neuraloperator were not installed
        from lit_constrained.tasks.darcy import Darcy
        try:
            Darcy()
        except ModuleNotFoundError as error:
            print(str(error))
    """)
    assert run.returncode == 0, run.stderr[-2000:]
    message = run.stdout.strip()
    assert "\n" not in message and "[fno]" in message and "neuraloperator" in message, message
