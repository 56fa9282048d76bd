"""``metarl runs [DIR]``: what run directories there are and what state each is in.

A run is

- ``running`` while a process holds its lock (:mod:`metarl.runs.lock`);
- ``finished`` once it has completed its budget;
- ``stopped`` when it stopped itself (e.g. every candidate invalid for too long) or was
  stopped by its time limit or a signal (:mod:`metarl.runs.stopping`), and nobody has
  resumed it since;
- ``interrupted`` otherwise: killed, crashed or out of disk; ``metarl resume`` continues it
  (from its last checkpoint, or from the beginning when it never reached one).

Nothing here starts JAX or opens a checkpoint: the state comes from the lock, the files'
names, ``status.json`` and the last line of ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarl.runs.layout import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    EVENT_KEY,
    METRICS_FILE,
    read_json,
    read_status,
)
from metarl.runs.lock import describe_holder, lock_holder

MAX_DEPTH = 3  # how deep below DIR to look for run directories


@dataclass(frozen=True)
class RunInfo:
    """One run directory as ``metarl runs`` shows it.

    Attributes:
        path: the directory.
        name: the experiment's name.
        state: ``running``, ``finished``, ``stopped`` or ``interrupted``.
        generation: steps completed (the last line of ``metrics.jsonl``; 0 before any).
        budget: steps the run is to complete.
        checkpoint: the newest checkpoint's step (``None`` before the first).
        best_fitness: best fitness so far (NaN before any valid candidate).
        started: when the run started (``YYYY-MM-DD HH:MM``).
        holder: who holds the lock, for a running run.
        reason: why a stopped run stopped, when a time limit or a signal stopped it.
    """

    path: Path
    name: str
    state: str
    generation: int
    budget: int | None
    checkpoint: int | None
    best_fitness: float
    started: str
    holder: dict[str, Any] | None = None
    reason: str | None = None


def _last_step_line(path: Path) -> dict[str, Any] | None:
    """The last summary line of ``metrics.jsonl`` (read from the end: the file can be long)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            chunk = 1 << 16
            while True:
                start = max(0, size - chunk)
                handle.seek(start)
                lines = handle.read(size - start).decode(errors="replace").splitlines()
                for raw in reversed(lines[1:] if start > 0 else lines):
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(line, dict) and EVENT_KEY not in line:
                        return line
                if start == 0:
                    return None
                chunk *= 4
    except OSError:
        return None


def _newest_checkpoint(run_dir: Path) -> int | None:
    folder = run_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return None
    steps = [int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(steps, default=None)


def _started(run_dir: Path, status: dict[str, Any]) -> str:
    if status.get("started"):
        return str(status["started"])[:16].replace("T", " ")
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime((run_dir / CONFIG_FILE)
                                                             .stat().st_mtime))
    except OSError:
        return "?"


def run_info(run_dir: str | Path) -> RunInfo:
    """The state of one run directory."""
    run_dir = Path(run_dir)
    config = read_json(run_dir / CONFIG_FILE, {}) or {}
    status = read_status(run_dir)
    last = _last_step_line(run_dir / METRICS_FILE) or {}
    # evolution and CEM-RL count generations, PBT and DvD segments; a population kind's
    # budget is in status.json
    generation = int(last.get("generation", last.get("segment", 0)))
    budget = (config.get("es") or {}).get("generations") if isinstance(config, dict) else None
    budget = budget if budget is not None else status.get("budget")
    best = last.get("best_fitness_so_far", last.get("best_return_so_far"))
    best = float(best) if isinstance(best, int | float) else math.nan
    holder = lock_holder(run_dir)
    checkpoint = _newest_checkpoint(run_dir)
    if holder is not None:
        state = "running"
    elif budget is not None and checkpoint is not None and checkpoint >= budget:
        state = "finished"
    elif status.get("state") == "stopped" and status.get("generation") == checkpoint:
        state = "stopped"
    else:
        state = "interrupted"
    reason = status.get("reason") if state == "stopped" else None
    return RunInfo(run_dir, str(config.get("name", run_dir.name)), state, generation,
                   budget, checkpoint, best, _started(run_dir, status), holder,
                   reason if isinstance(reason, str) else None)


def find_runs(root: str | Path, depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories (those with a ``config.json``) at or below ``root``, sorted."""
    root = Path(root)
    if (root / CONFIG_FILE).is_file():
        return [root]
    if depth == 0 or not root.is_dir():
        return []
    found = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir()
                          and not p.name.startswith("."))
    except OSError:
        return []
    for child in children:
        found += find_runs(child, depth - 1)
    return found


def list_runs(root: str | Path) -> list[RunInfo]:
    return [run_info(path) for path in find_runs(root)]


def format_runs(runs: list[RunInfo], root: str | Path | None = None) -> str:
    """A plain-text table of ``runs`` (paths relative to ``root``)."""
    if not runs:
        return f"no run directories in {root}" if root is not None else "no run directories"

    def where(path: Path) -> str:
        try:
            return str(path.relative_to(root)) if root is not None else str(path)
        except ValueError:
            return str(path)

    rows = [("run", "state", "generation", "best fitness", "started", "")]
    for run in runs:
        reached = f"{run.generation}/{run.budget}" if run.budget else str(run.generation)
        note = ""
        if run.state == "running":
            note = f"by {describe_holder(run.holder)}"
        elif run.state in ("interrupted", "stopped"):
            note = (f"resumes from checkpoint {run.checkpoint}" if run.checkpoint is not None
                    else "resumes from the start (no checkpoint yet)")
            if run.reason:  # a time limit's reason holds its numbers: the cause suffices
                note = f"by {run.reason.split(' (')[0]}; {note}"
        best = f"{run.best_fitness:.4g}" if math.isfinite(run.best_fitness) else "-"
        rows.append((where(run.path) or ".", run.state, reached, best, run.started, note))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)
