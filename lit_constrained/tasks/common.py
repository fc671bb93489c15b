"""Small helpers shared by the physics tasks: the MLP builder, dtype names, data caching, row loaders.

Nothing here knows about a particular problem.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from abc import ABC, abstractmethod
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from lit_constrained.data import EpochShuffleSampler, ResumableLoader

DTypeName = Literal["float32", "float64"]
BatchMode = Literal["full", "minibatch"]

#: default location of generated datasets (git-ignored)
DEFAULT_CACHE_DIR = Path("data") / "cache"


def mlp(
    in_dim: int,
    hidden: int,
    depth: int,
    out_dim: int,
    activation: Callable[[], nn.Module] = nn.Tanh,
) -> nn.Sequential:
    """A fully connected network ``in_dim -> hidden x depth -> out_dim``.

    ``depth`` is the number of hidden layers; each is ``Linear`` followed by ``activation()``; the
    output layer is linear. Weights use PyTorch's default ``nn.Linear`` initialization (seed it
    with ``torch.manual_seed`` / ``seed_everything`` before building).

    Example:
        >>> net = mlp(1, 32, 3, 1)
        >>> sum(p.numel() for p in net.parameters())
        2209
    """
    for name, value in (("in_dim", in_dim), ("hidden", hidden), ("out_dim", out_dim)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"mlp: {name} must be a positive integer, got {value!r}.")
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"mlp: depth (number of hidden layers) must be an integer >= 0, got {depth!r}.")
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), activation()]
        width = hidden
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"float64"`` to the torch dtype, with a clear error otherwise."""
    table = {"float32": torch.float32, "float64": torch.float64}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}.")
    return table[name]


def check_batch_mode(batch_mode: str, batch_fraction: float) -> None:
    """Validate the ``batch_mode`` / ``batch_fraction`` pair of a DataModule or task."""
    if batch_mode not in ("full", "minibatch"):
        raise ValueError(f"batch_mode must be 'full' or 'minibatch', got {batch_mode!r}.")
    if not (isinstance(batch_fraction, (int, float)) and 0.0 < float(batch_fraction) <= 1.0):
        raise ValueError(f"batch_fraction must lie in (0, 1], got {batch_fraction!r}.")


def cache_key(name: str, args: Mapping[str, Any], version: str = "1") -> str:
    """A short stable hash of the generator's name, version and arguments (the cache file's name).

    Every argument the arrays depend on belongs in ``args``; ``version`` is the generator's version,
    raised whenever its output changes for the same arguments (old files then simply stop matching).
    """
    text = json.dumps({"name": name, "generator_version": str(version), **args}, sort_keys=True, default=str)
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


#: keys of the integrity records stored in every cache file beside the arrays
_CHECKSUM_KEY = "__checksum__"
_META_KEY = "__meta__"


def arrays_checksum(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the arrays' names, dtypes, shapes and bytes (in name order)."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        value = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class CorruptCacheError(ValueError):
    """A cache file that cannot be read, lacks its integrity records or fails them."""


def _read_verified(path: Path, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The arrays of ``path`` after checking its metadata (name, version, arguments) and checksum.

    Any failure (truncated or non-zip file, missing records, other arguments, wrong content) raises
    :class:`CorruptCacheError` naming the file and what failed.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = {k: data[k] for k in data.files}
    except Exception as error:  # BadZipFile, EOFError, zlib/OSError, ValueError...: all mean "unreadable"
        raise CorruptCacheError(f"{path}: unreadable ({type(error).__name__}: {error})") from error
    if _CHECKSUM_KEY not in stored or _META_KEY not in stored:
        raise CorruptCacheError(f"{path}: no checksum/metadata record (written by an older version or another tool)")
    checksum = str(stored.pop(_CHECKSUM_KEY))
    stored_meta = json.loads(str(stored.pop(_META_KEY)))
    if stored_meta != meta:
        raise CorruptCacheError(f"{path}: made for {stored_meta}, not {meta}")
    actual = arrays_checksum(stored)
    if actual != checksum:
        raise CorruptCacheError(f"{path}: checksum mismatch (stored {checksum[:12]}..., content {actual[:12]}...)")
    return stored


def _write_atomic(path: Path, arrays: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write the arrays plus their checksum and metadata under a temporary name, then rename: readers
    (other ranks, concurrent runs) see either no file or a complete one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{np.random.SeedSequence().entropy % 10**12}.tmp.npz")
    records = {_CHECKSUM_KEY: np.array(arrays_checksum(arrays)), _META_KEY: np.array(json.dumps(meta, sort_keys=True))}
    try:
        np.savez(tmp, **arrays, **records)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def cached_arrays(
    name: str,
    args: Mapping[str, Any],
    generate: Callable[[], dict[str, np.ndarray]],
    cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
    version: str = "1",
) -> dict[str, np.ndarray]:
    """Load arrays from ``cache_dir/<name>-<hash(name, version, args)>.npz``, generating and saving them
    if absent.

    Each file stores, beside the arrays, a SHA-256 checksum of their content and the metadata
    (name, generator version, arguments) it was made for; both are verified on every load. A file that
    is truncated, unreadable, made for other arguments or whose content does not match its checksum is
    regenerated and replaced, with a warning naming it. ``cache_dir=None`` disables the cache (always
    generate). Files are written atomically (temporary name, then rename), so concurrent ranks never
    read a half-written file.
    """
    if cache_dir is None:
        return generate()
    path = Path(cache_dir) / f"{cache_key(name, args, version)}.npz"
    meta = json.loads(json.dumps({"name": name, "generator_version": str(version), "args": dict(args)},
                                 sort_keys=True, default=str))
    if path.exists():
        try:
            return _read_verified(path, meta)
        except CorruptCacheError as error:
            warnings.warn(f"Regenerating the cached dataset {error}.", stacklevel=2)
    arrays = generate()
    _write_atomic(path, arrays, meta)
    return arrays


class CachedArraysData(L.LightningDataModule, ABC):
    """A DataModule whose numpy arrays are generated from a seed and cached as ``.npz``.

    A subclass sets ``cache_name``, implements :meth:`generation_args` (the generator's arguments,
    also the cache key) and :meth:`generate`, and may extend :meth:`setup` (``self.tensors`` holds the
    arrays as tensors). ``self.hparams.cache_dir`` (``None``: no cache) says where the files live.
    """

    cache_name: str = ""
    #: raise when the generator's output changes for the same arguments (part of the cache key)
    generator_version: str = "1"

    @abstractmethod
    def generation_args(self) -> dict[str, Any]:
        """The generator's arguments (also the cache key)."""

    @abstractmethod
    def generate(self, **args: Any) -> dict[str, np.ndarray]:
        """The task's arrays, generated from ``generation_args()``."""

    def prepare_data(self) -> None:
        """Generate and cache once (rank 0), so other ranks only load."""
        self._load()

    def _load(self) -> dict[str, np.ndarray]:
        args = self.generation_args()
        cache_dir = None if self.hparams.cache_dir is None else Path(self.hparams.cache_dir)
        return cached_arrays(self.cache_name, args, lambda: self.generate(**args), cache_dir, self.generator_version)

    def setup(self, stage: str | None = None) -> None:
        if self.tensors:
            return
        self.arrays = self._load()
        self.tensors = {key: torch.from_numpy(np.ascontiguousarray(v)) for key, v in self.arrays.items()}


# ---------------------------------------------------------------------------------------------
# Data loading: rows sampled by index, fixed tensors attached to every batch
# ---------------------------------------------------------------------------------------------


class IndexDataset(torch.utils.data.Dataset):
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

    The shuffle is an :class:`~lit_constrained.data.EpochShuffleSampler`: the order of epoch ``e`` is
    a function of ``(seed, e)`` alone, never of the global RNG. ``seed=None`` takes
    ``torch.initial_seed()`` (the ``seed_everything`` seed when one was set). The loader is a
    :class:`~lit_constrained.data.ResumableLoader`: its position in the epoch is saved in checkpoints,
    so a run resumed at any step takes the uninterrupted run's batches. Under DDP Lightning swaps in
    a distributed sampler, which shards the rows over ranks."""
    check_batch_mode(batch_mode, batch_fraction)
    if batch_mode == "full":
        batch_size = n_rows
    else:
        batch_size = max(1, int(np.ceil(batch_fraction * n_rows)))
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
