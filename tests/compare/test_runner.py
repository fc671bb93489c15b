"""``compare.runner``: a worker pool's processes end when the process that started them is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PARENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from lit_constrained.compare.runner import exit_with_parent

    def long_run(path):
        with open(path, "w") as handle:
            handle.write(str(os.getpid()))
        time.sleep(120)

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=context, initializer=exit_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            pool.submit(long_run, sys.argv[1]).result()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    script, pid_file = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
        worker = int(pid_file.read_text())
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)  # no clean-up in the parent: only the worker's own watch can end it
        parent.wait()
        deadline = time.monotonic() + 15
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), "the worker outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if worker is not None and _alive(worker):  # a failed check leaves no stray worker behind
            os.kill(worker, signal.SIGKILL)


def test_the_watch_leaves_a_process_with_its_parent_alone() -> None:
    code = ("import os, time; from lit_constrained.compare.runner import exit_with_parent; "
            "exit_with_parent(os.getppid(), poll_seconds=0.01); time.sleep(0.5); print('finished')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "finished")
