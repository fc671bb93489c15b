"""Tests that run where a CUDA GPU exists (marker ``cuda``; skipped without one).

* every optimizer of the package (and torch Adam) on cuda against the same run on the CPU: float64
  within 1e-10, float32 within 1e-5 relative after 20 steps of a small constrained problem (the
  gradient, c and J recomputed on each device at every step);
* a few-step fit of every task on ``accelerator="gpu"``;
* 2-GPU DDP (NCCL; skipped with fewer than 2 GPUs): the row-sharded run equals the 1-process CPU
  run on the union of the batches.

``benchmarks/gpu_check.sh`` runs these plus the step benchmarks on a GPU machine.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch


from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall  # noqa: E402
from lit_constrained.jacobians import constraint_jacobian  # noqa: E402

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sqp_adam": functools.partial(SQPAdam, lr=1e-2),
    "sqp_heavy_ball": functools.partial(SQPHeavyBall, lr=1e-2),
    "adam_con": functools.partial(AdamCon, lr=1e-2),
    "momo": functools.partial(MoMo, lr=1.0),
    "momo_adam": functools.partial(MoMoAdam, lr=0.5),
    "constant_step_adam": functools.partial(ConstantStepAdam, lr=1e-2),
    "torch_adam": functools.partial(torch.optim.Adam, lr=1e-2),
}
STEPS = 20


def trajectory(name: str, device: str, dtype: torch.dtype, steps: int = STEPS) -> list[torch.Tensor]:
    """Weights after every step: least squares of a 2-16-1 tanh MLP on 64 fixed points, its values
    pinned at 4 anchors (c, J recomputed on ``device`` each step). The same seeded start everywhere."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(64, 2, generator=gen, dtype=torch.float64) * 2 - 1)
    y = torch.sin(2 * x[:, :1]) * torch.cos(x[:, 1:])
    anchors = torch.tensor([[0.1, 0.2], [0.5, -0.3], [-0.4, 0.7], [0.8, 0.8]], dtype=torch.float64)
    exact = torch.sin(2 * anchors[:, 0]) * torch.cos(anchors[:, 1])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(torch.float64)
    net = net.to(device=device, dtype=dtype)
    x, y, anchors, exact = (t.to(device=device, dtype=dtype) for t in (x, y, anchors, exact))
    params = list(net.parameters())
    optimizer = OPTIMIZERS[name](params)
    requires = getattr(optimizer, "requires", frozenset())
    out = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (net(x) - y).pow(2).mean()
        c = net(anchors).squeeze(-1) - exact
        kwargs: dict[str, Any] = {}
        if "jacobian" in requires:
            kwargs["jacobian"] = constraint_jacobian(c, params)
        if "constraints" in requires:
            kwargs["constraints"] = c.detach()
        loss.backward()
        value = loss.detach()
        optimizer.step(closure=lambda value=value: value, **kwargs)
        out.append(torch.cat([p.detach().reshape(-1) for p in params]).cpu().double())
    return out


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_on_cuda_equals_cpu_float64(name: str) -> None:
    gpu, cpu = trajectory(name, "cuda", torch.float64), trajectory(name, "cpu", torch.float64)
    assert (cpu[-1] - cpu[0]).abs().max() > 1e-3  # the weights moved
    for step, (a, b) in enumerate(zip(gpu, cpu)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=f"{name} float64 step {step}")


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_on_cuda_equals_cpu_float32(name: str) -> None:
    gpu, cpu = trajectory(name, "cuda", torch.float32)[-1], trajectory(name, "cpu", torch.float32)[-1]
    assert float((gpu - cpu).norm() / cpu.norm()) <= 1e-5, name


# ---------------------------------------------------------------------------- every task on the GPU


def _tasks() -> dict[str, Callable[[], tuple[Any, Any]]]:
    from lit_constrained.tasks import Burgers, BurgersData, Chemistry, ChemistryData, Spring, SpringData
    from lit_constrained.tasks.curve import CurveData, CurveFit

    def darcy() -> tuple[Any, Any]:
        from lit_constrained.tasks.darcy import Darcy, DarcyData

        data = DarcyData(n_train=8, n_val=2, n_test=2, n_generate=40, n_constraints=8, seed=1, cache_dir=None)
        return Darcy(hidden_channels=2, n_layers=2, n_modes=(6, 6), optimizer=functools.partial(SQPAdam, lr=1e-3)), data

    opt = functools.partial(SQPAdam, lr=1e-3)
    return {
        "curve": lambda: (CurveFit(optimizer=opt), CurveData(num_samples=64, batch_size=16)),
        "spring": lambda: (Spring(optimizer=opt), SpringData()),
        "chemistry": lambda: (Chemistry(optimizer=opt), ChemistryData(n_ic=4, n_val_ic=2, n_test_ic=2, cache_dir=None)),
        "burgers": lambda: (Burgers(optimizer=opt), BurgersData(n_train=2, n_val=1, n_test=1, cache_dir=None)),
        "darcy": darcy,
    }


@pytest.mark.parametrize("task_name", ["curve", "spring", "chemistry", "burgers", "darcy"])
def test_each_task_fits_a_few_steps_on_the_gpu(task_name: str, tmp_path: Path) -> None:
    import lightning.pytorch as pl

    torch.manual_seed(0)
    task, data = _tasks()[task_name]()
    before = torch.cat([p.detach().reshape(-1).double() for p in task.parameters() if not p.is_complex()]).clone()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=1, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(task, datamodule=data)
    assert trainer.global_step == 3
    assert all(p.device.type == "cuda" for p in task.parameters())
    after = torch.cat([p.detach().reshape(-1).double().cpu() for p in task.parameters() if not p.is_complex()])
    assert torch.isfinite(after).all() and (after - before).abs().max() > 0
    assert math.isfinite(float(task.last_step.objective))


# ---------------------------------------------------------------------------- 2 GPUs


def _gpu_worker(rank: int, port: int, out_dir: str) -> None:
    from tests.helpers import ddp as helpers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0",
                      LOCAL_RANK=str(rank))
    warnings.simplefilter("ignore")
    task = helpers.new_task("sqp_adam")
    trainer = helpers.make_trainer(helpers.callbacks_for("sqp_adam"), devices=2, accelerator="gpu")
    train, val = helpers.loaders(world=2)
    trainer.fit(task, train_dataloaders=train, val_dataloaders=val)
    torch.save(helpers.summary(trainer) | {"jacobian_rows": task.jacobian_rows}, Path(out_dir, f"rank{rank}.pt"))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_ddp_equal_one_cpu_process(tmp_path: Path) -> None:
    from tests.helpers import ddp as helpers
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # spawn: CUDA cannot be re-initialized in a forked child of a process that used it
    mp.start_processes(_gpu_worker, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    ref = helpers.run_single("sqp_adam")
    assert [ranks[0]["jacobian_rows"][0], ranks[1]["jacobian_rows"][0]] == [(3, 0, 2), (3, 2, 3)]
    for step, (a, b, r) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"], ref["steps"])):
        assert torch.equal(a["params"], b["params"]), step
        torch.testing.assert_close(a["params"].cpu(), r["params"], rtol=0, atol=1e-10, msg=f"step {step}")
