"""A run's config over time: compare the config a run continues with against the one its
checkpoint was saved with, and keep the history of what changed.

Resuming continues the experiment the checkpoint belongs to, so its config must be the one
saved in the checkpoint. Only the step budget (``es.generations`` for evolution: how far to
run) may change freely. Any other difference is refused with the list of changed fields,
unless the user accepts it explicitly (``metarl resume --accept-config-change``); an
accepted change is recorded in ``config_history.jsonl`` and as an event line in
``metrics.jsonl``, so that nobody reads two experiments as one.

``config_history.jsonl`` holds one JSON object per line: ``{"event": "start", "time",
"config"}`` when the run starts, then ``{"event": "config_change", "time", "after_step",
"changes", "config"}`` for every accepted change and ``{"event": "budget", ...}`` for every
change of the budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from metarl.runs.layout import CONFIG_HISTORY_FILE, RunError, append_jsonl, now, read_jsonl


class ConfigChangedError(RunError):
    """The run's config differs from the checkpoint's in more than the budget."""


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"es": {"sigma": 0.1}, "inner": [{"gamma": 0.9}]}`` ->
    ``{"es.sigma": 0.1, "inner[0].gamma": 0.9}`` (lists of plain values stay whole)."""
    if isinstance(data, dict):
        if not data and prefix:
            return {prefix: data}
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        flat = {}
        for index, value in enumerate(data):
            flat.update(flatten(value, f"{prefix}[{index}]"))
        return flat
    return {prefix: data}


def config_changes(saved: dict[str, Any], current: dict[str, Any]
                   ) -> list[tuple[str, Any, Any]]:
    """``(field path, saved value, current value)`` for every field that differs
    (a field present on one side only shows ``None`` on the other)."""
    before, after = flatten(saved), flatten(current)
    changes = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if json.dumps(old, sort_keys=True) != json.dumps(new, sort_keys=True):
            changes.append((path, old, new))
    return changes


def format_changes(changes: Iterable[tuple[str, Any, Any]]) -> str:
    """``es.sigma 0.05 -> 0.1; run.seed 0 -> 1``."""
    return "; ".join(f"{path} {json.dumps(old)} -> {json.dumps(new)}"
                     for path, old, new in changes)


def check_config_change(saved: dict[str, Any], current: dict[str, Any], *,
                        budget_fields: Iterable[str], accept: bool, where: str,
                        normalize: Callable[[dict[str, Any]], dict[str, Any]] = lambda d: d,
                        ) -> list[tuple[str, Any, Any]]:
    """The changes from ``saved`` to ``current`` beyond the budget (empty when there are
    none); raises :class:`ConfigChangedError` listing them unless ``accept``.

    ``normalize`` brings both configs to one form first (defaults filled in, old spellings
    upgraded), so only real differences count.
    """
    budget = set(budget_fields)
    changes = [change for change in config_changes(normalize(saved), normalize(current))
               if change[0] not in budget]
    if changes and not accept:
        allowed = ", ".join(sorted(budget)) or "nothing"
        raise ConfigChangedError(
            f"{where}: its config differs from the one its checkpoint was saved with in "
            f"{len(changes)} field(s): {format_changes(changes)}. Only the budget "
            f"({allowed}) may change when a run continues: restore those fields, start a "
            "new run, or pass --accept-config-change to continue this run with the change "
            "recorded in it"
        )
    return changes


def change_record(changes: list[tuple[str, Any, Any]]) -> list[dict[str, Any]]:
    return [{"field": path, "old": old, "new": new} for path, old, new in changes]


def record(run_dir: Path, event: str, **fields: Any) -> dict[str, Any]:
    """Append ``{"event": event, "time": ..., **fields}`` to ``config_history.jsonl``."""
    entry = {"event": event, "time": now(), **fields}
    append_jsonl(run_dir / CONFIG_HISTORY_FILE, entry, run_dir)
    return entry


def read_config_history(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / CONFIG_HISTORY_FILE
    return read_jsonl(path) if path.is_file() else []
