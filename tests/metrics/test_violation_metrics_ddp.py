"""Two CPU processes (gloo): metrics updated with per-rank shards sync to the value on the union."""

from __future__ import annotations

import datetime
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_constrained.metrics import VIOLATION_METRICS, RelativeViolation
from tests.helpers.ddp import free_port

WORLD = 2
# shard sizes per rank: uneven, with an empty batch on rank 0
SHARDS = {0: [5, 0, 13], 1: [2, 7]}
NAMES = sorted(VIOLATION_METRICS)


def _shards(rank: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    out: dict[int, list[torch.Tensor]] = {}
    for r in range(WORLD):  # every rank draws all shards in the same order, keeps its own
        out[r] = [torch.randn(n, generator=gen, dtype=torch.float64).mul(r + 1).to(dtype) for n in SHARDS[r]]
    return out[rank]


def _build(name: str, **kwargs: object) -> torch.nn.Module:
    if name == "relative":
        return RelativeViolation(**kwargs)  # type: ignore[arg-type]
    return VIOLATION_METRICS[name](**kwargs)  # type: ignore[arg-type]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        results: dict[str, float] = {}
        for dtype in (torch.float32, torch.float64):
            tag = str(dtype).removeprefix("torch.")
            shards = _shards(rank, dtype)
            variants = {name: _build(name) for name in NAMES}
            variants["relative_p1"] = RelativeViolation(p=1)
            variants["relative_pinf"] = RelativeViolation(p=float("inf"))
            variants["relative_given"] = RelativeViolation(reference=torch.tensor([3.0, 4.0]))
            for key, metric in variants.items():
                metric.set_dtype(dtype)
                for shard in shards:
                    metric.update(shard)
                results[f"{tag}/synced/{key}"] = metric.compute().item()
                if key.startswith("relative"):
                    results[f"{tag}/reference/{key}"] = float(metric.reference)
            for name in NAMES:  # sync_on_compute=False: the rank's own value, nothing summed
                local = _build(name, sync_on_compute=False).set_dtype(dtype)
                for shard in shards:
                    local.update(shard)
                results[f"{tag}/local/{name}"] = local.compute().item()
            # a rank that saw nothing still takes part in the sync with neutral states
            for name in ("max", "mean", "l1", "l2"):
                idle = _build(name).set_dtype(dtype)
                if rank == 0:
                    for shard in shards:
                        idle.update(shard)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "compute called before update" on rank 1
                    results[f"{tag}/idle/{name}"] = idle.compute().item()
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _expected(c: np.ndarray) -> dict[str, float]:
    a = np.abs(c.astype(np.float64))
    return {"max": a.max(), "mean": a.mean(), "l1": a.sum(), "l2": np.sqrt((a**2).sum())}


@pytest.mark.ddp
def test_synced_metrics_equal_metric_on_union(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert results[0].keys() == results[1].keys()
    for dtype, rel in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        tag = str(dtype).removeprefix("torch.")
        union = np.concatenate([torch.cat(_shards(r, dtype)).double().numpy() for r in range(WORLD)])
        expected = _expected(union)
        for r in range(WORLD):
            got = results[r]
            for name in ("max", "mean", "l1", "l2"):
                assert got[f"{tag}/synced/{name}"] == pytest.approx(expected[name], rel=rel), (r, tag, name)
            # the first synced value is the reference: 1 on every rank, with the union's norm as reference
            for key, norm in (("relative", "l2"), ("relative_p1", "l1"), ("relative_pinf", "max")):
                assert got[f"{tag}/synced/{key}"] == pytest.approx(1.0, rel=rel)
                assert got[f"{tag}/reference/{key}"] == pytest.approx(expected[norm], rel=rel)
            assert got[f"{tag}/synced/relative_given"] == pytest.approx(expected["l2"] / 5.0, rel=rel)
            # unsynced: the value on the rank's own shard
            own = _expected(torch.cat(_shards(r, dtype)).double().numpy())
            for name in ("max", "mean", "l1", "l2"):
                assert got[f"{tag}/local/{name}"] == pytest.approx(own[name], rel=rel), (r, tag, name)
            # only rank 0 updated: the synced value is rank 0's value
            only0 = _expected(torch.cat(_shards(0, dtype)).double().numpy())
            for name in ("max", "mean", "l1", "l2"):
                assert got[f"{tag}/idle/{name}"] == pytest.approx(only0[name], rel=rel), (r, tag, name)
