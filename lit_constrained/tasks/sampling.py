"""From rows to batches: a seeded per-epoch shuffle, a loader that resumes mid-epoch, and dict batches
sliced from whole tensors.

Exact resume needs two things from the training loader:

* the order of an epoch must not depend on the global RNG: :class:`EpochShuffleSampler` draws the
  permutation of epoch ``e`` from its own generator seeded with ``(seed, e)``;
* a checkpoint written after batch ``k`` of an epoch must make the resumed run start at batch ``k + 1``
  of the same permutation: :class:`ResumableLoader` implements ``state_dict`` / ``load_state_dict``,
  which Lightning's fit loop saves in the checkpoint (``loops.fit_loop.state_dict.combined_loader``)
  and restores before it creates the first iterator of the resumed run.

:func:`row_loader` puts the two together for the tasks' row data: the sampler picks row indices
(:class:`IndexDataset`) and :class:`RowCollate` slices every row tensor at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

BatchMode = Literal["full", "minibatch"]

_SEED_MODULUS = 2**63


class EpochShuffleSampler(Sampler[int]):
    """A random permutation per epoch, drawn from ``(seed, epoch)`` alone.

    The generator of epoch ``e`` is seeded with ``(seed * 100003 + e) mod 2^63``. Lightning calls
    ``set_epoch`` at the start of every epoch, so the order does not depend on the global RNG: a run
    resumed from a checkpoint sees exactly the batches of the uninterrupted run. The permutation is
    drawn when iteration starts (not at ``iter()``), so a ``set_epoch`` between the two still applies.

    Under DDP Lightning wraps the loader's sampler in its own distributed sampler, which shuffles again
    from ``seed_everything``'s seed and the epoch: still independent of the global RNG (exact resume),
    but the batches differ from a one-process run of the same config.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 0:
            raise ValueError(f"EpochShuffleSampler: size must be >= 0, got {size}.")
        self.size = int(size)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def permutation(self, epoch: int) -> list[int]:
        """The order of ``epoch`` (a pure function of ``seed`` and ``epoch``)."""
        gen = torch.Generator().manual_seed((self.seed * 100_003 + epoch) % _SEED_MODULUS)
        return torch.randperm(self.size, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        yield from self.permutation(self.epoch)

    def __len__(self) -> int:
        return self.size


def _samplers(loader: DataLoader) -> list[Any]:
    """The loader's sampler and its batch sampler's sampler (Lightning's ``set_epoch`` targets)."""
    found: dict[int, Any] = {}
    for candidate in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if candidate is not None:
            found[id(candidate)] = candidate
    return list(found.values())


class ResumableLoader(DataLoader):
    """A ``DataLoader`` whose position within the epoch survives a checkpoint.

    ``state_dict()`` returns ``{"epoch": e, "batches": k, "seed": s}``: the sampler's epoch, the number
    of batches this loader has handed out in the current pass and the sampler's shuffle seed (when it
    has one). ``load_state_dict`` arms the next
    ``iter()`` to continue after those ``k`` batches: it sets the samplers' epoch to ``e`` and skips
    the first ``k`` batches of the pass (the skipped batches are collated and discarded; this works
    with any sampler, Lightning's distributed one included, and with worker processes). A state
    saved after the last batch of an epoch (``k == len(loader)``) resumes at the start of the next
    epoch, which Lightning announces with ``set_epoch``.

    Lightning (2.x) saves the state of every training loader that has ``state_dict`` and
    ``load_state_dict`` and restores it before the resumed fit creates its first iterator, so with
    a seeded sampler (:class:`EpochShuffleSampler`) a run resumed at any step takes exactly the steps
    of the uninterrupted run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handed_out = 0
        self._skip_next_pass = 0

    def _epoch(self) -> int:
        for sampler in _samplers(self):
            if hasattr(sampler, "epoch"):
                return int(sampler.epoch)
        return 0

    def state_dict(self) -> dict[str, int]:
        state = {"epoch": self._epoch(), "batches": self._handed_out}
        seeds = [int(s.seed) for s in _samplers(self) if isinstance(getattr(s, "seed", None), int)]
        if seeds:
            state["seed"] = seeds[0]
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        if not {"epoch", "batches"} <= set(state):
            raise ValueError(f"ResumableLoader.load_state_dict: expected keys 'epoch' and 'batches', got {sorted(state)}.")
        epoch, batches = int(state["epoch"]), int(state["batches"])
        if batches >= len(self):  # saved after the epoch's last batch: the next pass is a new epoch
            epoch, batches = epoch + 1, 0
        for sampler in _samplers(self):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)
            if "seed" in state and isinstance(getattr(sampler, "seed", None), int):
                sampler.seed = int(state["seed"])  # the saved run's shuffle, whatever the new global seed
        self._skip_next_pass = batches
        self._handed_out = batches

    def __iter__(self) -> Iterator[Any]:
        base = super().__iter__()
        skip, self._skip_next_pass = self._skip_next_pass, 0
        self._handed_out = skip
        return self._counted(base, skip)

    def _counted(self, base: Iterator[Any], skip: int) -> Iterator[Any]:
        for _ in range(skip):
            next(base)
        for batch in base:
            self._handed_out += 1
            yield batch


# ---------------------------------------------------------------------------------------------
# Row data: rows sampled by index, fixed tensors attached to every batch
# ---------------------------------------------------------------------------------------------


def check_batch_mode(batch_mode: str, batch_fraction: float) -> None:
    """Validate the ``batch_mode`` / ``batch_fraction`` pair of a DataModule or task."""
    if batch_mode not in ("full", "minibatch"):
        raise ValueError(f"batch_mode must be 'full' or 'minibatch', got {batch_mode!r}.")
    if not (isinstance(batch_fraction, (int, float)) and 0.0 < float(batch_fraction) <= 1.0):
        raise ValueError(f"batch_fraction must lie in (0, 1], got {batch_fraction!r}.")


class IndexDataset(Dataset):
    """The integers ``0 .. n-1``: a sampler (and Lightning's distributed sampler) picks row indices,
    :class:`RowCollate` turns a list of them into a batch by slicing whole tensors at once."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"IndexDataset needs at least one row, got n={n}.")
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return int(i)


class RowCollate:
    """Collate row indices into a dict batch: ``rows[key][idx]`` for each row tensor, plus the
    ``fixed`` tensors unchanged (points every batch needs whole, e.g. the constraint points, which
    must be the same on every rank). Picklable, so it works with worker processes and spawn."""

    def __init__(self, rows: Mapping[str, Tensor], fixed: Mapping[str, Tensor] | None = None) -> None:
        sizes = {k: v.shape[0] for k, v in rows.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"RowCollate: row tensors must have the same first dimension, got {sizes}.")
        self.rows = dict(rows)
        self.fixed = dict(fixed or {})

    def __call__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        batch = {k: v[idx] for k, v in self.rows.items()}
        batch.update(self.fixed)
        return batch


def row_loader(
    n_rows: int,
    collate: RowCollate,
    batch_mode: str,
    batch_fraction: float,
    shuffle: bool,
    num_workers: int = 0,
    seed: int | None = None,
) -> ResumableLoader:
    """Full batch: one batch per epoch holding every row. Mini-batch: batches of
    ``ceil(batch_fraction * n_rows)`` rows, reshuffled every epoch (the last one may be smaller).

    The shuffle is an :class:`EpochShuffleSampler`: the order of epoch ``e`` is a function of
    ``(seed, e)`` alone, never of the global RNG. ``seed=None`` takes ``torch.initial_seed()`` (the
    ``seed_everything`` seed when one was set). The loader is a :class:`ResumableLoader`: its position
    in the epoch is saved in checkpoints, so a run resumed at any step takes the uninterrupted run's
    batches. Under DDP Lightning swaps in a distributed sampler, which shards the rows over ranks."""
    check_batch_mode(batch_mode, batch_fraction)
    if batch_mode == "full":
        batch_size = n_rows
    else:
        batch_size = max(1, int(math.ceil(batch_fraction * n_rows)))
    sampler = None
    if shuffle and batch_mode == "minibatch":
        sampler = EpochShuffleSampler(n_rows, seed=torch.initial_seed() if seed is None else seed)
    return ResumableLoader(
        IndexDataset(n_rows),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
