"""The run directory's guards: an exclusive OS lock (`fcntl.flock`) held by the one process that writes there (rank 0)
for the run's lifetime, and the errors that name a path the run could not write.

The OS drops a flock when its process dies, SIGKILL included: a killed run never leaves a stale lock behind.
Knows nothing of training or checkpoint contents.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from vlgrpo.trainer.group import launch_attempt
from vlgrpo.types import InputError

LOCK_NAME = ".vlgrpo.lock"


class RunDirError(InputError):
    """The run directory is in use by another run, not writable, or full; names the path and what was kept."""


def is_write_error(e: BaseException) -> bool:
    """An error of writing a file: OSError (ENOSPC, EROFS, EACCES, ...), or torch.save's writer failing
    ("PytorchStreamWriter failed writing file ..." from inline_container.cc, which is a RuntimeError)."""
    if isinstance(e, OSError):
        return True
    return isinstance(e, RuntimeError) and any(s in str(e) for s in ("PytorchStreamWriter", "inline_container"))


def describe(e: BaseException) -> str:
    """One line for a write error: the OS reason when there is one."""
    if isinstance(e, OSError) and e.errno is not None:
        return f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


class RunLock:
    """`RunLock(run_dir)` takes the lock or raises RunDirError naming the holder's PID; `release()` (or the process's
    death) gives it back. The lock file's content only names the holder: the lock is the flock on it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (PEP 446)
        except OSError as e:
            raise RunDirError(
                f"train.output_dir '{self.path.parent}' is not writable ({describe(e)}): choose a writable "
                "train.output_dir (or --out); nothing was written"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process that has not written its pid"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirError(f"cannot lock '{self.path}': {describe(e)}") from None
            raise RunDirError(
                f"train.output_dir '{self.path.parent}' is in use by another run ({holder}); two runs in one "
                "directory would interleave their steps. Wait for it to end (or stop it), or choose another "
                "train.output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0
        )
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


PERMANENT_FAILURE = ".permanent_failure.json"
"""Written by a rank that failed for good (an InputError: bad config or data, the non-finite limit, a full disk, a
checkpoint that fails its checksum); a restarted rank of the same launch reads it and exits at once."""


def mark_permanent_failure(run_dir: Path, error: BaseException) -> None:
    """Record that this attempt failed in a way a restart would only repeat. Best effort: a disk too full for this
    small file leaves the restart to find out again, as before."""
    record = {"attempt": launch_attempt(), "error": f"{type(error).__name__}: {error}", "time": time.time()}
    path = Path(run_dir) / PERMANENT_FAILURE
    tmp = path.with_name(f"{PERMANENT_FAILURE}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record))
        # atomic: every rank of the failing attempt writes it, and torchrun kills the slower ones, maybe mid-write; a
        # truncated record read by a restarted rank would let it replay the failure
        os.replace(tmp, path)
    except OSError:
        pass


def refuse_replay(run_dir: Path) -> None:
    """In a restarted attempt (torchrun restarts the whole group, whatever the exit code), stop at once when an
    earlier attempt of this launch failed for good: replaying it would fail the same way, MAX_RESTARTS times. A new
    launch (attempt 0) clears an old record: its user may have fixed the cause."""
    path = Path(run_dir) / PERMANENT_FAILURE
    attempt = launch_attempt()
    if attempt == 0:
        try:
            path.unlink()
        except OSError:
            pass
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if int(record.get("attempt", attempt)) < attempt:
        raise RunDirError(
            f"not replayed: attempt {record['attempt']} of this launch failed in a way a restart repeats "
            f"({record.get('error', 'see its log')}); fix the cause and launch again (the record is "
            f"{path}, cleared by the next launch)"
        )
