"""The network itself as a part's residual (``Imposed(self, points)``): a new user's 1D task written so
(``tests/jacobians/myineq_task.py``, u >= 0 at 41 points, u = 0 at the ends) trains in Python and through
the command line, and an exception raised inside the per-point Jacobian leaves the module's parameters
as they were (the user sees that exception, once, and Lightning's teardown can move the module)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_constrained.jacobians.pointwise import PointwiseJacobian

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import myineq_task  # noqa: E402


def _trained(steps: int, constraint_dtype: str) -> tuple[myineq_task.Positive, pl.Trainer]:
    pl.seed_everything(0)
    from lit_constrained.optim import SQPAdam

    task = myineq_task.Positive(optimizer=functools.partial(SQPAdam, lr=1e-3, rho="full"),
                                 constraint_dtype=constraint_dtype)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(task, datamodule=myineq_task.Data())
    return task, trainer


@pytest.mark.parametrize("constraint_dtype", ["float64", "native"])
def test_the_module_as_residual_trains_and_holds_its_rows(constraint_dtype: str):
    """5 steps: the parameters stay the module's own leaves (nn.Parameter, requiring grad), the ends are
    held to round-off and no grid value is below 0 beyond round-off (the exact u touches 0 at x = 1)."""
    task, trainer = _trained(5, constraint_dtype)
    assert trainer.global_step == 5
    for name, p in task.named_parameters():
        assert isinstance(p, torch.nn.Parameter) and p.requires_grad and p.grad_fn is None, name
    with torch.no_grad():
        ends = task(task.x_ends)
        grid = task(task.x_bound)
    assert ends.abs().max() < 1e-5
    assert (-grid).clamp(min=0).max() < 1e-5


def test_module_as_residual_matches_a_submodule_residual():
    """J of ``Imposed(self, x)`` equals J of the same function given as a closure over a submodule
    (``lambda x: self.net(x)[:, 0]``), computed independently by torch.autograd row by row."""
    torch.manual_seed(0)
    task = myineq_task.Positive(hidden=8)
    x = task.x_bound[:7]
    params = list(task.parameters())
    J = PointwiseJacobian(path="func")(task, params, [(task, x, 1)])
    rows = []
    for i in range(x.shape[0]):
        value = task.net(x[i:i + 1])[0, 0]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)]))
    torch.testing.assert_close(J, torch.stack(rows), rtol=1e-5, atol=1e-6)


def test_an_error_inside_the_jacobian_leaves_the_parameters_in_place():
    """A residual that raises while torch.func transforms it: the same exception reaches the caller and
    the module still holds its own parameters (``.cpu()`` and ``.data`` assignment, Lightning's
    teardown, work; a forward has a graph to them)."""
    torch.manual_seed(0)
    task = myineq_task.Positive(hidden=8)
    before = {n: p for n, p in task.named_parameters()}

    def broken(x: torch.Tensor) -> torch.Tensor:
        task(x)
        raise RuntimeError("the user's residual failed")

    with pytest.raises(RuntimeError, match="the user's residual failed"):
        PointwiseJacobian(path="func")(task, list(task.parameters()), [(broken, task.x_bound[:20], 1)])
    for name, p in task.named_parameters():
        assert p is before[name], name
    task.cpu()
    for p in task.parameters():
        p.data = p.data.clone()
    assert task(task.x_bound).requires_grad


def test_the_user_task_trains_through_the_command_line(tmp_path: Path):
    """The issue's config, 5 steps, through ``lit-constrained fit``: exit 0 and the fit summary."""
    shutil.copy(HERE / "myineq_task.py", tmp_path / "myineq.py")
    (tmp_path / "config.yaml").write_text(
        "model: {class_path: myineq.Positive, init_args: {optimizer: {class_path: lit_constrained.optim.SQPAdam,"
        " init_args: {lr: 1.0e-3, rho: full}}}}\ndata: {class_path: myineq.Data}\ntrainer: {max_steps: 5}\n")
    script = shutil.which("lit-constrained")
    base = [script] if script else [sys.executable, "-m", "lit_constrained.cli"]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*base, "fit", "--config", "config.yaml"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fit summary" in done.stdout + done.stderr
    assert "max |c|" in done.stdout + done.stderr
