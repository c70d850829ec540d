"""The progress watchdog of a training process: a rank that makes no progress for `train.fault_timeout_s` (a reward or
an image read that blocks, a rank waiting in a collective that another rank never enters) names its rank, step and
phase, dumps its threads' stacks and exits; torchrun then stops the other ranks at once.

Progress is a phase entered or left (`Timers` reports each one here) or a beat from inside a long one
(`vlgrpo.heartbeat`: an eval batch, a checkpoint file, a weight-sync tensor). A dead rank needs no watchdog (torchrun
sees it); a live rank that stops participating does. Knows nothing of models or data.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from contextlib import contextmanager

from vlgrpo import heartbeat
from vlgrpo.config.schema import WATCHDOG_WAITING_GRACE

EXIT_HUNG = 75
"""Exit status of a rank the watchdog stopped (EX_TEMPFAIL: a restart may well succeed)."""

WAITING_GRACE = WATCHDOG_WAITING_GRACE
"""A rank waiting in one of vlgrpo's own collectives fires after this many timeouts: when one rank blocks (in its
reward, say) the others soon wait for it in a collective; the blocked rank fires first and is the one named."""

_active: Watchdog | None = None
"""The started watchdog of this process (one training loop per process), for `waiting_for_ranks`."""


@contextmanager
def waiting_for_ranks(what: str):
    """Marks a collective of vlgrpo's own (a count, a gradient all-reduce): this rank now waits for the others."""
    dog = _active
    if dog is None:
        yield
        return
    dog.waiting = what
    try:
        yield
    finally:
        dog.waiting = None


class Watchdog:
    """`beat(phase)` on every phase boundary; a daemon thread stops the process when no beat came for `timeout_s`."""

    def __init__(self, timeout_s: float, rank: int = 0, step: int = 0, poll_s: float = 1.0, exit=os._exit):
        self.timeout_s, self.rank, self.poll_s = float(timeout_s), rank, poll_s
        self.step, self.phase, self._last = step, "start", time.monotonic()
        self._exit = exit
        self.waiting: str | None = None
        """The collective this rank waits in (`waiting_for_ranks`), or None."""
        self.inside: str | None = None
        """The last beat from inside the current phase (`vlgrpo.heartbeat`), or None."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, phase: str, step: int | None = None) -> None:
        """Progress: `phase` entered (or left: "after <phase>")."""
        self.phase, self.inside, self._last = phase, None, time.monotonic()
        if step is not None:
            self.step = step

    def beat_inside(self, what: str) -> None:
        """Progress inside the current phase (an eval batch, a checkpoint file, a weight-sync tensor)."""
        self.inside, self._last = what, time.monotonic()

    def start(self) -> Watchdog:
        global _active
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="vlgrpo-watchdog", daemon=True)
            self._thread.start()
            _active = self
            heartbeat.listen(self.beat_inside)
        return self

    def stop(self) -> None:
        global _active
        self._stop.set()
        heartbeat.unlisten(self.beat_inside)
        if _active is self:
            _active = None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s * (WAITING_GRACE if self.waiting else 1.0):
                self.fire(idle)
                return

    def fire(self, idle: float) -> None:
        """Name the rank, step and phase, dump every thread's stack, exit with EXIT_HUNG."""
        where = f" (last progress: {self.inside})" if self.inside else ""
        where += f", waiting for the other ranks in {self.waiting}" if self.waiting else ""
        print(
            f"[vlgrpo] error: rank {self.rank} made no progress for {idle:.0f} s in step {self.step}, phase "
            f"'{self.phase}'{where} (train.fault_timeout_s={self.timeout_s:g}): a blocked reward or image read, or a "
            "collective another rank never entered. Stopping this rank so the launcher stops the others; resume "
            "from the last checkpoint with train.resume=true. Stacks of this rank's threads:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        self._exit(EXIT_HUNG)
