"""DvD's diversity term: the log-determinant of an RBF kernel over members' actions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from metarl.population.diversity import log_det_diversity, rbf_kernel, squared_distances


def test_two_members_match_the_hand_computed_determinant():
    actions = jnp.array([[[0.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [1.0, 3.0]]])  # [2, B=2, A=2]
    # mean squared difference over the 4 numbers: (1 + 0 + 0 + 4) / 4
    np.testing.assert_allclose(squared_distances(actions), [[0.0, 1.25], [1.25, 0.0]])
    k = np.exp(-1.25 / 2.0)
    np.testing.assert_allclose(rbf_kernel(actions), [[1.0, k], [k, 1.0]], rtol=1e-6)
    jitter = 1e-4
    expected = np.log((1.0 + jitter) ** 2 - k ** 2)
    np.testing.assert_allclose(log_det_diversity(actions, jitter=jitter), expected, rtol=1e-5)


def test_ascending_the_diversity_pushes_actions_apart():
    actions = jax.random.normal(jax.random.PRNGKey(0), (4, 8, 1)) * 0.1
    before = squared_distances(actions)
    step = jax.grad(log_det_diversity)(actions)
    after = squared_distances(actions + 0.1 * step)
    off_diagonal = ~np.eye(4, dtype=bool)
    assert float(log_det_diversity(actions + 0.1 * step)) > float(log_det_diversity(actions))
    assert np.all(np.asarray(after)[off_diagonal] > np.asarray(before)[off_diagonal])


def test_identical_members_give_a_finite_value_and_gradient():
    actions = jnp.ones((5, 16, 2))
    value, gradient = jax.value_and_grad(log_det_diversity)(actions)
    assert np.isfinite(float(value)) and float(value) < -10.0  # nearly singular
    assert np.all(np.isfinite(np.asarray(gradient)))
    # far-apart members reach the maximum, M log(1 + jitter)
    apart = jnp.arange(5.0)[:, None, None] * 100.0 * jnp.ones((5, 16, 2))
    np.testing.assert_allclose(log_det_diversity(apart), 5 * np.log1p(1e-4), atol=2e-6)
