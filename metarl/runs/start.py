"""Starting a run in a directory, the same way for every run kind.

:func:`new_run_dir` names a fresh directory; :func:`started_run` creates it, takes its lock
(:mod:`metarl.runs.lock`), refuses a directory that holds another run
(:func:`metarl.runs.resume.check_fresh`), writes the config, the first config-history line
and the status, and keeps the lock while the run kind trains in its ``with`` block. Under
:mod:`jax.distributed` every process calls it; only process 0 writes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metarl.runs import config_history
from metarl.runs.layout import (
    CONFIG_FILE,
    RunError,
    now,
    remove_stale_temporaries,
    write_json,
    write_status,
)
from metarl.runs.lock import hold_run_lock
from metarl.runs.resume import check_fresh


def new_run_dir(output_dir: str | Path, name: str) -> Path:
    """A fresh directory ``<output_dir>/<name>-<timestamp>`` (suffixed if it exists)."""
    base = Path(output_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, suffix = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    return candidate


def create_run_dir(run_dir: Path, barrier: str) -> None:
    """Create ``run_dir`` (process 0 of a multi-process run; the others wait at the
    ``barrier`` of that name), a :class:`RunError` naming it when that fails."""
    from metarl import distributed

    if distributed.is_primary():
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunError(f"cannot create {run_dir}: {error.strerror or error}") from error
    distributed.barrier(barrier)


def copy_files(run_dir: Path, files: Mapping[str, Path]) -> None:
    """Copy each ``file`` to ``run_dir / path`` (folders created; a file already there is
    kept when it is that very file); a :class:`RunError` naming it when that fails."""
    for inside, source in files.items():
        target = run_dir / inside
        try:
            if target.exists() and target.samefile(source):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        except OSError as error:
            raise RunError(f"cannot copy {source} to {target}: "
                           f"{error.strerror or error}") from error


@contextmanager
def started_run(run_dir: Path, config: dict[str, Any], *, command: str,
                normalize: Callable[[dict[str, Any]], dict[str, Any]],
                budget_fields: Iterable[str], files: Mapping[str, Path] | None = None,
                **status: Any) -> Iterator[None]:
    """Create ``run_dir`` for a new run of ``config`` (plain data) and hold its lock for the
    ``with`` block. ``command`` names the holder in the lock; ``files`` (``{path inside
    run_dir: file}``) are copied in before the config is written (what the config reads
    from outside, e.g. its objective's module); ``status`` adds fields to ``status.json``
    (e.g. the run kind and its budget)."""
    from metarl import distributed

    create_run_dir(run_dir, "metarl-start-mkdir")
    with hold_run_lock(run_dir, command):
        check_fresh(run_dir, config, normalize=normalize, budget_fields=budget_fields)
        distributed.barrier("metarl-start-checked")  # all have looked before 0 writes
        if distributed.is_primary():
            remove_stale_temporaries(run_dir)
            copy_files(run_dir, files or {})
            write_json(run_dir / CONFIG_FILE, config, run_dir)
            config_history.record(run_dir, "start", config=config)
            write_status(run_dir, "running", started=now(), **status)
        distributed.barrier("metarl-start-created")
        yield
