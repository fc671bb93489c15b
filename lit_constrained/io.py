"""Atomic file writes: a reader (another rank, a concurrent run, the next run after a crash) sees either
the previous file or the complete new one, never half a file.

The content is written to a temporary file in the same directory (so the rename stays on one file
system), which then replaces the target with :func:`os.replace` (atomic on POSIX and Windows). The
temporary name is hidden and unique per process and call, so concurrent writers of one path do not
collide; whichever rename comes last wins. A failed write leaves the target as it was and removes the
temporary file.

A process killed mid-write (SIGKILL, a lost node) cannot remove its temporary file:
``.<name>.<pid>.<host><random>.tmp`` stays behind (``.<name>.<pid>.<random>.tmp`` before the host tag). :func:`remove_stale_temporaries` removes those of
processes that no longer run on this host (a run calls it on its checkpoint directories at its start,
:class:`~lit_constrained.callbacks.integrity.CheckpointIntegrity`); a file of a live process, of this
process, or of another host (its tag is the first 6 hex digits, from the host name: on a shared file
system its pid cannot be checked from here) is kept. A name without the tag (written before it
existed) counts as this host's.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic", "remove_stale_temporaries", "stale_temporaries"]

#: ``.<name>.<pid>.<6 hex of the host><12 random hex><suffix>``, the name write_atomic gives its temporary
#: file (``<12 random hex>`` alone: the name before the host tag, taken as this host's)
_TEMPORARY = re.compile(
    r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<host>[0-9a-f]{6})?[0-9a-f]{12}(?P<suffix>\.tmp(\.[A-Za-z0-9]+)?)$"
)


def _host_tag() -> str:
    """6 hex digits of this host's name (which host wrote a temporary file)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user counts: signal 0 is refused)."""
    if pid <= 0:
        return True  # not a process id: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def stale_temporaries(directory: str | Path) -> list[Path]:
    """The temporary files of :func:`write_atomic` in ``directory`` (not below) left by processes of this
    host that no longer run; never one of this process or of a live one."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    host, own = _host_tag(), os.getpid()
    stale = []
    for entry in directory.iterdir():
        match = _TEMPORARY.match(entry.name)
        if match is None or match["host"] not in (None, host) or not entry.is_file():
            continue
        pid = int(match["pid"])
        if pid != own and not _running(pid):
            stale.append(entry)
    return sorted(stale)


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Remove :func:`stale_temporaries` of ``directory``; returns the files removed (a file that vanished
    meanwhile, or cannot be removed, is skipped)."""
    removed = []
    for path in stale_temporaries(directory):
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{_host_tag()}{secrets.token_hex(6)}{suffix}")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
