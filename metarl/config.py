"""Typed, validated experiment configs, loaded from TOML (or the JSON a run saves).

An experiment file has five tables; every field is documented on its dataclass below:

.. code-block:: toml

    name = "value_distance_cartpole"
    [objective]              # ObjectiveConfig: which learned loss to evolve
    name = "value_distance"
    [inner]                  # the inner loop: algorithm = "ppo" (default) and the fields of
    env_id = "CartPole-v1"   # its config class, e.g. PPOConfig (use [[inner]] several
                             # times for fitness over several environments)
    [es]                     # ESConfig: the evolution strategy
    [fitness]                # FitnessConfig: how training runs become a fitness
    [run]                    # RunConfig: seeds, chunking, checkpoints, output

Unknown fields, wrong types and bad values (NaN and infinite numbers included) raise
:class:`ConfigError` (a ``ValueError``) naming the dotted path of the field, e.g.
``es.population_size``. Building a config builds no environment and starts no JAX
computation: checks that need the environment run when the learners are built
(:class:`metarl.evolution.Evolution`), and name the field too.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inner_loops.population import AUTO, check_chunk_size
from inner_loops.registry import DEFAULT_ALGORITHM, algorithm_of, get_algorithm
from inner_loops.validation import (
    check_choice,
    check_finite,
    check_in_range,
    check_non_negative_int,
    check_positive,
    check_positive_int,
)

STRATEGIES = ("Open_ES", "SNES", "CMA_ES", "Sep_CMA_ES", "PGPE")
ANTITHETIC_STRATEGIES = ("Open_ES", "PGPE")
FITNESS_SHAPINGS = ("centered_rank", "standardize", "raw")
FITNESS_METRICS = ("final_return", "mean_return")


class ConfigError(ValueError):
    """A config field is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class ObjectiveConfig:
    """The learned objective whose meta-parameters are evolved.

    Attributes:
        name: a registered objective (``metarl.objectives.available_objectives()``), e.g.
            ``value_distance``, ``lpo``, ``ta_lpo``.
        options: keyword arguments of that objective's factory, e.g. ``hidden_sizes``.
    """

    name: str = "value_distance"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        _check_finite_numbers("objective.options", self.options)

    def build(self):
        """The :class:`~inner_loops.objective.Objective` this config names."""
        from metarl.objectives import make_objective

        try:
            return make_objective(self.name, **self.options)
        except ValueError as error:
            raise ConfigError(f"objective: {error}") from error


@dataclass(frozen=True)
class ESConfig:
    """The outer evolution strategy (evosax).

    Attributes:
        strategy: one of ``Open_ES`` (default), ``SNES``, ``CMA_ES``, ``Sep_CMA_ES``, ``PGPE``.
        population_size: candidates per generation; even for ``Open_ES``/``PGPE``
            (antithetic pairs).
        generations: generations to run.
        sigma: initial standard deviation of the search distribution (evosax's default of
            1.0 is far too large for neural meta-parameters).
        sigma_decay: multiplicative decay of ``sigma`` per generation (``Open_ES``).
        sigma_min: floor of the decayed ``sigma`` (``Open_ES``).
        learning_rate: Adam step size on the distribution mean (``Open_ES``, ``PGPE``,
            ``SNES``).
        learning_rate_decay: multiplicative decay of the learning rate per generation.
        antithetic: mirrored sampling (``Open_ES`` only; ``PGPE`` always mirrors).
        fitness_shaping: ``centered_rank`` (default), ``standardize`` or ``raw``; used by
            ``Open_ES`` and ``PGPE`` (the others rank by construction).
    """

    strategy: str = "Open_ES"
    population_size: int = 16
    generations: int = 10
    sigma: float = 0.03
    sigma_decay: float = 0.999
    sigma_min: float = 1e-3
    learning_rate: float = 0.03
    learning_rate_decay: float = 0.999
    antithetic: bool = True
    fitness_shaping: str = "centered_rank"

    def __post_init__(self):
        check_choice("es.strategy", self.strategy, STRATEGIES, ConfigError)
        check_choice("es.fitness_shaping", self.fitness_shaping, FITNESS_SHAPINGS, ConfigError)
        check_positive_int("es.population_size", self.population_size, ConfigError)
        check_positive_int("es.generations", self.generations, ConfigError)
        if self.strategy in ANTITHETIC_STRATEGIES and self.population_size % 2:
            raise ConfigError(
                f"es.population_size: {self.strategy} samples antithetic pairs, so the "
                f"population must be even; got {self.population_size}"
            )
        if self.population_size < 2:
            raise ConfigError("es.population_size: needs at least 2 candidates to rank")
        for name in ("sigma", "learning_rate", "sigma_min"):
            check_positive(f"es.{name}", getattr(self, name), ConfigError)
        for name in ("sigma_decay", "learning_rate_decay"):
            check_in_range(f"es.{name}", getattr(self, name), 0.0, 1.0, low_open=True,
                           error=ConfigError)


@dataclass(frozen=True)
class FitnessConfig:
    """How the training runs of a candidate become one fitness number (higher is better).

    Attributes:
        metric: ``mean_return`` (mean episode return over the whole run: area under the
            learning curve) or ``final_return`` (mean over the last ``final_fraction`` of
            updates).
        final_fraction: share of the last updates averaged by ``final_return``.
        seeds_per_candidate: agents trained from scratch per candidate and environment;
            fitness averages over them.
        common_seeds: all candidates of a generation use the same seeds (common random
            numbers: less noise when ranking).
        normalize_by_baseline: divide each environment's return by the absolute return of
            standard PPO on it, so that no environment dominates a multi-environment
            fitness. Baselines are measured once at the start unless given.
        baseline_returns: known PPO returns per ``[[inner]]`` entry (skips measuring them).
        baseline_seeds: seeds used to measure the baselines.
    """

    metric: str = "mean_return"
    final_fraction: float = 0.1
    seeds_per_candidate: int = 2
    common_seeds: bool = True
    normalize_by_baseline: bool = False
    baseline_returns: tuple[float, ...] = ()
    baseline_seeds: int = 4

    def __post_init__(self):
        check_choice("fitness.metric", self.metric, FITNESS_METRICS, ConfigError)
        check_positive_int("fitness.seeds_per_candidate", self.seeds_per_candidate, ConfigError)
        check_positive_int("fitness.baseline_seeds", self.baseline_seeds, ConfigError)
        check_in_range("fitness.final_fraction", self.final_fraction, 0.0, 1.0, low_open=True,
                       error=ConfigError)
        object.__setattr__(self, "baseline_returns", tuple(
            check_finite(f"fitness.baseline_returns[{i}]", b, ConfigError)
            for i, b in enumerate(self.baseline_returns)))
        if any(b == 0 for b in self.baseline_returns):
            raise ConfigError("fitness.baseline_returns: a baseline of 0 cannot normalise")


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
            ``WANDB_MODE`` says otherwise), each an optional extra (:mod:`metarl.trackers`).
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
        from metarl.trackers import TRACKERS

        for index, name in enumerate(self.trackers):
            check_choice(f"run.trackers[{index}]", name, TRACKERS, ConfigError)
        if len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(f"run.trackers: a tracker is named twice: {list(self.trackers)}")
        check_non_negative_int("run.max_invalid_generations", self.max_invalid_generations,
                               ConfigError)


def default_inner_config() -> Any:
    """The default algorithm's config with its defaults (PPO on CartPole-v1)."""
    return get_algorithm(DEFAULT_ALGORITHM).config_class()


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole meta-evolution experiment.

    Attributes:
        name: used for the run directory.
        description: free text.
        objective: see :class:`ObjectiveConfig`.
        inner: one algorithm config (a registered config class, e.g.
            :class:`~inner_loops.ppo.PPOConfig`) per environment of the fitness.
        es: see :class:`ESConfig`.
        fitness: see :class:`FitnessConfig`.
        run: see :class:`RunConfig`.
    """

    name: str = "experiment"
    description: str = ""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    inner: tuple[Any, ...] = field(default_factory=lambda: (default_inner_config(),))
    es: ESConfig = field(default_factory=ESConfig)
    fitness: FitnessConfig = field(default_factory=FitnessConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self):
        if not isinstance(self.inner, list | tuple):
            object.__setattr__(self, "inner", (self.inner,))
        object.__setattr__(self, "inner", tuple(self.inner))
        if not self.inner:
            raise ConfigError("inner: at least one environment is needed")
        for entry in self.inner:
            try:
                algorithm_of(entry)
            except ValueError as error:
                raise ConfigError(f"inner: {error}") from None
        env_ids = [cfg.env_id for cfg in self.inner]
        if len(set(env_ids)) != len(env_ids):
            raise ConfigError(f"inner: environments repeat: {env_ids}")
        baselines = self.fitness.baseline_returns
        if baselines and len(baselines) != len(self.inner):
            raise ConfigError(
                f"fitness.baseline_returns: {len(baselines)} values for "
                f"{len(self.inner)} [[inner]] environments"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form that :func:`config_from_dict` reads back to an equal config."""
        data = dataclasses.asdict(self)
        data["inner"] = [inner_to_dict(cfg) for cfg in self.inner]
        return _plain(data)

    def replace(self, **changes) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)


def inner_to_dict(inner: Any) -> dict[str, Any]:
    """An algorithm config as the ``[inner]`` table that :func:`_build_inner` reads back."""
    return _plain({"algorithm": algorithm_of(inner).name, **dataclasses.asdict(inner),
                   "env_params": dict(inner.env_params)})


def _check_finite_numbers(path: str, value: Any) -> None:
    """Every float inside ``value`` (nested tables and lists) is finite, or a
    :class:`ConfigError` names where it is not."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite_numbers(f"{path}.{key}", item)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_finite_numbers(f"{path}[{index}]", item)
    elif isinstance(value, float):
        check_finite(path, value, ConfigError)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _coerce(path: str, value, annotation):
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
        return tuple(_coerce(f"{path}[{i}]", v, t)
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


def _build(cls, data: dict, path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(
            f"{where}{unknown[0]}: unknown field; allowed: {', '.join(names)}"
        )
    kwargs = {}
    for name, value in data.items():
        field_path = f"{path}.{name}" if path else name
        kwargs[name] = _coerce(field_path, value, hints[name])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{path}.{error}" if path else str(error)) from error


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from plain data."""
    data = dict(data)
    kind = data.pop("kind", "evolve")  # other kinds: metarl.kinds
    if kind != "evolve":
        raise ConfigError(f"kind: this is a {kind!r} experiment, not an evolution one; start "
                          "it with `metarl run FILE` (metarl.kinds.start from Python)")
    sections = {"objective": ObjectiveConfig, "es": ESConfig, "fitness": FitnessConfig,
                "run": RunConfig}
    kwargs: dict[str, Any] = {}
    for name, cls in sections.items():
        if name in data:
            kwargs[name] = _build(cls, data.pop(name), name)
    if "inner" in data:
        inner = data.pop("inner")
        entries = [inner] if isinstance(inner, dict) else inner
        if not isinstance(entries, list):
            raise ConfigError(f"inner: expected a table or a list of tables, got {inner!r}")
        kwargs["inner"] = tuple(
            _build_inner(entry, f"inner[{i}]" if len(entries) > 1 else "inner")
            for i, entry in enumerate(entries)
        )
    return _build(ExperimentConfig, {**data, **kwargs}, "")


def _build_inner(entry: Any, path: str):
    """One ``[inner]`` table: ``algorithm`` (default ``"ppo"``) picks the config class."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: expected a table, got {entry!r}")
    entry = dict(entry)
    name = entry.pop("algorithm", DEFAULT_ALGORITHM)
    try:
        algorithm = get_algorithm(name)
    except ValueError as error:
        raise ConfigError(f"{path}.{error}") from None
    return _build(algorithm.config_class, entry, path)


def upgrade_saved_config(data: dict[str, Any]) -> dict[str, Any]:
    """A run's saved ``config.json`` data in today's form: runs written by metarl 0.1 say
    ``run.chunk_size = 0`` for what is now ``"auto"``, and name no ``algorithm`` (PPO)."""
    data = json.loads(json.dumps(data))
    run = data.get("run")
    if isinstance(run, dict) and run.get("chunk_size") == 0:
        run["chunk_size"] = AUTO
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as TOML) to raw config data.

    ``inner.FIELD=...`` sets the field in every ``[[inner]]`` entry; ``inner.0.FIELD=...``
    only in the first.
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
        if keys[0] == "inner":
            inner = data.setdefault("inner", {})
            entries = [inner] if isinstance(inner, dict) else inner
            keys = keys[1:]
            if keys and keys[0].isdigit():
                index = int(keys.pop(0))
                if index >= len(entries):
                    raise ConfigError(f"--set {path}: there are only {len(entries)} inner entries")
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


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override (``--set`` style) and validate an experiment config."""
    return config_from_dict(apply_overrides(read_config_data(path), overrides or []))
