"""The discovery file: one ``.npz`` holding a learned objective's meta-parameters and a card
that says what they are.

Layout (written with :func:`numpy.savez_compressed`)::

    value/layers/0/w   float32 array, one entry per meta-parameter leaf, keyed by its path
    value/layers/0/b   in the meta-parameters ("/"-joined dict keys and list indices)
    ...
    __card__           0-d numpy unicode array: the card as JSON text

Nothing in the file is pickled and no code runs to read it: plain numpy reads every array
and the card without metarl, e.g.::

    import json, numpy as np
    with np.load("lpo_cpu-mean.npz", allow_pickle=False) as data:
        card = json.loads(str(data["__card__"]))
        weights = {key: data[key] for key in data.files if key != "__card__"}

The card (plain JSON) holds ``format`` (``"metarl.discovery"``), ``format_version``, the
objective (registered name, options, slots), the meta-parameters' tree (each leaf's path,
shape and dtype) with the sha256 of their bytes, and what :mod:`metarl.discoveries.card`
adds: the inputs each slot reads, what it was found under, its verdicts, distilled
formulas and caveats. :func:`read_discovery` checks the format, version, tree and checksum
and refuses anything else with a :class:`DiscoveryFileError`.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "metarl.discovery"
FORMAT_VERSION = 1
CARD_KEY = "__card__"
PATH_SEPARATOR = "/"
# What every card holds, whatever wrote it; the rest is read where it is present.
REQUIRED_FIELDS = ("format", "format_version", "objective", "meta_params")


class DiscoveryFileError(ValueError):
    """A file that is not a discovery this metarl can read: damaged, foreign, or newer."""


def flatten_tree(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """``{path: array}`` of every leaf of ``tree`` (nested dicts and lists of arrays), in a
    fixed order: dict keys sorted, list items in order; paths join keys and indices with
    ``"/"`` (``value/layers/0/w``). Empty dicts and lists leave no entry."""
    if isinstance(tree, Mapping):
        flat = {}
        for key in sorted(tree):
            if PATH_SEPARATOR in str(key) or not str(key):
                raise ValueError(f"a meta-parameter key cannot be empty or hold "
                                 f"{PATH_SEPARATOR!r}: {key!r}")
            flat.update(flatten_tree(tree[key], f"{prefix}{key}{PATH_SEPARATOR}"))
        return flat
    if isinstance(tree, list | tuple):
        flat = {}
        for index, item in enumerate(tree):
            flat.update(flatten_tree(item, f"{prefix}{index}{PATH_SEPARATOR}"))
        return flat
    return {prefix.rstrip(PATH_SEPARATOR): np.asarray(tree)}


def tree_layout(tree: Any) -> Any:
    """The structure of ``tree`` with every leaf replaced by ``None``: what the card keeps
    so that empty slots (``{"policy": {}}``) and lists survive the round trip."""
    if isinstance(tree, Mapping):
        return {str(key): tree_layout(tree[key]) for key in sorted(tree)}
    if isinstance(tree, list | tuple):
        return [tree_layout(item) for item in tree]
    return None


def unflatten_tree(layout: Any, arrays: Mapping[str, np.ndarray], prefix: str = "") -> Any:
    """The tree of ``layout`` (:func:`tree_layout`) with its leaves from ``arrays`` (keyed
    as :func:`flatten_tree` keys them)."""
    if isinstance(layout, dict):
        return {key: unflatten_tree(value, arrays, f"{prefix}{key}{PATH_SEPARATOR}")
                for key, value in layout.items()}
    if isinstance(layout, list):
        return [unflatten_tree(value, arrays, f"{prefix}{index}{PATH_SEPARATOR}")
                for index, value in enumerate(layout)]
    return arrays[prefix.rstrip(PATH_SEPARATOR)]


def arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over every array's path, dtype, shape and bytes (C order), in path order."""
    digest = hashlib.sha256()
    for path in sorted(arrays):
        array = np.ascontiguousarray(arrays[path])
        digest.update(json.dumps([path, array.dtype.str, list(array.shape)]).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def tree_description(arrays: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """``[{"path", "shape", "dtype"}]`` of every array, in path order."""
    return [{"path": path, "shape": list(np.shape(arrays[path])),
             "dtype": str(np.asarray(arrays[path]).dtype)} for path in sorted(arrays)]


def discovery_bytes(meta_params: Any, card: Mapping[str, Any]) -> tuple[bytes, dict]:
    """The file's bytes for ``meta_params`` (a pytree of arrays) and ``card`` (plain JSON
    data), and the card as written: with ``format``, ``format_version`` and
    ``meta_params`` (``layout``, ``tree``, ``sha256``) filled in from the arrays."""
    arrays = flatten_tree(meta_params)
    if CARD_KEY in arrays:
        raise ValueError(f"a meta-parameter cannot be named {CARD_KEY!r}")
    card = dict(card)
    card["format"], card["format_version"] = FORMAT, FORMAT_VERSION
    card["meta_params"] = {**dict(card.get("meta_params", {})),
                           "layout": tree_layout(meta_params),
                           "tree": tree_description(arrays), "sha256": arrays_sha256(arrays)}
    text = json.dumps(card, sort_keys=True, allow_nan=False)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays, **{CARD_KEY: np.asarray(text)})
    return buffer.getvalue(), card


def write_discovery(path: str | Path, meta_params: Any, card: Mapping[str, Any],
                    force: bool = False) -> dict:
    """Write the discovery file at ``path`` (:func:`discovery_bytes`) and return its card.

    Raises:
        FileExistsError: ``path`` exists and ``force`` is false.
    """
    path = Path(path)
    data, written = discovery_bytes(meta_params, card)
    with open(path, "wb" if force else "xb") as file:
        file.write(data)
    return written


def read_discovery(source: str | Path | bytes) -> tuple[dict, Any]:
    """``(card, meta_params)`` of a discovery file (a path or its bytes): numpy arrays in
    the tree the card describes, checked against the card's shapes, dtypes and sha256.

    Raises:
        DiscoveryFileError: the file is not an npz (damaged or not a discovery), has no
            card (a foreign npz), a card that is not JSON or lacks a field, a format or
            version this metarl does not read, or arrays that do not match the card.
    """
    name = "the given bytes" if isinstance(source, bytes) else str(source)
    raw = source if isinstance(source, bytes) else _read_bytes(Path(source))
    try:
        archive = np.load(io.BytesIO(raw), allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an npz archive")
        with archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as error:
        raise DiscoveryFileError(f"{name} is damaged or not a discovery file: it does not "
                                 f"read as a numpy .npz archive ({error})") from None
    if CARD_KEY not in arrays:
        raise DiscoveryFileError(f"{name} is not a metarl discovery: the npz has no "
                                 f"{CARD_KEY!r} entry (arrays: {sorted(arrays)[:5]})")
    card = _card(name, arrays.pop(CARD_KEY))
    _check_arrays(name, card, arrays)
    return card, unflatten_tree(card["meta_params"]["layout"], arrays)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DiscoveryFileError(f"no discovery file at {path}") from None
    except OSError as error:
        raise DiscoveryFileError(f"cannot read {path}: {error}") from None


def _card(name: str, entry: np.ndarray) -> dict:
    """The card in ``entry``, its format and version checked."""
    if entry.shape != () or entry.dtype.kind != "U":
        raise DiscoveryFileError(f"{name} is damaged: its {CARD_KEY} is not a 0-d text array")
    try:
        card = json.loads(str(entry))
    except ValueError as error:
        raise DiscoveryFileError(f"{name} is damaged: its card is not valid JSON "
                                 f"({error})") from None
    if not isinstance(card, dict):
        raise DiscoveryFileError(f"{name} is damaged: its card is not a JSON object")
    missing = [field for field in REQUIRED_FIELDS if field not in card]
    if missing:
        raise DiscoveryFileError(f"{name} is damaged: its card lacks {', '.join(missing)}")
    if card["format"] != FORMAT:
        raise DiscoveryFileError(f"{name} is not a metarl discovery: its card's format is "
                                 f"{card['format']!r}, not {FORMAT!r}")
    version = card["format_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DiscoveryFileError(f"{name} is damaged: format_version {version!r} is not a "
                                 "positive integer")
    if version > FORMAT_VERSION:
        raise DiscoveryFileError(
            f"{name} was written by a newer metarl (discovery format version {version}; this "
            f"metarl reads up to {FORMAT_VERSION}); upgrade metarl to read it")
    meta = card["meta_params"]
    if not (isinstance(meta, dict) and all(key in meta for key in ("layout", "tree",
                                                                   "sha256"))):
        raise DiscoveryFileError(f"{name} is damaged: its card's meta_params lacks layout, "
                                 "tree or sha256")
    return card


def _check_arrays(name: str, card: dict, arrays: dict[str, np.ndarray]) -> None:
    """The arrays are those the card lists, of its shapes and dtypes, with its checksum."""
    meta = card["meta_params"]
    if tree_description(arrays) != meta["tree"]:
        listed = {entry.get("path") for entry in meta["tree"] if isinstance(entry, dict)}
        differ = sorted(set(arrays) ^ listed) or [
            entry["path"] for entry in tree_description(arrays) if entry not in meta["tree"]]
        raise DiscoveryFileError(f"{name} is damaged: its arrays do not match the card's "
                                 f"tree (paths, shapes or dtypes differ at {differ[:5]})")
    if arrays_sha256(arrays) != meta["sha256"]:
        raise DiscoveryFileError(f"{name} is damaged: the checksum of its arrays does not "
                                 f"match the card's sha256 {meta['sha256'][:12]}...")
