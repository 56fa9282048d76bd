"""Truncated evolution: the meta-parameters update after every ``K`` updates of the inner
loop, not after whole training runs (``[es] truncations = M > 1`` with ``PersistentES`` or
``NoiseReuseES``).

**The schedule.** Every training run of ``U`` updates is cut into ``M`` truncations of
``K = U / M`` updates (per environment; ``U`` must divide). One *generation* of such a run
is one truncation: the strategy asks for ``C`` candidates, every agent advances ``K``
updates with its candidate's meta-parameters, the strategy is told each candidate's
fitness on those ``K`` updates, and its mean moves. The ``C x S`` agents (and their run
keys) are carried in the :class:`~metarl.evolve.generation.EvolutionState` from one
truncation to the next: candidate ``i``'s agents continue from where candidate ``i``'s
agents stopped. After ``M`` truncations (an *unroll*) every agent starts again from
scratch, on new seeds drawn from the generation's key. All particles start together
(evosax keeps one step counter), so ``es.generations`` counts meta-updates: a run of
``G`` generations trains ``G / M`` unrolls.

**The estimators** (Vicol et al. 2021, PES; Li et al. 2023, NRES). The fitness a
truncation scores is the fitness metric on its ``K`` updates alone. Its sum over an
unroll is ``M`` times the whole run's ``mean_return`` (area under the learning curve),
which is what the two estimators target. ``PersistentES`` draws a new perturbation every
truncation and weights each truncation's fitness by the sum of the perturbations the
particle has carried since the unroll began, so the influence of earlier truncations on
later returns, through the agent's state, is credited to them. ``NoiseReuseES`` keeps one
perturbation for the whole unroll, which gives the same unbiasedness with lower variance
when truncations are many. Plain truncated ES (a fresh perturbation scored on its own
truncation) ignores that influence: it is greedy, biased towards what pays within ``K``
updates. That is why only these two strategies take ``truncations > 1``.

**What fits, and the bias that remains.**

- Fitness: ``fitness.metric = "mean_return"`` only. ``final_return`` scores the end of
  the run alone: only the last truncation would carry signal, at the cost of a full run.
- Objectives: any. A temporally aware objective (TA-LPO) sees the right training progress,
  since the agents' update counters are carried.
- Both estimators are unbiased for a *fixed* search mean. Here the mean moves after every
  truncation, so later truncations of an unroll are trained with meta-parameters the
  earlier perturbations were not drawn around: a bias that shrinks with the learning rate
  (the papers' own setting). Fitness shaping also matters: ``raw`` keeps the estimator's
  form; the default centred ranks, or standardising, rescale each truncation's fitness on
  its own, which weights truncations unequally.
- A truncation in which an agent finishes no episode has no return. Such a run scores the
  mean of the runs of its environment and seed that did (no signal, no penalty); a run
  whose losses went non-finite ranks last, as in whole-run evolution.

Not combined with ``es.rungs > 1`` (rungs stop candidates within one whole run). With
``es.evolution_seeds > 1`` the ``N`` evolutions' agents train together
(:mod:`metarl.evolve.replicated`), each evolution on its own schedule: one that resumed
from an earlier truncation starts its new agents when its own unroll ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from metarl.config import ConfigError
from metarl.evolve.fitness import draw_hyperparameters, run_is_valid, run_return, runs_of
from metarl.sharding import advance_population, init_population


@struct.dataclass
class TruncationState:
    """The inner loops carried between truncations (part of the evolution's state).

    Attributes:
        agents: per environment the ``C * S`` agent states (candidate-major).
        run_keys: ``[E, C, S, 2]`` the keys the agents started from (their drawn
            hyperparameters are redrawn from them every truncation).
        truncation: ``[]`` int32, the truncation the next generation trains, ``0 .. M-1``;
            ``0`` starts new agents.
        unroll_fitness: ``[]`` the population's mean fitness summed over the truncations
            of the current unroll so far.
    """

    agents: tuple
    run_keys: jax.Array
    truncation: jax.Array
    unroll_fitness: jax.Array


def truncation_updates(learners: Sequence[Any], truncations: int) -> tuple[int, ...]:
    """``K`` per environment: the updates each truncation trains, ``U / M``.

    Raises:
        ConfigError: named ``es.truncations`` when an environment's ``U`` updates do not
            split into ``M`` equal truncations.
    """
    updates = []
    for learner in learners:
        if learner.num_updates % truncations:
            raise ConfigError(
                f"es.truncations: {truncations} truncations do not split the "
                f"{learner.num_updates} updates of {learner.algorithm} on "
                f"{learner.config.env_id} evenly; choose a divisor of {learner.num_updates}")
        updates.append(learner.num_updates // truncations)
    return tuple(updates)


def empty_truncation_state(learners: Sequence[Any], population, run_keys,
                           hypers_of: Callable[[Any], Sequence]) -> TruncationState:
    """A state of the right shapes and dtypes, filled with zeros (no computation): the
    first generation starts every agent afresh, so the values are never read.

    Args:
        learners, population, run_keys: as for :func:`train_truncation` (arrays or
            :class:`jax.ShapeDtypeStruct` s: only their shapes are used).
        hypers_of: ``run_keys -> `` per environment the runs' hyperparameters.
    """

    def agents_of(population, run_keys):
        return tuple(_init_agents(learner, population, keys, env_hypers, "auto", None)
                     for learner, keys, env_hypers in zip(learners, run_keys,
                                                          hypers_of(run_keys), strict=True))

    shapes = jax.eval_shape(agents_of, population, run_keys)
    return TruncationState(
        agents=jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
        run_keys=jnp.zeros(run_keys.shape, run_keys.dtype),
        truncation=jnp.int32(0),
        unroll_fitness=jnp.float32(0.0),
    )


def _init_agents(learner, population, keys, hypers, chunk_size, mesh):
    """Fresh states of one environment's ``C * S`` agents from ``keys [C, S, 2]``."""
    num_candidates, num_seeds = keys.shape[:2]
    meta, env_hypers = runs_of(population, hypers, num_candidates, num_seeds)
    flat_keys = keys.reshape(num_candidates * num_seeds, *keys.shape[2:])
    return init_population(learner, flat_keys, meta, env_hypers, chunk_size, mesh)


def train_truncation(learners: Sequence[Any], population, new_run_keys: jax.Array,
                     carried: TruncationState, updates: Sequence[int], fitness_config,
                     chunk_size, mesh=None) -> tuple[TruncationState, jax.Array, jax.Array]:
    """One truncation of ``G`` evolutions' agents: start new agents where an evolution is
    at truncation 0 (from ``new_run_keys``), continue the carried ones elsewhere, and
    advance every one ``K`` updates with its candidate's meta-parameters, all ``G * C * S``
    agents of an environment in one call. Pure; runs inside the jitted generation.

    Args:
        learners: one learner per environment ``E``.
        population: the ``P = G * C`` candidates' meta-parameters (leading axis ``[P]``,
            evolution-major).
        new_run_keys: ``[E, P, S, 2]`` the keys new agents start from.
        carried: the agents of the previous truncation: per environment ``[P * S, ...]``,
            ``run_keys [E, P, S, 2]``, ``truncation`` ``[]`` (one evolution) or ``[G]``.
        updates: ``K`` per environment (:func:`truncation_updates`).
        fitness_config: the :class:`~metarl.evolve.config.FitnessConfig`.
        chunk_size, mesh: as for :func:`metarl.sharding.advance_population`.

    Returns ``(carried', returns [P, S, E], valid [P, S, E])``: the agents after the
    truncation (``truncation`` and ``unroll_fitness`` unchanged: the tell moves them) and
    each run's fitness metric on its ``K`` updates, a run without a finished episode
    scoring the mean of its evolution's others (module docstring).
    """
    fresh = jnp.reshape(carried.truncation == 0, (-1,))  # [G]
    groups = fresh.shape[0]
    num_rows, num_seeds = new_run_keys.shape[1:3]
    fresh_rows = jnp.repeat(fresh, num_rows // groups)  # [P]
    run_keys = jnp.where(fresh_rows[None, :, None, None], new_run_keys, carried.run_keys)
    fresh_runs = jnp.repeat(fresh_rows, num_seeds)  # [P * S]
    agents, returns, valid = [], [], []
    for env, learner in enumerate(learners):
        hypers = draw_hyperparameters(run_keys[env], learner.default_hypers, fitness_config)

        def restart(keys=run_keys[env], hypers=hypers, learner=learner, env=env):
            new = _init_agents(learner, population, keys, hypers, chunk_size, mesh)
            if groups == 1:  # one evolution: all of its agents start again
                return new
            return jax.tree.map(  # only the evolutions at their first truncation
                lambda a, b: jnp.where(fresh_runs.reshape(-1, *[1] * (a.ndim - 1)), a, b),
                new, carried.agents[env])

        start = jax.lax.cond(jnp.any(fresh), restart, lambda env=env: carried.agents[env])
        meta, run_hypers = runs_of(population, hypers, num_rows, num_seeds)
        state, metrics = advance_population(learner, start, meta, run_hypers, updates[env],
                                            chunk_size, mesh)
        metrics = jax.tree.map(lambda x: x.reshape(num_rows, num_seeds, *x.shape[1:]),
                               metrics)
        env_returns = run_return(metrics, fitness_config)
        trained = jnp.all(metrics["finite"], axis=-1)
        # no episode ended within the truncation: no signal, so the mean of the evolution's
        # runs (same seed index) that did, or 0 where none did: every candidate alike
        finished = jnp.isfinite(env_returns)
        per_group = (groups, num_rows // groups, num_seeds)
        count = jnp.sum(finished.reshape(per_group), axis=1)  # [G, S]
        total = jnp.sum(jnp.where(finished, env_returns, 0.0).reshape(per_group), axis=1)
        fill = jnp.repeat(total / jnp.maximum(count, 1), num_rows // groups, axis=0)
        env_returns = jnp.where(trained & ~finished, fill, env_returns)
        agents.append(state)
        returns.append(env_returns)
        valid.append(run_is_valid({"finite": metrics["finite"]}, env_returns))
    carried = carried.replace(agents=tuple(agents), run_keys=run_keys)
    return carried, jnp.stack(returns, axis=-1), jnp.stack(valid, axis=-1)


def advance_unroll(carried: TruncationState, mean_fitness: jax.Array, truncations: int
                   ) -> tuple[TruncationState, jax.Array]:
    """The bookkeeping after a truncation's tell: count it, add the population's
    ``mean_fitness`` to the unroll's sum. Returns ``(carried', finished)`` where
    ``finished`` says this truncation ended an unroll (the next starts new agents)."""
    truncation = carried.truncation + 1
    finished = truncation == truncations
    total = carried.unroll_fitness + mean_fitness
    return carried.replace(truncation=jnp.where(finished, 0, truncation).astype(jnp.int32),
                           unroll_fitness=jnp.where(finished, 0.0, total)
                           .astype(jnp.float32)), finished
