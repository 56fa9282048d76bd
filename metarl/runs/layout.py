"""What a run directory holds, the errors about it, and how its files are written.

Every run kind (evolution today, population training next) writes the same layout::

    config.json                  the resolved config the run continues with
    config_history.jsonl         the config at the start, and every change accepted since
    metrics.jsonl                one JSON line per step (generation or segment); lines with
                                 an ``"event"`` key record events such as accepted config
                                 changes and are skipped by :func:`read_metrics`
    status.json                  running / finished / stopped (and why), the backend, for
                                 ``metarl runs``
    run.lock                     held (``flock``) by the one process writing the directory
    checkpoints/<step>/          orbax checkpoints (:mod:`metarl.runs.checkpoint`)
    damaged-checkpoints/         checkpoints that did not read back, moved aside (never
                                 deleted) by a resume
    evaluations/<n>.json         every evaluation made of the run (:mod:`metarl.runs.evaluations`)
    plots/                       figures

Files are replaced atomically (:func:`atomic_write`: a temporary file in the same
directory, flushed and synced, then renamed over the old one), so a process killed at any
moment leaves either the old or the new file, both whole. A write that fails for a full disk
raises :class:`DiskFullError` naming the file; the file it was replacing is left as it was.

``metrics.jsonl`` is the one file that grows by appending while a run trains
(:func:`append_line`: one write of the whole line, then a sync), so that a step costs its
own line, not the whole history. A process killed inside that write can leave a last line
cut short, without its newline: readers (:func:`read_jsonl`) skip such a line, and a resume
writes the file anew, atomically, from the history of the checkpoint it continues from. An
append that fails (a full disk) cuts the file back to its lines before it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
CONFIG_HISTORY_FILE = "config_history.jsonl"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
LOCK_FILE = "run.lock"
CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged-checkpoints"
EVALUATIONS_DIR = "evaluations"
PLOTS_DIR = "plots"

EVENT_KEY = "event"  # marks a metrics.jsonl line that is not a step's summary


class RunError(RuntimeError):
    """A run directory is missing, in use, damaged beyond use, or not a run.

    The command line prints its message on one line and exits with code 2.
    """


class CheckpointError(RunError):
    """A run cannot be restored (no usable checkpoint, or one that does not fit the config)."""


class DiskFullError(RunError):
    """A file of the run could not be written because its disk (or quota) is full."""


class RunStopped(RuntimeError):
    """A run stopped itself (e.g. every candidate invalid for too many generations).

    Its checkpoints are kept; the command line exits with code 3.
    """


class RunInterrupted(RuntimeError):
    """A run stopped by its time limit or a signal (:mod:`metarl.runs.stopping`), its last
    completed step checkpointed: ``metarl resume`` continues it exactly. The command line
    exits with code 4.

    Attributes:
        run_dir: the directory ``metarl resume`` takes to continue it.
        step: the steps completed and checkpointed.
        abandoned: a step was in flight and was abandoned; its computation may still be
            running, so a command line exits without waiting for it.
    """

    def __init__(self, message: str, run_dir: Path, step: int, abandoned: bool):
        super().__init__(message)
        self.run_dir, self.step, self.abandoned = run_dir, step, abandoned


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# tensorstore (orbax's array writer) reports a full disk as a ValueError with these words
_DISK_FULL_TEXT = ("No space left on device", "os_error_code='28'", "Disk quota exceeded")


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) says the disk is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(error) for text in _DISK_FULL_TEXT):
            return True
        error = error.__cause__ or error.__context__
    return False


def write_failure(error: OSError, path: Path, run_dir: Path | None = None) -> RunError:
    """The :class:`RunError` to raise when writing ``path`` failed with ``error``."""
    where = run_dir if run_dir is not None else path.parent
    if is_disk_full(error):
        return DiskFullError(
            f"disk full: could not write {path} ({error.strerror or error}); the files "
            f"written before are intact. Free some space, then continue with "
            f"`metarl resume {where}`"
        )
    return RunError(f"could not write {path}: {error.strerror or error}")


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (best effort where unsupported)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temporary_path(path: Path) -> Path:
    """Where :func:`atomic_write` stages ``path`` (hidden, named by the writing process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: str | Path, data: bytes, run_dir: Path | None = None) -> None:
    """Replace ``path`` with ``data`` so that a reader (or a crash) sees all or nothing."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_failure(error, path, run_dir) from error
    fsync_directory(path.parent)


def write_json(path: str | Path, data: Any, run_dir: Path | None = None,
               indent: int | None = 2) -> None:
    atomic_write(path, (json.dumps(data, indent=indent) + "\n").encode(), run_dir)


def write_jsonl(path: str | Path, lines: list[dict[str, Any]],
                run_dir: Path | None = None) -> None:
    atomic_write(path, "".join(json.dumps(line) + "\n" for line in lines).encode(), run_dir)


def append_jsonl(path: str | Path, line: dict[str, Any], run_dir: Path | None = None) -> None:
    """Append one line by rewriting the file atomically (these files stay small)."""
    path = Path(path)
    lines = read_jsonl(path) if path.is_file() else []
    write_jsonl(path, [*lines, line], run_dir)


def append_line(path: str | Path, line: dict[str, Any], run_dir: Path | None = None) -> None:
    """Append ``line`` as one JSON line to ``path`` (created if missing) in one write, then
    sync it. If the write fails, the file is cut back to its length before, and the error
    raised as :func:`write_failure`'s."""
    path = Path(path)
    data = memoryview((json.dumps(line) + "\n").encode())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as error:
        raise write_failure(error, path, run_dir) from error
    try:
        size = os.fstat(fd).st_size
        try:
            while data:  # a regular file takes it in one write unless the disk fills
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise write_failure(error, path, run_dir) from error
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file, but a last line without its newline that does not
    parse: one still being appended, or cut short by a kill (:func:`append_line`)."""
    text = Path(path).read_text()
    rows = text.splitlines()
    lines = []
    for index, row in enumerate(rows):
        if not row.strip():
            continue
        try:
            lines.append(json.loads(row))
        except ValueError:
            if index == len(rows) - 1 and not text.endswith("\n"):
                break
            raise
    return lines


def read_json(path: str | Path, default: Any = None) -> Any:
    """``path``'s JSON, or ``default`` when it is missing or does not parse."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def remove_stale_temporaries(run_dir: Path) -> None:
    """Remove temporary files that a killed writer left in ``run_dir`` (call with the lock
    held: no other process writes there then)."""
    for tmp in run_dir.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def now() -> str:
    """Local time as ``2026-11-23T08:21:00+0100``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --------------------------------------------------------------------------------------
# metrics.jsonl: step lines and event lines


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The step lines of a run's ``metrics.jsonl`` (event lines left out)."""
    return [line for line in read_metrics_and_events(run_dir) if EVENT_KEY not in line]


def read_metrics_and_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every line of a run's ``metrics.jsonl``, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise RunError(f"no {METRICS_FILE} in {run_dir}")
    return read_jsonl(path)


def merge_events(history: list[dict[str, Any]], events: list[dict[str, Any]],
                 step_key: str = "generation") -> list[dict[str, Any]]:
    """Step lines with each event placed after the step it followed (``after_step``)."""
    merged, pending = [], sorted(events, key=lambda e: e.get("after_step", 0))
    for line in history:
        while pending and pending[0].get("after_step", 0) < line[step_key]:
            merged.append(pending.pop(0))
        merged.append(line)
    return merged + pending


def write_metrics(run_dir: Path, history: list[dict[str, Any]],
                  events: list[dict[str, Any]] = (), step_key: str = "generation") -> None:
    """Replace ``metrics.jsonl`` with ``history`` and ``events`` (:func:`merge_events`),
    atomically."""
    write_jsonl(run_dir / METRICS_FILE, merge_events(history, list(events), step_key), run_dir)


def append_metrics(run_dir: Path, line: dict[str, Any]) -> None:
    """Append one step's ``line`` to ``metrics.jsonl`` (:func:`append_line`); the file must
    already hold every line and event before it."""
    append_line(run_dir / METRICS_FILE, line, run_dir)


# --------------------------------------------------------------------------------------
# status.json


def read_status(run_dir: Path) -> dict[str, Any]:
    status = read_json(run_dir / STATUS_FILE, {})
    return status if isinstance(status, dict) else {}


STOP_FIELDS = ("message", "reason", "resume")  # what a stop says, dropped once it goes on


def write_status(run_dir: Path, state: str, **fields: Any) -> None:
    """Record ``state`` (``running``, ``finished``, ``stopped``) keeping ``started`` (and
    the other fields, but what a stop said once the run is no longer stopped)."""
    status = read_status(run_dir)
    if state != "stopped":
        for name in STOP_FIELDS:
            status.pop(name, None)
    status.update(fields, state=state, updated=now())
    status.setdefault("started", now())
    write_json(run_dir / STATUS_FILE, status, run_dir)
