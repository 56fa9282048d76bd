"""One writer per run directory: an ``flock`` on ``<run_dir>/run.lock``.

The process that starts or resumes a run holds an exclusive lock on the lock file for as
long as it writes the directory, and records its pid, host and command in it. A second
``evolve`` / ``resume`` of the same directory refuses with a message naming that holder.
The operating system drops the lock when its process ends, however it ends (SIGKILL, a
crash, a reboot), so a lock left behind by a killed run never blocks the next resume; the
file itself stays, holding the last holder's name. ``flock`` works between processes of
one machine and, on Linux, on NFS (as a POSIX lock); under :mod:`jax.distributed` only the
primary process takes it (:func:`hold_run_lock`).

:func:`lock_holder` asks without blocking whether someone holds a directory's lock (it
takes a shared lock for an instant, which is why :func:`acquire` retries for a moment
before it refuses).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metarl.runs.layout import LOCK_FILE, RunError, now

RETRY_SECONDS = 2.0  # how long acquire waits out someone probing the lock


class RunLockedError(RunError):
    """Another process holds the run directory's lock."""


class RunLock:
    """A held lock; :meth:`release` (or the end of the process) frees it."""

    def __init__(self, path: Path, fd: int, holder: dict[str, Any]):
        self.path, self._fd, self.holder = path, fd, holder

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (it has not written its name yet)"
    text = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("command"):
        text += f" (`{holder['command']}`, since {holder.get('since', '?')})"
    return text


def _read_holder(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw.decode()) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def acquire(run_dir: str | Path, command: str = "", wait: float = RETRY_SECONDS) -> RunLock:
    """Lock ``run_dir`` (which must exist) for writing, or raise :class:`RunLockedError`."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RunError(f"cannot lock {run_dir}: {error.strerror or error}") from error
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLockedError(
                    f"{run_dir} is in use by {describe_holder(holder)}: one process writes a "
                    "run directory at a time. Wait for it to finish, or stop it and then "
                    f"`metarl resume {run_dir}`"
                ) from None
            time.sleep(0.05)
        except OSError as error:
            os.close(fd)
            raise RunError(f"cannot lock {run_dir}: {error.strerror or error}") from error
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": now()}
    data = json.dumps(holder).encode()
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    return RunLock(path, fd, holder)


def lock_holder(run_dir: str | Path) -> dict[str, Any] | None:
    """Who holds ``run_dir``'s lock (``{"pid", "host", "command", "since"}``; ``{}`` if it
    has not written its name yet), or ``None`` when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_run_lock(run_dir: str | Path, command: str = "") -> Iterator[RunLock | None]:
    """Hold ``run_dir``'s lock for the ``with`` block.

    Under :mod:`jax.distributed` the primary process takes the lock and tells the others
    whether it got it, so that every process refuses together; the others hold nothing
    (``None``).
    """
    from metarl import distributed

    lock, refusal = None, ""
    if distributed.is_primary():
        try:
            lock = acquire(run_dir, command)
        except RunError as error:
            refusal = str(error)
    if distributed.process_count() > 1:
        refusal = distributed.agree(refusal)
    if refusal:
        raise RunLockedError(refusal)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
