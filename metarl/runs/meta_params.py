"""Meta-parameter files of a run: the evolved parameters of a learned objective, kept beside
the checkpoints so that evaluation, figures and comparisons read them without restoring a
checkpoint.

An evolution run keeps two (flax msgpack, written atomically after every generation)::

    best_meta_params.msgpack   best candidate so far
    mean_meta_params.msgpack   current centre of the search distribution
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from metarl.runs.layout import RunError, atomic_write

BEST_FILE = "best_meta_params.msgpack"
MEAN_FILE = "mean_meta_params.msgpack"
CANDIDATE_FILES = {"mean": MEAN_FILE, "best": BEST_FILE}


def save_meta_params(path: str | Path, meta_params) -> None:
    """Write meta-parameters (a pytree of arrays) as flax msgpack, atomically."""
    arrays = jax.tree.map(np.asarray, jax.device_get(meta_params))
    atomic_write(Path(path), serialization.msgpack_serialize(
        serialization.to_state_dict(arrays)
    ))


def meta_params_sha256(path: str | Path) -> str:
    """The SHA-256 of a meta-parameter file's bytes: what an evaluation record keeps to say
    which meta-parameters it judged, and a discovery's card compares with it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_meta_params(path: str | Path, template=None):
    """Read meta-parameters written by :func:`save_meta_params`.

    With a ``template`` (e.g. ``objective.init(key)``) the result has its exact structure;
    without one, the lists the file holds come back as lists: msgpack stores them as dicts
    keyed ``"0"``, ..., ``"n-1"``, and every dict keyed exactly so is read as a list.
    """
    path = Path(path)
    if not path.is_file():
        raise RunError(f"no meta-parameters file at {path}")
    raw = serialization.msgpack_restore(path.read_bytes())
    if template is None:
        return lists_restored(raw)
    return serialization.from_state_dict(template, raw)


def lists_restored(tree: Any) -> Any:
    """``tree`` with every dict whose keys are exactly ``"0"``, ..., ``"n-1"`` (``n >= 1``)
    turned into the list of its values in that order, at any depth."""
    if isinstance(tree, dict):
        children = {key: lists_restored(value) for key, value in tree.items()}
        if children and set(children) == {str(index) for index in range(len(children))}:
            return [children[str(index)] for index in range(len(children))]
        return children
    if isinstance(tree, list | tuple):
        return type(tree)(lists_restored(value) for value in tree)
    return tree


def read_meta_params(path: str | Path, template: Any) -> Any:
    """Meta-parameters from ``path`` as float32 arrays in ``template``'s structure, or a
    :class:`~metarl.runs.layout.RunError` saying how they do not fit it."""
    path = Path(path)
    try:
        params = load_meta_params(path, template)
    except (TypeError, KeyError, ValueError):
        # Files written before lists were stored as {"0": ...} dicts hold the lists as they
        # were; their raw tree already has the template's structure.
        params = load_meta_params(path)
    expected, found = jax.tree.structure(template), jax.tree.structure(params)
    if expected != found:
        raise RunError(
            f"{path} does not hold meta-parameters of this run's objective: "
            f"expected {expected}, found {found}"
        )
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    for want, got in zip(jax.tree.leaves(template), jax.tree.leaves(params), strict=True):
        if np.shape(want) != np.shape(got):
            raise RunError(f"{path}: a meta-parameter has shape {np.shape(got)}, the "
                           f"objective's has {np.shape(want)}")
    return params


def read_candidates(run_dir: str | Path, template: Any) -> dict[str, Any]:
    """``{"mean": params, "best": params}`` for the meta-parameter files ``run_dir`` has
    (:func:`read_meta_params` of each)."""
    run_dir = Path(run_dir)
    return {which: read_meta_params(run_dir / filename, template)
            for which, filename in CANDIDATE_FILES.items() if (run_dir / filename).is_file()}
