"""Tests of the probe environments and the shared off-policy pieces.

- Probes (:mod:`inner_loops.probe_envs`): built by ``make_env`` like any id; their exact
  Q-values satisfy the Bellman equation on real rollouts (so the documented table, the
  dynamics and :func:`exact_q` agree; for the noisy probe up to its noise); truncation vs
  termination as documented; the noisy probe's reward noise has the documented
  distribution (values, outlier rate, mean) and leaves the noiseless probes' draws alone.
- :func:`inner_loops.off_policy.collect`: stored transitions keep the pre-reset observation
  and mark only terminations; episode summaries; the acting function gets its noise slice.
- :func:`inner_loops.off_policy.evaluate_policy`: counts each environment's first episode.
- Target helpers: TD target, Polyak and periodic updates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import available_envs, make_env, make_vec_env, off_policy, replay
from inner_loops.probe_envs import (
    OUTLIER,
    OUTLIER_RATE,
    PROBES,
    best_action,
    exact_q,
    outlier_noise,
    probe_ids,
)

GAMMA = 0.9
ROLLOUT_STEPS = 12
NUM_ENVS = 4


def test_every_probe_is_an_environment_id():
    ids = probe_ids()
    assert len(ids) == 2 * len(PROBES)
    assert set(ids) <= set(available_envs())
    for env_id in ids:
        spec = make_env(env_id).spec
        assert spec.obs_shape == (1,)
        if env_id.endswith("-discrete"):
            assert (spec.discrete, spec.action_dim) == (True, 2)
        else:
            assert (spec.discrete, spec.action_dim) == (False, 1)
            assert (spec.action_low, spec.action_high) == ((-1.0,), (1.0,))
        assert spec.max_episode_steps == (2 if "discount" in env_id else 1)


@pytest.mark.parametrize("bad", ["probe/constant", "probe/nothing-discrete",
                                 "probe/constant-binary"])
def test_unknown_probe_lists_the_probes(bad):
    with pytest.raises(ValueError, match=r"^env_id: unknown probe .*probe/constant-discrete"):
        make_env(bad)


def test_probes_take_no_parameters():
    with pytest.raises(ValueError, match=r"^env_params.gravity: probe/constant-discrete"):
        make_env("probe/constant-discrete", {"gravity": 1.0})


def random_rollout(env_id: str, key: jax.Array) -> dict[str, np.ndarray]:
    """``ROLLOUT_STEPS`` steps of ``NUM_ENVS`` copies under uniformly random actions."""
    vec_env = make_vec_env(env_id, NUM_ENVS)
    spec = vec_env.spec

    @jax.jit
    def run(key):
        reset_key, action_key, step_key = jax.random.split(key, 3)
        obs, state = vec_env.reset(reset_key)
        actions = off_policy.uniform_actions(action_key, spec, (ROLLOUT_STEPS, NUM_ENVS))

        def step(carry, inputs):
            obs, state = carry
            action, key = inputs
            result = vec_env.step(key, state, action, jnp.float32(1.0))
            return (result.obs, result.state), {
                "obs": obs, "action": action, "reward": result.reward,
                "final_obs": result.final_obs, "terminated": result.terminated,
                "truncated": result.truncated, "next_obs": result.obs,
            }

        _, out = jax.lax.scan(step, (obs, state),
                              (actions, jax.random.split(step_key, ROLLOUT_STEPS)))
        return out

    return {k: np.asarray(v).reshape(ROLLOUT_STEPS * NUM_ENVS, *v.shape[2:])
            for k, v in run(key).items()}


@pytest.mark.parametrize("env_id", probe_ids())
def test_exact_q_satisfies_the_bellman_equation(env_id):
    """On every step of a random rollout ``Q(s, a) = r + gamma (1 - terminated) max Q(s')``,
    ``s'`` the observation reached before any reset; truncated steps bootstrap."""
    steps = random_rollout(env_id, jax.random.PRNGKey(0))
    name = env_id.split("/")[1].rsplit("-", 1)[0]
    visited = np.unique(steps["obs"][:, 0])
    assert set(visited) <= set(PROBES[name].observations)
    q = exact_q(env_id, steps["obs"], steps["action"], GAMMA)
    next_best = exact_q(env_id, steps["final_obs"], best_action(env_id, steps["final_obs"]),
                        GAMMA)
    bootstrap = np.where(steps["terminated"], 0.0, GAMMA * next_best)
    noise = steps["reward"] + bootstrap - q
    if PROBES[name].noise is None:
        np.testing.assert_allclose(noise, 0.0, atol=1e-6)
    else:  # the exact Q is the expected reward's: what is left is the noise, 0 or +-OUTLIER
        levels = np.array([-OUTLIER, 0.0, OUTLIER])
        np.testing.assert_allclose(levels[np.abs(noise[:, None] - levels).argmin(1)], noise,
                                   atol=1e-4)
    ends = steps["terminated"] | steps["truncated"]
    if name == "bootstrap":
        assert not steps["terminated"].any() and steps["truncated"].all()
        np.testing.assert_allclose(q, 1.0 / (1.0 - GAMMA))
    else:
        assert not steps["truncated"].any()
    if name == "discount":
        np.testing.assert_array_equal(ends, steps["obs"][:, 0] == 1.0)
        np.testing.assert_array_equal(steps["final_obs"][:, 0], steps["obs"][:, 0] + 1.0)
        np.testing.assert_array_equal(steps["next_obs"][ends, 0], 0.0)  # reset
    else:
        assert ends.all()
    if PROBES[name].random_sign:
        assert set(visited) == {-1.0, 1.0}


def test_outlier_noise_has_the_documented_distribution():
    """``observation_action_outliers``' reward noise: ``±OUTLIER`` at rate ``OUTLIER_RATE``
    (half each sign), else 0, so mean 0 (1e5 draws: within 4.5 standard errors); the
    environment adds it to ``observation_action``'s reward on every step."""
    draws = np.asarray(jax.jit(jax.vmap(outlier_noise))(
        jax.random.split(jax.random.PRNGKey(0), 100_000)))
    assert set(np.unique(draws)) == {-OUTLIER, 0.0, OUTLIER}
    rate = OUTLIER_RATE
    for value, expected in ((OUTLIER, rate / 2), (-OUTLIER, rate / 2), (0.0, 1.0 - rate)):
        share = np.mean(draws == value)
        assert abs(share - expected) < 4.5 * np.sqrt(expected * (1 - expected) / draws.size)
    assert abs(draws.mean()) < 4.5 * np.sqrt(rate) * OUTLIER / np.sqrt(draws.size)
    noisy = random_rollout("probe/observation_action_outliers-discrete", jax.random.PRNGKey(1))
    residual = noisy["reward"] - exact_q("probe/observation_action-discrete", noisy["obs"],
                                          noisy["action"], GAMMA)
    assert np.isin(residual, [-OUTLIER, 0.0, OUTLIER]).all()
    assert (residual == OUTLIER).any() and (residual == -OUTLIER).any()  # 2 and 3 of 48


def test_exact_q_values_of_the_table():
    obs = np.array([[-1.0], [1.0], [1.0]])
    np.testing.assert_allclose(
        exact_q("probe/observation_action-discrete", obs, np.array([0, 1, 0]), GAMMA),
        [1.0, 1.0, -1.0])
    np.testing.assert_allclose(
        exact_q("probe/observation_action-continuous", obs, np.array([[-0.5], [0.5], [0.0]]),
                GAMMA), [0.0, 0.0, -0.25])
    np.testing.assert_allclose(
        exact_q("probe/action-continuous", obs, np.array([[0.5], [-1.0], [3.0]]), GAMMA),
        [0.0, -2.25, -0.25])  # actions beyond the bounds are clipped by the probe
    np.testing.assert_allclose(
        exact_q("probe/discount-discrete", np.array([[0.0], [1.0]]), np.array([0, 1]), GAMMA),
        [GAMMA, 1.0])
    np.testing.assert_array_equal(best_action("probe/observation_action-discrete", obs),
                                  [0, 1, 1])
    np.testing.assert_allclose(best_action("probe/observation_action-continuous", obs)[:, 0],
                               [-0.5, 0.5, 0.5])


# ---------------------------------------------------------------------------- collect


@pytest.fixture(scope="module")
def collect_discount():
    """Four steps of two ``discount`` probes into a buffer of 16 under "always action 1",
    the acting function recording the noise it was handed."""
    vec_env = make_vec_env("probe/discount-discrete", 2)
    spec = vec_env.spec

    @jax.jit
    def run(key):
        actors = off_policy.reset_actors(vec_env, key)
        buffer = replay.init(16, off_policy.example_transition(spec))
        noise = jnp.arange(8, dtype=jnp.float32).reshape(4, 2)
        act = lambda obs, noise: jnp.where(noise >= 0, 1, 0).astype(jnp.int32)  # noqa: E731
        return off_policy.collect(vec_env, act, actors, buffer, key, 4, noise)

    return run(jax.random.PRNGKey(0))


def test_collect_stores_pre_reset_observations(collect_discount):
    actors, buffer, summary = collect_discount
    assert int(buffer.size) == 8 and int(buffer.position) == 8
    stored = jax.tree.map(lambda x: np.asarray(x[:8]), buffer.storage)
    # env-major within a step: slots 2t, 2t + 1 hold step t of envs 0 and 1
    np.testing.assert_array_equal(stored.obs[:, 0], [0, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(stored.next_obs[:, 0], [1, 1, 2, 2, 1, 1, 2, 2])
    np.testing.assert_array_equal(stored.terminated, [0, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(stored.reward, [0, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(stored.action, [1] * 8)
    # two episodes per env finished, each of return 1 and length 2
    assert (int(summary.count), float(summary.return_sum), float(summary.length_sum)) == (
        4, 4.0, 8.0)
    np.testing.assert_array_equal(actors.obs[:, 0], [0, 0])
    np.testing.assert_array_equal(actors.episodes.running_length, [0, 0])


def test_collect_on_truncation_keeps_bootstrapping():
    vec_env = make_vec_env("probe/bootstrap-continuous", 3)
    spec = vec_env.spec

    @jax.jit
    def run(key):
        actors = off_policy.reset_actors(vec_env, key)
        buffer = replay.init(4, off_policy.example_transition(spec))
        act = lambda obs, noise: jnp.full((3, 1), 2.0)  # noqa: E731
        return off_policy.collect(vec_env, act, actors, buffer, key, 2)

    actors, buffer, summary = run(jax.random.PRNGKey(1))
    assert int(buffer.size) == 4 and int(buffer.position) == 2  # 6 transitions, 4 slots
    assert not np.asarray(buffer.storage.terminated).any()
    np.testing.assert_array_equal(buffer.storage.action[:, 0], [2.0] * 4)  # as acted
    assert int(summary.count) == 6 and float(summary.return_sum) == 6.0
    previous = jnp.float32(7.0)
    assert float(summary.mean_return(previous)) == 1.0
    none = off_policy.EpisodeSummary(jnp.int32(0), jnp.float32(0.0), jnp.float32(0.0))
    assert float(none.mean_return(previous)) == 7.0 and float(none.mean_length(previous)) == 7.0


# ------------------------------------------------------------------------- evaluation


def test_evaluate_policy_counts_the_first_episode_of_each_environment():
    env = make_env("probe/discount-discrete")
    evaluation = jax.jit(
        lambda key: off_policy.evaluate_policy(env, lambda obs: jnp.zeros(5, jnp.int32), key,
                                               num_episodes=5, max_steps=7)
    )(jax.random.PRNGKey(0))
    # episodes of two steps paying 0 then 1; the later episodes of the 7 steps don't count
    assert float(evaluation.eval_return) == 1.0 and float(evaluation.eval_length) == 2.0

    env = make_env("probe/observation_action-discrete")
    greedy = lambda obs: (obs[:, 0] > 0).astype(jnp.int32)  # noqa: E731
    wrong = lambda obs: (obs[:, 0] < 0).astype(jnp.int32)  # noqa: E731
    for act, expected in ((greedy, 1.0), (wrong, -1.0)):
        evaluation = off_policy.evaluate_policy(env, act, jax.random.PRNGKey(3), 8, 1)
        assert float(evaluation.eval_return) == expected


def test_evaluate_policy_stops_at_max_steps():
    """CartPole pays 1 per step: pushing left forever falls within a few dozen steps, and a
    cap of 5 steps cuts every episode at 5."""
    env = make_env("CartPole-v1")
    left = lambda obs: jnp.zeros(obs.shape[0], jnp.int32)  # noqa: E731
    full = off_policy.evaluate_policy(env, left, jax.random.PRNGKey(0), 4,
                                      env.spec.max_episode_steps)
    assert 5.0 < float(full.eval_return) < 40.0
    assert float(full.eval_return) == float(full.eval_length)
    capped = off_policy.evaluate_policy(env, left, jax.random.PRNGKey(0), 4, 5)
    assert float(capped.eval_return) == 5.0 and float(capped.eval_length) == 5.0


# ---------------------------------------------------------------------------- targets


def test_td_target_bootstraps_unless_terminated():
    target = off_policy.td_target(jnp.array([1.0, 1.0]), jnp.array([10.0, 10.0]),
                                  jnp.array([False, True]), jnp.float32(0.5))
    np.testing.assert_allclose(target, [6.0, 1.0])


def test_polyak_and_periodic_updates():
    target, online = {"w": jnp.zeros(3)}, {"w": jnp.full(3, 2.0)}
    np.testing.assert_allclose(off_policy.polyak_update(target, online, 0.25)["w"], 0.5)
    np.testing.assert_allclose(off_policy.polyak_update(target, online, 1.0)["w"], 2.0)
    hard = [float(off_policy.periodic_update(target, online, 1.0, jnp.int32(n), 4)["w"][0])
            for n in range(6)]
    assert hard == [2.0, 0.0, 0.0, 0.0, 2.0, 0.0]
    # traced rates per member: one vmap, two Polyak rates
    moved = jax.vmap(off_policy.polyak_update, in_axes=(None, None, 0))(
        target, online, jnp.array([0.1, 0.5]))
    np.testing.assert_allclose(moved["w"][:, 0], [0.2, 1.0], rtol=1e-6)


def test_uniform_actions_cover_the_action_space():
    discrete = off_policy.uniform_actions(jax.random.PRNGKey(0),
                                          make_env("CartPole-v1").spec, (500,))
    assert discrete.dtype == jnp.int32 and set(np.unique(discrete)) == {0, 1}
    pendulum = make_env("Pendulum-v1").spec
    continuous = np.asarray(off_policy.uniform_actions(jax.random.PRNGKey(1), pendulum,
                                                       (500,)))
    assert continuous.shape == (500, 1)
    assert continuous.min() >= -2.0 and continuous.max() <= 2.0
    assert continuous.min() < -1.8 and continuous.max() > 1.8
