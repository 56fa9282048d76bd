"""The typed-table machinery every run kind's experiment files are read with.

Experiment files are TOML (a run saves its resolved config as JSON); each run kind's loader
(:mod:`metarl.evolve.config`, :mod:`metarl.population.pbt_run`,
:mod:`metarl.population.method_config`) builds its frozen config dataclasses from their
tables with :func:`build_table`, which checks every field against its type annotation and
lets the dataclass check its values. Unknown fields, wrong types and bad values (NaN and
infinite numbers included) raise :class:`ConfigError` (a ``ValueError``) naming the dotted
path of the field, e.g. ``es.population_size``.

What every kind shares lives here too: the ``[run]`` table (:class:`RunConfig`), the
``[inner]`` table of an algorithm (:func:`build_inner`, :func:`inner_to_dict`), ``--set``
overrides (:func:`apply_overrides`), reading files (:func:`read_config_data`) and the
checks of a kind's tables (:func:`refuse_tables`, :func:`single_inner`). Building a config
builds no environment and starts no JAX computation.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inner_loops.population import AUTO, check_chunk_size
from inner_loops.registry import DEFAULT_ALGORITHM, algorithm_of, get_algorithm
from inner_loops.validation import (
    check_choice,
    check_finite,
    check_non_negative_int,
    check_positive_int,
)

TRACKERS = ("tensorboard", "wandb")  # the values of run.trackers (metarl.runs.trackers)
# Every table any kind's experiment file may have, so that a kind can name the tables it
# lacks (refuse_tables) instead of calling them unknown fields.
KIND_TABLES = ("objective", "es", "fitness", "pbt", "cem_rl", "dvd")


class ConfigError(ValueError):
    """A config field is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class RunConfig:
    """Seeds, memory, checkpoints and output of a run.

    Attributes:
        seed: master random seed of the run (ES sampling and agent seeds).
        chunk_size: train at most this many agents at once, per device; bounds memory for
            large populations. ``"auto"`` (default): 16 per CPU device, which keeps
            throughput from falling as the population grows, and everything at once on
            accelerators (:mod:`inner_loops.population`).
        shard: split each generation's candidates × seeds over every visible device (all
            processes under ``jax.distributed``; see ``docs/scaling.md``); results equal
            the unsharded run to float rounding, which long runs amplify. On by default;
            with one device it changes nothing. On the CPU the ``metarl`` command exposes
            one device per core, so this uses them all.
        checkpoint_every: save a checkpoint every this many generations.
        keep_checkpoints: most recent checkpoints kept (the best one is kept as well).
        max_invalid_generations: stop the run (exit code 3, checkpoints kept) after this
            many generations in a row in which every candidate was invalid (NaN or
            infinite returns); 0 never stops.
        output_dir: parent directory of run directories.
        progress: show a progress bar.
        trackers: experiment trackers that receive every generation's metrics and, at the
            end, the run's figures: ``"tensorboard"`` and/or ``"wandb"`` (offline unless
            ``WANDB_MODE`` says otherwise), each an optional extra (:mod:`metarl.runs.trackers`).
            Default: none. May change when a run is resumed.
    """

    seed: int = 0
    chunk_size: int | str = AUTO
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    max_invalid_generations: int = 5
    output_dir: str = "runs"
    progress: bool = True
    shard: bool = True
    trackers: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.shard, bool):
            raise ConfigError(f"run.shard: expected true or false, got {self.shard!r}")
        check_non_negative_int("run.seed", self.seed, ConfigError)
        try:
            check_chunk_size(self.chunk_size)
        except ValueError as error:
            raise ConfigError(f"run.{error}") from None
        check_positive_int("run.checkpoint_every", self.checkpoint_every, ConfigError)
        check_positive_int("run.keep_checkpoints", self.keep_checkpoints, ConfigError)
        for index, name in enumerate(self.trackers):
            check_choice(f"run.trackers[{index}]", name, TRACKERS, ConfigError)
        if len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(f"run.trackers: a tracker is named twice: {list(self.trackers)}")
        check_non_negative_int("run.max_invalid_generations", self.max_invalid_generations,
                               ConfigError)


def default_inner_config() -> Any:
    """The default algorithm's config with its defaults (PPO on CartPole-v1)."""
    return get_algorithm(DEFAULT_ALGORITHM).config_class()


def inner_to_dict(inner: Any) -> dict[str, Any]:
    """An algorithm config as the ``[inner]`` table that :func:`build_inner` reads back."""
    return plain({"algorithm": algorithm_of(inner).name, **dataclasses.asdict(inner),
                  "env_params": dict(inner.env_params)})


def check_finite_numbers(path: str, value: Any) -> None:
    """Every float inside ``value`` (nested tables and lists) is finite, or a
    :class:`ConfigError` names where it is not."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite_numbers(f"{path}.{key}", item)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_finite_numbers(f"{path}[{index}]", item)
    elif isinstance(value, float):
        check_finite(path, value, ConfigError)


def plain(value):
    """``value`` with every tuple a list, recursively: what JSON and TOML write."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def coerce(path: str, value, annotation):
    """Check ``value`` against a field's type, converting lists to tuples and ints to floats."""
    origin = typing.get_origin(annotation)
    if annotation is Any or origin is types.UnionType:
        return value  # the dataclass's own checks decide
    if origin is tuple:
        item_types = typing.get_args(annotation)
        pairs = typing.get_origin(item_types[0]) is tuple  # env_params: a table in TOML
        if pairs and isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected {'a table' if pairs else 'a list'}, "
                              f"got {value!r}")
        if len(item_types) == 2 and item_types[1] is Ellipsis:  # tuple[X, ...]
            item_types = (item_types[0],) * len(value)
        elif len(value) != len(item_types):
            raise ConfigError(f"{path}: expected {len(item_types)} items, got {value!r}")
        return tuple(coerce(f"{path}[{i}]", v, t)
                     for i, (v, t) in enumerate(zip(value, item_types, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a table, got {value!r}")
        return dict(value)
    if annotation is float:
        return check_finite(path, value, ConfigError)
    if annotation is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # allow 1e5 in TOML for step counts
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    return value


def build_table(cls, data: dict, path: str,
                unknown_note: Callable[[str], str] | None = None):
    """The dataclass ``cls`` from the table ``data`` at the dotted ``path`` (``""`` for
    the top level): unknown fields, values of the wrong type and the dataclass's own
    ``ValueError`` become a :class:`ConfigError` naming the field's path.
    ``unknown_note(name)`` adds to an unknown field's error what the field is instead
    (a table of several types: whose field it is)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f"{path}." if path else ""
        note = unknown_note(unknown[0]) if unknown_note else ""
        raise ConfigError(
            f"{where}{unknown[0]}: unknown field{note}; allowed: {', '.join(names)}"
        )
    kwargs = {}
    for name, value in data.items():
        field_path = f"{path}.{name}" if path else name
        kwargs[name] = coerce(field_path, value, hints[name])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{path}.{error}" if path else str(error)) from error


def single_inner(data: Any, kind: str, algorithm: str | None = None) -> Any:
    """The one ``[inner]`` table of a kind that trains one algorithm on one environment
    (a list of exactly one ``[[inner]]`` table is accepted), built by :func:`build_inner`;
    ``algorithm`` is the default algorithm of the table."""
    if isinstance(data, list):
        if len(data) != 1:
            raise ConfigError(f"inner: a {kind} experiment trains one algorithm on one "
                              f"environment; got {len(data)} [[inner]] tables")
        data = data[0]
    if not isinstance(data, dict):
        raise ConfigError(f"inner: expected a table, got {data!r}")
    return build_inner({"algorithm": algorithm, **data} if algorithm else data, "inner")


def refuse_tables(data: dict[str, Any], kind: str, own: tuple[str, ...]) -> None:
    """A :class:`ConfigError` for a table of another kind in ``kind``'s experiment data
    (``own``: the tables ``kind`` has besides ``[run]``)."""
    for name in KIND_TABLES:
        if name in data and name not in own:
            tables = ", ".join(f"[{table}]" for table in (*own, "run"))
            raise ConfigError(f"{name}: a {kind} experiment has no [{name}] table (it has "
                              f"{tables})")


def build_inner(entry: Any, path: str):
    """One ``[inner]`` table: ``algorithm`` (default ``"ppo"``) picks the config class."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: expected a table, got {entry!r}")
    entry = dict(entry)
    name = entry.pop("algorithm", DEFAULT_ALGORITHM)
    try:
        algorithm = get_algorithm(name)
    except ValueError as error:
        raise ConfigError(f"{path}.{error}") from None
    return build_table(algorithm.config_class, entry, path)


def upgrade_saved_config(data: dict[str, Any]) -> dict[str, Any]:
    """A run's saved ``config.json`` data in today's form: runs written by metarl 0.1 say
    ``run.chunk_size = 0`` for what is now ``"auto"``, and name no ``algorithm`` (PPO); an
    evolution's ``[meta]`` table keeps its ``method`` alone."""
    data = json.loads(json.dumps(data))
    run = data.get("run")
    if isinstance(run, dict) and run.get("chunk_size") == 0:
        run["chunk_size"] = AUTO
    meta = data.get("meta")
    if (data.get("kind", "evolve") == "evolve" and isinstance(meta, dict)
            and meta.get("method", "evolution") == "evolution"):
        # [meta] was once one table for both engines, whose method "evolution" took the
        # meta-gradient fields at their defaults only (so a saved one that validated holds
        # nothing else); its evolution type (metarl.evolve.metagradient_config.
        # EvolutionMeta) has none of them now, and would refuse them as unknown fields
        data["meta"] = {"method": "evolution"}
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as TOML) to raw config data.

    ``inner.FIELD=...`` sets the field in every ``[[inner]]`` entry; ``inner.0.FIELD=...``
    only in the first; ``held_out.FIELD=...`` and ``held_out.0.FIELD=...`` do the same for
    the ``[[held_out]]`` tasks.
    """
    data = json.loads(json.dumps(data))
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"--set {override!r}: expected key.path=value")
        path, raw = override.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        keys = path.strip().split(".")
        targets = [data]
        if keys[0] in ("inner", "held_out"):
            if keys[0] == "held_out" and not data.get("held_out"):
                raise ConfigError(f"--set {path}: the experiment has no [[held_out]] tasks")
            tables = data.setdefault(keys[0], {})
            entries = [tables] if isinstance(tables, dict) else tables
            if not all(isinstance(entry, dict) for entry in entries):
                raise ConfigError(f"--set {path}: {keys[0]} is not a table")
            name, keys = keys[0], keys[1:]
            if keys and keys[0].isdigit():
                index = int(keys.pop(0))
                if index >= len(entries):
                    raise ConfigError(f"--set {path}: there are only {len(entries)} {name} "
                                      "entries")
                entries = [entries[index]]
            targets = entries
        if not keys:
            raise ConfigError(f"--set {override!r}: no field named")
        for target in targets:
            node = target
            for key in keys[:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"--set {path}: {key} is not a table")
            node[keys[-1]] = value
    return data


def read_config_data(path: str | Path) -> dict[str, Any]:
    """Raw data of a ``.toml`` experiment file or a run's ``config.json``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {error}") from error
