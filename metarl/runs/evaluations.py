"""Every evaluation made of a run, kept side by side in ``<run_dir>/evaluations/<n>.json``.

An evaluation costs minutes of compute, so none replaces another: each is saved under the
next free number with what defines it (its ``spec``: environments, seeds, budget, which
meta-parameters and their digest, baselines), and an identical request finds the earlier
record instead of recomputing it, unless the caller asks to rerun it, which replaces that
record in place. Runs written before this layout have one ``evaluation.json``; it is
still read, as the record with id ``"legacy"``.

:func:`saved_evaluation` is how every run kind's evaluation is kept (or found again);
:func:`list_records` is the one reader that plots and comparisons use.
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
