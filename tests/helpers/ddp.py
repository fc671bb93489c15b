"""Helpers of tests/test_ddp.py: a float64 task, recorders, and the 2-process worker.

The 2 workers are started once for all optimizers (``torch.multiprocessing.start_processes``, fork
where available: a spawned process re-imports torch and Lightning, seconds each). Each worker sets ``LOCAL_RANK`` etc., so Lightning's default cluster
environment treats the processes as launched externally: ``Trainer(strategy="ddp", devices=2)`` then
runs in place, and several Trainers in a row reuse the one gloo process group.

Data layout: see :func:`loaders`. The 1-process reference run takes, at every step, the union of the
2 ranks' batches; equal batch sizes per rank make the mean of the rank means the mean over the union.
"""

from __future__ import annotations

import copy
import datetime
import functools
import inspect
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Callable

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from lit_constrained.callbacks import ConstraintViolationMonitor, LipschitzEstimator
from lit_constrained.module import ConstrainedModule
from lit_constrained.optim import AdamCon, ConstantStepAdam, MoMo, MoMoAdam, SQPAdam, SQPHeavyBall
from tests.helpers.lightning import MemoryLogger

WORLD = 2
SEED = 0  # seed_everything(SEED): Lightning's DistributedSampler takes its seed from it
BATCH = 4  # training rows per rank and step
N_TRAIN = 16  # 8 rows per rank: 2 steps per epoch
N_VAL = 12  # 6 rows per rank, one validation batch each
EPOCHS = 3  # 6 steps
RESUME_EPOCH = 1  # the 2-process checkpoint written at the end of this epoch (after step 4)
STEPS_PER_EPOCH = N_TRAIN // (WORLD * BATCH)

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sqp_adam": functools.partial(SQPAdam, lr=1e-2),
    "sqp_heavy_ball": functools.partial(SQPHeavyBall, lr=1e-2),
    "adam_con": functools.partial(AdamCon, lr=1e-2),
    "momo": functools.partial(MoMo, lr=1.0, estimate_lower_bound=True),
    "momo_adam": functools.partial(MoMoAdam, lr=0.5),
    "constant_step_adam": functools.partial(ConstantStepAdam, lr=None),  # lr from LipschitzEstimator
    "torch_adam": functools.partial(torch.optim.Adam, lr=1e-2),
}


def free_port() -> int:
    """A TCP port on localhost that is free now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def target(x: Tensor) -> Tensor:
    return torch.sin(2.0 * x[..., 0]) * torch.cos(x[..., 1])


def dataset(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = target(x) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    return TensorDataset(x, y.unsqueeze(-1))


def train_set() -> TensorDataset:
    return dataset(N_TRAIN, seed=11)


def val_set() -> TensorDataset:
    return dataset(N_VAL, seed=12)


ANCHORS = ((0.1, 0.2), (0.5, -0.3), (-0.4, 0.7))
PER_RANK_ROWS = 2  # constraints of BatchConstraintTask: the first rows of each rank's batch


class ShardTask(ConstrainedModule):
    """Least squares on the (per-rank) batch; the network pinned to ``target`` at fixed anchors
    (the first ``anchors`` of ``ANCHORS``; 3: m not divisible by 2 ranks, 1: fewer rows than ranks).

    The anchors are the same on every rank (``constraints_shared``, the default); validation reports
    the residual at every validation row. ``jacobian_rows`` records the rows each Jacobian call made.
    """

    def __init__(self, hidden: int = 6, anchors: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        ).double()
        anchor_x = torch.tensor(ANCHORS[:anchors], dtype=torch.float64)
        self.register_buffer("anchor_x", anchor_x)
        self.register_buffer("anchor_y", target(anchor_x))
        self.jacobian_rows: list[tuple[int, int, int]] = []  # (m, start, stop)

    def constraint_jacobian(self, batch: Any, constraints: Tensor, params: Any, rows: slice | None = None) -> Tensor:
        start, stop, _ = (rows or slice(None)).indices(constraints.numel())
        self.jacobian_rows.append((constraints.numel(), start, stop))
        return super().constraint_jacobian(batch, constraints, params, rows=rows)

    def objective(self, batch: Any) -> Tensor:
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def constraints(self, batch: Any) -> Tensor:
        return self.net(self.anchor_x).squeeze(-1) - self.anchor_y

    def validation_constraints(self, batch: Any) -> Tensor:
        x, y = batch
        return (self.net(x) - y).squeeze(-1)


class BatchConstraintTask(ShardTask):
    """Constraints from each rank's own batch (``constraints_shared = False``): the network pinned
    to ``target`` at the first ``PER_RANK_ROWS`` rows of every block of ``BATCH`` rows. On a rank
    (a batch of BATCH rows) those are its own first rows; on the 1-process union batch in rank-major
    order (:class:`RankMajorBatches`) the same rows of every rank, in rank order: the union."""

    constraints_shared = False

    def constraints(self, batch: Any) -> Tensor:
        x, _ = batch
        block = BATCH if x.shape[0] % BATCH == 0 else x.shape[0]  # another batch (validation): its first rows
        points = x.reshape(-1, block, 2)[:, :PER_RANK_ROWS].reshape(-1, 2)
        return self.net(points).squeeze(-1) - target(points)


class SharedFlagWrongTask(BatchConstraintTask):
    """Per-rank constraints declared shared: the step must refuse (not mix rows of different points)."""

    constraints_shared = True


TASKS: dict[str, tuple[type[ShardTask], dict[str, Any]]] = {
    "shard": (ShardTask, {}),  # m = 3 shared rows over 2 ranks: 2 + 1
    "one_anchor": (ShardTask, {"anchors": 1}),  # m = 1 < 2 ranks: rank 1 differentiates no row
    "per_rank": (BatchConstraintTask, {}),  # 2 rows per rank, gathered: 4 rows
}
JACOBIAN_OPTIMIZERS = ("sqp_adam", "sqp_heavy_ball", "adam_con")
VARIANT_RUNS: dict[str, tuple[str, ...]] = {  # the 2-process runs beyond the main "shard" loop
    "one_anchor": JACOBIAN_OPTIMIZERS,
    "per_rank": tuple(OPTIMIZERS),
}


class RankMajorBatches(BatchSampler):
    """The 1-process reference of a per-rank-constraint run: global batch j of a 1-replica
    ``DistributedSampler`` (the union of the ranks' batches j, interleaved: rank r holds entries
    r, r + W, ...) reordered rank by rank, so that the batch is rank 0's rows, then rank 1's."""

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield [index for r in range(WORLD) for index in batch[r::WORLD]]


def flat_params(module: torch.nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()



def _plain(value: Any) -> Any:
    if isinstance(value, Tensor):  # scalars as Python numbers (pytest.approx iterates 0-dim tensors)
        return value.item() if value.dim() == 0 else value.detach().clone()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


class Recorder(Callback):
    """Weights, per-rank objective and optimizer state around every training step."""

    def __init__(self) -> None:
        self.start: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self._local: float | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        self.start = {
            "params": flat_params(pl_module),
            "global_step": trainer.global_step,
            "lr": optimizer.param_groups[0]["lr"],
            "optimizer_state": _plain(optimizer.state_dict()["state"]),
        }

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():  # the objective this rank's step is about to see, before any reduce
            self._local = float(pl_module.objective(batch))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        optimizer = trainer.optimizers[0]
        state = optimizer.state
        self.steps.append(
            {
                "global_step": trainer.global_step,
                "params": flat_params(pl_module),
                "local_objective": self._local,
                "objective": float(outputs["objective"]),
                "constraints": outputs["constraints"].clone(),
                "momo": _plain(state.get("global")) if "global" in state else None,
                "momo_group": _plain(state.get("group0")) if "group0" in state else None,
                "momo_tau": _momo_tau(optimizer),
            }
        )


def _momo_tau(optimizer: Any) -> float | None:
    """MoMo's last step size: in ``optimizer.diagnostics`` (filled on the steps asked for
    diagnostics) or, in older layouts, in ``state["group0"]``."""
    diagnostics = getattr(optimizer, "diagnostics", None) or {}
    if "tau" in diagnostics:
        return float(diagnostics["tau"])
    group = optimizer.state.get("group0") if isinstance(optimizer.state, dict) else None
    return float(group["tau"]) if isinstance(group, dict) and "tau" in group else None


def callbacks_for(name: str, checkpoint_dir: str | None = None) -> list[Callback]:
    callbacks: list[Callback] = []
    if name == "constant_step_adam":
        callbacks.append(LipschitzEstimator(num_samples=3, mode="full", seed=3))
    names = ("max", "mean", "l1", "l2", "relative")
    callbacks += [ConstraintViolationMonitor(names), ConstraintViolationMonitor(names, source="validation_constraints"), Recorder()]
    if checkpoint_dir is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=checkpoint_dir,
                filename="{epoch}",
                save_top_k=-1,
                every_n_epochs=1,
                save_on_train_epoch_end=True,
            )
        )
    return callbacks


def make_trainer(
    callbacks: list[Callback], devices: int, max_epochs: int = EPOCHS, num_nodes: int = 1,
    accelerator: str = "cpu", **kwargs: Any,
) -> pl.Trainer:
    if devices * num_nodes > 1:
        backend = "nccl" if accelerator == "gpu" else "gloo"
        kwargs["strategy"] = DDPStrategy(process_group_backend=backend, timeout=datetime.timedelta(seconds=120))
    return pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        num_nodes=num_nodes,
        max_epochs=max_epochs,
        logger=MemoryLogger(),
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **kwargs,
    )


def loaders(world: int, rank_major: bool = False) -> tuple[DataLoader, DataLoader]:
    """The training and validation loaders of a run on ``world`` processes.

    Under DDP, Lightning gives the training loader a ``DistributedSampler(shuffle=True,
    seed=PL_GLOBAL_SEED)``: per epoch e the permutation ``randperm(N, seed + e)``, rank r taking its
    entries r, r + 2, ... So global batch j is entries ``2*BATCH*j ... 2*BATCH*(j+1) - 1`` of that
    permutation, which a 1-process ``DistributedSampler(num_replicas=1)`` with batches of ``2*BATCH``
    yields as its batch j (``rank_major``: reordered by :class:`RankMajorBatches`). Validation is not
    shuffled: rank r gets rows r, r + 2, ...
    """
    data = train_set()
    if world == 1:
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=SEED)
        if rank_major:
            train = DataLoader(data, batch_sampler=RankMajorBatches(sampler, BATCH * WORLD, drop_last=False))
        else:
            train = DataLoader(data, batch_size=BATCH * WORLD, sampler=sampler)
    else:
        train = DataLoader(data, batch_size=BATCH)
    val = DataLoader(val_set(), batch_size=N_VAL // world)
    return train, val


def new_task(name: str, variant: str = "shard") -> ShardTask:
    pl.seed_everything(SEED, verbose=False)
    kind, kwargs = TASKS[variant]
    return kind(optimizer=OPTIMIZERS[name], **kwargs)


def summary(trainer: pl.Trainer) -> dict[str, Any]:
    recorder = next(c for c in trainer.callbacks if isinstance(c, Recorder))
    logger = trainer.logger
    assert isinstance(logger, MemoryLogger)
    lipschitz = [c.lr for c in trainer.callbacks if isinstance(c, LipschitzEstimator)]
    return {
        "start": recorder.start,
        "steps": recorder.steps,
        "logs": logger.records,
        "alpha": lipschitz[0] if lipschitz else None,
    }


def run_single(
    name: str, ckpt_path: str | None = None, max_epochs: int = EPOCHS, variant: str = "shard"
) -> dict[str, Any]:
    """The 1-process run on the union of the ranks' batches (or resumed from ``ckpt_path``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    task = new_task(name, variant)
    if ckpt_path is not None:  # rebuild task and optimizer from the checkpoint's hyper-parameters
        task = ShardTask.load_from_checkpoint(ckpt_path, weights_only=False)
    trainer = make_trainer(callbacks_for(name), devices=1, max_epochs=max_epochs)
    train, val = loaders(world=1, rank_major=not TASKS[variant][0].constraints_shared)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(task, train_dataloaders=train, val_dataloaders=val, ckpt_path=ckpt_path, weights_only=False)
        finally:
            torch.set_num_threads(threads)
    out = summary(trainer)
    out["jacobian_rows"] = task.jacobian_rows
    return out


def _momo_without_reduce(task: ShardTask, rank: int) -> dict[str, Tensor]:
    """One MoMo step on each rank from the same weights and the same (all-reduced) gradient, once with
    the rank's own loss and once with the rank-mean loss: the first is what skipping the reduce of f
    would do. The batch: BATCH rows of the rank's own shard (rows rank, rank + 2, ...)."""
    x, y = train_set().tensors
    x, y = x[rank::WORLD][:BATCH], y[rank::WORLD][:BATCH]
    net = copy.deepcopy(task.net)
    loss = (net(x) - y).pow(2).mean()
    grads = torch.autograd.grad(loss, list(net.parameters()))
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= WORLD
    loss_mean = loss.detach().clone()
    dist.all_reduce(loss_mean)
    loss_mean /= WORLD
    out: dict[str, Tensor] = {"local_loss": loss.detach().clone(), "mean_loss": loss_mean}
    for tag, value in (("with_own_loss", loss.detach()), ("with_mean_loss", loss_mean)):
        replica = copy.deepcopy(net)
        offset = 0
        for p in replica.parameters():
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        optimizer = MoMo(replica.parameters(), lr=1.0)
        if "diagnostics" in inspect.signature(optimizer.step).parameters:
            optimizer.step(closure=lambda value=value: value, diagnostics=True)
        else:
            optimizer.step(closure=lambda value=value: value)
        out[tag] = flat_params(replica)
        out[f"{tag}_tau"] = torch.tensor(_momo_tau(optimizer))
    return out


def _refused_run() -> str:
    """A 2-process fit of :class:`SharedFlagWrongTask`: the error message each rank raised (last:
    Lightning's teardown after an exception leaves the process group usable, but nothing follows)."""
    pl.seed_everything(SEED, verbose=False)
    task = SharedFlagWrongTask(optimizer=OPTIMIZERS["sqp_adam"])
    trainer = make_trainer(callbacks_for("sqp_adam"), devices=WORLD, max_epochs=1)
    train, _ = loaders(world=WORLD)
    try:
        trainer.fit(task, train_dataloaders=train)
    except ValueError as error:
        return str(error)
    return ""


def worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: every optimizer in turn with Trainer(strategy="ddp", devices=2); results to out_dir."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), NODE_RANK="0", LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    results: dict[str, Any] = {}
    for name in OPTIMIZERS:
        task = new_task(name)
        trainer = make_trainer(callbacks_for(name, str(Path(out_dir, "ckpt", name))), devices=WORLD)
        train, val = loaders(world=WORLD)
        trainer.fit(task, train_dataloaders=train, val_dataloaders=val)
        results[name] = summary(trainer)
        results[name]["world_size"] = trainer.world_size
        results[name]["global_rank"] = trainer.global_rank
        results[name]["jacobian_rows"] = task.jacobian_rows
        if name == "momo":
            results["momo_without_reduce"] = _momo_without_reduce(task, rank)
    for variant, names in VARIANT_RUNS.items():
        for name in names:
            task = new_task(name, variant)
            trainer = make_trainer(callbacks_for(name), devices=WORLD)
            train, val = loaders(world=WORLD)
            trainer.fit(task, train_dataloaders=train, val_dataloaders=val)
            results[(variant, name)] = summary(trainer) | {"jacobian_rows": task.jacobian_rows}
    results["shared_flag_wrong"] = _refused_run()
    torch.save(results, Path(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
