r"""Checkpoints that are not trained on silently when damaged, and that fail with one line naming the file.

**A content hash with every checkpoint.** :func:`with_content_hash` adds the entry
``checkpoint["lit_constrained_integrity"]`` before the file is written: the SHA-256 of every tensor (by
its place, e.g. ``state_dict/net.0.weight`` or ``optimizer_states/0/state/0/exp_avg_sq``: dtype, shape
and bytes) and of each top-level section's other content (``epoch``, ``loops``, ``hyper_parameters``,
...: its keys, types and values). :func:`verify_content_hash` recomputes them after a load; a file whose
content differs is refused with an error naming the file and the entries that differ. A checkpoint
without the entry (written by plain Lightning or before this existed) loads with a one-line note.

The hash detects damage (a flipped bit on disk, a truncated copy, a bad transfer), not forgery: whoever
can rewrite the file can recompute it. What a crafted checkpoint can make the package import is bounded
by the allowlist (:func:`lit_constrained.class_spec.check_trusted`) and ``weights_only`` loads.

**Readable or a clear error.** :func:`read_checkpoint` turns the errors torch gives for an empty,
truncated, unreadable or damaged file (``OSError: [Errno 22] Invalid argument`` without a name; a
RuntimeError about the zip/mmap format) into one :class:`CheckpointReadError` line naming the file and
what is wrong with it.

**Written whole.** :class:`IntegrityCheckpointIO` is the Lightning ``CheckpointIO`` that does both for a
Trainer (installed by :class:`lit_constrained.callbacks.integrity.CheckpointIntegrity`): it writes a
local checkpoint to a hidden temporary file in the same directory, flushed to disk, that then replaces
the target (:func:`lit_constrained.io.write_atomic`), so a full disk or a crash mid-save leaves the
previous file as it was; a failed write is one :class:`CheckpointWriteError` naming the file and the
cause (``No space left on device``) and saying that the previous file is unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from .class_spec import check_checkpoint_names
from .hints import SetupError
from .io import write_atomic

__all__ = [
    "INTEGRITY_KEY", "CheckpointError", "CheckpointReadError", "CheckpointCorruptedError", "CheckpointWriteError",
    "content_digests", "with_content_hash", "verify_content_hash", "read_checkpoint", "IntegrityCheckpointIO",
    "install_integrity_io", "check_before_loading",
]

INTEGRITY_KEY = "lit_constrained_integrity"
"""The checkpoint entry holding the content hash: ``{"format": 1, "algorithm": "sha256", "digests": {...}}``."""

FORMAT = 1
_SHOWN = 6  # entries named in an error before "and N more"


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used as it is (the message names the file and why)."""


class CheckpointReadError(CheckpointError, SetupError):
    """The file is empty, truncated, unreadable or not a checkpoint (a :class:`~lit_constrained.hints.SetupError`:
    ``lit-constrained`` prints it as one line, exit status 2)."""


class CheckpointCorruptedError(CheckpointError, SetupError):
    """The file reads, but its content differs from the content hash written with it (a
    :class:`~lit_constrained.hints.SetupError`: one line on the command line, exit status 2)."""

    def __init__(self, message: str, differing: list[str]) -> None:
        super().__init__(message)
        self.differing = differing


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (e.g. a full disk); the previous file at that path is unchanged."""


# ---------------------------------------------------------------------------------------------- hashing
def _tensor_digest(tensor: Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (its values, whatever its device or layout)."""
    digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    data = tensor.detach()
    if data.is_quantized:
        digest.update(repr((data.qscheme(), data.q_scale() if data.qscheme() == torch.per_tensor_affine else None)).encode())
        data = data.int_repr()
    if data.layout != torch.strided:
        data = data.to_dense()
    if data.device.type == "meta":
        return digest.hexdigest()
    data = data.cpu().contiguous().reshape(-1)
    if data.numel():
        digest.update(memoryview(data.view(torch.uint8).numpy()))
    return digest.hexdigest()


def _plain_repr(value: Any) -> str:
    """A deterministic text for a non-tensor leaf (an object's repr with its address is replaced by its type)."""
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        return f"{type(value).__name__}:{value!r}"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else f"{type(value).__qualname__}:{text}"


def _digest_into(value: Any, path: str, tensors: dict[str, Any], values: Any) -> None:
    """Tensors get their own digest at ``path``; everything else (the structure included) feeds ``values``."""
    if isinstance(value, Tensor):
        values.update(f"{path}:tensor\n".encode())
        digest = _tensor_digest(value)
        tensors[path] = digest if path not in tensors else hashlib.sha256((tensors[path] + digest).encode()).hexdigest()
    elif isinstance(value, np.ndarray):
        values.update(f"{path}:ndarray{value.dtype}{value.shape}\n".encode())
        values.update(memoryview(np.ascontiguousarray(value)).cast("B"))
    elif isinstance(value, Mapping):
        values.update(f"{path}:{type(value).__qualname__}{{{len(value)}\n".encode())
        for key, item in value.items():
            values.update(f"{path}<{key!r}\n".encode())
            _digest_into(item, f"{path}/{key}", tensors, values)
    elif isinstance(value, (list, tuple)):
        values.update(f"{path}:{type(value).__qualname__}[{len(value)}\n".encode())
        for index, item in enumerate(value):
            _digest_into(item, f"{path}/{index}", tensors, values)
    else:
        values.update(f"{path}={_plain_repr(value)}\n".encode())


def content_digests(checkpoint: Mapping[str, Any]) -> dict[str, str]:
    """The SHA-256 digests :data:`INTEGRITY_KEY` stores: one per tensor (``"state_dict/net.0.weight"``)
    and one per top-level section for the rest of its content (``"hyper_parameters"``, ``"loops"``, ...)."""
    digests: dict[str, str] = {}
    for key, value in checkpoint.items():
        if key == INTEGRITY_KEY:
            continue
        tensors: dict[str, str] = {}
        values = hashlib.sha256()
        _digest_into(value, str(key), tensors, values)
        digests[str(key)] = values.hexdigest()
        digests.update(tensors)
    return digests


def with_content_hash(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``checkpoint`` with its content hash under :data:`INTEGRITY_KEY`."""
    record = {"format": FORMAT, "algorithm": "sha256", "digests": content_digests(checkpoint)}
    return {**{k: v for k, v in checkpoint.items() if k != INTEGRITY_KEY}, INTEGRITY_KEY: record}


def _named(entries: list[str]) -> str:
    shown = ", ".join(entries[:_SHOWN])
    return shown + (f" and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else "")


def verify_content_hash(checkpoint: Mapping[str, Any], source: str) -> bool:
    """Check ``checkpoint`` (read from ``source``) against its content hash.

    Returns True when it matches, False (after a one-line note) when the checkpoint has none. Raises
    :class:`CheckpointCorruptedError` naming ``source`` and the differing entries otherwise.
    """
    record = checkpoint.get(INTEGRITY_KEY)
    if record is None:
        rank_zero_info(
            f"lit-constrained: {source} has no content hash (not written by lit-constrained, e.g. by plain "
            "Lightning): loaded without an integrity check."
        )
        return False
    stored = record.get("digests") if isinstance(record, Mapping) else None
    if not isinstance(stored, Mapping) or record.get("algorithm") != "sha256":
        raise CheckpointCorruptedError(
            f"{source}: its content-hash entry '{INTEGRITY_KEY}' is damaged (no sha256 digests), so its content "
            "cannot be checked. Use another checkpoint, or delete that entry to load the file unchecked.",
            [INTEGRITY_KEY],
        )
    actual = content_digests(checkpoint)
    differing = [name for name in stored if name in actual and actual[name] != stored[name]]
    missing = [name for name in stored if name not in actual]
    added = [name for name in actual if name not in stored]
    if not (differing or missing or added):
        return True
    parts = []
    if differing:
        parts.append(f"{_named(differing)} differ{'s' if len(differing) == 1 else ''}")
    if missing:
        parts.append(f"{_named(missing)} missing")
    if added:
        parts.append(f"{_named(added)} not in the hash")
    raise CheckpointCorruptedError(
        f"{source} does not match the content hash written with it: {'; '.join(parts)} ({len(stored)} entries "
        "hashed). The file changed after it was saved (a damaged disk, copy or transfer, or an edit): resume "
        "from another checkpoint or retrain; if the change was intended, delete its "
        f"'{INTEGRITY_KEY}' entry to load it unchecked.",
        differing + missing + added,
    )


# ---------------------------------------------------------------------------------------------- reading
def _is_local(path: Any) -> bool:
    return isinstance(path, (str, Path)) and ("://" not in str(path) or str(path).startswith("file://"))


def _local_path(path: str | Path) -> Path:
    text = str(path)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _diagnose(path: Path, error: BaseException) -> str:
    """Why ``path`` (a local file that torch could not load) is not a checkpoint, in one sentence."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK") and not zipfile.is_zipfile(path):
        return (f"is truncated ({size} bytes, the end of its zip archive is missing): it was cut off while "
                "being written or copied (a full disk, a killed process, an interrupted transfer)")
    if zipfile.is_zipfile(path):
        return f"could not be loaded ({size} bytes, a complete zip archive; torch: {_first_line(error)})"
    return f"is not a checkpoint written by torch.save ({size} bytes; torch: {_first_line(error)})"


def read_checkpoint(path: str | Path | IO, load: Callable[[], Any] | None = None, **torch_load: Any) -> Any:
    """The checkpoint at ``path``, loaded by ``load()`` (default: ``torch.load(path, **torch_load)``).

    A local file that is missing, a directory, empty, truncated, unreadable or damaged raises one line
    naming it (:class:`CheckpointReadError`; ``FileNotFoundError`` when missing). A ``weights_only``
    refusal keeps torch's explanation, named. Other sources (URLs, file objects) are loaded as they are.
    """
    load = load or (lambda: torch.load(path, **torch_load))
    if not _is_local(path):
        return load()
    local = _local_path(path)  # type: ignore[arg-type]
    if not local.exists():
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
    if local.is_dir():
        raise CheckpointReadError(f"Checkpoint {path} is a directory, not a file: pass the .ckpt file inside it.")
    try:
        size = local.stat().st_size
        if size == 0:
            raise CheckpointReadError(
                f"Checkpoint {path} is empty (0 bytes): it was cut off while being written (a full disk or a "
                "killed process?). Use another checkpoint."
            )
        return load()
    except CheckpointError:
        raise
    except pickle.UnpicklingError as error:
        refused = "weights_only" in str(error) or "Weights only" in str(error)
        if refused and zipfile.is_zipfile(local):  # a whole file with types outside torch's safe list
            raise CheckpointReadError(
                f"Checkpoint {path} holds objects that a weights_only load refuses ({str(error).splitlines()[0]}): "
                "only if you trust the file, load it with weights_only=False."
            ) from error
        raise CheckpointReadError(f"Checkpoint {path} {_diagnose(local, error)}. Use another checkpoint.") from None
    except PermissionError as error:
        raise CheckpointReadError(f"Checkpoint {path} cannot be read: {error.strerror}.") from None
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as error:
        complete = zipfile.is_zipfile(local)  # then the cause may be elsewhere (a map_location): keep torch's trace
        raise CheckpointReadError(f"Checkpoint {path} {_diagnose(local, error)}. Use another checkpoint.") from (
            error if complete else None
        )


# ---------------------------------------------------------------------------------------------- writing
def _write_failure(path: str | Path, error: OSError, previous_kept: bool) -> str:
    target = _local_path(path) if _is_local(path) else None
    cause = error.strerror or str(error)
    code = errno.errorcode.get(error.errno, "") if error.errno else ""
    where = ""
    if target is not None:
        try:
            free = shutil.disk_usage(target.parent if target.parent.exists() else Path.cwd()).free
            where = f", {free / 2**20:.1f} MiB free on its file system"
        except OSError:
            pass
    kept = f" The previous {target.name} is unchanged." if previous_kept and target is not None else ""
    hint = (" Free some space, or save elsewhere (the checkpoint callback's dirpath, or --trainer.default_root_dir)."
            if error.errno in (errno.ENOSPC, errno.EDQUOT) else "")
    return f"Could not write the checkpoint {path}: {cause}{f' ({code})' if code else ''}{where}.{kept}{hint}"


def _save_durable(checkpoint: Mapping[str, Any], tmp: Path) -> None:
    """``torch.save`` to ``tmp``, flushed to the disk before the rename makes it the checkpoint."""
    with tmp.open("wb") as handle:
        torch.save(checkpoint, handle)
        handle.flush()
        os.fsync(handle.fileno())


class IntegrityCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that hashes what it saves and verifies what it loads.

    Saving adds the content hash (:func:`with_content_hash`); a local file is written atomically
    (temporary file in the same directory, fsync, rename), other targets through ``inner``. Loading
    reads through ``inner`` with clear errors (:func:`read_checkpoint`), checks the hash
    (:func:`verify_content_hash`), then calls ``check_loaded(checkpoint, path)`` if set (what the module it
    is restored into requires of it: its task class and shapes, trusted names). Removing and teardown
    are ``inner``'s.

    Args:
        inner: the CheckpointIO that does the reading and writing (default: Lightning's ``TorchCheckpointIO``).
    """

    def __init__(self, inner: CheckpointIO | None = None) -> None:
        self.inner = inner if inner is not None else TorchCheckpointIO()
        self.check_loaded: Callable[[Mapping[str, Any], str], None] | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        hashed = with_content_hash(checkpoint)
        direct = type(self.inner) is TorchCheckpointIO and storage_options is None and _is_local(path)
        target = _local_path(path) if _is_local(path) else None
        existed = target is not None and target.exists()
        try:
            if direct:
                write_atomic(target, lambda tmp: _save_durable(hashed, tmp))  # type: ignore[arg-type]
            else:
                self.inner.save_checkpoint(hashed, path, storage_options=storage_options)
        except OSError as error:
            raise CheckpointWriteError(_write_failure(path, error, existed and direct)) from error

    def load_checkpoint(self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"weights_only": weights_only}
        if map_location is not None:
            options["map_location"] = map_location
        checkpoint = read_checkpoint(path, load=lambda: self.inner.load_checkpoint(path, **options))
        verify_content_hash(checkpoint, str(path))
        if self.check_loaded is not None:
            self.check_loaded(checkpoint, str(path))
        return checkpoint

    def remove_checkpoint(self, path: str | Path) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def install_integrity_io(strategy: Any) -> IntegrityCheckpointIO:
    """Wrap ``strategy.checkpoint_io`` (Lightning's public setter) in :class:`IntegrityCheckpointIO`, once."""
    current = strategy.checkpoint_io
    if isinstance(current, IntegrityCheckpointIO):
        return current
    wrapped = IntegrityCheckpointIO(current)
    strategy.checkpoint_io = wrapped
    return wrapped


def check_before_loading(
    checkpoint_path: str | Path | IO, trusted: tuple[str, ...],
    inspect: Callable[[Mapping[str, Any], str], None] | None = None,
) -> str | Path | IO:
    """Read ``checkpoint_path`` once (``weights_only=True``) before Lightning builds anything from it:
    readable (:func:`read_checkpoint`), naming only trusted modules
    (:func:`~lit_constrained.class_spec.check_checkpoint_names`), matching its content hash
    (:func:`verify_content_hash`), then ``inspect(checkpoint, name)`` (e.g. the task-class check). Returns
    the path, or a rewound in-memory copy of a file object."""
    # Lightning's own reader (private, as load_from_checkpoint uses it): local paths, URLs and file objects
    from lightning.fabric.utilities.cloud_io import _load as pl_load

    source: Any = checkpoint_path
    name = str(checkpoint_path)
    if not isinstance(checkpoint_path, (str, Path)):
        name = f"the checkpoint read from {getattr(checkpoint_path, 'name', type(checkpoint_path).__name__)}"
        source = io.BytesIO(checkpoint_path.read())
    checkpoint = read_checkpoint(source, load=lambda: pl_load(source, map_location="cpu", weights_only=True))
    check_checkpoint_names(checkpoint, trusted, name)
    verify_content_hash(checkpoint, name)
    if inspect is not None:
        inspect(checkpoint, name)
    if isinstance(source, io.BytesIO):
        source.seek(0)
    return source
