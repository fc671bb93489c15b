"""The lean install: neuraloperator is the optional [fno] extra, imported only when a Darcy network is built,
and nothing the package does not use (wandb, pytest) is loaded by importing it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("wandb", "neuralop", "pytest", "configmypy", "h5py", "tensorly")


def test_imports_load_no_extra_and_darcy_without_neuraloperator_names_the_extra_in_one_line():
    # one fresh interpreter for both checks (an import costs seconds on a shared machine)
    code = f"""
        import json, sys
        import lit_constrained, lit_constrained.cli.fit, lit_constrained.tasks, lit_constrained.tasks.darcy
        import lit_constrained.physics
        loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
        sys.modules["neuralop"] = None  # as if neuraloperator were not installed
        from lit_constrained.tasks.darcy import Darcy
        try:
            Darcy()
            message = None
        except ModuleNotFoundError as error:
            message = str(error)
        print(json.dumps({{"loaded": loaded, "message": message}}))
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [], result
    message = result["message"]
    assert message and "\n" not in message and "[fno]" in message and "neuraloperator" in message, message
