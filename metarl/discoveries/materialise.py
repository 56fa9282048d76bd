"""A discovery file as a run directory, so that ``metarl evaluate FILE`` evaluates it as any
evolution run.

:func:`materialise` writes, into a folder of the cache (default
``~/.cache/metarl/discoveries/<id>``, ``$XDG_CACHE_HOME`` respected) or a given one:

* ``config.json``: the experiment from the card (``found_under.experiment``);
* the candidate's meta-parameters file (``mean_meta_params.msgpack`` or
  ``best_meta_params.msgpack``);
* ``distill.json`` with the card's distilled formulas, where it has some;
* ``status.json`` saying it came from an exported file (``state = "exported"``, the
  file's id and card's source);
* ``held_out_roots.json`` with the held-out roots (``eval_seed``) of the evaluations its
  card's verdicts come from, so that its first evaluation draws other held-out seeds
  (:func:`metarl.runs.evaluations.used_eval_seeds`).

The folder is named by the discovery's id (the sha256 of its arrays and experiment), so
evaluating the same discovery again finds the folder and its earlier ``evaluations/``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from metarl.discoveries import zoo
from metarl.discoveries.fileformat import read_discovery
from metarl.evolve.distill import DISTILL_FILE
from metarl.runs.evaluations import write_used_roots
from metarl.runs.layout import CONFIG_FILE, STATUS_FILE, RunError, now, read_json, write_json
from metarl.runs.meta_params import CANDIDATE_FILES, save_meta_params

ZOO_PREFIX = "zoo:"
EXPORTED_STATE = "exported"
ID_LENGTH = 16


def is_discovery(source: str | Path) -> bool:
    """Whether ``source`` names a discovery rather than a run directory: ``zoo:<name>``, or
    an existing file (not a folder)."""
    text = str(source)
    return text.startswith(ZOO_PREFIX) or Path(source).is_file()


def discovery_path(source: str | Path) -> Path:
    """The file of a discovery named as :func:`is_discovery` accepts it."""
    text = str(source)
    if text.startswith(ZOO_PREFIX):
        return zoo.entry_path(text[len(ZOO_PREFIX):])
    return Path(source)


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/metarl/discoveries`` (``~/.cache`` when it is not set)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "metarl" / "discoveries"


def discovery_id(card: dict[str, Any]) -> str:
    """The first hex digits of the sha256 of the card's arrays checksum, candidate and
    experiment: equal for every export of one candidate of one run."""
    experiment = card.get("found_under", {}).get("experiment")
    text = json.dumps([card["meta_params"]["sha256"], card.get("candidate"), experiment],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:ID_LENGTH]


def materialise(source: str | Path, into: str | Path | None = None) -> tuple[Path, dict]:
    """The run directory of the discovery ``source`` (a file or ``zoo:<name>``), written if
    it is not there yet, and the discovery's card.

    Raises:
        DiscoveryFileError: the file does not read (:func:`read_discovery`).
        RunError: ``into`` holds something else than this discovery (another run, other
            files), or the card has no experiment to evaluate under.
    """
    path = discovery_path(source)
    card, meta_params = read_discovery(path)
    experiment = (card.get("found_under") or {}).get("experiment")
    candidate = card.get("candidate")
    if not isinstance(experiment, dict) or candidate not in CANDIDATE_FILES:
        raise RunError(f"{path}: its card has no experiment or candidate to evaluate under")
    identity = discovery_id(card)
    run_dir = Path(into) if into is not None else cache_root() / identity
    status = read_json(run_dir / STATUS_FILE, {}) if run_dir.is_dir() else {}
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if not (isinstance(status, dict) and status.get("discovery_id") == identity):
            raise RunError(f"{run_dir} already holds something else than the discovery "
                           f"{path}; name an empty or new folder")
        return run_dir, card
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CONFIG_FILE, experiment, run_dir)
    save_meta_params(run_dir / CANDIDATE_FILES[candidate], meta_params)
    if card.get("distilled"):
        write_json(run_dir / DISTILL_FILE, {"candidates": {candidate: card["distilled"]}},
                   run_dir)
    verdicts = card.get("verdicts") if isinstance(card.get("verdicts"), dict) else {}
    write_used_roots(run_dir, [c.get("eval_seed") for c in verdicts.get("comparisons") or []
                               if isinstance(c, dict)],
                     f"the evaluations of run {card.get('source', {}).get('run_dir')} "
                     "behind the card's verdicts")
    write_json(run_dir / STATUS_FILE, {
        "kind": "evolve", "state": EXPORTED_STATE, "started": now(), "updated": now(),
        "generation": card.get("generation"), "discovery_id": identity,
        "message": f"materialised from the exported discovery {path} (candidate "
                   f"{candidate}, from run {card.get('source', {}).get('run_dir')}); it "
                   "has no checkpoint and cannot be resumed, only evaluated",
    }, run_dir)
    return run_dir, card
