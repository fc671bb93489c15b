"""Atomic file writes: a reader (another rank, a concurrent run, the next run after a crash) sees either
the previous file or the complete new one, never half a file.

The content is written to a temporary file in the same directory (so the rename stays on one file
system), which then replaces the target with :func:`os.replace` (atomic on POSIX and Windows). The
temporary name is hidden and unique per process and call, so concurrent writers of one path do not
collide; whichever rename comes last wins. A failed write leaves the target as it was and removes the
temporary file.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, write: Callable[[Path], object], suffix: str = ".tmp") -> Path:
    """Create ``path`` atomically: ``write(tmp)`` writes the content to ``tmp``, which then replaces ``path``.

    Args:
        path: the file to create or replace (its parent directories are created).
        write: writes the whole content to the path it is given, e.g.
            ``lambda tmp: tmp.write_text(text)`` or ``lambda tmp: np.savez(tmp, **arrays)``.
        suffix: the temporary file's suffix; ``".tmp.npz"`` for writers that append their own
            extension otherwise (``np.savez``).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}{suffix}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
