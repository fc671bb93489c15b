"""Two "nodes" x one process on localhost, started the way a cluster starts them.

Each process gets only Lightning's cluster environment variables (``MASTER_ADDR=127.0.0.1``,
``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE=2``, ``LOCAL_RANK=0``), as torchrun or a SLURM script
sets them on each node, and builds ``Trainer(strategy="ddp", devices=1, num_nodes=2)``. Lightning's
default environment then derives the global rank from the node rank. The run (SQP-Adam on the
float64 task of tests.helpers.ddp, row-sharded Jacobian: node 0 differentiates 2 of the 3 rows, node 1
one) must equal the 1-process run on the union of the nodes' batches at every step.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import ddp as helpers

pytestmark = pytest.mark.ddp

NAME = "sqp_adam"


def node_worker(node_rank: int, port: int, out_dir: str) -> None:
    """One "node": its own process, told only what a cluster launcher tells it."""
    for key in ("LOCAL_WORLD_SIZE", "GROUP_RANK", "RANK", "SLURM_JOB_ID", "SLURM_NTASKS"):
        os.environ.pop(key, None)  # nothing else decides the rank (a SLURM job would switch environments)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(node_rank), WORLD_SIZE="2", LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    task = helpers.new_task(NAME)
    trainer = helpers.make_trainer(helpers.callbacks_for(NAME), devices=1, num_nodes=2)
    train, val = helpers.loaders(world=2)
    trainer.fit(task, train_dataloaders=train, val_dataloaders=val)
    env = trainer.strategy.cluster_environment
    result = helpers.summary(trainer) | {
        "jacobian_rows": task.jacobian_rows,
        "ranks": (trainer.global_rank, trainer.node_rank, trainer.local_rank, trainer.world_size, trainer.num_nodes),
        "environment": type(env).__name__,
    }
    torch.save(result, Path(out_dir, f"node{node_rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("nodes")
    fork = "fork" in multiprocessing.get_all_start_methods() and not dist.is_initialized()
    mp.start_processes(node_worker, args=(helpers.free_port(), str(out)), nprocs=2, join=True,
                       start_method="fork" if fork else "spawn")
    return [torch.load(out / f"node{r}.pt", weights_only=False) for r in range(2)]


def test_two_nodes_take_their_ranks_from_the_cluster_variables(nodes: list[dict[str, Any]]) -> None:
    for node_rank, run in enumerate(nodes):
        # (global rank, node rank, local rank, world size, nodes): global rank = node rank x 1 + 0
        assert run["ranks"] == (node_rank, node_rank, 0, 2, 2)
        assert run["environment"] == "LightningEnvironment"
    assert [nodes[0]["jacobian_rows"][0], nodes[1]["jacobian_rows"][0]] == [(3, 0, 2), (3, 2, 3)]


def test_two_nodes_equal_one_process(nodes: list[dict[str, Any]]) -> None:
    ref = helpers.run_single(NAME)
    steps = helpers.EPOCHS * helpers.STEPS_PER_EPOCH
    assert len(nodes[0]["steps"]) == len(ref["steps"]) == steps
    for step, (a, b, r) in enumerate(zip(nodes[0]["steps"], nodes[1]["steps"], ref["steps"])):
        assert torch.equal(a["params"], b["params"]), step  # bit-identical replicas across the nodes
        torch.testing.assert_close(a["params"], r["params"], rtol=0, atol=1e-12, msg=f"step {step}")
        assert a["objective"] == pytest.approx(r["objective"], rel=1e-12)
        torch.testing.assert_close(a["constraints"], r["constraints"], rtol=0, atol=1e-12)
    assert (nodes[0]["steps"][-1]["params"] - nodes[0]["start"]["params"]).abs().max() > 1e-3
