"""Tests of the PPO inner loop :mod:`inner_loops.ppo`.

- GAE against a plain-Python reference, a hand-computed case, and the two episode-end rules
  (termination does not bootstrap, truncation bootstraps from the final observation, and no
  advantage flows across either).
- Config validation: every bad setting raises ``ValueError`` naming the field and what is
  allowed.
- Learning: CartPole-v1 with PureJaxRL's settings reaches ~500; Acrobot-v1, a MinAtar game
  and Pendulum-v1 clearly beat a random policy (and their own start) in short runs of one
  agent each;
  brax/inverted_pendulum runs a few updates with finite metrics and terminations. Each
  training program is compiled exactly once; the long CartPole run trains in a subprocess,
  alongside the rest.

Learning tests are marked ``slow`` (for selection with ``-m "not slow"``); they run by default.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _learning import learning_metrics, start_first, start_learning_run, stop_learning_run
from _xla import LEARNING_COMPILER_OPTIONS
from hypothesis import given, settings
from hypothesis import strategies as st

from inner_loops import PPOConfig, compute_gae, make_train, networks, ppo
from inner_loops.ppo import shuffled_indices

METRICS = {
    "episode_return", "episode_length", "episodes", "policy_loss", "value_loss", "entropy",
    "approx_kl", "clip_fraction", "learning_rate", "finite",
}
LOSS_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")

gae = jax.jit(compute_gae)

# Mean episode return of a uniformly random policy, measured with this adapter (8-64 envs,
# 1000-2000 steps; the untrained agents start there too). Measuring them inside the tests
# would compile each environment once more, for numbers that do not change.
RANDOM_RETURN = {"Acrobot-v1": -496.0, "SpaceInvaders-MinAtar": 3.8, "Pendulum-v1": -1246.0}


# ------------------------------------------------------------------- random draws


@pytest.mark.parametrize("n", [1, 2, 7, 512, 4096, 4097, 10_000])
def test_shuffled_indices_is_a_permutation(n):
    """Packed single-sort path (n <= 4096) and the jax.random.permutation path (n > 4096)."""
    keys = jax.random.split(jax.random.PRNGKey(n), 3)
    # jitted: one small program per size, rather than each operation compiled on its own
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffled_indices(k, n)))(keys))
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n >= 7:
        assert not np.array_equal(orders[0], orders[1])  # different keys, different orders
        assert not np.array_equal(orders[0], np.arange(n))


def test_shuffled_indices_is_uniform():
    """Over 8000 shuffles of 6 items each item lands in each position with probability 1/6:
    a chi-square test of the 6 x 6 position counts (25 degrees of freedom; 52.6 is its
    99.9% quantile)."""
    n, samples = 6, 8000
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffled_indices(k, n)))(
        jax.random.split(jax.random.PRNGKey(1), samples)))
    counts = np.zeros((n, n))
    np.add.at(counts, (orders, np.broadcast_to(np.arange(n), orders.shape)), 1)
    expected = samples / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 52.6, counts


def test_action_from_noise_samples_the_policy():
    """Gumbel-argmax sampling matches the categorical probabilities, and Gaussian noise the
    mean and std; log-probabilities are those of the sampled actions."""
    key_d, key_c = jax.random.split(jax.random.PRNGKey(2))

    # jitted: one small program for each kind, rather than each operation compiled alone
    @functools.partial(jax.jit, static_argnums=1)
    def sample(key, discrete, logits_or_mean, log_std):
        noise = networks.action_noise(key, discrete, logits_or_mean.shape)
        return networks.action_from_noise(noise, discrete, logits_or_mean, log_std)

    logits = np.broadcast_to(np.log(np.float32([0.1, 0.2, 0.7])), (20_000, 3))
    action, log_prob = sample(key_d, True, logits, None)
    freq = np.bincount(np.asarray(action), minlength=3) / 20_000
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.7], atol=0.015)
    np.testing.assert_allclose(
        log_prob, np.log([0.1, 0.2, 0.7])[np.asarray(action)], rtol=1e-5)

    mean = np.broadcast_to(np.float32([1.0, -2.0]), (20_000, 2))
    action, _ = sample(key_c, False, mean, np.log(np.float32([0.5, 2.0])))
    np.testing.assert_allclose(np.mean(action, 0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(np.std(action, 0), [0.5, 2.0], rtol=0.03)


# ------------------------------------------------------------------------------- GAE


def reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE by its definition, with loops: ``A_t = sum_k (gamma lam)^k delta_{t+k}``, the sum
    stopping after the first step that ends the episode; ``delta_u`` bootstraps from
    ``next_values[u]`` unless step ``u`` terminated."""
    num_steps, num_envs = rewards.shape
    advantages = np.zeros((num_steps, num_envs))
    for n in range(num_envs):
        for t in range(num_steps):
            total, weight = 0.0, 1.0
            for u in range(t, num_steps):
                bootstrap = 0.0 if terminated[u, n] else gamma * next_values[u, n]
                total += weight * (rewards[u, n] + bootstrap - values[u, n])
                if terminated[u, n] or truncated[u, n]:
                    break
                weight *= gamma * lam
            advantages[t, n] = total
    return advantages, advantages + values


def random_rollout(seed: int, end_prob: float, shape=(16, 4)):
    """Random rewards/values and episode ends; half the ends are terminations."""
    rng = np.random.default_rng(seed)
    rewards, values, next_values = (rng.standard_normal(shape).astype(np.float32)
                                    for _ in range(3))
    u = rng.random(shape)
    terminated = u < end_prob / 2
    truncated = (u >= end_prob / 2) & (u < end_prob)
    return rewards, values, next_values, terminated, truncated


def run_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    advantages, targets = gae(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(next_values),
        jnp.asarray(terminated), jnp.asarray(terminated | truncated),
        jnp.float32(gamma), jnp.float32(lam),
    )
    return np.asarray(advantages), np.asarray(targets)


def test_gae_hand_computed():
    # gamma = 0.9, lambda = 0.5, so gamma * lambda = 0.45. One env, three steps:
    #   step 0 is truncated (time limit): bootstraps from V(final obs) = next_values[0] = 4.0,
    #          but nothing flows back from step 1, which belongs to the next episode;
    #   step 1 continues: bootstraps from next_values[1] = 1.5 (= values[2]);
    #   step 2 terminates: next_values[2] = 9.0 must be ignored.
    # delta_2 = 3 - 1.5                 = 1.5   A_2 = 1.5
    # delta_1 = 2 + 0.9 * 1.5 - 1.0     = 2.35  A_1 = 2.35 + 0.45 * 1.5 = 3.025
    # delta_0 = 1 + 0.9 * 4.0 - 0.5     = 4.1   A_0 = 4.1
    # targets = A + values = [4.6, 4.025, 3.0]
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[0.5], [1.0], [1.5]], np.float32)
    next_values = np.array([[4.0], [1.5], [9.0]], np.float32)
    terminated = np.array([[False], [False], [True]])
    truncated = np.array([[True], [False], [False]])
    advantages, targets = run_gae(rewards, values, next_values, terminated, truncated, 0.9, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [4.1, 3.025, 1.5], rtol=1e-6)
    np.testing.assert_allclose(targets[:, 0], [4.6, 4.025, 3.0], rtol=1e-6)

    # Without episode ends everything chains:
    # delta = [1 + 0.9 - 0.5, 2 + 1.35 - 1, 3 + 1.8 - 1.5] = [1.4, 2.35, 3.3]
    # A_2 = 3.3, A_1 = 2.35 + 0.45 * 3.3 = 3.835, A_0 = 1.4 + 0.45 * 3.835 = 3.12575
    next_values = np.array([[1.0], [1.5], [2.0]], np.float32)
    no_end = np.zeros((3, 1), bool)
    advantages, targets = run_gae(rewards, values, next_values, no_end, no_end, 0.9, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [3.12575, 3.835, 3.3], rtol=1e-6)
    np.testing.assert_allclose(targets[:, 0], [3.62575, 4.835, 4.8], rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    end_prob=st.sampled_from([0.0, 0.05, 0.2, 0.6]),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_matches_reference(seed, end_prob, gamma, lam):
    arrays = random_rollout(seed, end_prob)
    advantages, targets = run_gae(*arrays, gamma, lam)
    expected_advantages, expected_targets = reference_gae(*arrays, gamma, lam)
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets, expected_targets, rtol=1e-4, atol=1e-4)


def test_gae_terminated_steps_ignore_next_values():
    rewards, values, next_values, terminated, truncated = random_rollout(1, 0.3)
    assert terminated.any()
    base, _ = run_gae(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    changed = np.where(terminated, next_values + 100.0, next_values)
    advantages, _ = run_gae(rewards, values, changed, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(advantages, base, rtol=1e-6, atol=1e-6)


def test_gae_truncated_steps_bootstrap_from_next_values():
    """A truncated step's advantage moves by exactly gamma * (change of V(final obs))."""
    gamma = 0.99
    rewards, values, next_values, terminated, truncated = random_rollout(2, 0.3)
    assert truncated.any()
    base, _ = run_gae(rewards, values, next_values, terminated, truncated, gamma, 0.95)
    changed = np.where(truncated, next_values + 1.0, next_values)
    advantages, _ = run_gae(rewards, values, changed, terminated, truncated, gamma, 0.95)
    difference = advantages - base
    np.testing.assert_allclose(difference[truncated], gamma, rtol=1e-4)
    # Earlier steps of the same episode see it discounted; other episodes not at all.
    np.testing.assert_array_less(np.abs(difference[~truncated]), gamma)


def test_gae_does_not_flow_across_episode_ends():
    """Changing anything after an episode end leaves advantages up to that end unchanged."""
    rewards, values, next_values, terminated, truncated = random_rollout(3, 0.0)
    terminated[5, 0] = True  # env 0 ends by termination at step 5
    truncated[9, 1] = True  # env 1 ends by truncation at step 9
    base, _ = run_gae(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    later = np.zeros_like(terminated)
    later[6:, 0] = True
    later[10:, 1] = True
    perturbed = [np.where(later, x + 10.0, x) for x in (rewards, values, next_values)]
    advantages, _ = run_gae(*perturbed, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(advantages[~later], base[~later], rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(advantages[later] - base[later]) > 1e-3)


# ----------------------------------------------------------------------- bad configs


# (changes to the defaults, the field the error must name, words it must contain)
BAD_CONFIGS = [
    ({"num_minibatches": 3}, "num_minibatches", ["512", "allowed"]),
    ({"env_id": "CartPole-v9"}, "env_id", ["CartPole-v1", "Acrobot-v1", "brax/hopper"]),
    ({"env_id": "Pendulum-v1", "policy": "categorical"}, "policy", ["auto", "gaussian"]),
    ({"env_id": "CartPole-v1", "policy": "gaussian"}, "policy", ["auto", "categorical"]),
    ({"policy": "beta"}, "policy", ["auto", "categorical", "gaussian"]),
    ({"activation": "gelu"}, "activation", ["tanh", "relu"]),
    ({"precision": "float16"}, "precision", ["float32", "bfloat16"]),
    ({"num_envs": 0}, "num_envs", ["positive integer"]),
    ({"num_steps": -1}, "num_steps", ["positive integer"]),
    ({"total_timesteps": 0}, "total_timesteps", ["positive integer"]),
    ({"update_epochs": 0}, "update_epochs", ["positive integer"]),
    ({"num_minibatches": 0}, "num_minibatches", ["positive integer"]),
    ({"num_envs": 2.5}, "num_envs", ["positive integer"]),
    ({"num_envs": True}, "num_envs", ["positive integer"]),
    ({"hidden_sizes": (64, 0)}, "hidden_sizes", ["positive"]),
    ({"total_timesteps": 100}, "total_timesteps", ["512"]),
    ({"gamma": 1.5}, "gamma", ["[0, 1]"]),
    ({"gae_lambda": -0.1}, "gae_lambda", ["[0, 1]"]),
    ({"learning_rate": 0.0}, "learning_rate", ["positive"]),
    ({"clip_eps": -0.2}, "clip_eps", ["positive"]),
]


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    BAD_CONFIGS,
    ids=[",".join(f"{k}={v}" for k, v in changes.items()) for changes, _, _ in BAD_CONFIGS],
)
def test_bad_config_names_field_and_allowed_values(changes, field, allowed):
    """Checks of the config's own values fail when it is made; checks that need the
    environment (its name, its action space) fail when the learner is built."""
    needs_env = "env_id" in changes
    with pytest.raises(ValueError) as info:
        config = PPOConfig(**changes)
        if needs_env:
            ppo.build(config)
    message = str(info.value)
    assert message.startswith(f"{field}:"), message
    for value in allowed:
        assert value in message, message


@pytest.mark.parametrize(("num_envs", "num_steps", "num_minibatches"), [(4, 128, 3), (3, 10, 4)])
def test_minibatch_error_lists_the_divisors_of_the_batch(num_envs, num_steps, num_minibatches):
    batch = num_envs * num_steps
    with pytest.raises(ValueError, match=r"^num_minibatches:") as info:
        PPOConfig(num_envs=num_envs, num_steps=num_steps, num_minibatches=num_minibatches)
    listed = str(info.value).split("allowed:")[1].replace("...", "").split(",")
    listed = [int(x) for x in listed]
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    assert listed == divisors[: len(listed)] and len(listed) >= min(len(divisors), 8)
    assert num_minibatches not in listed


def test_replace_revalidates_and_config_is_frozen():
    config = PPOConfig()
    with pytest.raises(ValueError, match="num_minibatches"):
        config.replace(num_minibatches=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_envs = 8  # type: ignore[misc]
    smaller = config.replace(num_envs=2, num_steps=8, total_timesteps=100, num_minibatches=2)
    assert (smaller.batch_size, smaller.minibatch_size, smaller.num_updates) == (16, 8, 6)
    assert smaller.steps_per_agent == 96


def test_defaults_are_purejaxrl_cartpole():
    config = PPOConfig()
    assert (config.env_id, config.num_envs, config.num_steps) == ("CartPole-v1", 4, 128)
    assert (config.total_timesteps, config.update_epochs, config.num_minibatches) == (
        500_000, 4, 4)
    assert config.hidden_sizes == (64, 64) and config.activation == "tanh"
    hypers = config.hyperparams()
    np.testing.assert_allclose(
        [hypers.learning_rate, hypers.gamma, hypers.gae_lambda, hypers.clip_eps,
         hypers.ent_coef, hypers.vf_coef, hypers.max_grad_norm],
        [2.5e-4, 0.99, 0.95, 0.2, 0.01, 0.5, 0.5], rtol=1e-6,
    )
    assert all(x.dtype == jnp.float32 and x.shape == () for x in hypers)


def test_env_params_reach_the_training_environment():
    """CartPole capped at 8 steps: an untrained policy rarely falls that fast (its episodes
    last about 20 steps uncapped), so nearly every episode is cut at 8: all 16 of this one
    update's, and of each of 72 other keys'. A small PPO (one update, one hidden layer of 8
    units, one minibatch) compiles in 2.3 CPU-s, the default one in 3.9."""
    config = PPOConfig(env_params={"max_steps_in_episode": 8}, num_envs=4, num_steps=32,
                       total_timesteps=128, hidden_sizes=(8,), update_epochs=1,
                       num_minibatches=1)
    metrics = jax.jit(make_train(config))(jax.random.PRNGKey(0))
    lengths = np.asarray(metrics["episode_length"])
    assert np.all(lengths <= 8.0) and np.all(lengths > 7.0), lengths


# --------------------------------------------------------------------------- helpers


def train_seeds(config: PPOConfig, num_seeds: int, seed: int = 0, compiler_options=None):
    """Train ``num_seeds`` agents in one ``jit(vmap(train))``; metrics as numpy arrays,
    ``[num_seeds, num_updates]`` each.

    One agent is trained by ``jit(train)`` on the same key, without ``vmap``: batching
    every primitive (and re-batching each ``scan`` body) makes tracing slower: tracing and
    lowering brax's large physics program took 8.2 CPU-seconds with it, 5.5 without."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
    if compiler_options is None:  # these train for long: compile them to run fast
        compiler_options = LEARNING_COMPILER_OPTIONS
    if num_seeds == 1:
        compiled = jax.jit(make_train(config)).lower(keys[0]).compile(compiler_options)
        return jax.tree.map(lambda x: x[None], jax.device_get(compiled(keys[0])))
    compiled = jax.jit(jax.vmap(make_train(config))).lower(keys).compile(compiler_options)
    return jax.device_get(compiled(keys))


def check_metrics(metrics, config: PPOConfig, num_seeds: int, discrete: bool):
    """The metrics contract of ``train``, for any run."""
    num_updates = config.num_updates
    assert set(metrics) == METRICS
    for name, value in metrics.items():
        assert value.shape == (num_seeds, num_updates), name
    assert metrics["finite"].dtype == np.bool_ and metrics["finite"].all()
    for name in LOSS_METRICS:
        assert np.isfinite(metrics[name]).all(), name
    assert np.all((metrics["clip_fraction"] >= 0) & (metrics["clip_fraction"] <= 1))
    assert np.all(metrics["approx_kl"] >= -1e-6)  # (r - 1) - log r >= 0
    if discrete:
        assert np.all(metrics["entropy"] > 0)

    # Learning rate: linear decay to zero, lr * (1 - update / num_updates).
    expected_lr = config.learning_rate * (1.0 - np.arange(num_updates) / num_updates)
    lr = expected_lr if config.anneal_lr else np.full(num_updates, config.learning_rate)
    np.testing.assert_allclose(
        metrics["learning_rate"], np.broadcast_to(lr, (num_seeds, num_updates)),
        rtol=1e-5, atol=config.learning_rate * 1e-6,
    )

    # Episode statistics: NaN before the first finished episode, then carried forward
    # through updates in which none finished.
    episodes = metrics["episodes"]
    assert np.issubdtype(episodes.dtype, np.integer) and np.all(episodes >= 0)
    for seed in range(num_seeds):
        for name in ("episode_return", "episode_length"):
            series = metrics[name][seed]
            finished = np.flatnonzero(episodes[seed] > 0)
            first = finished[0] if len(finished) else num_updates
            assert np.isnan(series[:first]).all(), name
            assert np.isfinite(series[first:]).all(), name
            for i in range(first + 1, num_updates):
                if episodes[seed, i] == 0:
                    assert series[i] == series[i - 1], name


def early_late(returns: np.ndarray, fraction: float = 0.2):
    """Mean return per seed over the first and the last ``fraction`` of updates."""
    span = max(1, int(returns.shape[1] * fraction))
    return np.nanmean(returns[:, :span], axis=1), np.nanmean(returns[:, -span:], axis=1)


# Each short learning check trains one agent, compiled at the XLA settings that make its
# compile + run cheapest. A second agent (they trained two) doubled the run to check what
# another key's agent checks, and the calibrations below ran 8 keys each, every one passing
# with room. CPU-seconds of compile + run, each in a fresh process (a shared CPU, +-20%):
#                          one agent, as here     two agents: suite's / short-run / learning
#   Acrobot-v1             suite's   3.6 + 4.4    3.1 + 8.8 / 12.4 + 2.2 / 16.2 + 1.9
#   SpaceInvaders-MinAtar  short-run 11  + 6.0    4.0 + 34  / 12.4 + 13  / 20.4 + 12
#   Pendulum-v1            short-run 6.4 + 3.1    3.2 + 30  /  8.4 + 8.6 / 10.6 + 5.1
# The suite's own settings (the root conftest.py's XLA_FLAGS): level 0, older code generation.
SUITE_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0,
                          "xla_cpu_use_fusion_emitters": False}
# Level 1 with XLA's older (non-"fusion emitter") code generation: for programs whose run is
# short next to their compile it is the cheapest. Not for the long CartPole run (5.7 + 29
# CPU-s against 9.2 + 17 with LEARNING_COMPILER_OPTIONS).
SHORT_RUN_COMPILER_OPTIONS = {**LEARNING_COMPILER_OPTIONS, "xla_cpu_use_fusion_emitters": False}


# A hang inside XLA never returns to Python, so the learning tests use pytest-timeout's
# thread method, which ends the run with stack traces instead of freezing CI. The limits
# are generous: the machines are shared and their speed varies.
LONG = pytest.mark.timeout(900, method="thread")
SHORT = pytest.mark.timeout(300, method="thread")


# ------------------------------------------------------------------- short runs


@pytest.mark.slow
@SHORT
def test_acrobot_beats_random_policy():
    config = PPOConfig(
        env_id="Acrobot-v1", num_envs=8, num_steps=128, total_timesteps=65_536,
        num_minibatches=8, update_epochs=4, learning_rate=2.5e-3,
    )
    metrics = train_seeds(config, 1, compiler_options=SUITE_COMPILER_OPTIONS)
    check_metrics(metrics, config, 1, discrete=True)
    early, late = early_late(metrics["episode_return"])
    print(f"Acrobot-v1 early {early.round(1)} late {late.round(1)}")
    # Measured with these options, one agent for each of seed = 0..7: early -268 to -500,
    # late -92 to -119 (seed 0: -270 -> -95), each gaining at least 166. Half the steps
    # (32768) left seed 3 at -456: not enough.
    assert np.all(late > RANDOM_RETURN["Acrobot-v1"] + 250.0), (early, late)
    assert np.all(late > early + 100.0), (early, late)


@pytest.mark.slow
@SHORT
def test_minatar_space_invaders_beats_random_policy():
    config = PPOConfig(
        env_id="SpaceInvaders-MinAtar", num_envs=64, num_steps=32, total_timesteps=65_536,
        num_minibatches=8, update_epochs=4, learning_rate=5e-3, activation="relu",
    )
    metrics = train_seeds(config, 1, compiler_options=SHORT_RUN_COMPILER_OPTIONS)
    check_metrics(metrics, config, 1, discrete=True)
    early, late = early_late(metrics["episode_return"])
    print(f"SpaceInvaders-MinAtar early {early.round(2)} late {late.round(2)}")
    # Measured with these options, one agent for each of seed = 0..7: early 3.7 to 4.3, late
    # 12.2 to 15.0 (seed 0: 4.3 -> 13.5), each gaining at least 8.2. Fewer steps leave too
    # little room: 49152 ended at 9.7 to 12.0, 32768 at 7.7 to 10.3.
    assert np.all(late > 2.5 * RANDOM_RETURN["SpaceInvaders-MinAtar"]), (early, late)
    assert np.all(late > early + 4.0), (early, late)


@pytest.mark.slow
@SHORT
def test_pendulum_beats_random_policy():
    config = PPOConfig(
        env_id="Pendulum-v1", num_envs=8, num_steps=128, total_timesteps=65_536,
        num_minibatches=32, update_epochs=10, learning_rate=3e-4, gamma=0.95, gae_lambda=0.9,
        ent_coef=0.0, normalize_obs=True, normalize_reward=True,
    )
    metrics = train_seeds(config, 1, compiler_options=SHORT_RUN_COMPILER_OPTIONS)
    check_metrics(metrics, config, 1, discrete=False)
    early, late = early_late(metrics["episode_return"])
    print(f"Pendulum-v1 early {early.round(1)} late {late.round(1)}")
    # Measured with these options, one agent for each of seed = 0..7: early -1131 to -1309,
    # late -225 to -419 (seed 0: -1243 -> -391), each gaining at least 724. Half the steps
    # (32768) is far too few: late -963 to -1155, one seed gaining nothing.
    assert np.all(late > RANDOM_RETURN["Pendulum-v1"] + 500.0), (early, late)
    assert np.all(late > early + 400.0), (early, late)


@pytest.mark.slow
@SHORT
def test_brax_trains_with_finite_metrics_and_terminations():
    """A few tiny updates on brax/inverted_pendulum with normalisation: everything finite,
    and the random policy drops the pole long before the 1000-step time limit, so brax
    terminations end episodes and reach the episode statistics, which count the raw
    reward (1 per step) rather than the normalised one.

    Brax's physics makes a large program, and tracing it dominates; the inverted pendulum
    (two bodies) is the cheapest brax system to trace. It is compiled at XLA's lowest
    backend optimisation level with the older (non-"fusion emitter") code generation, the
    suite's own settings, which cut the compile time (the numbers it computes are the same
    operations, only less optimised machine code; nothing here is compared bit for bit)."""
    config = PPOConfig(
        env_id="brax/inverted_pendulum", num_envs=2, num_steps=32, total_timesteps=192,
        num_minibatches=2, update_epochs=2, hidden_sizes=(16,), learning_rate=3e-4,
        normalize_obs=True, normalize_reward=True,
    )
    metrics = train_seeds(
        config, 1, compiler_options={"xla_backend_optimization_level": 0,
                                     "xla_cpu_use_fusion_emitters": False,
                                     "xla_llvm_disable_expensive_passes": True},
    )
    check_metrics(metrics, config, 1, discrete=False)
    assert metrics["episodes"].sum() >= 1
    finished = np.isfinite(metrics["episode_length"])
    assert np.all((metrics["episode_length"][finished] > 0)
                  & (metrics["episode_length"][finished] < 1000))
    np.testing.assert_allclose(metrics["episode_return"][finished],
                               metrics["episode_length"][finished], rtol=1e-5)
    assert np.all(metrics["value_loss"] > 0)


# -------------------------------------------------------------- CartPole, full length


# Every one of 22 agents (PRNGKey(0) and PRNGKey(1), 8 each; PRNGKey(0), (1) and (2), 2
# each) ended at 500 and returned 500 over its last 5% of updates, so one agent meets the
# thresholds below with room; it is the first of PRNGKey(0)'s (JAX's keys split alike for
# any count), one of those 22. Its run costs ~4.2 CPU-seconds an agent (1, 2 and 4 agents:
# 4.8, 8.8 and 16.9 s; compiling, ~10 s, does not depend on it): a second agent costs 4 s.
CARTPOLE_SEEDS = 1


# The CartPole run (1M agent-steps) is the longest piece of this module. It trains in a
# subprocess started when the module starts, so it runs on the second core while the tests
# above compile their programs (in one process, jax would run it and them one after another).
CARTPOLE_WORKER = """
import gc
import sys

gc.set_threshold(100_000, 50, 50)  # as the suite's conftest.py: tracing makes many objects
import jax
import numpy as np
from inner_loops import PPOConfig, make_train

keys = jax.random.split(jax.random.PRNGKey(0), int(sys.argv[2]))
metrics = jax.jit(jax.vmap(make_train(PPOConfig())))(keys)
np.savez(sys.argv[1], **jax.device_get(metrics))
"""
CARTPOLE_TIMEOUT = 800  # seconds; generous, for a shared and busy CPU


@pytest.fixture(scope="module")
def cartpole_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cartpole")
    process = start_learning_run(CARTPOLE_WORKER, folder, CARTPOLE_SEEDS)
    yield process, folder
    stop_learning_run(process)


@pytest.fixture(scope="module", autouse=True)
def start_cartpole_first(request):
    """Start the CartPole run at the start of the module when its tests are selected."""
    start_first(request, "cartpole_process", "cartpole")


@pytest.fixture(scope="module")
def cartpole_run(cartpole_process):
    """PureJaxRL's CartPole-v1 settings (the defaults), 5e5 steps, CARTPOLE_SEEDS agents in
    one ``jit(vmap(train))``: the config and its metrics ``[CARTPOLE_SEEDS, 976]``."""
    process, folder = cartpole_process
    return PPOConfig(), learning_metrics(process, folder, CARTPOLE_TIMEOUT,
                                         "CartPole training")


@pytest.mark.slow
@LONG
def test_cartpole_learns_with_purejaxrl_settings(cartpole_run):
    config, metrics = cartpole_run
    final = metrics["episode_return"][:, -1]
    print(f"CartPole-v1 final return per seed: {final}; mean {final.mean():.1f}")
    assert final.mean() >= 450.0, final
    assert np.median(final) >= 450.0, final
    initial = metrics["episode_return"][:, 0]  # the untrained policy: about 22, as random
    assert np.all(initial < 40.0), initial
    _, late = early_late(metrics["episode_return"], 0.05)
    assert np.all(late > 300.0), late


@pytest.mark.slow
@LONG
def test_cartpole_metrics_contract(cartpole_run):
    config, metrics = cartpole_run
    check_metrics(metrics, config, CARTPOLE_SEEDS, discrete=True)
    # CartPole pays 1 per step, so a return is the episode's length.
    np.testing.assert_allclose(metrics["episode_return"], metrics["episode_length"])
    assert np.all(metrics["episode_length"] <= 500.0)
    assert metrics["learning_rate"][0, 0] == pytest.approx(2.5e-4)
    assert np.all(metrics["learning_rate"][:, -1] < 1e-6)  # annealed to about zero
    assert np.all(metrics["entropy"][:, -1] < metrics["entropy"][:, 0])
    # Episodes last at most 500 steps, so all but the last one per env must have finished.
    total = metrics["episodes"].sum(axis=1)
    assert np.all(total >= (config.steps_per_agent - 500 * config.num_envs) / 500)
