"""Every evaluation made of a run, kept side by side in ``<run_dir>/evaluations/<n>.json``.

An evaluation costs minutes of compute, so none replaces another: each is saved under the
next free number with what defines it (its ``spec``: environments, seeds, budget, which
meta-parameters and their digest, baselines), and an identical request finds the earlier
record instead of recomputing it, unless the caller asks to rerun it, which replaces that
record in place. Runs written before this layout have one ``evaluation.json``; it is
still read, as the record with id ``"legacy"``.

:func:`saved_evaluation` is how every run kind's evaluation is kept (or found again);
:func:`list_records` is the one reader that plots and comparisons use.

Held-out seeds are meant to be looked at once: :func:`used_eval_seeds` gathers the roots
of the held-out key streams (``eval_seed``) that a run's evaluations used, and those of
evaluations made of the same candidate elsewhere (``held_out_roots.json``, written where
a run directory is made from an exported discovery), so that a new evaluation can draw a
root none of them used (:func:`fresh_root`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metarl.curves import record_text
from metarl.runs.layout import (
    EVALUATIONS_DIR,
    atomic_write,
    fsync_directory,
    now,
    temporary_path,
    write_failure,
)

LEGACY_FILE = "evaluation.json"
USED_ROOTS_FILE = "held_out_roots.json"  # {"roots": [int], "source": str}: used elsewhere


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        warnings.warn(f"skipping evaluation {path}: it does not read back ({error})",
                      UserWarning, stacklevel=3)
        return None


def list_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every evaluation of ``run_dir``, oldest first: the reports as saved, each with its
    ``id`` (``"legacy"`` for an old ``evaluation.json``, else the number ``n`` of
    ``evaluations/<n>.json``) and ``path``."""
    run_dir = Path(run_dir)
    records = []
    legacy = run_dir / LEGACY_FILE
    if legacy.is_file():
        data = _load(legacy)
        reports = data if isinstance(data, list) else (
            data.get("evaluations", [data]) if isinstance(data, dict) else [])
        for index, report in enumerate(reports):
            if isinstance(report, dict):
                name = "legacy" if len(reports) == 1 else f"legacy-{index + 1}"
                records.append({**report, "id": name, "path": str(legacy)})
    folder = run_dir / EVALUATIONS_DIR
    if folder.is_dir():
        numbered = sorted((int(p.stem), p) for p in folder.glob("*.json") if p.stem.isdigit())
        for number, path in numbered:
            report = _load(path)
            if isinstance(report, dict):
                records.append({**report, "id": number, "path": str(path)})
    return records


def find_same(run_dir: str | Path, spec: dict[str, Any],
              normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = None
              ) -> dict[str, Any] | None:
    """The latest saved evaluation whose spec equals ``spec``, if any. ``normalise`` maps a
    saved spec to the form specs have now (an option added since, filled with what it
    meant before) before comparing; the record itself is returned as saved."""
    wanted = json.dumps(spec, sort_keys=True)
    for record in reversed(list_records(run_dir)):
        saved = record.get("spec")
        if normalise is not None and isinstance(saved, dict):
            saved = normalise(saved)
        if json.dumps(saved, sort_keys=True) == wanted:
            return record
    return None


def save_record(run_dir: str | Path, report: dict[str, Any],
                replace: str | Path | None = None) -> Path:
    """Write ``report`` as ``evaluations/<n>.json`` under the next free ``n`` (or over the
    file ``replace``) and return its path. Two evaluations saved at once get two numbers."""
    run_dir = Path(run_dir)
    data = record_text(report).encode()
    if replace is not None:
        atomic_write(Path(replace), data, run_dir)
        return Path(replace)
    folder = run_dir / EVALUATIONS_DIR
    folder.mkdir(exist_ok=True)
    staged = temporary_path(folder / "new.json")
    atomic_write(staged, data, run_dir)
    try:
        number = max((int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()),
                     default=0) + 1
        while True:
            target = folder / f"{number}.json"
            try:
                os.link(staged, target)  # fails if another process took the number
                break
            except FileExistsError:
                number += 1
            except OSError as error:
                raise write_failure(error, target, run_dir) from error
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()
    fsync_directory(folder)
    return target


def saved_evaluation(run_dir: str | Path, spec: dict[str, Any],
                     compute: Callable[[], dict[str, Any]], rerun: bool = False,
                     normalise: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                     ) -> dict[str, Any]:
    """An evaluation of a run, kept as ``evaluations/<n>.json``.

    ``spec`` says what was evaluated (kind, checkpoint or meta-parameters, seeds, method);
    an earlier record with the same ``spec`` is returned as it is (``reused``) unless
    ``rerun``, when ``compute()`` makes the report again and replaces it. Saved specs are
    compared after ``normalise`` (:func:`find_same`). The report gets ``run_dir``,
    ``created``, ``spec``, ``path``, ``id``, ``reused`` and ``replaced``.
    """
    earlier = find_same(run_dir, spec, normalise)
    if earlier is not None and not rerun:
        return {**earlier, "reused": True}
    computed = compute()
    report = {"run_dir": str(run_dir), "created": now(), **computed, "spec": spec}
    replace = earlier["path"] if earlier is not None and earlier["id"] != "legacy" else None
    path = save_record(run_dir, report, replace=replace)
    return {**report, "path": str(path), "id": int(path.stem), "reused": False,
            "replaced": replace is not None}


def digest(*values: Any) -> str:
    """A short fingerprint of plain-JSON ``values`` (e.g. a checkpoint's last line), for an
    evaluation's ``spec``."""
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()


def used_eval_seeds(run_dir: str | Path, unrecorded: int | None = None) -> dict[int, list[Any]]:
    """Root of a held-out key stream -> the ids of ``run_dir``'s evaluations that used it
    (their ``eval_seed``, or their spec's; ``unrecorded`` for a record that names none, as
    old ones made at the default root), plus the roots :data:`USED_ROOTS_FILE` lists,
    under its ``source``."""
    run_dir = Path(run_dir)
    used: dict[int, list[Any]] = {}
    for record in list_records(run_dir):
        spec = record.get("spec") if isinstance(record.get("spec"), dict) else {}
        root = record.get("eval_seed", spec.get("eval_seed", unrecorded))
        if isinstance(root, int) and not isinstance(root, bool):
            used.setdefault(root, []).append(record["id"])
    elsewhere = run_dir / USED_ROOTS_FILE
    if elsewhere.is_file():
        data = _load(elsewhere)
        if isinstance(data, dict):
            for root in data.get("roots") or []:
                if isinstance(root, int) and not isinstance(root, bool):
                    used.setdefault(root, []).append(str(data.get("source", elsewhere.name)))
    return used


def fresh_root(taken: Any, start: int) -> int:
    """The first integer from ``start`` up that is not in ``taken`` (roots already used,
    and roots kept for other key streams)."""
    root = start
    while root in taken:
        root += 1
    return root


def write_used_roots(run_dir: str | Path, roots: Any, source: str) -> Path | None:
    """Write :data:`USED_ROOTS_FILE` into ``run_dir`` naming ``roots`` (held-out roots
    evaluations made elsewhere used, e.g. of the run a discovery was exported from) and
    their ``source``; nothing when there are none."""
    roots = sorted({int(r) for r in roots if isinstance(r, int) and not isinstance(r, bool)})
    if not roots:
        return None
    run_dir = Path(run_dir)
    path = run_dir / USED_ROOTS_FILE
    atomic_write(path, json.dumps({"roots": roots, "source": source}).encode(), run_dir)
    return path
