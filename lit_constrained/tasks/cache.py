"""Generated arrays cached as ``.npz`` files, keyed by a hash of the generator's name, version and
arguments, verified by a checksum on every load and written atomically.

Nothing here knows about a particular problem; :class:`~lit_constrained.tasks.datamodule.RowDataModule`
uses it for every task's data.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_atomic

#: default location of generated datasets (git-ignored)
DEFAULT_CACHE_DIR = Path("data") / "cache"


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
    records = {_CHECKSUM_KEY: np.array(arrays_checksum(arrays)), _META_KEY: np.array(json.dumps(meta, sort_keys=True))}
    write_atomic(path, lambda tmp: np.savez(tmp, **arrays, **records), suffix=".tmp.npz")


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
