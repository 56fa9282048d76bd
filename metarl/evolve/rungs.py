"""Candidates stopped early: a generation trained in rungs (successive halving).

With ``[es] rungs = R > 1`` a generation trains its candidates in ``R`` segments of the
inner loop (:meth:`~inner_loops.learner.Learner.init`, then ``advance``). After every rung
but the last, each evolution keeps only its best ``ceil(C / eta^(r + 1))`` candidates by
their fitness so far; the others stop there. Rung ``r`` of an environment whose run has
``U`` updates ends after update ``round(U * eta^(r + 1 - R))``: with ``eta = 3`` and
``R = 3``, a ninth, a third and all of the budget, so that each survivor gets ``eta`` times
the updates of the rung before (Jamieson & Talwalkar 2016; Li et al. 2017's Hyperband runs
such brackets). With ``C = 9`` that trains 9, 3 and 1 candidates: ``(27 + 18 + 18) / 243``
of the full generation's agent-steps. ``eta = 1`` stops no one: the rungs then split the
budget evenly, and the generation equals the one trained in a single call bit for bit.

"Fitness so far" is the run's fitness metric on the updates trained so far
(:func:`metarl.evolve.fitness.run_return` on the partial learning curve: its mean for
``mean_return``, the mean of its last ``final_fraction`` for ``final_return``), combined
over seeds and environments as a full run's is (:func:`~metarl.evolve.fitness.
combine_fitness`; a run that went non-finite ranks last).

What the strategy is told: the survivors of the last rung their full-budget fitness; a
candidate stopped after rung ``r`` its fitness so far, shifted so that it ranks below
every candidate that trained further (and in order among those stopped with it). The
default ``centered_rank`` shaping sees only that order; with ``raw`` or ``standardize``
the shifted values enter (see :func:`rank_below_survivors`).

Shapes stay static under ``jit``: rung ``r`` trains exactly ``K_r`` candidates per
evolution, gathered from the previous rung's states (one compiled generation; the rungs
are unrolled in it). Compared with masking (every candidate stepped, the stopped ones'
updates thrown away), gathering trains only what survives, so the generation costs the
fraction above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from metarl.config import ConfigError
from metarl.evolve.fitness import combine_fitness, run_is_valid, run_return, runs_of
from metarl.sharding import advance_population, init_population


def survivors(num_candidates: int, rungs: int, eta: int) -> tuple[int, ...]:
    """``K_r``: the candidates of one evolution that train in rung ``r``, ``r < rungs``:
    ``ceil(C / eta^r)``, at least 1."""
    return tuple(max(1, math.ceil(num_candidates / eta**r)) for r in range(rungs))


def rung_ends(num_updates: int, rungs: int, eta: int) -> tuple[int, ...]:
    """The update after which each rung ends, for a run of ``num_updates`` updates:
    ``round(U * eta^(r + 1 - rungs))``; the last is ``U``. With ``eta = 1`` no candidate
    stops, and the rungs split the run evenly: ``round(U * (r + 1) / rungs)``.

    Raises:
        ConfigError: a rung would train no update (``U`` too small for ``rungs`` and
            ``eta``), named as ``es.rungs``.
    """
    if eta == 1:
        ends = tuple(round(num_updates * (r + 1) / rungs) for r in range(rungs))
    else:
        ends = tuple(max(1, round(num_updates * float(eta) ** (r + 1 - rungs)))
                     for r in range(rungs))
    if any(b <= a for a, b in zip(ends, ends[1:], strict=False)):
        raise ConfigError(
            f"es.rungs: {rungs} rungs with eta {eta} over {num_updates} updates would end "
            f"at updates {list(ends)}; every rung needs at least one update of its own "
            "(fewer rungs, a smaller eta or a longer run)")
    return ends


def agent_steps(num_candidates: int, seeds: int, updates: Sequence[int],
                steps_per_update: Sequence[int], rungs: int, eta: int) -> int:
    """Environment steps of one generation of one evolution: per environment (its
    ``updates`` and ``steps_per_update``), each rung's survivors times its new updates."""
    kept = survivors(num_candidates, rungs, eta)
    total = 0
    for num_updates, steps in zip(updates, steps_per_update, strict=True):
        ends = rung_ends(num_updates, rungs, eta)
        starts = (0, *ends[:-1])
        total += sum(k * seeds * (end - start) * steps
                     for k, start, end in zip(kept, starts, ends, strict=True))
    return total


def select(fitness: jax.Array, alive: jax.Array, keep: int) -> jax.Array:
    """The positions, within each evolution's ``alive`` candidates, of the ``keep`` best.

    Args:
        fitness: ``[G, C]`` fitness so far of every candidate of ``G`` evolutions.
        alive: ``[G, K]`` the candidates (indices into ``C``) that trained in this rung.
        keep: ``K' <= K`` candidates to keep training.

    Returns ``[G, K']`` positions into ``alive``'s second axis, best first.
    """
    scores = jnp.take_along_axis(fitness, alive, axis=1)
    return jax.lax.top_k(scores, keep)[1]


def rank_below_survivors(fitness: jax.Array, reached: jax.Array, rungs: int) -> jax.Array:
    """What the strategy is told: ``fitness [C]`` (each candidate's fitness at the last rung
    it trained in, ``reached [C]``) with every candidate stopped after rung ``r`` shifted
    below all that trained further, keeping the order and spread within each rung.

    The candidates that stopped after rung ``r < rungs - 1`` move down as a block, where
    needed, until their best is their own spread plus one below the worst of those that
    trained further (the margin :func:`~metarl.evolve.fitness.combine_fitness` gives
    invalid runs). Survivors keep their values. An empty rung changes nothing."""
    adjusted = fitness
    floor = jnp.min(jnp.where(reached == rungs - 1, fitness, jnp.inf))
    for rung in range(rungs - 2, -1, -1):
        here = reached == rung
        best = jnp.max(jnp.where(here, adjusted, -jnp.inf))
        worst = jnp.min(jnp.where(here, adjusted, jnp.inf))
        shift = jnp.where(jnp.any(here), jnp.minimum(0.0, floor - best - (best - worst) - 1.0),
                          0.0)
        adjusted = jnp.where(here, adjusted + shift, adjusted)
        floor = jnp.minimum(floor, jnp.min(jnp.where(here, adjusted, jnp.inf)))
    return adjusted


def train_in_rungs(learners, population, run_keys: jax.Array, hypers: Sequence, fitness_config,
                   baselines: jax.Array, groups: int, rungs: int, eta: int, chunk_size,
                   mesh=None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Train ``P = G * C`` candidates (``G`` evolutions of ``C``) in rungs, stopping all
    but each evolution's best after every rung but the last. Pure; runs inside the jitted
    generation.

    Args:
        learners: one :class:`~inner_loops.learner.Learner` per environment ``E``.
        population: candidates' meta-parameters, leading axis ``[P]`` (evolution-major).
        run_keys: ``[E, P, S, 2]`` one key per environment, candidate and seed.
        hypers: per environment the learner's hyperparameters: scalars shared by every
            run, or ``[P, S]`` arrays (:func:`~metarl.evolve.fitness.draw_hyperparameters`).
        fitness_config: the :class:`~metarl.evolve.config.FitnessConfig`.
        baselines: ``[G, E]`` each evolution's normalisation baselines.
        groups: ``G``; a candidate competes only within its own evolution.
        rungs, eta: the schedule (:func:`survivors`, :func:`rung_ends`).
        chunk_size, mesh: as for :func:`metarl.sharding.advance_population`.

    Returns ``(returns [P, S, E], valid [P, S, E], reached [P])``: each run's score at the
    last rung its candidate trained in, and that rung.
    """
    num_candidates = run_keys.shape[1] // groups
    num_seeds = run_keys.shape[2]
    kept = survivors(num_candidates, rungs, eta)
    ends = [rung_ends(learner.num_updates, rungs, eta) for learner in learners]
    curves = [jnp.full((groups * num_candidates, num_seeds, learner.num_updates), jnp.nan,
                       jnp.float32) for learner in learners]
    finite = [jnp.ones((groups * num_candidates, num_seeds, learner.num_updates), bool)
              for learner in learners]
    states = [None] * len(learners)
    reached = jnp.zeros((groups * num_candidates,), jnp.int32)
    alive = jnp.broadcast_to(jnp.arange(num_candidates), (groups, num_candidates))
    rung_scores = []
    for rung, count in enumerate(kept):
        rows = (jnp.arange(groups)[:, None] * num_candidates + alive).reshape(-1)  # [G*K]
        runs = rows.size * num_seeds
        for env, learner in enumerate(learners):
            start = 0 if rung == 0 else ends[env][rung - 1]
            steps = ends[env][rung] - start
            # per-run hyperparameters ([P, S]) of the candidates still training
            gathered = jax.tree.map(lambda x, rows=rows: x[rows] if jnp.ndim(x) else x,
                                    hypers[env])
            meta, env_hypers = runs_of(jax.tree.map(lambda x, rows=rows: x[rows], population),
                                       gathered, rows.size, num_seeds)
            if rung == 0:
                keys = run_keys[env][rows].reshape(runs, *run_keys.shape[3:])
                states[env] = init_population(learner, keys, meta, env_hypers, chunk_size,
                                              mesh)
            states[env], metrics = advance_population(learner, states[env], meta, env_hypers,
                                                      steps, chunk_size, mesh)
            shape = (rows.size, num_seeds, steps)
            curves[env] = curves[env].at[rows, :, start:start + steps].set(
                metrics["episode_return"].reshape(shape))
            finite[env] = finite[env].at[rows, :, start:start + steps].set(
                metrics["finite"].reshape(shape))
        reached = reached.at[rows].set(rung)
        returns, valid = [], []
        for env in range(len(learners)):
            partial = {"episode_return": curves[env][..., :ends[env][rung]],
                       "finite": finite[env][..., :ends[env][rung]]}
            env_returns = run_return(partial, fitness_config)
            returns.append(env_returns)
            valid.append(run_is_valid(partial, env_returns))
        rung_scores.append((jnp.stack(returns, axis=-1), jnp.stack(valid, axis=-1)))
        if rung == rungs - 1:
            break
        returns, valid = rung_scores[-1]
        per_group = (groups, num_candidates, num_seeds, len(learners))
        fitness, _ = jax.vmap(combine_fitness)(returns.reshape(per_group),
                                               valid.reshape(per_group), baselines)
        positions = select(fitness, alive, kept[rung + 1])  # [G, K']
        alive = jnp.take_along_axis(alive, positions, axis=1)
        state_rows = ((jnp.arange(groups)[:, None, None] * count + positions[..., None])
                      * num_seeds + jnp.arange(num_seeds)).reshape(-1)
        states = [jax.tree.map(lambda x, rows=state_rows: x[rows], state) for state in states]
    candidates = jnp.arange(reached.size)
    returns = jnp.stack([score[0] for score in rung_scores])[reached, candidates]
    valid = jnp.stack([score[1] for score in rung_scores])[reached, candidates]
    return returns, valid, reached

