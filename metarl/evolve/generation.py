"""The ES driver: ask -> train population × seeds -> fitness -> tell, as one jitted step.

:class:`Evolution` holds what is static for a run (objective, strategy, inner trainers) and
exposes pure functions of :class:`EvolutionState`:

- ``init(key) -> EvolutionState``
- ``generation(state) -> (state, metrics)``: one whole generation, compiled once
  (``evolution.step`` is its ``jax.jit``); it is ``ask -> score -> tell``:
- ``ask(state) -> Asked``: the candidates ``[C]`` and the keys of their runs;
- ``sample_tasks(generation) -> [K] | None``: with ``fitness.tasks_per_generation = K``
  below the ``E`` ``[[inner]]`` tasks, the tasks this generation trains;
- ``score(population, run_keys, baselines, tasks) -> Scores``: train them (``[C, S, E]``
  returns, ``[C, S, K]`` with sampled tasks);
- ``tell(state, asked, scores) -> (state, metrics)``: fitness, the strategy's update.

:mod:`metarl.evolve.replicated` maps ``ask`` and ``tell`` over ``N`` stacked states and
scores all ``N * C`` candidates in one call. Users think in returns (higher is better);
evosax minimises, so the sign is flipped exactly once, in :meth:`Evolution.tell`.

**Sampled tasks** (``fitness.tasks_per_generation = K < E``). Generation ``g`` draws ``K``
distinct task indices, uniformly without replacement (the first ``K`` of a random
permutation of ``0 .. E-1``, sorted), from the key ``fold_in(fold_in(PRNGKey(task_seed),
TASK_STREAM), g)`` (``task_seed``: ``fitness.task_seed``, else ``run.seed``): a function
of the seed and the generation number alone, so a resumed run draws what the uninterrupted
one drew, and the draws use none of the evolution's own key stream. Each drawn task trains
on the keys it would have had were every task trained (the ask splits one key per task as
always). Inside the jitted generation the ``K`` drawn tasks train one after the other
(``lax.map``), each by a ``lax.switch`` over the ``E`` learners with an index that is the
same for every evolution run together, so that only the drawn task's training runs: under
``vmap`` a batched index would turn the switch into a select that trains every task.
Evolutions run together (:mod:`metarl.evolve.replicated`) therefore see the same task
sequence, their seeds' configs all naming the base seed as ``fitness.task_seed``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

from inner_loops.learner import strong_types
from inner_loops.population import check_population_memory
from inner_loops.registry import make_learner
from metarl.config import ConfigError
from metarl.evolve.config import ESConfig, ExperimentConfig
from metarl.evolve.fitness import (
    combine_fitness,
    draw_hyperparameters,
    evaluate_candidates,
    run_is_valid,
    run_return,
)
from metarl.evolve.metagradient_config import EvolutionMeta
from metarl.evolve.rungs import agent_steps, rank_below_survivors, rung_ends, train_in_rungs
from metarl.evolve.strategies import (
    ask_search,
    build_strategy,
    init_search,
    search_centre,
    tell_search,
)
from metarl.evolve.truncation import (
    TruncationState,
    advance_unroll,
    empty_truncation_state,
    train_truncation,
    truncation_updates,
)
from metarl.programs import program_key, shared_program
from metarl.sharding import put_replicated, replicate, run_mesh

# folded into PRNGKey(task_seed) to start the stream of the tasks drawn per generation
# (fitness.tasks_per_generation): the key of generation g is fold_in(that, g)
TASK_STREAM = 0x7461_736B


def step_program_key(config: ExperimentConfig, *extra) -> tuple:
    """The :func:`metarl.programs.program_key` of a generation step of ``config``: without
    its held-out tasks and its budget (``es.generations``), which never enter the step, so a
    run continued with more generations, or evaluated, compiles nothing new."""
    unbudgeted = dataclasses.replace(config.es, generations=1)
    return program_key(config.replace(held_out=(), es=unbudgeted), *extra)


def search_start(objective, seed: int):
    """The meta-parameters an evolution run with ``run.seed = seed`` starts its search at:
    the objective's initialisation from the second of three keys split from
    ``PRNGKey(seed)`` (:meth:`Evolution.init`). Evaluating it beside the search's result
    (``metarl evaluate RUN --start``) tells what the search changed from what its starting
    point already did."""
    return objective.init(_start_keys(jax.random.PRNGKey(seed))[1])


def _start_keys(key: jax.Array) -> jax.Array:
    """``[3]`` keys from a run's root key: carried on, the objective's initialisation, the
    strategy's initialisation."""
    return jax.random.split(key, 3)


def make_strategy(config: ESConfig, template: Any):
    """Build the evosax strategy named in ``config`` for meta-parameters like ``template``.

    Returns ``(strategy, es_params)``; σ, learning rate and their decays come from the
    config because evosax's defaults (σ = 1, SGD at 1e-3) do not suit neural meta-parameters
    (:func:`metarl.evolve.strategies.build_strategy` says which settings reach which
    strategy).
    """
    return build_strategy(config, template)


@struct.dataclass
class EvolutionState:
    """Everything that changes between generations (all arrays; checkpointable).

    Attributes:
        es_state: the evosax strategy's state.
        key: ``[2]`` PRNG key for the next generation.
        generation: ``[]`` generations completed.
        best_fitness: ``[]`` best candidate fitness seen so far (higher is better).
        best_meta_params: the meta-parameters that scored ``best_fitness``.
        baselines: ``[E]`` return of the algorithm's own losses per environment, used for
            normalisation (ones when off).
    """

    es_state: Any
    key: jax.Array
    generation: jax.Array
    best_fitness: jax.Array
    best_meta_params: Any
    baselines: jax.Array


@struct.dataclass
class TruncatedEvolutionState(EvolutionState):
    """:class:`EvolutionState` of a run with ``es.truncations > 1``: also the agents carried
    between truncations, ``truncation`` (:class:`~metarl.evolve.truncation.TruncationState`).
    A class of its own, so that the checkpoints of every other run keep their structure."""

    truncation: TruncationState = None


@struct.dataclass
class Asked:
    """One generation's candidates before they are scored (:meth:`Evolution.ask`).

    Attributes:
        population: the ``C`` candidates: meta-parameters with leading axis ``[C]``.
        es_state: the strategy's state after the ask (the tell continues it).
        key: ``[2]`` the key of the next generation.
        tell_key: ``[2]`` the key of this generation's tell.
        run_keys: ``[E, C, S, 2]`` one key per environment, candidate and training seed.
    """

    population: Any
    es_state: Any
    key: jax.Array
    tell_key: jax.Array
    run_keys: jax.Array


@struct.dataclass
class Scores:
    """What training the candidates gave (:meth:`Evolution.score`).

    Attributes:
        returns: ``[C, S, E]`` each run's return (the fitness metric).
        valid: ``[C, S, E]`` whether each run stayed finite.
        hyperparameters: with ``fitness.hyperparameter_ranges``, per ranged field the
            ``[E, C, S]`` values the runs trained with; empty otherwise.
        reached: with ``es.rungs > 1``, ``[C]`` the last rung each candidate trained in
            (its returns are its scores there; :mod:`metarl.evolve.rungs`); else ``None``.
        tasks: with ``fitness.tasks_per_generation = K < E``, ``[K]`` the indices of the
            ``[[inner]]`` tasks that trained (sorted); the returns, validity and
            hyperparameters then have ``K`` where they have ``E`` above. ``None`` when
            every task trained.
    """

    returns: jax.Array
    valid: jax.Array
    hyperparameters: dict
    reached: jax.Array | None = None
    tasks: jax.Array | None = None


class Evolution:
    """A meta-evolution experiment: static parts plus pure ``init`` / ``generation``.

    The inner loops are the :class:`~inner_loops.learner.Learner` s of ``config.inner``
    (any registered algorithm), trained with the evolved objective; only their ``train``
    and the contract's metrics are used here. The learners of ``config.held_out`` are
    built too, to check those entries as ``[[inner]]`` ones are, and never trained.

    ``mesh`` (a :class:`jax.sharding.Mesh`, e.g. :func:`metarl.sharding.population_mesh`)
    shards each generation's ``C * S`` training runs over its devices; by default a mesh
    over every visible device is built when ``config.run.shard`` is true, and none otherwise.
    A one-device mesh is dropped, so that case runs the unsharded program unchanged.
    """

    def __init__(self, config: ExperimentConfig, mesh=None):
        if not isinstance(config.meta, EvolutionMeta):
            raise ConfigError(f"meta.method: {config.meta.method!r} takes meta-gradient "
                              "steps (metarl.evolve.metagradient.MetaGradient), not "
                              "generations")
        self.config = config
        self.mesh = run_mesh(config.run.shard, mesh)
        self.objective = config.objective.build()
        self.template = self.objective.init(jax.random.PRNGKey(0))
        self.num_dims = ravel_pytree(self.template)[0].size
        if self.num_dims == 0:
            raise ConfigError(
                f"objective.name: {config.objective.name!r} has no meta-parameters to evolve; "
                "choose a learned objective such as value_distance, lpo or ta_lpo"
            )
        self.strategy, self.es_params = make_strategy(config.es, self.template)
        self.learners = [build_learner(inner, self.objective, _inner_path(config, i))
                         for i, inner in enumerate(config.inner)]
        for index, inner in enumerate(config.held_out):  # checked as [[inner]]; not trained
            build_learner(inner, self.objective, f"held_out[{index}]"
                          if len(config.held_out) > 1 else "held_out")
        # before anything is allocated: a population of replay buffers can outgrow memory
        runs = config.es.population_size * config.fitness.seeds_per_candidate
        for learner in self.learners:
            check_population_memory(learner, runs, config.run.chunk_size,
                                    1 if mesh is None else mesh.devices.size)
        if config.es.rungs > 1:  # a schedule that leaves a rung without updates fails here
            for learner in self.learners:
                rung_ends(learner.num_updates, config.es.rungs, config.es.eta)
        self.truncation_updates = (truncation_updates(self.learners, config.es.truncations)
                                   if config.es.truncations > 1 else None)
        # one traced and compiled step for every Evolution of an equal config in a process
        self.step = shared_program(step_program_key(config, "generation", mesh),
                                   lambda: jax.jit(self.generation))

    @property
    def agent_steps_per_generation(self) -> int:
        """Environment steps one generation trains (fewer with ``es.rungs > 1``; with
        sampled tasks ``K`` times the mean over the ``E`` tasks, exact when their budgets
        are equal)."""
        cfg = self.config
        if self.truncation_updates is not None:  # one truncation of every agent
            return agent_steps(cfg.es.population_size, cfg.fitness.seeds_per_candidate,
                               self.truncation_updates,
                               [learner.steps_per_update for learner in self.learners], 1, 1)
        steps = agent_steps(cfg.es.population_size, cfg.fitness.seeds_per_candidate,
                            [learner.num_updates for learner in self.learners],
                            [learner.steps_per_update for learner in self.learners],
                            cfg.es.rungs, cfg.es.eta)
        if cfg.samples_tasks:
            return round(steps * cfg.tasks_per_generation / len(self.learners))
        return steps

    def init(self, key: jax.Array | None = None, baselines=None) -> EvolutionState:
        """Initial state; the search starts at the objective's own initialisation."""
        if key is None:
            key = jax.random.PRNGKey(self.config.run.seed)
        key, init_key, es_key = _start_keys(key)
        mean = self.objective.init(init_key)
        es_state = init_search(self.config.es, self.strategy, self.es_params, es_key, mean)
        if baselines is None:
            baselines = self.config.fitness.baseline_returns or (1.0,) * len(self.config.inner)
        state = EvolutionState(
            es_state=es_state,
            key=key,
            generation=jnp.int32(0),
            best_fitness=jnp.float32(-jnp.inf),
            best_meta_params=mean,
            baselines=jnp.asarray(baselines, jnp.float32),
        )
        if self.truncation_updates is not None:
            asked = jax.eval_shape(self.ask, state)  # the shapes of the first candidates
            state = TruncatedEvolutionState(**vars(state), truncation=empty_truncation_state(
                self.learners, asked.population, asked.run_keys, self._hypers))
        state = strong_types(state)
        if self.mesh is not None:  # the placement every generation returns: compile once
            state = put_replicated(state, self.mesh)
        return state

    def mean_meta_params(self, state: EvolutionState):
        """The current centre of the search distribution, as objective meta-parameters (a
        population-based strategy's best solution)."""
        return search_centre(self.config.es, self.strategy, state.es_state)

    def generation(self, state: EvolutionState) -> tuple[EvolutionState, dict]:
        """Ask, train ``C × S`` agents per environment, score, tell. Pure; jit it.

        It is :meth:`ask`, :meth:`score` and :meth:`tell` in a row (the pieces that
        :mod:`metarl.evolve.replicated` maps over ``N`` states).

        With ``fitness.hyperparameter_ranges`` every run trains at hyperparameters drawn
        from its own key (:func:`~metarl.evolve.fitness.draw_hyperparameters`), and the
        metrics hold ``hyperparameters``: per ranged field the ``[E, 2]`` smallest and
        largest value drawn on each environment.

        With ``fitness.tasks_per_generation = K < E`` only the ``K`` tasks of
        :meth:`sample_tasks` train, and the metrics hold ``tasks`` (``[K]``), with
        ``returns`` ``[C, K]`` and the hyperparameters' ``[K, 2]`` of those tasks.

        With ``es.truncations > 1`` a generation is one truncation
        (:meth:`truncated_generation`)."""
        if self.truncation_updates is not None:
            return self.truncated_generation(state)
        tasks = self.sample_tasks(state.generation)
        asked = self.ask(state)
        scores = self.score(asked.population, asked.run_keys, state.baselines[None], tasks)
        state, metrics = self.tell(state, asked, scores)
        if self.mesh is not None:  # every process of a multi-host run can read the results
            state, metrics = replicate((state, metrics), self.mesh)
        return state, metrics

    def sample_tasks(self, generation: jax.Array) -> jax.Array | None:
        """``[K]`` int32: the indices (sorted) of the ``[[inner]]`` tasks that generation
        ``generation`` (``[]``, the generations completed before it) trains, drawn
        uniformly without replacement from the task stream (module docstring); ``None``
        when every task trains (``fitness.tasks_per_generation`` unset or ``E``). Pure;
        call it with an index that is the same for every evolution run together."""
        cfg = self.config
        if not cfg.samples_tasks:
            return None
        stream = jax.random.fold_in(jax.random.PRNGKey(cfg.task_seed), TASK_STREAM)
        key = jax.random.fold_in(stream, generation)
        drawn = jax.random.permutation(key, len(self.learners))[:cfg.tasks_per_generation]
        return jnp.sort(drawn).astype(jnp.int32)

    def ask(self, state: EvolutionState) -> Asked:
        """The generation's ``C`` candidates and the keys of their training runs (the
        state's key split as every generation splits it). Pure; ``vmap`` it over states."""
        cfg = self.config
        num_candidates, num_seeds = cfg.es.population_size, cfg.fitness.seeds_per_candidate
        key, ask_key, tell_key, *env_keys = jax.random.split(state.key, 3 + len(self.learners))
        population, es_state = ask_search(cfg.es, self.strategy, self.es_params, ask_key,
                                          state.es_state, state.generation)
        run_keys = []
        for env_key in env_keys:
            if cfg.fitness.common_seeds:
                seeds = jax.random.split(env_key, num_seeds)
                keys = jnp.broadcast_to(seeds, (num_candidates, *seeds.shape))
            else:
                keys = jax.random.split(env_key, num_candidates * num_seeds)
                keys = keys.reshape(num_candidates, num_seeds, -1)
            run_keys.append(keys)
        return Asked(population=population, es_state=es_state, key=key, tell_key=tell_key,
                     run_keys=jnp.stack(run_keys))

    def score(self, population, run_keys: jax.Array, baselines: jax.Array,
              tasks: jax.Array | None = None) -> Scores:
        """Train every candidate of ``population`` (leading axis ``[P]``) on its keys
        ``run_keys [E, P, S, 2]`` with each environment's learner, all ``P * S`` runs of an
        environment in one call of :func:`~metarl.evolve.fitness.evaluate_candidates`
        (chunked and sharded there). ``P`` is ``C`` for one evolution and ``N * C`` for
        ``N`` evolved together (evolution-major), with ``baselines [N, E]``. Without rungs
        every run depends on its own candidate and key only; with ``es.rungs > 1`` the
        candidates of each evolution train in rungs and compete within it
        (:func:`metarl.evolve.rungs.train_in_rungs`, which reads the baselines).

        With ``tasks`` (``[K]``, :meth:`sample_tasks`; not batched) only those tasks
        train, on their own keys ``run_keys[tasks]`` (:meth:`score_tasks`)."""
        cfg = self.config
        if tasks is not None:
            return self.score_tasks(population, run_keys, tasks)
        hypers = self._hypers(run_keys)
        ranged = {name: jnp.stack([getattr(h, name) for h in hypers])
                  for name in cfg.fitness.hyperparameter_ranges}
        if cfg.es.rungs > 1:
            returns, valid, reached = train_in_rungs(
                self.learners, population, run_keys, hypers, cfg.fitness, baselines,
                baselines.shape[0], cfg.es.rungs, cfg.es.eta, cfg.run.chunk_size, self.mesh)
            return Scores(returns=returns, valid=valid, hyperparameters=ranged,
                          reached=reached)
        returns, valid = [], []
        for learner, keys, env_hypers in zip(self.learners, run_keys, hypers, strict=True):
            env_returns, env_valid, _ = evaluate_candidates(
                learner.train, population, keys, env_hypers, cfg.fitness,
                cfg.run.chunk_size, self.mesh,
            )
            returns.append(env_returns)
            valid.append(env_valid)
        return Scores(returns=jnp.stack(returns, axis=-1), valid=jnp.stack(valid, axis=-1),
                      hyperparameters=ranged)

    def score_tasks(self, population, run_keys: jax.Array, tasks: jax.Array) -> Scores:
        """Train every candidate of ``population`` (``[P]``) on the ``K`` tasks ``tasks``
        only (``[K]`` int32, the same for every evolution of ``population``): the tasks one
        after the other (``lax.map``), each by a ``lax.switch`` over the ``E`` learners, so
        one task's training runs per slot and the program holds each learner once.

        Returns :class:`Scores` with ``returns`` and ``valid`` ``[P, S, K]``,
        ``hyperparameters`` ``[K, P, S]`` per ranged field and ``tasks``."""
        cfg = self.config
        names = tuple(cfg.fitness.hyperparameter_ranges)

        def branch(learner):
            def train(keys):  # [P, S, 2] -> [P, S], [P, S], {name: [P, S]}
                hypers = draw_hyperparameters(keys, learner.default_hypers, cfg.fitness)
                returns, valid, _ = evaluate_candidates(
                    learner.train, population, keys, hypers, cfg.fitness,
                    cfg.run.chunk_size, self.mesh)
                ranged = {name: jnp.asarray(getattr(hypers, name), jnp.float32)
                          for name in names}
                return returns.astype(jnp.float32), valid, ranged
            return train

        branches = [branch(learner) for learner in self.learners]
        returns, valid, ranged = jax.lax.map(
            lambda slot: jax.lax.switch(slot[0], branches, slot[1]),
            (tasks, run_keys[tasks]))
        return Scores(returns=jnp.moveaxis(returns, 0, -1), valid=jnp.moveaxis(valid, 0, -1),
                      hyperparameters=ranged, tasks=tasks)

    def _hypers(self, run_keys: jax.Array) -> list:
        """Per environment the hyperparameters of the runs of ``run_keys [E, P, S, 2]``
        (:func:`~metarl.evolve.fitness.draw_hyperparameters`)."""
        return [draw_hyperparameters(keys, learner.default_hypers, self.config.fitness)
                for learner, keys in zip(self.learners, run_keys, strict=True)]

    def truncated_generation(self, state: EvolutionState) -> tuple[EvolutionState, dict]:
        """One truncation (:mod:`metarl.evolve.truncation`): ask, advance every carried
        agent ``K`` updates (new agents at an unroll's first truncation), tell each
        candidate's fitness on those updates. Pure; jit it.

        ``best_fitness`` is here the population's mean fitness per truncation over a whole
        unroll, the best unroll so far, and ``best_meta_params`` the search centre at the
        end of that unroll: a perturbed candidate trains only ``K`` updates, so no single
        candidate has a whole run's score. The metrics add ``truncation``, the truncation
        just trained (``0 .. M-1``), and ``unroll_fitness``, that mean once an unroll
        ends (NaN before)."""
        asked = self.ask(state)
        carried, scores = self.score_truncation(asked.population, asked.run_keys,
                                                state.truncation)
        told, metrics = self.tell(state, asked, scores)
        state, metrics = self.end_truncation(state, told, metrics, carried)
        if self.mesh is not None:
            state, metrics = replicate((state, metrics), self.mesh)
        return state, metrics

    def score_truncation(self, population, run_keys: jax.Array, carried: TruncationState
                         ) -> tuple[TruncationState, Scores]:
        """Advance the agents of ``P`` candidates (``G`` evolutions of ``C``; ``carried``
        has their ``[P * S]`` agents) one truncation
        (:func:`~metarl.evolve.truncation.train_truncation`): the carried agents after it,
        and the runs' scores ``[P, S, E]``."""
        cfg = self.config
        carried, returns, valid = train_truncation(
            self.learners, population, run_keys, carried, self.truncation_updates,
            cfg.fitness, cfg.run.chunk_size, self.mesh)
        scores = Scores(returns=returns, valid=valid, hyperparameters={
            name: jnp.stack([getattr(h, name) for h in self._hypers(carried.run_keys)])
            for name in cfg.fitness.hyperparameter_ranges})
        return carried, scores

    def end_truncation(self, state: EvolutionState, told: EvolutionState, metrics: dict,
                       carried: TruncationState) -> tuple[EvolutionState, dict]:
        """After the tell of one evolution's truncation (``state`` before it, ``told``
        after): count the truncation, keep the best unroll (module docstring of
        :mod:`metarl.evolve.truncation`), carry the agents. Pure; ``vmap`` it over
        evolutions."""
        truncations = self.config.es.truncations
        trained = state.truncation.truncation
        fitness = jnp.where(metrics["valid"], metrics["fitness"], jnp.nan)
        mean_fitness = jnp.where(jnp.any(metrics["valid"]), jnp.nanmean(fitness), 0.0)
        unroll = (carried.unroll_fitness + mean_fitness) / truncations
        carried, finished = advance_unroll(carried, mean_fitness, truncations)
        # the tell tracked single candidates; with truncations whole unrolls compare
        improved = finished & (unroll > state.best_fitness)
        centre = self.mean_meta_params(told)
        state = told.replace(
            truncation=carried,
            best_fitness=jnp.where(improved, unroll, state.best_fitness),
            best_meta_params=jax.tree.map(lambda new, old: jnp.where(improved, new, old),
                                          centre, state.best_meta_params))
        metrics = {**metrics, "best_fitness": state.best_fitness, "truncation": trained,
                   "unroll_fitness": jnp.where(finished, unroll, jnp.nan)}
        return state, metrics

    def tell(self, state: EvolutionState, asked: Asked, scores: Scores
             ) -> tuple[EvolutionState, dict]:
        """Fitness from ``scores`` (``[C, S, E]``), the strategy's update, the best so
        far: the next state and the generation's metrics. Pure; ``vmap`` it over states.

        With sampled tasks (``scores.tasks``, ``[K]``) the returns are ``[C, S, K]``, each
        normalised by its own task's baseline, and the metrics add ``tasks``.

        Users think in returns (higher is better); evosax minimises, so the sign is flipped
        here, once."""
        returns, valid = scores.returns, scores.valid
        baselines = (state.baselines if scores.tasks is None
                     else state.baselines[scores.tasks])
        fitness, candidate_valid = combine_fitness(returns, valid, baselines)
        if scores.reached is not None:
            fitness = rank_below_survivors(fitness, scores.reached, self.config.es.rungs)
        population = asked.population
        es_state = tell_search(self.config.es, self.strategy, self.es_params, asked.tell_key,
                               population, -fitness, asked.es_state, state.generation)
        best_index = jnp.argmax(fitness)
        improved = candidate_valid[best_index] & (fitness[best_index] > state.best_fitness)
        best_params = jax.tree.map(lambda x: x[best_index], population)
        state = state.replace(  # the baselines (and carried agents) stay
            es_state=es_state,
            key=asked.key,
            generation=state.generation + 1,
            best_fitness=jnp.where(improved, fitness[best_index], state.best_fitness),
            best_meta_params=jax.tree.map(
                lambda new, old: jnp.where(improved, new, old), best_params,
                state.best_meta_params,
            ),
        )
        metrics = {
            "fitness": fitness,
            "valid": candidate_valid,
            "returns": jnp.where(valid, returns, jnp.nan).mean(axis=1),  # [C, E]
            "invalid_runs": jnp.sum(~valid),
            "best_fitness": state.best_fitness,
        }
        if scores.reached is not None:
            metrics["rung_reached"] = scores.reached
        if scores.tasks is not None:
            metrics["tasks"] = scores.tasks
        if scores.hyperparameters:  # [E, 2]: the smallest and largest value drawn
            metrics["hyperparameters"] = {
                name: jnp.stack([jnp.min(values, axis=(1, 2)), jnp.max(values, axis=(1, 2))],
                                axis=-1)
                for name, values in scores.hyperparameters.items()}
        return state, metrics

    def measure_baselines(self, key: jax.Array) -> jax.Array:
        """Return per environment ``[E]`` of each algorithm with its own default losses
        (standard PPO for PPO): the normalisation baselines."""
        cfg = self.config
        values = []
        for inner, env_key in zip(cfg.inner, jax.random.split(key, len(cfg.inner)),
                                  strict=True):
            learner = make_learner(inner)
            keys = jax.random.split(env_key, cfg.fitness.baseline_seeds)
            metrics = jax.jit(jax.vmap(learner.train))(keys)
            returns = run_return(metrics, cfg.fitness)
            ok = run_is_valid(metrics, returns)
            if not bool(jnp.any(ok)):
                raise RuntimeError(f"baseline {learner.algorithm} on {inner.env_id} produced "
                                   "no finite return")
            values.append(float(jnp.mean(returns[ok])))
        if any(v == 0 for v in values):
            raise RuntimeError(f"a baseline return is exactly 0 ({values}); cannot normalise")
        return jnp.asarray(values, jnp.float32)


def _inner_path(config: ExperimentConfig, index: int) -> str:
    return f"inner[{index}]" if len(config.inner) > 1 else "inner"


def build_learner(inner, objective=None, path: str = "inner"):
    """:func:`inner_loops.registry.make_learner`, its errors as :class:`ConfigError` naming
    the field: an unknown environment (``inner.env_id``), a policy that does not fit it,
    an objective that does not fit the algorithm (``objective.name``)."""
    try:
        return make_learner(inner, objective)
    except ValueError as error:
        message = str(error)
        if message.startswith("objective "):
            raise ConfigError(f"objective.name: {message}") from None
        raise ConfigError(f"{path}.{message}") from None
