"""A parent directory of replicated runs: ``N`` ordinary run directories run together.

A run with ``N > 1`` replicates (an evolution experiment's ``es.evolution_seeds``) writes,
instead of one run directory, a parent::

    PARENT/replicates.json      what the parent holds (below)
    PARENT/run.lock             held while a process starts or resumes the replicates
    PARENT/seed_0/ ... seed_{N-1}/
                                ordinary run directories (:mod:`metarl.runs.layout`), each
                                resumable, evaluable and plottable on its own
    PARENT/evaluations/<n>.json verdicts across the replicates (:mod:`metarl.runs.evaluations`)

``replicates.json`` holds ``kind`` (the run kind of every replicate), ``replicates`` (the
replicate directories' names, in order), ``count``, ``base_seed`` (replicate ``i`` runs
with ``run.seed = base_seed + i``), ``config`` (the experiment config as started, plain
data) and what the kind records for all replicates at once (for evolution, the
normalisation ``baselines`` measured once for every seed). Nothing here starts JAX.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metarl.runs.layout import CONFIG_FILE, RunError, now, read_json, write_json

REPLICATES_FILE = "replicates.json"
REPLICATE_PREFIX = "seed_"


def replicate_names(count: int) -> list[str]:
    """``["seed_0", ..., "seed_{count-1}"]``: the replicate directories of a parent."""
    return [f"{REPLICATE_PREFIX}{index}" for index in range(count)]


def is_replicated(path: str | Path) -> bool:
    """Whether ``path`` is a parent of replicated runs (it holds ``replicates.json``)."""
    return (Path(path) / REPLICATES_FILE).is_file()


def read_replicates(parent: str | Path) -> dict[str, Any]:
    """The parent's ``replicates.json`` (a :class:`RunError` when it is missing or not the
    table this module writes)."""
    parent = Path(parent)
    if not parent.is_dir():
        raise RunError(f"run directory not found: {parent}")
    data = read_json(parent / REPLICATES_FILE)
    names = data.get("replicates") if isinstance(data, dict) else None
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)
            and isinstance(data.get("config"), dict)):
        raise RunError(f"{parent} is not a parent of replicated runs: its {REPLICATES_FILE} "
                       "is missing or does not read back")
    return data


def write_replicates(parent: Path, kind: str, config: dict[str, Any], count: int,
                     base_seed: int, **fields: Any) -> dict[str, Any]:
    """Write the parent's ``replicates.json`` (atomically) and return it; ``fields`` are
    what the kind keeps for all replicates (e.g. ``baselines``)."""
    data = {"kind": kind, "count": count, "base_seed": base_seed,
            "replicates": replicate_names(count), "config": config, "updated": now(),
            **fields}
    write_json(parent / REPLICATES_FILE, data, parent)
    return data


def replicate_dirs(parent: str | Path) -> list[Path]:
    """The replicate directories of ``parent``, in order (those not created yet too)."""
    parent = Path(parent)
    return [parent / name for name in read_replicates(parent)["replicates"]]


def expand_replicates(paths: list[str | Path]) -> list[Path]:
    """``paths`` with every parent of replicated runs replaced by its replicates that are
    run directories (have a ``config.json``), in order."""
    expanded = []
    for path in map(Path, paths):
        if is_replicated(path) and not (path / CONFIG_FILE).is_file():
            expanded += [d for d in replicate_dirs(path) if (d / CONFIG_FILE).is_file()]
        else:
            expanded.append(path)
    return expanded
