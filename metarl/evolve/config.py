"""The experiment files of run kind "evolve": what is evolved, how, and how it is scored.

An evolution experiment has five tables; every field is documented on its dataclass below:

.. code-block:: toml

    name = "value_distance_cartpole"
    [objective]              # ObjectiveConfig: which learned loss to evolve
    name = "value_distance"
    [inner]                  # the inner loop: algorithm = "ppo" (default) and the fields of
    env_id = "CartPole-v1"   # its config class, e.g. PPOConfig (use [[inner]] several
                             # times for fitness over several environments)
    [es]                     # ESConfig: the evolution strategy
    [fitness]                # FitnessConfig: how training runs become a fitness
    [run]                    # RunConfig (metarl.config): seeds, chunking, checkpoints, output

Errors name the dotted path of the bad field (:class:`~metarl.config.ConfigError`). Checks
that need the environment run when the learners are built
(:class:`metarl.evolve.generation.Evolution`), and name the field too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from inner_loops.registry import algorithm_of
from inner_loops.validation import (
    check_choice,
    check_finite,
    check_in_range,
    check_positive,
    check_positive_int,
)
from metarl.config import (
    ConfigError,
    RunConfig,
    build_inner,
    build_table,
    check_finite_numbers,
    default_inner_config,
    inner_to_dict,
    plain,
    refuse_tables,
)
from metarl.evolve.strategies import STRATEGIES as STRATEGY_SPECS
from metarl.evolve.strategies import available_strategies, check_es_table, check_strategy
from metarl.population.priors import Prior, hyperparameter_fields

STRATEGIES = available_strategies()
FITNESS_SHAPINGS = ("centered_rank", "standardize", "raw")
FITNESS_METRICS = ("final_return", "mean_return")


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
        check_finite_numbers("objective.options", self.options)

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

    Which of these settings a strategy reads, and the table of strategies, are in
    :mod:`metarl.evolve.strategies` and the learned-objectives guide.

    Attributes:
        strategy: an evosax class name: ``Open_ES`` (default), ``SNES``, ``CMA_ES``,
            ``Sep_CMA_ES``, ``PGPE`` and the others that
            ``metarl.evolve.strategies.available_strategies()`` lists; the evosax strategies
            not offered, and why, are in ``metarl.evolve.strategies.EXCLUDED``.
        population_size: candidates ``C`` per generation; even where the strategy samples
            mirrored pairs (e.g. ``Open_ES``, ``PGPE``).
        generations: generations to run.
        sigma: initial standard deviation of the search distribution (evosax's default of
            1.0 is far too large for neural meta-parameters): ``std_init``, or the start of
            the ``std_schedule``, of the strategy.
        sigma_decay: multiplicative decay of ``sigma`` per generation, where the strategy
            takes a ``std_schedule`` (``Open_ES``, ``ARS``, ...).
        sigma_min: floor of the decayed ``sigma`` (same strategies).
        learning_rate: Adam step size on the distribution mean, where the strategy takes
            an optimizer (``Open_ES``, ``PGPE``, ``SNES``, ...).
        learning_rate_decay: multiplicative decay of the learning rate per generation.
        antithetic: mirrored sampling, where the strategy lets it be switched (``Open_ES``,
            ``EvoTF_ES``; ``PGPE`` and some others always mirror).
        fitness_shaping: ``centered_rank`` (default), ``standardize`` or ``raw``; used by
            the strategies that estimate a gradient from one generation's values
            (``Open_ES``, ``PGPE``, ``ARS``, ``ASEBO``, ``ESMC``); the others keep their
            own (rank weights, or raw fitness compared across generations).
        options: the strategy's own settings: scalar fields of its evosax
            ``default_params`` by name, e.g. ``{ c_std = 0.3 }`` for ``CMA_ES`` (``std_init``
            is ``sigma``). An unknown key is an error that lists the strategy's keys.
        evolution_seeds: independent evolutions run together (default 1: one ordinary
            run). With ``N > 1`` the run directory becomes a parent of ``N`` ordinary run
            directories ``seed_0 ... seed_{N-1}``: seed ``i`` is the run of this
            experiment with ``run.seed = run.seed + i`` and ``evolution_seeds = 1`` (its
            own ``config.json`` says so), and all ``N`` advance together, one compiled
            generation for ``N`` ES states (:mod:`metarl.evolve.replicated`). ``metarl
            run FILE --evolution-seeds N`` sets it.
        rungs: candidates stopped early (successive halving, :mod:`metarl.evolve.rungs`):
            each generation trains in ``rungs`` segments, and after each but the last only
            the best ``ceil(C / eta^(r + 1))`` candidates by their fitness so far train on;
            the others rank below every one that trained further. ``1`` (default): every
            candidate trains its whole budget, the full generation. 3 with ``eta = 3``
            reached the full generations' held-out verdicts on the main job and on
            ``experiments/lpo_cpu.toml`` at 14% and 26% of their agent-steps, but misled a
            search started from L2's tuned setting, whose first rung rewarded what helps
            early training only (``docs/evidence/discovery-cost.md``).
        eta: the factor of successive halving: rung ``r`` ends after ``U * eta^(r + 1 -
            rungs)`` of a run's ``U`` updates, and ``1 / eta`` of its candidates go on.
            ``1`` stops no one: every candidate trains through rungs that split its run
            evenly, which gives the full generation bit for bit. Default 3.
        truncations: truncated evolution (:mod:`metarl.evolve.truncation`): every training
            run is cut into this many truncations of equal length, and the meta-parameters
            update after each; agents carry over and start again from scratch after the
            last. A generation is then one truncation. Needs ``PersistentES`` or
            ``NoiseReuseES`` and ``fitness.metric = "mean_return"``; not with ``rungs > 1``.
            ``1`` (default): every generation trains whole runs.
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
    evolution_seeds: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    rungs: int = 1
    eta: int = 3
    truncations: int = 1

    def __post_init__(self):
        check_strategy(self.strategy)
        check_positive_int("es.truncations", self.truncations, ConfigError)
        if self.truncations > 1:
            if not STRATEGY_SPECS[self.strategy].truncated:
                truncated = [name for name, spec in STRATEGY_SPECS.items() if spec.truncated]
                raise ConfigError(
                    f"es.truncations: {self.strategy} scores whole training runs; truncated "
                    f"evolution needs a strategy that estimates from truncated unrolls: "
                    f"{', '.join(truncated)}")
            if self.rungs > 1:
                raise ConfigError("es.truncations: not combined with es.rungs > 1 (rungs stop "
                                  "candidates within whole runs); choose one of the two")

        check_positive_int("es.evolution_seeds", self.evolution_seeds, ConfigError)
        check_positive_int("es.rungs", self.rungs, ConfigError)
        check_positive_int("es.eta", self.eta, ConfigError)
        check_choice("es.fitness_shaping", self.fitness_shaping, FITNESS_SHAPINGS, ConfigError)
        check_positive_int("es.population_size", self.population_size, ConfigError)
        check_positive_int("es.generations", self.generations, ConfigError)
        if not isinstance(self.antithetic, bool):
            raise ConfigError(f"es.antithetic: expected true or false, got {self.antithetic!r}")
        object.__setattr__(self, "options", check_es_table(
            self.strategy, self.population_size, self.antithetic, self.options))
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
        tune_baseline: normalise by the baseline at its best setting rather than at the
            ``[inner]`` one: the algorithm's own losses are searched over the grid
            ``metarl evaluate --tune`` gives them (PPO: ``clip_eps`` x learning rate, 12
            settings; other algorithms: learning rate x1/3, x1, x3) on ``baseline_seeds``
            seeds, one program per environment, and the best setting's mean return
            normalises (:func:`metarl.evolve.tuning.tuned_fitness_baselines`). Needs
            ``normalize_by_baseline``, no ``baseline_returns`` and at least 2 seeds.
        hyperparameter_ranges: robust fitness: traced hyperparameter name -> the range
            every training run draws its value from, ``{ low, high }`` (uniform) or
            ``{ low, high, log = true }`` (log-uniform, ``low > 0``), e.g.
            ``learning_rate = { low = 1e-4, high = 1e-3, log = true }``. Each of the
            ``C x S`` runs of a generation draws its own values inside the jitted
            generation (:func:`metarl.evolve.fitness.draw_hyperparameters`; with
            ``common_seeds`` every candidate gets the same draws per seed index), so
            evolution favours objectives that work across the range. Every name must be
            a traced hyperparameter of every ``[inner]`` algorithm and both ends values
            its config accepts. Empty (default): every run trains at the ``[inner]``
            values.
    """

    metric: str = "mean_return"
    final_fraction: float = 0.1
    seeds_per_candidate: int = 2
    common_seeds: bool = True
    normalize_by_baseline: bool = False
    baseline_returns: tuple[float, ...] = ()
    baseline_seeds: int = 4
    tune_baseline: bool = False
    hyperparameter_ranges: dict[str, Prior] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "hyperparameter_ranges",
                           _build_ranges(self.hyperparameter_ranges))
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
        if not isinstance(self.tune_baseline, bool):
            raise ConfigError(f"fitness.tune_baseline: expected true or false, got "
                              f"{self.tune_baseline!r}")
        if self.tune_baseline and not self.normalize_by_baseline:
            raise ConfigError("fitness.tune_baseline: only with normalize_by_baseline = true")
        if self.tune_baseline and self.baseline_returns:
            raise ConfigError("fitness.tune_baseline: baseline_returns are given, so no "
                              "baseline is measured to tune; drop one of the two")
        if self.tune_baseline and self.baseline_seeds < 2:
            raise ConfigError(f"fitness.baseline_seeds: tuning the baseline needs at least 2 "
                              f"to compare settings, got {self.baseline_seeds}")


RANGES_PATH = "fitness.hyperparameter_ranges"


def _build_ranges(ranges: Any) -> dict[str, Prior]:
    """``fitness.hyperparameter_ranges`` as ``name -> Prior`` (tables become priors;
    errors name ``fitness.hyperparameter_ranges.<name>.<field>``), sorted by name."""
    if not isinstance(ranges, dict):
        raise ConfigError(f"{RANGES_PATH}: expected a table of tables, got {ranges!r}")
    built = {}
    for name, spec in sorted(ranges.items()):
        path = f"{RANGES_PATH}.{name}"
        if isinstance(spec, Prior):
            built[name] = spec
        elif isinstance(spec, dict):
            built[name] = build_table(Prior, spec, path)
        else:
            raise ConfigError(f"{path}: expected a table {{ low, high, log }}, got {spec!r}")
    return built


def check_ranges_fit(ranges: dict[str, Prior], inners: tuple[Any, ...]) -> None:
    """Raise :class:`ConfigError` naming ``fitness.hyperparameter_ranges.<name>`` when a
    range is no traced hyperparameter of some ``[inner]`` algorithm, or an end of it is a
    value that algorithm's config refuses."""
    for index, inner in enumerate(inners):
        algorithm = algorithm_of(inner).name
        traced = hyperparameter_fields(inner)
        where = f" (inner[{index}])" if len(inners) > 1 else ""
        for name, prior in ranges.items():
            path = f"{RANGES_PATH}.{name}"
            if name not in traced:
                raise ConfigError(f"{path}: not a traced hyperparameter of {algorithm}{where}; "
                                  f"allowed: {', '.join(traced)}")
            for bound in ("low", "high"):
                value = getattr(prior, bound)
                try:
                    inner.replace(**{name: value})
                except ValueError as error:
                    raise ConfigError(f"{path}.{bound}: {value} is not a valid {name} for "
                                      f"{algorithm}{where} ({error})") from None


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
        check_ranges_fit(self.fitness.hyperparameter_ranges, self.inner)
        if self.es.truncations > 1 and self.fitness.metric != "mean_return":
            raise ConfigError(
                f"fitness.metric: truncated evolution (es.truncations = "
                f"{self.es.truncations}) scores each truncation on its own, which sums to "
                f"mean_return over a run; {self.fitness.metric!r} scores the run's end "
                "alone. Use \"mean_return\"")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form that :func:`config_from_dict` reads back to an equal config."""
        data = dataclasses.asdict(self)
        data["inner"] = [inner_to_dict(cfg) for cfg in self.inner]
        return plain(data)

    def replace(self, **changes) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from plain data."""
    data = dict(data)
    kind = data.pop("kind", "evolve")  # other kinds: metarl.kinds
    if kind != "evolve":
        raise ConfigError(f"kind: expected 'evolve' here, got {kind!r}")
    refuse_tables(data, "evolve", ("objective", "es", "fitness", "inner"))
    sections = {"objective": ObjectiveConfig, "es": ESConfig, "fitness": FitnessConfig,
                "run": RunConfig}
    kwargs: dict[str, Any] = {}
    for name, cls in sections.items():
        if name in data:
            kwargs[name] = build_table(cls, data.pop(name), name)
    if "inner" in data:
        inner = data.pop("inner")
        entries = [inner] if isinstance(inner, dict) else inner
        if not isinstance(entries, list):
            raise ConfigError(f"inner: expected a table or a list of tables, got {inner!r}")
        kwargs["inner"] = tuple(
            build_inner(entry, f"inner[{i}]" if len(entries) > 1 else "inner")
            for i, entry in enumerate(entries)
        )
    return build_table(ExperimentConfig, {**data, **kwargs}, "")
