"""The experiment files of run kind "evolve": what is evolved, how, and how it is scored.

An evolution experiment has five tables, and an optional list of held-out tasks; every
field is documented on its dataclass below:

.. code-block:: toml

    name = "value_distance_cartpole"
    [objective]              # ObjectiveConfig: which learned loss to evolve
    name = "value_distance"
    [inner]                  # the inner loop: algorithm = "ppo" (default) and the fields of
    env_id = "CartPole-v1"   # its config class, e.g. PPOConfig (use [[inner]] several
                             # times for fitness over several tasks: the training set)
    [es]                     # ESConfig: the evolution strategy
    [fitness]                # FitnessConfig: how training runs become a fitness (and
                             # tasks_per_generation: how many [[inner]] tasks each
                             # generation samples)
    [run]                    # RunConfig (metarl.config): seeds, chunking, checkpoints, output
    [meta]                   # optional: method = "evolution" (default, EvolutionMeta) or
                             # "metagradient" (MetaGradientConfig), discovering by
                             # meta-gradients instead (metarl.evolve.metagradient_config)
    [[held_out]]             # optional, as [[inner]]: tasks never trained on during
    env_id = "CartPole-v1"   # evolution, which `metarl evaluate` evaluates on as well
    env_params = { gravity = 12.0 }

**Tasks.** Each ``[[inner]]`` entry is one task of the training set, each ``[[held_out]]``
entry one task kept for evaluation. A task is its ``env_id`` and ``env_params``: two
entries may share an ``env_id`` and differ in ``env_params`` (CartPole at two gravities,
the train and test rulesets of an XLand benchmark), but no two entries of the experiment
may be the same task. Each task has a label (:func:`task_labels`), used as its key in
``metrics.jsonl`` and evaluation records: its ``env_id`` where no other task of the
experiment shares it (so an experiment of distinct environments keeps the keys it always
had), else ``env_id[name=value,...]`` with its ``env_params``.

Errors name the dotted path of the bad field (:class:`~metarl.config.ConfigError`). Checks
that need the environment run when the learners are built
(:class:`metarl.evolve.generation.Evolution`), and name the field too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inner_loops.registry import algorithm_of
from inner_loops.validation import (
    check_choice,
    check_finite,
    check_in_range,
    check_non_negative_int,
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
from metarl.evolve.metagradient_config import EvolutionMeta, MetaGradientConfig, meta_from_dict
from metarl.evolve.strategies import STRATEGIES as STRATEGY_SPECS
from metarl.evolve.strategies import available_strategies, check_es_table, check_strategy
from metarl.population.priors import Prior, hyperparameter_fields

STRATEGIES = available_strategies()
FITNESS_SHAPINGS = ("centered_rank", "standardize", "raw")
FITNESS_METRICS = ("final_return", "mean_return")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The learned objective whose meta-parameters are evolved.

    Building it imports ``module`` (when given) and checks ``name`` and ``options`` against
    the registered factory, so a config that builds names an objective that exists, with
    options its factory takes (:mod:`metarl.objectives.options`).

    Attributes:
        name: a registered objective (``metarl.objectives.available_objectives()``), e.g.
            ``value_distance``, ``lpo``, ``ta_lpo``, or one that ``module`` or an installed
            package (entry points ``metarl.objectives``) registers.
        options: keyword arguments of that objective's factory, e.g. ``hidden_sizes``.
        module: the module that registers ``name`` when it is not one of this package's:
            an importable module name (``"my_objectives"``, ``"mypkg.objectives"``) or a
            path to a ``.py`` file, absolute or relative to ``base_dir``. A run copies a
            ``.py`` file into its directory (``objective_source/<file name>``) and records
            that path, so every later command finds it (:meth:`recorded_in`).
        sha256: the ``.py`` file's sha256, recorded when it is first read; a file that
            differs later is used with a warning.
        base_dir: the folder a relative ``.py`` path is read from, set by the loader (the
            experiment file's folder, the run directory); neither saved nor compared.
    """

    name: str = "value_distance"
    options: dict[str, Any] = field(default_factory=dict)
    module: str | None = None
    sha256: str | None = None
    base_dir: str | None = field(default=None, compare=False)

    def __post_init__(self):
        check_finite_numbers("objective.options", self.options)
        for name in ("module", "sha256", "base_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"objective.{name}: expected a non-empty string, got "
                                  f"{value!r}")
        if self.sha256 is not None and not (self.module and self.module.endswith(".py")):
            raise ConfigError("objective.sha256: the sha256 of a .py file named by "
                              "objective.module; there is none")
        from metarl.objectives.options import check_options

        declaration = self.declaration()
        try:
            check_options(self.name, declaration.factory, self.options)
        except ValueError as error:
            raise ConfigError(f"objective.{error}") from None

    def declaration(self):
        """The registered objective (:class:`~metarl.objectives.registry.
        RegisteredObjective`), ``module`` imported first; a one-line
        :class:`~metarl.config.ConfigError` naming the objective, where it was to come from,
        why it was not found and what to do."""
        from metarl.objectives.registry import available_objectives, get_objective
        from metarl.objectives.sources import (
            WHAT_TO_DO,
            ObjectiveSourceError,
            describe_source,
            file_sha256,
            import_objective_module,
            is_file_source,
            source_path,
        )

        where = describe_source(self.module, self.base_dir)
        if self.module is not None:
            try:
                import_objective_module(self.module, self.base_dir, self.sha256)
            except ObjectiveSourceError as error:
                restore = "restore that file, or " if is_file_source(self.module) else ""
                raise ConfigError(f"objective: cannot load objective {self.name!r}: {error}; "
                                  f"{restore}{WHAT_TO_DO}") from None
            if is_file_source(self.module) and self.sha256 is None:
                object.__setattr__(self, "sha256",
                                   file_sha256(source_path(self.module, self.base_dir)))
        try:
            return get_objective(self.name)
        except ValueError:
            why = (f"its {where} was imported but registers no objective of that name"
                   if self.module is not None
                   else f"{where}, and no installed package registers it")
            raise ConfigError(f"objective: unknown objective {self.name!r} ({why}); "
                              f"{WHAT_TO_DO}; available objectives: "
                              f"{', '.join(available_objectives())}") from None

    def build(self):
        """The :class:`~inner_loops.objective.Objective` this config names."""
        from metarl.objectives import make_objective

        self.declaration()  # the module, imported in this process
        try:
            return make_objective(self.name, **self.options)
        except ValueError as error:
            raise ConfigError(f"objective: {error}") from error

    def recorded_in(self, run_dir: str | Path) -> tuple[ObjectiveConfig, dict[str, Path]]:
        """This config as the run in ``run_dir`` records it, and the files to copy there
        (``{path inside run_dir: file}``): a ``.py`` module becomes its copy
        ``objective_source/<file name>`` with its sha256; anything else stays as it is."""
        from metarl.objectives.sources import ObjectiveSourceError, is_file_source, recorded_source

        if self.module is None or not is_file_source(self.module):
            return self, {}
        try:
            inside, sha256, path = recorded_source(self.module, self.base_dir)
        except ObjectiveSourceError as error:
            raise ConfigError(f"objective.module: {error}") from None
        if self.sha256 is not None and sha256 != self.sha256:
            raise ConfigError(f"objective.module: {path} changed after the experiment was "
                              f"loaded (sha256 {self.sha256[:12]}..., now {sha256[:12]}...); "
                              "start the run again")
        recorded = dataclasses.replace(self, module=inside, sha256=sha256,
                                       base_dir=str(Path(run_dir).absolute()))
        return recorded, {inside: path}

    def to_dict(self) -> dict[str, Any]:
        """Plain data as a run saves it: no ``base_dir``, and ``module`` and ``sha256`` only
        when set (a config without them reads as before they existed)."""
        data = {"name": self.name, "options": plain(self.options)}
        for name in ("module", "sha256"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data


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
        tasks_per_generation: task distributions as the training set: ``K`` of the ``E``
            ``[[inner]]`` tasks train in each generation, drawn uniformly without
            replacement and anew every generation, and a candidate's fitness combines
            those ``K`` tasks only (each normalised by its own baseline as always). Only
            the drawn tasks' agents are trained, inside the one jitted generation
            (:meth:`metarl.evolve.generation.Evolution.sample_tasks`). ``1 <= K <= E``;
            not with ``es.rungs > 1`` nor ``es.truncations > 1``. ``None`` (default) or
            ``E``: every task trains in every generation, the generation computed before
            the option existed, bit for bit.
        task_seed: the seed of the stream the tasks are drawn from: generation ``g``
            draws with ``fold_in(fold_in(PRNGKey(task_seed), TASK_STREAM), g)``, so the
            draws depend on the seed and the generation alone (a resumed run draws what
            the uninterrupted one drew). ``None`` (default): ``run.seed``. The seeds of
            replicated evolution (``es.evolution_seeds > 1``) are given the base seed
            here, so that they all see the same task sequence. Only with
            ``tasks_per_generation < E``.
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
    tasks_per_generation: int | None = None
    task_seed: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "hyperparameter_ranges",
                           _build_ranges(self.hyperparameter_ranges))
        if self.tasks_per_generation is not None:
            check_positive_int("fitness.tasks_per_generation", self.tasks_per_generation,
                               ConfigError)
        if self.task_seed is not None:
            check_non_negative_int("fitness.task_seed", self.task_seed, ConfigError)
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


def task_label(inner: Any, shared: bool) -> str:
    """The label of the task of one ``[[inner]]`` or ``[[held_out]]`` entry: its
    ``env_id``, or, where ``shared`` (another task of the experiment has the same
    ``env_id``), ``env_id[name=value,...]`` with its ``env_params`` in name order
    (``env_id[defaults]`` for none), e.g. ``CartPole-v1[gravity=12.0]``."""
    if not shared:
        return inner.env_id
    params = ",".join(f"{name}={_param_text(value)}" for name, value in inner.env_params)
    return f"{inner.env_id}[{params or 'defaults'}]"


def _param_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def task_labels(*groups: tuple[Any, ...]) -> tuple[tuple[str, ...], ...]:
    """The labels (:func:`task_label`) of the tasks of each of ``groups`` (e.g. the
    ``[[inner]]`` and the ``[[held_out]]`` entries), an ``env_id`` counted as shared when
    it occurs more than once over all of them together."""
    counts: dict[str, int] = {}
    for group in groups:
        for inner in group:
            counts[inner.env_id] = counts.get(inner.env_id, 0) + 1
    return tuple(tuple(task_label(inner, counts[inner.env_id] > 1) for inner in group)
                 for group in groups)


def _same_task(a: Any, b: Any) -> bool:
    return a.env_id == b.env_id and tuple(a.env_params) == tuple(b.env_params)


def _entry_path(table: str, index: int, count: int) -> str:
    return f"{table}[{index}]" if count > 1 else table


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole meta-evolution experiment.

    Attributes:
        name: used for the run directory.
        description: free text.
        objective: see :class:`ObjectiveConfig`.
        inner: one algorithm config (a registered config class, e.g.
            :class:`~inner_loops.ppo.PPOConfig`) per task of the training set (``E``
            tasks; ``fitness.tasks_per_generation`` of them train in each generation).
        es: see :class:`ESConfig`.
        fitness: see :class:`FitnessConfig`.
        run: see :class:`RunConfig`.
        held_out: tasks kept out of evolution (``[[held_out]]`` tables, each an
            algorithm config as ``inner``'s, whose learner is built, and checked, the same
            way): never trained during evolution, and evaluated on by ``metarl evaluate``
            besides the training tasks, marked "held out". None may be the same task
            (``env_id`` and ``env_params``) as a training task or another held-out one.
            Empty by default.
        meta: the engine, a type per ``method``
            (:func:`~metarl.evolve.metagradient_config.meta_from_dict`):
            :class:`~metarl.evolve.metagradient_config.EvolutionMeta` (the default) or
            :class:`~metarl.evolve.metagradient_config.MetaGradientConfig`, whose
            meta-gradient steps have no ``[es]`` table. It refuses the settings of the
            other tables that its engine does not read (``check_experiment``).
    """

    name: str = "experiment"
    description: str = ""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    inner: tuple[Any, ...] = field(default_factory=lambda: (default_inner_config(),))
    es: ESConfig = field(default_factory=ESConfig)
    fitness: FitnessConfig = field(default_factory=FitnessConfig)
    run: RunConfig = field(default_factory=RunConfig)
    held_out: tuple[Any, ...] = ()
    meta: EvolutionMeta | MetaGradientConfig = field(default_factory=EvolutionMeta)

    def __post_init__(self):
        for table in ("inner", "held_out"):
            entries = getattr(self, table)
            if not isinstance(entries, list | tuple):
                entries = (entries,)
            object.__setattr__(self, table, tuple(entries))
        if not self.inner:
            raise ConfigError("inner: at least one environment is needed")
        for table in ("inner", "held_out"):
            entries = getattr(self, table)
            for index, entry in enumerate(entries):
                try:
                    algorithm_of(entry)
                except ValueError as error:
                    raise ConfigError(f"{_entry_path(table, index, len(entries))}: "
                                      f"{error}") from None
        self._check_distinct_tasks()
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
        self._check_task_sampling()
        if not isinstance(self.meta, EvolutionMeta | MetaGradientConfig):
            raise ConfigError(f"meta: expected an EvolutionMeta or a MetaGradientConfig "
                              f"(metarl.evolve.metagradient_config), got {self.meta!r}")
        self.meta.check_experiment(self)  # what its engine does not read, refused

    def _check_distinct_tasks(self) -> None:
        """No two entries of ``inner`` and ``held_out`` are the same task."""
        seen: list[tuple[str, Any]] = []
        for table in ("inner", "held_out"):
            entries = getattr(self, table)
            for index, entry in enumerate(entries):
                path = _entry_path(table, index, len(entries))
                for other_path, other in seen:
                    if _same_task(entry, other):
                        params = dict(entry.env_params) or "none"
                        kind = ("a held-out task must differ from every training task"
                                if table == "held_out" and other_path.startswith("inner")
                                else "entries that share an env_id must differ in "
                                     "env_params")
                        raise ConfigError(
                            f"{path}: the same task as {other_path} (env_id "
                            f"{entry.env_id!r}, env_params {params}); {kind}")
                seen.append((path, entry))

    def _check_task_sampling(self) -> None:
        fitness, count = self.fitness, len(self.inner)
        if fitness.tasks_per_generation is not None and fitness.tasks_per_generation > count:
            raise ConfigError(
                f"fitness.tasks_per_generation: {fitness.tasks_per_generation} tasks per "
                f"generation out of {count} [[inner]] tasks; it must be between 1 and "
                f"{count}")
        if not self.samples_tasks:
            if fitness.task_seed is not None:
                raise ConfigError(
                    "fitness.task_seed: seeds the tasks drawn per generation; only with "
                    f"fitness.tasks_per_generation below the {count} [[inner]] tasks")
            return
        if self.es.rungs > 1:
            raise ConfigError(
                "fitness.tasks_per_generation: not combined with es.rungs > 1 (rungs "
                "compare candidates across every task's partial runs); choose one of the two")
        if self.es.truncations > 1:
            raise ConfigError(
                "fitness.tasks_per_generation: not combined with es.truncations > 1 (the "
                "agents carried between truncations train on fixed tasks); choose one of "
                "the two")

    @property
    def tasks_per_generation(self) -> int:
        """``K``: the training tasks each generation trains (``E`` unless sampled)."""
        return self.fitness.tasks_per_generation or len(self.inner)

    @property
    def samples_tasks(self) -> bool:
        """Whether each generation draws ``K < E`` of the training tasks."""
        return self.tasks_per_generation < len(self.inner)

    @property
    def task_seed(self) -> int:
        """The seed of the task stream: ``fitness.task_seed``, or ``run.seed``."""
        return self.run.seed if self.fitness.task_seed is None else self.fitness.task_seed

    @property
    def task_labels(self) -> tuple[str, ...]:
        """``[E]`` the labels of the training tasks (:func:`task_labels`)."""
        return task_labels(self.inner, self.held_out)[0]

    @property
    def held_out_labels(self) -> tuple[str, ...]:
        """The labels of the held-out tasks (:func:`task_labels`)."""
        return task_labels(self.inner, self.held_out)[1]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form that :func:`config_from_dict` reads back to an equal config."""
        data = dataclasses.asdict(self)
        data["objective"] = self.objective.to_dict()
        data["inner"] = [inner_to_dict(cfg) for cfg in self.inner]
        data["held_out"] = [inner_to_dict(cfg) for cfg in self.held_out]
        self.meta.omit_unused(data)  # an evolution's [meta], a meta-gradient run's [es]
        return plain(data)

    def replace(self, **changes) -> ExperimentConfig:
        return dataclasses.replace(self, **changes)

    def recorded_in(self, run_dir: str | Path) -> tuple[ExperimentConfig, dict[str, Path]]:
        """This config as a run in ``run_dir`` records it and the files to copy there
        (:meth:`ObjectiveConfig.recorded_in`): the hook ``record_sources`` of the run kinds
        that train it."""
        objective, files = self.objective.recorded_in(run_dir)
        return (self if objective is self.objective else self.replace(objective=objective),
                files)


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from plain data."""
    data = dict(data)
    kind = data.pop("kind", "evolve")  # other kinds: metarl.kinds
    if kind != "evolve":
        raise ConfigError(f"kind: expected 'evolve' here, got {kind!r}")
    refuse_tables(data, "evolve", ("objective", "es", "fitness", "inner", "meta"))
    sections = {"objective": ObjectiveConfig, "es": ESConfig, "fitness": FitnessConfig,
                "run": RunConfig}
    kwargs: dict[str, Any] = {}
    for name, cls in sections.items():
        if name in data:
            kwargs[name] = build_table(cls, data.pop(name), name)
    if "meta" in data:  # its method picks its type
        kwargs["meta"] = meta_from_dict(data.pop("meta"))
    if "suite" in data:  # a suite's meta-train side as [[inner]], its meta-test side held out
        taken = [table for table in ("inner", "held_out") if table in data]
        if taken:
            raise ConfigError(f"suite: takes the place of [[inner]] and [[held_out]]; this "
                              f"experiment also has {', '.join(taken)}: give one or the other "
                              "(to change every task's settings, use suite.settings, e.g. "
                              "--set suite.settings.total_timesteps=100000)")
        from metarl.suites import suite_experiment_tasks

        kwargs["inner"], kwargs["held_out"] = suite_experiment_tasks(data.pop("suite"))
    for table in ("inner", "held_out"):  # [[held_out]] tables are read as [[inner]] ones
        if table in data:
            value = data.pop(table)
            entries = [value] if isinstance(value, dict) else value
            if not isinstance(entries, list | tuple):
                raise ConfigError(f"{table}: expected a table or a list of tables, got "
                                  f"{value!r}")
            kwargs[table] = tuple(build_inner(entry, _entry_path(table, i, len(entries)))
                                  for i, entry in enumerate(entries))
    return build_table(ExperimentConfig, {**data, **kwargs}, "")
