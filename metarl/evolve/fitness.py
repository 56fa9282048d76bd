"""From training runs to fitness: population × seeds evaluation, NaN handling, normalisation.

Shapes used throughout: ``C`` candidates (meta-parameter sets), ``S`` seeds per candidate,
``E`` environments, ``U`` updates per training run. Only the contract's ``episode_return``
and ``finite`` metrics are read, so any algorithm's learner can be scored.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from inner_loops.population import AUTO, ChunkSize
from metarl.evolve.config import FitnessConfig
from metarl.population.priors import sample
from metarl.sharding import train_population

# folded into a run's key to draw its hyperparameters (fitness.hyperparameter_ranges): far
# above any index ``split`` gives the run's own use of that key (``fold_in(k, i)`` equals
# ``split(k, n)[i]`` under JAX's partitionable threefry)
HYPERPARAMETER_STREAM = 0x6879_7072


def run_return(metrics: dict, config: FitnessConfig) -> jax.Array:
    """The return one training run scores: ``episode_return [..., U] -> [...]``.

    ``mean_return`` averages the learning curve (area under it); ``final_return`` averages
    its last ``final_fraction`` of updates. Updates before the first finished episode hold
    NaN and are skipped; a run that never finished an episode scores NaN.
    """
    curve = metrics["episode_return"]
    if config.metric == "final_return":
        num_updates = curve.shape[-1]
        window = max(1, round(config.final_fraction * num_updates))
        curve = curve[..., num_updates - window :]
    seen = jnp.isfinite(curve)
    total = jnp.sum(jnp.where(seen, curve, 0.0), axis=-1)
    count = jnp.sum(seen, axis=-1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def run_is_valid(metrics: dict, returns: jax.Array) -> jax.Array:
    """A run is valid when every update's losses were finite and its return is a number."""
    return jnp.all(metrics["finite"], axis=-1) & jnp.isfinite(returns)


def draw_hyperparameters(keys: jax.Array, hypers, config: FitnessConfig):
    """The hyperparameters each training run of ``keys [C, S, 2]`` trains with.

    Without ``config.hyperparameter_ranges`` that is ``hypers`` itself (scalars shared by
    every run). With them, each run draws every ranged field from its range
    (:meth:`metarl.population.priors.Prior.sample`: uniform, or log-uniform with ``log``;
    one key per field, split by name) with the key ``fold_in(run_key, HYPERPARAMETER_STREAM)``
    of its own training key, and keeps ``hypers``' value for the other fields. The draws are
    thus part of the generation's key stream and need no key of their own: with
    ``common_seeds`` every candidate trains on the same keys per seed index and so with the
    same draws (common random numbers), and a new generation draws anew. Returns
    ``[C, S]`` arrays in that case.
    """
    ranges = config.hyperparameter_ranges
    if not ranges:
        return hypers

    def draw(key):
        return sample(jax.random.fold_in(key, HYPERPARAMETER_STREAM), ranges, hypers)

    num_candidates, num_seeds = keys.shape[:2]
    drawn = jax.vmap(draw)(keys.reshape(num_candidates * num_seeds, *keys.shape[2:]))
    return jax.tree.map(lambda x: x.reshape(num_candidates, num_seeds), drawn)


def evaluate_candidates(
    train,
    meta_params,
    keys: jax.Array,
    hypers,
    config: FitnessConfig,
    chunk_size: ChunkSize = AUTO,
    mesh=None,
) -> tuple[jax.Array, jax.Array, dict]:
    """Train every candidate on ``S`` seeds of one environment.

    Args:
        train: the learner's ``train`` for this environment.
        meta_params: pytree with leading axis ``[C]``.
        keys: ``[C, S, 2]`` PRNG keys, one per training run.
        hypers: the learner's hyperparameters: scalars shared by all runs, or ``[C, S]``
            arrays, one setting per run (:func:`draw_hyperparameters`).
        config: fitness settings.
        chunk_size: train at most this many runs at once per device (``"auto"`` or a
            positive integer, see :mod:`inner_loops.population`).
        mesh: a :class:`jax.sharding.Mesh` (:func:`metarl.sharding.population_mesh`) to shard
            the ``C * S`` runs over; ``None`` (default) trains them on one device.

    Returns ``(returns [C, S], valid [C, S], metrics)`` where ``metrics`` holds the full
    per-update summaries ``[C, S, U]``.
    """
    num_candidates, num_seeds = keys.shape[:2]
    flat_keys = keys.reshape(num_candidates * num_seeds, *keys.shape[2:])
    flat_meta, flat_hypers = runs_of(meta_params, hypers, num_candidates, num_seeds)
    metrics = train_population(train, flat_keys, flat_meta, flat_hypers, chunk_size, mesh)
    metrics = jax.tree.map(lambda x: x.reshape(num_candidates, num_seeds, *x.shape[1:]), metrics)
    returns = run_return(metrics, config)
    return returns, run_is_valid(metrics, returns), metrics


def runs_of(meta_params, hypers, num_candidates: int, num_seeds: int):
    """What each of ``C * S`` training runs (candidate-major) trains with:
    ``(meta_params [C * S], hypers [C * S])`` from candidates' ``meta_params [C]`` and
    hyperparameters that are scalars shared by every run or ``[C, S]`` arrays."""
    runs = num_candidates * num_seeds
    flat_meta = jax.tree.map(lambda x: jnp.repeat(x, num_seeds, axis=0), meta_params)
    flat_hypers = jax.tree.map(
        lambda x: jnp.broadcast_to(x, (num_candidates, num_seeds)).reshape(runs), hypers)
    return flat_meta, flat_hypers


def combine_fitness(
    returns: jax.Array, valid: jax.Array, baselines: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One fitness per candidate from ``returns [C, S, E]``; higher is better.

    Each environment's return is divided by ``|baseline|`` (ones when not normalising),
    then averaged over seeds and environments. A candidate with any invalid run (NaN or inf
    in training) gets a fitness strictly below every valid candidate, so strategies rank it
    last without non-finite numbers reaching them.

    Returns ``(fitness [C], candidate_valid [C])``.
    """
    normalised = returns / jnp.abs(baselines)
    candidate_valid = jnp.all(valid, axis=(1, 2))
    raw = jnp.mean(jnp.where(valid, normalised, 0.0), axis=(1, 2))
    any_valid = jnp.any(candidate_valid)
    lowest = jnp.min(jnp.where(candidate_valid, raw, jnp.inf))
    highest = jnp.max(jnp.where(candidate_valid, raw, -jnp.inf))
    worst = jnp.where(any_valid, lowest - (highest - lowest) - 1.0, 0.0)
    return jnp.where(candidate_valid, raw, worst), candidate_valid
