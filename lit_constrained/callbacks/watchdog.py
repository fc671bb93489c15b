"""LauncherWatchdog: under DDP, a rank whose launching process died (SIGKILL, a crash) ends too.

A rank blocked in a collective with a dead peer waits for the process group's timeout (30 minutes by
default; gloo notices the closed socket at once, NCCL does not). Who notices what:

* a rank started by Lightning's launcher (``strategy: ddp``) dies: Lightning's own observer thread on
  rank 0 (``_ChildProcessObserver``, every 5 s) kills rank 0 and the other ranks;
* a worker of torchrun dies: the torchrun agent stops the others (SIGTERM, then SIGKILL after 30 s);
* the launching process dies (Lightning's rank 0, the torchrun agent): nobody is left to end the other
  ranks. This callback's daemon thread looks every ``poll_seconds`` whether this rank's parent is
  gone (the process was re-parented) and, if that lasts ``grace_seconds`` (a parent that ended
  normally has a child that ends by itself by then), ends this rank with exit status 1 and one
  line on stderr.

Only a rank that a launcher started is watched: a torchrun worker (``TORCHELASTIC_RUN_ID`` set), or a
rank whose parent runs the same command (Lightning's launcher re-runs it for ranks 1, 2, ...). A rank
started from a shell (rank 0 of ``strategy: ddp``, a node started by hand) keeps running when the
shell goes. It watches from setup to teardown of a fit; on one process it does nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


class LauncherWatchdog(Callback):
    """Ends this rank (exit status 1) when its launching process died during the fit.

    Args:
        grace_seconds: how long a failure must last before this rank ends.
        poll_seconds: how often the processes are looked at.
    """

    def __init__(self, grace_seconds: float = 5.0, poll_seconds: float = 0.5) -> None:
        if not (grace_seconds >= 0 and poll_seconds > 0):
            raise ValueError(f"grace_seconds must be >= 0 and poll_seconds > 0, got {grace_seconds!r}, {poll_seconds!r}.")
        self.grace_seconds = float(grace_seconds)
        self.poll_seconds = float(poll_seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rank = 0
        self._parent = 0
        self.clock: Callable[[], float] = time.monotonic
        """The clock the failure's duration is read from (seconds; a test injects its own)."""

    # ------------------------------------------------------------------ what is watched
    def failure(self) -> str | None:
        """What went wrong with the watched process, or None."""
        if self._parent > 1 and os.getppid() != self._parent:
            return f"the launching process (pid {self._parent}) has ended"
        return None

    def _watch(self) -> None:
        first_seen: float | None = None
        while not self._stop.wait(self.poll_seconds):
            failure = self.failure()
            if failure is None:
                first_seen = None
                continue
            now = self.clock()
            first_seen = now if first_seen is None else first_seen
            if now - first_seen >= self.grace_seconds and not self._stop.is_set():
                self._end(failure)

    def _end(self, failure: str) -> None:
        where = f" (rank {self._rank})" if self._rank else ""
        print(f"lit-constrained{where}: {failure} during training: ending this rank too (exit status 1).",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # the main thread may be blocked in a collective that never returns

    @staticmethod
    def started_by_a_launcher() -> bool:
        """Whether this process is a torchrun worker or a rank Lightning's launcher started (its parent
        runs the same command line, but for the interpreter's spelling)."""
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            return True
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as parent, open("/proc/self/cmdline", "rb") as own:
                return parent.read().split(b"\0")[1:] == own.read().split(b"\0")[1:]
        except OSError:  # no /proc: do not watch
            return False

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage != "fit" or trainer.world_size == 1 or self._thread is not None or not self.started_by_a_launcher():
            return
        self._rank = trainer.global_rank
        self._parent = os.getppid()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="lit-constrained-watchdog", daemon=True)
        self._thread.start()

    def _stop_watching(self) -> None:
        self._stop.set()
        self._thread = None

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        self._stop_watching()

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._stop_watching()
