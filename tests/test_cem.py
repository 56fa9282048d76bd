"""The cross-entropy method of CEM-RL against hand-computed updates, and on a quadratic."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl.population import cem
from metarl.population.cem import CEMConfig


def test_elite_weights_are_log_rank_weights_summing_to_one():
    weights = np.asarray(cem.elite_weights(3))
    expected = np.log(4.0 / np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(weights, expected / expected.sum(), rtol=1e-6)
    assert weights[0] > weights[1] > weights[2] > 0


def test_ask_draws_antithetic_pairs_around_the_mean():
    config = CEMConfig(population_size=6, num_elites=3, init_std=0.5)
    state = cem.init(jnp.array([1.0, -2.0]), config)
    members = np.asarray(cem.ask(jax.random.PRNGKey(0), state, config))
    assert members.shape == (6, 2)
    np.testing.assert_allclose(members[:3] + members[3:], 2 * np.array([[1.0, -2.0]] * 3),
                               atol=1e-6)


def test_tell_moves_to_the_weighted_elites_and_adds_the_decaying_noise():
    config = CEMConfig(population_size=4, num_elites=2, init_std=1.0, extra_noise_init=0.1,
                       extra_noise_end=0.0, extra_noise_decay=0.5)
    state = cem.init(jnp.zeros(2), config)
    members = jnp.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0], [0.0, -2.0]])
    fitness = jnp.array([3.0, 5.0, float("nan"), 1.0])  # NaN ranks last
    told = cem.tell(members, fitness, state, config)
    w1, w2 = np.log(3.0 / 1.0), np.log(3.0 / 2.0)
    w1, w2 = w1 / (w1 + w2), w2 / (w1 + w2)
    # elites by fitness: member 1 (rank 1), member 0 (rank 2)
    np.testing.assert_allclose(told.mean, [w2 * 1.0, w1 * 2.0], rtol=1e-6)
    np.testing.assert_allclose(told.variance, [w2 * 1.0 + 0.1, w1 * 4.0 + 0.1], rtol=1e-6)
    np.testing.assert_allclose(told.extra_noise, 0.05, rtol=1e-6)
    assert int(told.generation) == 1


def test_cem_finds_the_minimum_of_a_quadratic():
    config = CEMConfig(population_size=20, num_elites=10, init_std=1.0, extra_noise_init=1e-2,
                       extra_noise_end=1e-6, extra_noise_decay=0.9)
    target = jnp.array([3.0, -1.0, 0.5, 2.0])

    @jax.jit
    def generation(state, key):
        members = cem.ask(key, state, config)
        fitness = -jnp.sum(jnp.square(members - target), axis=1)
        return cem.tell(members, fitness, state, config), None

    state = cem.init(jnp.zeros(4), config)
    state, _ = jax.lax.scan(generation, state, jax.random.split(jax.random.PRNGKey(0), 60))
    np.testing.assert_allclose(state.mean, target, atol=0.05)
    assert float(jnp.max(state.variance)) < 1e-2


@pytest.mark.parametrize(("changes", "message"), [
    ({"population_size": 5}, "cem.population_size: must be even"),
    ({"num_elites": 12}, "cem.num_elites: 12 elites"),
    ({"num_elites": 0}, "cem.num_elites: must be a positive integer"),
    ({"init_std": -1.0}, "cem.init_std: must be non-negative"),
    ({"extra_noise_init": float("inf")}, "cem.extra_noise_init: must be a finite number"),
    ({"extra_noise_decay": 1.5}, "cem.extra_noise_decay"),
])
def test_bad_cem_configs_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        CEMConfig(**changes)
