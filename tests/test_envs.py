"""Tests of the environment adapter :mod:`inner_loops.envs`.

Specs of the supported families (classic control, MinAtar, brax), the error for unknown ids,
how episode ends are reported (termination vs. truncation, ``final_obs`` vs. the auto-reset
observation), for gymnax and for the adapter's own brax time limit, and the running
normalisation of :class:`~inner_loops.envs.VecEnv`.

Rollouts are short ``lax.scan`` s, one small compilation per environment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import available_envs, make_env, make_vec_env
from inner_loops.envs import BRAX_EPISODE_LENGTH

# (obs_shape, discrete, action_dim, action bound) from the gymnax and brax definitions.
EXPECTED_SPECS = {
    "CartPole-v1": ((4,), True, 2, None),
    "Acrobot-v1": ((6,), True, 3, None),
    "Pendulum-v1": ((3,), False, 1, 2.0),
    "MountainCarContinuous-v0": ((2,), False, 1, 1.0),
    "Breakout-MinAtar": ((10, 10, 4), True, 3, None),
    "SpaceInvaders-MinAtar": ((10, 10, 6), True, 4, None),
    "brax/hopper": ((11,), False, 3, 1.0),
}

# CartPole-v1 terminates when |x| > 2.4 or |theta| > 12 degrees; resets within ±0.05.
CARTPOLE_X_LIMIT = 2.4
CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360
CARTPOLE_RESET_BOUND = 0.05
PENDULUM_TIME_LIMIT = 200


def rollout(env, policy, key, num_steps: int) -> dict[str, np.ndarray]:
    """Run ``policy(key, obs) -> action`` for ``num_steps`` steps from a reset, jitted.

    Returns numpy arrays with a leading time axis: ``obs[t]`` is the observation after step
    ``t`` (auto-reset when the episode ended), ``final_obs[t]`` the one reached by it.
    """

    @jax.jit
    def run(key):
        reset_key, key = jax.random.split(key)
        obs, state = env.reset(reset_key)

        def step(carry, step_key):
            state, obs = carry
            action_key, env_key = jax.random.split(step_key)
            action = policy(action_key, obs)
            next_obs, state, reward, terminated, truncated, final_obs = env.step(
                env_key, state, action
            )
            out = {
                "obs": next_obs,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "final_obs": final_obs,
            }
            return (state, next_obs), out

        (_, _), out = jax.lax.scan(step, (state, obs), jax.random.split(key, num_steps))
        return out

    return jax.device_get(run(key))


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize("env_id", list(EXPECTED_SPECS))
def test_spec(env_id):
    obs_shape, discrete, action_dim, bound = EXPECTED_SPECS[env_id]
    spec = make_env(env_id).spec
    assert spec.env_id == env_id
    assert spec.obs_shape == obs_shape
    assert spec.discrete is discrete
    assert spec.action_dim == action_dim
    if discrete:
        assert spec.action_low is None and spec.action_high is None
    else:
        assert spec.action_low == (-bound,) * action_dim
        assert spec.action_high == (bound,) * action_dim


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar"])
def test_gymnax_reset_and_step_shapes(env_id, key):
    """Observations come out as float32 of the spec's shape (MinAtar's are booleans inside);
    a continuous action is a vector even where gymnax wants a scalar (Pendulum)."""
    env = make_env(env_id)
    spec = env.spec
    obs, state = env.reset(key)
    assert obs.shape == spec.obs_shape and obs.dtype == jnp.float32
    action = jnp.int32(0) if spec.discrete else jnp.zeros(spec.action_dim)
    obs, state, reward, terminated, truncated, final_obs = env.step(key, state, action)
    assert obs.shape == final_obs.shape == spec.obs_shape
    assert obs.dtype == final_obs.dtype == jnp.float32
    assert reward.shape == () and reward.dtype == jnp.float32
    assert terminated.dtype == truncated.dtype == jnp.bool_
    assert np.all(np.isfinite(np.asarray(obs)))


def test_available_envs_cover_both_libraries():
    ids = available_envs()
    assert "CartPole-v1" in ids and "Breakout-MinAtar" in ids
    assert "brax/hopper" in ids and "brax/ant" in ids
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("env_id", ["CartPole-v2", "cartpole-v1", "brax/not-a-robot", ""])
def test_unknown_env_id_lists_valid_ids(env_id):
    with pytest.raises(ValueError) as info:
        make_env(env_id)
    message = str(info.value)
    assert "env_id" in message
    assert repr(env_id) in message
    for valid in ("CartPole-v1", "Pendulum-v1", "Breakout-MinAtar", "brax/hopper"):
        assert valid in message


def test_non_string_env_id_is_rejected():
    with pytest.raises(ValueError, match="env_id"):
        make_env(None)


def test_vec_env_needs_at_least_one_env():
    with pytest.raises(ValueError, match="num_envs"):
        make_vec_env("CartPole-v1", 0)


# --------------------------------------------------------------- episode ends, gymnax


def test_pendulum_time_limit_is_truncation_not_termination(key):
    """Pendulum-v1 never terminates; it truncates every 200 steps and then auto-resets."""
    env = make_env("Pendulum-v1")
    out = rollout(env, lambda k, obs: jnp.zeros(1), key, 2 * PENDULUM_TIME_LIMIT + 5)

    assert not out["terminated"].any()
    np.testing.assert_array_equal(
        np.flatnonzero(out["truncated"]), [PENDULUM_TIME_LIMIT - 1, 2 * PENDULUM_TIME_LIMIT - 1]
    )
    for t in range(len(out["obs"])):
        if out["truncated"][t]:
            # final_obs continues the episode; obs is the start of the next one.
            assert not np.allclose(out["final_obs"][t], out["obs"][t])
        else:
            np.testing.assert_array_equal(out["final_obs"][t], out["obs"][t])
    assert np.all(out["reward"] <= 0.0) and np.all(np.isfinite(out["reward"]))


def test_cartpole_falling_over_is_termination_not_truncation(key):
    """Always pushing right topples the pole within a few dozen steps: a termination."""
    env = make_env("CartPole-v1")
    out = rollout(env, lambda k, obs: jnp.int32(1), key, 60)

    done = out["terminated"] | out["truncated"]
    assert done.any()
    assert not out["truncated"].any()
    first = int(np.flatnonzero(done)[0])
    assert 3 <= first < 40
    final = out["final_obs"][first]
    assert abs(final[0]) > CARTPOLE_X_LIMIT or abs(final[2]) > CARTPOLE_THETA_LIMIT
    # The observation after the step is a fresh episode, near upright.
    assert np.all(np.abs(out["obs"][first]) <= CARTPOLE_RESET_BOUND)
    np.testing.assert_array_equal(out["final_obs"][:first], out["obs"][:first])
    np.testing.assert_array_equal(out["reward"], np.ones_like(out["reward"]))


# ----------------------------------------------------------------- episode ends, brax


def test_brax_time_limit_is_truncation_with_final_obs(key):
    """The adapter's own brax time limit: truncation after BRAX_EPISODE_LENGTH steps.

    ``brax/fast`` (brax's trivial test environment, observation ``[position, velocity]``,
    reset to zeros) never terminates and compiles in a moment, so the full limit is cheap.
    """
    env = make_env("brax/fast")
    out = rollout(env, lambda k, obs: jnp.ones(1), key, BRAX_EPISODE_LENGTH + 5)

    assert not out["terminated"].any()
    limit = BRAX_EPISODE_LENGTH - 1
    np.testing.assert_array_equal(np.flatnonzero(out["truncated"]), [limit])
    assert out["final_obs"][limit][0] > 1.0  # far along after a thousand pushes
    np.testing.assert_array_equal(out["obs"][limit], np.zeros(2))  # auto-reset
    keep = np.arange(len(out["obs"])) != limit
    np.testing.assert_array_equal(out["final_obs"][keep], out["obs"][keep])
    # The next episode restarts from rest: position grows again from zero.
    assert 0.0 < out["obs"][limit + 1][0] < out["final_obs"][limit - 1][0]


# ------------------------------------------------------------ environment parameters


def test_env_params_set_the_time_limit_and_the_dynamics(key):
    """``max_steps_in_episode`` moves Pendulum's truncation; a stronger ``g`` makes the same
    first step from the same start swing faster."""
    env = make_env("Pendulum-v1", {"max_steps_in_episode": 10})
    out = rollout(env, lambda k, obs: jnp.zeros(1), key, 25)
    assert not out["terminated"].any()
    np.testing.assert_array_equal(np.flatnonzero(out["truncated"]), [9, 19])

    def speed_change(env):
        """θ̇ after one unforced step minus θ̇ at the reset: 3 g / (2 l) sin θ dt."""
        obs, state = env.reset(key)
        return env.step(key, state, jnp.zeros(1))[0][2] - obs[2]

    default = speed_change(make_env("Pendulum-v1"))  # g = 10
    heavy = speed_change(make_env("Pendulum-v1", [("g", 30.0)]))
    assert abs(default) > 1e-3
    np.testing.assert_allclose(heavy, 3.0 * default, rtol=1e-3)


def test_brax_episode_length_is_an_env_param(key):
    env = make_env("brax/fast", {"episode_length": 7})
    out = rollout(env, lambda k, obs: jnp.ones(1), key, 16)
    np.testing.assert_array_equal(np.flatnonzero(out["truncated"]), [6, 13])


@pytest.mark.parametrize(
    ("env_id", "env_params", "message"),
    [
        ("CartPole-v1", {"gravty": 9.0},
         "env_params.gravty: CartPole-v1 has no such scalar parameter; allowed: "
         "max_steps_in_episode, gravity,"),
        ("CartPole-v1", {"max_steps_in_episode": 2.5},
         "env_params.max_steps_in_episode: expected an integer, got 2.5"),
        ("CartPole-v1", {"gravity": "strong"}, "env_params.gravity: expected a number"),
        ("CartPole-v1", {"gravity": True}, "env_params.gravity: expected a number, got True"),
        ("Acrobot-v1", {"available_torque": 1.0},
         "env_params.available_torque: Acrobot-v1 has no such scalar parameter"),
        ("CartPole-v1", [1, 2], "env_params: expected a table"),
        ("brax/fast", {"gravity": 1.0}, "env_params.gravity: brax/fast has no such parameter; "
                                        "allowed: episode_length"),
        ("brax/fast", {"episode_length": 0}, "episode_length: expected a positive integer"),
    ],
)
def test_bad_env_params_name_the_parameter(env_id, env_params, message):
    with pytest.raises(ValueError) as error:
        make_env(env_id, env_params)
    assert message in str(error.value)


# ----------------------------------------------------------- presampled resets


@pytest.mark.parametrize("env_id", ["CartPole-v1", "brax/fast"])
def test_step_with_a_given_fresh_start_equals_drawing_it(env_id, key):
    """``step(key, ..., fresh)`` with ``fresh = reset(k)`` is the step that draws its own
    reset from ``key``, whenever ``k`` is the key it would have drawn with."""
    env = make_env(env_id)
    action = jnp.int32(1) if env.spec.discrete else jnp.ones(env.spec.action_dim)

    @jax.jit
    def both(key):
        _, state = env.reset(key)
        implicit = env.step(key, state, action)
        if env_id.startswith("brax/"):
            step_key, reset_key = key, key  # brax dynamics are deterministic
        else:
            step_key, reset_key = jax.random.split(key)
        explicit = env.step(step_key, state, action, env.reset(reset_key))
        return implicit, explicit

    implicit, explicit = jax.device_get(both(key))
    for a, b in zip(jax.tree.leaves(implicit), jax.tree.leaves(explicit), strict=True):
        np.testing.assert_array_equal(a, b)


def test_vec_env_presampled_resets_start_the_next_episodes(key):
    """With :meth:`VecEnv.presample`, an episode that ends at step ``t`` continues from the
    presampled fresh observation of step ``t``; every other observation continues its
    episode. Always pushing right ends CartPole episodes within a few dozen steps."""
    num_envs, num_steps = 3, 80
    vec_env = make_vec_env("CartPole-v1", num_envs)

    @jax.jit
    def run(key):
        reset_key, noise_key = jax.random.split(key)
        obs, state = vec_env.reset(reset_key)
        noise = vec_env.presample(noise_key, num_steps)

        def step(carry, step_noise):
            state, obs = carry
            actions = jnp.ones(num_envs, jnp.int32)
            obs, state, reward, terminated, truncated, final_obs, raw = vec_env.step(
                None, state, actions, jnp.float32(0.99), step_noise)
            return (state, obs), (obs, final_obs, terminated | truncated)

        _, out = jax.lax.scan(step, (state, obs), noise)
        return out, noise

    (obs, final_obs, done), noise = jax.device_get(run(key))
    assert noise.fresh_obs.shape == (num_steps, num_envs, 4)
    assert done.sum() >= num_envs
    np.testing.assert_array_equal(obs[done], noise.fresh_obs[done])
    np.testing.assert_array_equal(obs[~done], final_obs[~done])


# --------------------------------------------------------------------- normalisation


def test_vec_env_normalisation_keeps_observations_standardised(key):
    """After many random steps, normalised observations have mean ~0 and std ~1 per
    dimension, and the discounted return of normalised rewards has std ~1, although the raw
    data are far from standard. Raw and normalised runs share keys, hence trajectories."""
    num_envs, num_steps, gamma = 16, 1000, 0.99
    plain = make_vec_env("Pendulum-v1", num_envs)
    normed = make_vec_env("Pendulum-v1", num_envs, normalize_obs=True, normalize_reward=True)

    def run(vec_env, key):
        reset_key, key = jax.random.split(key)
        obs, state = vec_env.reset(reset_key)

        def step(carry, step_key):
            state, obs = carry
            action_key, env_key = jax.random.split(step_key)
            actions = jax.random.uniform(action_key, (num_envs, 1), minval=-2.0, maxval=2.0)
            obs, state, reward, terminated, truncated, final_obs, raw = vec_env.step(
                env_key, state, actions, gamma
            )
            done = terminated | truncated
            return (state, obs), (obs, final_obs, reward, raw, done)

        _, out = jax.lax.scan(step, (state, obs), jax.random.split(key, num_steps))
        return out

    both = jax.jit(lambda k: (run(plain, k), run(normed, k)))
    (raw_obs, _, plain_reward, _, _), (obs, final_obs, reward, raw_reward, done) = (
        jax.device_get(both(key))
    )
    np.testing.assert_array_equal(raw_reward, plain_reward)  # same trajectories
    assert done.any()

    late = slice(num_steps // 2, None)
    raw_std = raw_obs[late].reshape(-1, 3).std(0)
    assert raw_std.max() > 2.5  # angular velocity is far from unit scale when raw
    flat = obs[late].reshape(-1, 3)
    np.testing.assert_array_less(np.abs(flat.mean(0)), 0.2)
    np.testing.assert_array_less(np.abs(flat.std(0) - 1.0), 0.2)

    # final_obs is normalised with the same statistics: equal to obs unless the episode ended.
    same = ~done
    np.testing.assert_array_equal(final_obs[same], obs[same])
    assert not np.allclose(final_obs[done], obs[done])

    # Rewards are rescaled, not shifted: one positive factor per step for all envs.
    nonzero = raw_reward != 0.0
    assert nonzero.mean() > 0.99
    scale = np.where(nonzero, reward / np.where(nonzero, raw_reward, 1.0), np.nan)
    assert np.all(scale[nonzero] > 0)
    per_step = np.nanmedian(scale, axis=1, keepdims=True)
    np.testing.assert_allclose(scale[nonzero], np.broadcast_to(per_step, scale.shape)[nonzero],
                               rtol=1e-4)
    discounted = np.zeros(num_envs)
    returns = []
    for t in range(num_steps):
        discounted = gamma * discounted + reward[t]
        returns.append(discounted)
        discounted = np.where(done[t], 0.0, discounted)
    returns = np.asarray(returns)[late]
    assert 0.7 < returns.std() < 1.4
    assert np.abs(raw_reward).max() > 5.0  # raw rewards are not unit scale
