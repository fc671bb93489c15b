"""Every shipped config trains under the README's DDP command (``--trainer.strategy ddp --trainer.devices
2 --trainer.accelerator cpu``, 2 CPU processes, gloo), a few steps each, whatever parameters its
objective leaves out: the obstacle's Dirichlet energy does not depend on the output bias, which its
constraints do, and DDP's reducer refused the next step ("parameters that were not used in producing
the loss"). Each run has a hard timeout (a hang is killed and fails the test).

The default run trains four configs (:data:`DEFAULT_RUN`, about 20 s each on 2 cores); ``-m slow`` every
other config under configs/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_constrained.module_parts.step_services import reaching_every_parameter
from tests.helpers.cli_runs import REPO, start

pytestmark = pytest.mark.ddp
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml"))
RUN_TIMEOUT = 300.0  # seconds: a run that has not ended by then hangs


#: the default run: the configs whose objective leaves a parameter out (the obstacle's), an automatic
#: choice of imposed rows (the same on both ranks) and coupled rows beside pointwise ones (density)
DEFAULT_RUN = [
    "configs/density/recommended/sqp_adam.yaml",
    "configs/obstacle/recommended/sqp_adam.yaml",
    "configs/obstacle/recommended/sqp_heavyball_float64.yaml",
    "configs/pinnacle_wave/sqp_adam.yaml",
]


def _trains_under_ddp(config: str, tmp_path: Path) -> None:
    run = start(tmp_path, ["--config", config, "--trainer.max_steps", "2"], name="ddp")
    code = run.wait(RUN_TIMEOUT)
    assert code == 0, f"{config}: exit {code}\n{run.stderr[-3000:]}"
    assert "fit summary" in run.stdout + run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("config", DEFAULT_RUN)
def test_the_chosen_configs_train_under_ddp(config: str, tmp_path: Path) -> None:
    _trains_under_ddp(config, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("config", [c for c in CONFIGS if c not in DEFAULT_RUN])
def test_every_other_config_trains_under_ddp(config: str, tmp_path: Path) -> None:
    _trains_under_ddp(config, tmp_path)


def test_reaching_every_parameter_changes_neither_value_nor_gradient() -> None:
    """Against the gradient of the objective alone by autograd: the same loss and gradients, and a
    zero (not None) for the parameter the objective leaves out."""
    torch.manual_seed(0)
    used, unused = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))
    loss = (used ** 3).sum()
    (expected,) = torch.autograd.grad(loss, [used], retain_graph=True)
    anchored = reaching_every_parameter(loss, [used, unused])
    assert torch.equal(anchored.detach(), loss.detach())
    g_used, g_unused = torch.autograd.grad(anchored, [used, unused])
    assert torch.equal(g_used, expected)
    assert torch.equal(g_unused, torch.zeros(4))
