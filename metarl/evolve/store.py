"""A content-addressed store of what judging trains: trained once, reused exactly.

An evaluation is a plan of trainings (objective x environment x setting x seeds); most of
them do not depend on the objective being judged: a baseline's held-out rows, its tuning
search, its tuned held-out row, its points across a knob, the untrained policy a suite
normalises by. :class:`TrainingStore` keeps each such result under the SHA-256 of
everything that determines it: the caller's key parts (the environment and its settings,
the algorithm, the grid, the tuning and held-out seeds, the fitness metric, ...) and
:func:`code_version`, a digest of the inner loops' and objectives' source and of the jax
version and backend that ran them. A later evaluation asking for exactly the same thing
gets the stored result, bit for bit; a change to any part of the key is another entry.

Entries are JSON files ``<directory>/<key[:2]>/<key>.json`` written atomically (a temporary
file renamed into place), each holding its key, its key parts and the SHA-256 of its
payload. An entry that cannot be read, names another key or whose payload does not match
its digest is *damaged*: it is trained again and rewritten, never trusted. A store without
a directory keeps its entries in memory only (the evaluations of one process share them).

The default directory is ``$METARL_CACHE_DIR``, else ``$XDG_CACHE_HOME/metarl/trainings``,
else ``~/.cache/metarl/trainings``: the user's cache folder, never a run directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CODE_SOURCES", "STORE_FORMAT", "TrainingStore", "code_version", "default_directory",
           "key_of", "params_digest"]

STORE_FORMAT = 1
# the source whose change changes what a stored training holds: the algorithms, the
# objectives and how trainings become scores and tuning choices
CODE_SOURCES = ("inner_loops", "metarl/objectives", "metarl/evolve/fitness.py",
                "metarl/evolve/generation.py", "metarl/evolve/tuning.py", "metarl/sweep.py",
                "metarl/curves.py")
_ROOT = Path(__file__).resolve().parents[2]
_CODE_VERSION: str | None = None


def code_version() -> str:
    """SHA-256 over the Python source of :data:`CODE_SOURCES` (relative path and bytes of
    every ``.py`` file, in sorted order), the jax version, the default backend,
    ``XLA_FLAGS`` and the options judging compiles with
    (:func:`metarl.programs.judging_compiler_options`): a training stored under one code
    version is never returned to another."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        import jax

        from metarl.programs import judging_compiler_options

        # XLA's flags and options change float rounding (the test suite compiles at
        # another level)
        digest = hashlib.sha256(f"jax {jax.__version__} {jax.default_backend()} "
                                f"{_rounding_flags()} {judging_compiler_options()}".encode())
        files = []
        for source in CODE_SOURCES:
            path = _ROOT / source
            files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(_ROOT)).encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
        _CODE_VERSION = digest.hexdigest()
    return _CODE_VERSION


def _rounding_flags() -> str:
    """``XLA_FLAGS`` without the flags that only set how long CPU collectives wait
    (:func:`metarl.sharding.use_cpu_cores` adds one): waiting longer computes the same."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    return " ".join(f for f in flags if not f.startswith("--xla_cpu_collective_call_"))


def default_directory() -> Path:
    """Where a store keeps its entries unless told otherwise (module docstring)."""
    if os.environ.get("METARL_CACHE_DIR"):
        return Path(os.environ["METARL_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "metarl" / "trainings"


def _plain(part: Any) -> Any:
    """A key part as JSON data: a dataclass (an ``[inner]`` config, a tuning plan) as its
    fields, tuples as lists."""
    if dataclasses.is_dataclass(part) and not isinstance(part, type):
        return {"__class__": type(part).__name__,
                **{f.name: _plain(getattr(part, f.name)) for f in dataclasses.fields(part)}}
    if isinstance(part, dict):
        return {str(k): _plain(v) for k, v in part.items()}
    if isinstance(part, list | tuple):
        return [_plain(v) for v in part]
    return part


def key_of(parts: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(key, plain parts)``: the SHA-256 of the canonical JSON of ``parts`` and of
    :func:`code_version`, and the parts as stored beside it."""
    plain = _plain(list(parts))
    text = json.dumps({"parts": plain, "code": code_version(), "format": STORE_FORMAT},
                      sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest(), plain


def params_digest(tree: Any) -> str:
    """SHA-256 of a pytree of arrays (meta-parameters): every leaf's path, dtype, shape
    and bytes, in the tree's order."""
    import jax
    import numpy as np

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        array = np.asarray(leaf)
        digest.update(f"{jax.tree_util.keystr(path)} {array.dtype} {array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _payload_digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class TrainingStore:
    """Trainings kept by content (module docstring).

    Args:
        directory: where entries are kept across processes; ``None``: in memory only.

    Attributes:
        hits, misses, damaged: entries found, trained, and found damaged (and trained
            again) since the store was made.
    """

    def __init__(self, directory: str | Path | None = None):
        self.directory = None if directory is None else Path(directory).expanduser()
        self._memory: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = self.damaged = 0

    @classmethod
    def default(cls) -> TrainingStore:
        """A store in :func:`default_directory`."""
        return cls(default_directory())

    def path_of(self, key: str) -> Path | None:
        """The file of entry ``key`` (``None`` for a store in memory)."""
        return None if self.directory is None else self.directory / key[:2] / f"{key}.json"

    def get(self, parts: Sequence[Any], compute: Callable[[], Any],
            encode: Callable[[Any], Any] = lambda value: value,
            decode: Callable[[Any], Any] = lambda value: value) -> Any:
        """The result of the training ``parts`` names: stored, else ``compute()`` stored.

        ``encode`` turns a computed result into JSON data and ``decode`` turns that back;
        what is returned is always ``decode(encode(result))``, so a fresh and a stored
        answer are the same objects."""
        key, plain = key_of(parts)
        # several environments may train at once, in threads, each its own keys: only the
        # counts and the dictionary are shared
        with self._lock:
            payload = self._memory.get(key)
            if payload is not None:
                self.hits += 1
                return decode(payload)
        payload = self._read(key)
        trained = payload is None
        if trained:
            payload = json.loads(json.dumps(encode(compute())))
            self._write(key, plain, payload)
        with self._lock:
            self.misses += trained
            self.hits += not trained
            self._memory[key] = payload
        return decode(payload)

    def _read(self, key: str) -> Any | None:
        path = self.path_of(key)
        if path is None or not path.exists():
            return None
        try:
            entry = json.loads(path.read_text())
            if (entry["format"] == STORE_FORMAT and entry["key"] == key
                    and entry["payload_sha256"] == _payload_digest(entry["payload"])):
                return entry["payload"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        with self._lock:
            self.damaged += 1
        return None

    def _write(self, key: str, plain: list[Any], payload: Any) -> None:
        path = self.path_of(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"format": STORE_FORMAT, "key": key, "code_version": code_version(),
                 "parts": plain, "payload_sha256": _payload_digest(payload),
                 "payload": payload}
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp",
                                         delete=False) as handle:
            json.dump(entry, handle, sort_keys=True, default=repr)
        os.replace(handle.name, path)

    def summary(self) -> str:
        """One line: where the store is and what it found."""
        where = "in memory" if self.directory is None else str(self.directory)
        damaged = f", {self.damaged} damaged and trained again" if self.damaged else ""
        return (f"training store {where}: {self.hits} reused, {self.misses} trained"
                f"{damaged}")
