"""Data-loading helpers shared by the tasks."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochShuffleSampler(Sampler[int]):
    """A random permutation per epoch, drawn from ``(seed, epoch)`` alone.

    Lightning calls ``set_epoch`` at the start of every epoch, so the order does not depend on the
    global RNG: a run resumed from a checkpoint at an epoch boundary sees exactly the batches of the
    uninterrupted run. Under DDP Lightning wraps the loader's sampler in its own distributed sampler,
    which shuffles again from ``seed_everything``'s seed and the epoch: still independent of the global
    RNG (exact resume), but the batches differ from a one-process run of the same config.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.size, generator=gen).tolist())

    def __len__(self) -> int:
        return self.size
