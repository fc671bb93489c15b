"""write_atomic: the target is either the old file or the complete new one; nothing is left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lit_constrained.io import write_atomic


def test_writes_through_a_hidden_sibling_then_replaces(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "dir" / "out.json"  # parents are created
    seen: list[Path] = []

    def write(tmp: Path) -> None:
        seen.append(tmp)
        assert not target.exists()  # nothing visible under the target's name while writing
        tmp.write_text(json.dumps({"a": 1}))

    assert write_atomic(target, write) == target
    assert json.loads(target.read_text()) == {"a": 1}
    (tmp,) = seen
    assert tmp.parent == target.parent and tmp.name.startswith(".out.json.") and tmp.suffix == ".tmp"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]  # the temporary file is gone

    write_atomic(str(target), lambda tmp: tmp.write_text("second"))  # replaces an existing file
    assert target.read_text() == "second"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_numpy_savez_with_its_extension(tmp_path: Path) -> None:
    # np.savez appends ".npz" unless the name ends with it: the suffix keeps the temporary name exact
    target = tmp_path / "arrays.npz"
    x = np.arange(5.0)
    write_atomic(target, lambda tmp: np.savez(tmp, x=x), suffix=".tmp.npz")
    with np.load(target) as data:
        np.testing.assert_array_equal(data["x"], x)
    assert [p.name for p in tmp_path.iterdir()] == ["arrays.npz"]


def test_concurrent_writers_use_distinct_temporaries(tmp_path: Path) -> None:
    # two writes of one path in flight at once (threads, or a nested write) never share a temporary
    target = tmp_path / "out.txt"
    names: list[str] = []

    def outer(tmp: Path) -> None:
        names.append(tmp.name)
        tmp.write_text("outer")
        write_atomic(target, lambda inner: (names.append(inner.name), inner.write_text("inner")))
        assert tmp.read_text() == "outer"

    write_atomic(target, outer)
    assert names[0] != names[1] and target.read_text() == "outer"  # the last rename wins


# -- stale temporary files of a process killed mid-write (issue 37, item 16) ------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from lit_constrained.io import _host_tag, remove_stale_temporaries  # noqa: E402


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_only_the_temporaries_of_dead_processes_of_this_host_are_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "dead": f".last.ckpt.{dead}.{_host_tag()}0123456789ab.tmp",
            "dead_untagged": f".last.ckpt.{dead}.0123456789ab.tmp",  # the name before the host tag
            "dead_npz": f".arrays.npz.{dead}.{_host_tag()}0123456789ab.tmp.npz",
            "live": f".last.ckpt.{live.pid}.{_host_tag()}0123456789ab.tmp",
            "own": f".last.ckpt.{os.getpid()}.{_host_tag()}0123456789ab.tmp",
            "other_host": f".last.ckpt.{dead}.{'0' * 6 if _host_tag() != '0' * 6 else '1' * 6}0123456789ab.tmp",
            "not_ours": f".last.ckpt.{dead}.xyz.tmp",
            "checkpoint": "last.ckpt",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"PK half a file")
        removed = remove_stale_temporaries(tmp_path)
        assert sorted(p.name for p in removed) == sorted(names[k] for k in ("dead", "dead_untagged", "dead_npz"))
        kept = {"live", "own", "other_host", "not_ours", "checkpoint"}
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[k] for k in kept)
    finally:
        live.kill()
        live.wait(timeout=60)
    assert remove_stale_temporaries(tmp_path / "missing") == []
