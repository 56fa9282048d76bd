"""PPO's choices that differ by backend (``shuffle``, ``final_values``, ``env_resets``): each
is validated, ``auto`` resolves by backend, and each alternative computes what it says.

The defaults on the CPU are today's program bit for bit (the suite's recorded results rely
on it); the alternatives draw other random numbers (``shuffle``, ``env_resets``) or keep the
same targets in another place (``final_values = "in_rollout"``), or, with
``final_values = "none"``, change the targets at time limits as PureJaxRL's ``ppo.py`` does.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import PPOConfig, make_train
from inner_loops.envs import make_vec_env
from inner_loops.ppo import (
    Minibatch,
    Transition,
    make_parts,
    next_values,
    resolve_env_resets,
    shuffle_into_minibatches,
    shuffled_indices,
)

# CartPole cut at 8 steps: every rollout of 16 steps ends episodes by truncation
TINY = PPOConfig(num_envs=2, num_steps=16, total_timesteps=2 * 2 * 16, num_minibatches=2,
                 hidden_sizes=(8,), env_params={"max_steps_in_episode": 8})


@pytest.mark.parametrize("field, allowed", [
    ("shuffle", "sort, permutation"),
    ("final_values", "batched, in_rollout, none"),
    ("env_resets", "auto, presampled, in_step"),
])
def test_each_choice_is_checked_and_the_error_names_field_and_choices(field, allowed):
    with pytest.raises(ValueError, match=f"^{field}: got 'fast'; allowed: {allowed}$"):
        PPOConfig(**{field: "fast"})


def test_auto_env_resets_presample_on_the_cpu_and_draw_in_the_step_elsewhere():
    assert resolve_env_resets("auto", "cpu") == "presampled"
    assert resolve_env_resets("auto", "gpu") == "in_step"
    assert resolve_env_resets("presampled", "gpu") == "presampled"
    assert resolve_env_resets("in_step", "cpu") == "in_step"
    assert jax.default_backend() == "cpu"  # the suite's machine: auto keeps today's program
    assert make_parts(TINY).vec_env.presample_resets
    assert not make_parts(TINY.replace(env_resets="in_step")).vec_env.presample_resets


def test_in_step_resets_replace_a_truncated_episode_by_a_fresh_start():
    vec_env = make_vec_env("CartPole-v1", 3, env_params={"max_steps_in_episode": 2},
                           presample_resets=False)

    @jax.jit
    def two_steps(key):
        obs, state = vec_env.reset(key)
        noise = vec_env.presample(jax.random.fold_in(key, 1), 2)
        assert noise.fresh_obs is None and noise.fresh_state is None
        actions = jnp.zeros(3, jnp.int32)
        first = vec_env.step(None, state, actions, 0.99,
                             jax.tree.map(lambda x: x[0], noise))
        second = vec_env.step(None, first.state, actions, 0.99,
                              jax.tree.map(lambda x: x[1], noise))
        return obs, first, second

    obs, first, second = two_steps(jax.random.PRNGKey(0))
    assert not np.any(first.truncated) and np.all(second.truncated)
    # the final observation continues the episode; the new one is a fresh CartPole start
    # (every coordinate within +-0.05), drawn in the step from its key
    assert np.all(np.abs(np.asarray(second.obs)) <= 0.05)
    assert not np.allclose(second.obs, second.final_obs)
    assert np.all(np.asarray(second.state.env_state.time) == 0)


def _rollout(values: np.ndarray, done: np.ndarray, terminated: np.ndarray, final_obs):
    steps, envs = values.shape
    zeros = jnp.zeros((steps, envs))
    return Transition(obs=jnp.zeros((steps, envs, 4)), action=zeros.astype(jnp.int32),
                      log_prob=zeros, value=jnp.asarray(values), reward=zeros,
                      terminated=jnp.asarray(terminated), done=jnp.asarray(done),
                      final_obs=final_obs)


def test_next_values_of_each_final_values_choice():
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    done = np.array([[False, True], [True, False], [False, False]])
    terminated = np.array([[False, True], [False, False], [False, False]])  # one truncation
    final_obs = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 4))
    last_obs = jax.random.normal(jax.random.PRNGKey(2), (2, 4))
    parts = make_parts(TINY)
    params = parts.network.init(jax.random.PRNGKey(0), last_obs)

    def value(obs):
        return np.asarray(parts.network.apply(params, obs, method=parts.network.value))

    batched, ends = next_values(parts, params, _rollout(values, done, terminated, final_obs),
                                None, last_obs)
    np.testing.assert_array_equal(batched, value(final_obs))
    np.testing.assert_array_equal(ends, terminated)  # a truncation bootstraps

    valued = jnp.asarray(value(final_obs))
    in_rollout, ends = next_values(parts.__class__(**{**vars(parts), "config": TINY.replace(
        final_values="in_rollout")}), params, _rollout(values, done, terminated, None), valued,
        last_obs)
    np.testing.assert_array_equal(in_rollout, valued)
    np.testing.assert_array_equal(ends, terminated)

    none_parts = parts.__class__(**{**vars(parts), "config": TINY.replace(final_values="none")})
    shifted, ends = next_values(none_parts, params, _rollout(values, done, terminated, None),
                                None, last_obs)
    # the next step's value, the value of the observation after the last step at the end,
    # and every episode end (the truncation too) stops bootstrapping
    np.testing.assert_array_equal(shifted[:2], values[1:])
    np.testing.assert_array_equal(shifted[2], value(last_obs))
    np.testing.assert_array_equal(ends, done)


def test_shuffle_choices_give_the_packed_sort_or_jax_random_permutation():
    config = TINY.replace(num_minibatches=4)
    n = config.batch_size
    index = jnp.arange(n, dtype=jnp.float32).reshape(config.num_steps, config.num_envs)
    batch = Minibatch(*[index] * 6)
    key = jax.random.PRNGKey(3)
    for choice, order in (("sort", shuffled_indices(key, n)),
                          ("permutation", jax.random.permutation(key, n))):
        minibatches = shuffle_into_minibatches(config.replace(shuffle=choice), batch, key)
        assert minibatches.obs.shape == (4, n // 4)
        np.testing.assert_array_equal(np.asarray(minibatches.obs).reshape(-1), order)
    assert not np.array_equal(shuffled_indices(key, n), jax.random.permutation(key, n))


@pytest.fixture(scope="module")
def trained():
    """Two updates of the tiny config per choice, from the same keys."""
    keys = jax.random.split(jax.random.PRNGKey(4), 2)
    runs = {}
    for name, changes in {"batched": {}, "in_rollout": {"final_values": "in_rollout"},
                          "pure_jax_rl": {"final_values": "none", "env_resets": "in_step",
                                          "shuffle": "permutation"}}.items():
        runs[name] = jax.device_get(jax.jit(jax.vmap(make_train(TINY.replace(**changes))))(
            keys))
    return runs


def test_in_rollout_final_values_train_as_the_batched_ones(trained):
    batched, in_rollout = trained["batched"], trained["in_rollout"]
    assert np.all(batched["episodes"] > 0)  # truncations every update
    for name in ("value_loss", "policy_loss", "approx_kl", "episode_return"):
        np.testing.assert_allclose(in_rollout[name], batched[name], rtol=1e-5, atol=1e-6)


def test_purejaxrl_choices_train_with_finite_losses_and_other_draws(trained):
    run, batched = trained["pure_jax_rl"], trained["batched"]
    assert np.all(run["finite"]) and np.all(run["episodes"] > 0)
    # other random draws (resets, minibatch order) and other targets at the time limit
    assert not np.allclose(run["value_loss"], batched["value_loss"])
