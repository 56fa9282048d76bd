"""Tests of CEM-RL, :mod:`metarl.population.cem_rl`.

- Learning: on Pendulum-v1 cut to 100-step episodes, for each of 3 seeds the mean actor of
  a population of 6 (3 RL actors) ends far above the untrained actor it started from (the
  seeds train as one vmapped program).
- Bookkeeping of a tiny run: one record per generation, fitness per member, the first half
  marked as RL actors, no gradient step before the buffer holds ``learning_starts``
  transitions, environment steps counted, the buffer filled by the evaluations.
- The pieces of a generation: the RL half's actors (and the critic) change and the others
  do not; an actor's fitness is the return of the transitions it stored; an actor with NaN
  parameters gets fitness NaN, ranks last, and puts no NaN in the buffer.
- Bad input: another algorithm, more elites than members, an odd population, a fraction
  outside [0, 1] or rounding to no actor, a discrete environment: each names the field.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _typed_states import input_types
from _xla import LEARNING_COMPILER_OPTIONS

from inner_loops.dqn import DQNConfig
from inner_loops.ppo import PPOConfig
from inner_loops.sac import SACConfig
from inner_loops.td3 import TD3Config
from metarl.population import cem
from metarl.population.cem_rl import CEMRLConfig, make_cem_rl, train_cem_rl

FAST_COMPILE = {"xla_backend_optimization_level": 0}
EPISODE_STEPS = 20
TINY_INNER = TD3Config(env_id="Pendulum-v1", env_params={"max_steps_in_episode": EPISODE_STEPS},
                       actor_hidden_sizes=(16, 16), critic_hidden_sizes=(16, 16),
                       batch_size=16, learning_starts=100, buffer_size=1000, eval_episodes=2)
TINY = CEMRLConfig(inner=TINY_INNER, population_size=4, num_elites=2, generations=3,
                   gradient_steps=4, init_std=0.1)

# ------------------------------------------------------------------------- learning

# Three seeds for the CPU that one seed of 200-step episodes and 64-unit networks took
# (40 against 41 CPU-s for this test alone, cold cache): 100-step episodes halve a
# generation's evaluations and gradient steps, 32-unit networks make each step cheaper, and
# one vmapped program (one compilation) serves every seed. They train in this process: a
# subprocess costs some 4 CPU-s to start Python and JAX, and would overlap nothing, this
# test coming first.
LEARNING_SEEDS = 3
LEARNING_TIMEOUT = 900


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT, method="thread")
def test_pendulum_mean_actor_learns():
    """20 generations of 6 actors on 100-step episodes (12 000 environment steps), 3 seeds:
    on every seed the mean actor's return, averaged over the last 3 generations, is far
    above the untrained actor's (about -680 on these episodes)."""
    inner = TD3Config(env_id="Pendulum-v1", env_params={"max_steps_in_episode": 100},
                      actor_hidden_sizes=(32, 32), critic_hidden_sizes=(32, 32),
                      buffer_size=50_000, learning_starts=600, eval_episodes=5)
    config = CEMRLConfig(inner=inner, population_size=6, num_elites=3, generations=20)
    run = make_cem_rl(config)

    def jit(fn):
        return jax.jit(fn, compiler_options=LEARNING_COMPILER_OPTIONS)

    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(LEARNING_SEEDS))
    states = jit(jax.vmap(run.init))(keys)
    initial = np.asarray(jit(jax.vmap(lambda state: run.parts.evaluate(
        run.mean_actor(state), jax.random.PRNGKey(1), inner.eval_episodes)))(states))
    generation = jit(jax.vmap(run.generation))
    returns = []
    for _ in range(config.generations):
        states, metrics = generation(states)
        returns.append(np.asarray(metrics["mean_return"]))
    final = np.stack(returns, axis=1)[:, -3:].mean(axis=1)
    print(f"CEM-RL Pendulum: untrained {initial}, final mean actor {final}")
    assert final.shape == (LEARNING_SEEDS,)
    # Measured over seeds 0-11 (four runs of 3): untrained -666 to -693, final -131 to -197,
    # gains of 480 to 535 (on seeds 0-2: -670, -690, -689 -> -171, -173, -166).
    assert np.all(final > -350.0), final
    assert np.all(final > initial + 300.0), (initial, final)


# --------------------------------------------------------------------- a tiny run


@pytest.fixture(scope="module")
def tiny_run():
    return train_cem_rl(TINY, jax.random.PRNGKey(0), compiler_options=FAST_COMPILE)


def test_a_fresh_state_is_typed_as_a_generation_returns_it(tiny_run):
    """Or the generation would compile twice: for the first call and for the rest."""
    fresh = jax.eval_shape(tiny_run.run.init, jax.random.PRNGKey(0))
    assert input_types(fresh) == input_types(tiny_run.state)


def test_one_record_per_generation_with_fitness_per_member(tiny_run):
    history = tiny_run.history
    assert len(history) == TINY.generations
    steps = TINY.population_size * TINY.episodes_per_member * EPISODE_STEPS
    assert [record["env_steps"] for record in history] == [steps, 2 * steps, 3 * steps]
    for record in history:
        assert len(record["fitness"]) == TINY.population_size
        assert np.all(np.isfinite(record["fitness"]))
        fitness = np.array(record["fitness"])
        assert record["best_fitness"] == pytest.approx(fitness.max())
        assert record["elite_fitness"] == pytest.approx(np.sort(fitness)[-2:].mean())
        assert np.isfinite(record["mean_return"])
    # 80 transitions per generation: no gradient step until 100 are stored
    assert [record["learning"] for record in history] == [False, False, True]
    assert [record["rl_actor"] for record in history] == [[False] * 4, [False] * 4,
                                                         [True, True, False, False]]
    assert np.isnan(history[0]["rl_fitness"])
    fitness = np.array(history[2]["fitness"])
    assert history[2]["rl_fitness"] == pytest.approx(fitness[:2].mean())
    assert history[2]["cem_fitness"] == pytest.approx(fitness[2:].mean())
    assert history[0]["critic_loss"] == 0.0 and history[2]["critic_loss"] > 0.0
    assert history[2]["skipped_critic_steps"] == history[2]["skipped_actor_steps"] == 0
    state = tiny_run.state
    assert int(state.buffer.size) == 3 * steps
    assert int(state.cem.generation) == 3
    assert state.cem.mean.shape == (tiny_run.run.num_params,)
    np.testing.assert_array_equal(
        jax.tree.structure(tiny_run.mean_actor),
        jax.tree.structure(tiny_run.run.parts.init_actor(jax.random.PRNGKey(0))))


@pytest.fixture(scope="module")
def pieces(tiny_run):
    """The run's state after three generations (its buffer holds 240 transitions), the
    jitted pieces of a generation, and actors drawn around the mean."""
    run, state = tiny_run.run, tiny_run.state
    members = cem.ask(jax.random.PRNGKey(5), state.cem, TINY.cem)
    actors = jax.vmap(run.unravel)(members)
    train = jax.jit(run.train_rl_actors, compiler_options=FAST_COMPILE)
    evaluate = jax.jit(run.evaluate_members, compiler_options=FAST_COMPILE)
    return run, state, actors, train, evaluate


def test_the_rl_half_changes_its_actors_and_the_critic(pieces):
    run, state, actors, train, _ = pieces
    critic, trained, diagnostics, learning = train(state, actors, run.hyperparams(),
                                                   jax.random.PRNGKey(1))
    assert bool(learning)
    before = jax.vmap(run.parts.flatten)(actors)
    after = jax.vmap(run.parts.flatten)(trained)
    moved = np.abs(np.asarray(after - before)).max(axis=1)
    assert np.all(moved[:2] > 0), moved
    np.testing.assert_array_equal(after[2:], before[2:])
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), critic.params,
                           state.critic.params)
    assert all(jax.tree.leaves(changed))
    assert float(diagnostics.critic_loss) > 0
    assert int(diagnostics.skipped_actor_steps) == 0


def test_fitness_is_the_return_of_the_transitions_each_actor_stored(pieces):
    run, state, actors, _, evaluate = pieces
    buffer, fitness = evaluate(actors, state.buffer, jax.random.PRNGKey(2))
    size = TINY.population_size
    # the buffer (capacity 1000) had 240 transitions: the new ones fill slots 240..319,
    # one row of the 4 actors' environments per step
    rewards = np.asarray(buffer.storage.reward[240:240 + size * EPISODE_STEPS])
    returns = rewards.reshape(EPISODE_STEPS, size).sum(axis=0)
    np.testing.assert_allclose(fitness, returns, rtol=1e-5)
    assert int(buffer.size) == 240 + size * EPISODE_STEPS


def test_an_actor_with_nan_parameters_ranks_last_and_stores_no_nan(pieces):
    run, state, actors, _, evaluate = pieces
    poisoned = jax.tree.map(lambda a: a.at[1].set(jnp.nan), actors)
    buffer, fitness = evaluate(poisoned, state.buffer, jax.random.PRNGKey(3))
    fitness = np.asarray(fitness)
    assert np.isnan(fitness[1]) and np.all(np.isfinite(np.delete(fitness, 1)))
    for leaf in jax.tree.leaves(buffer.storage):
        assert np.all(np.isfinite(np.asarray(leaf, np.float32)))
    # the distribution moves to the finite elites; the poisoned actor is never one
    members = jax.vmap(run.parts.flatten)(poisoned)
    told = cem.tell(members, jnp.asarray(fitness), state.cem, TINY.cem)
    assert np.all(np.isfinite(np.asarray(told.mean)))
    order = np.argsort(-np.where(np.isnan(fitness), -np.inf, fitness))
    assert order[-1] == 1


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("inner, name", [
    (SACConfig(env_id="Pendulum-v1"), "sac"),
    (PPOConfig(), "ppo"),
    (DQNConfig(), "dqn"),
])
def test_another_algorithm_is_refused(inner, name):
    with pytest.raises(ValueError, match=rf"cem_rl\.inner: needs a TD3 config .* got '{name}'"):
        CEMRLConfig(inner=inner)


@pytest.mark.parametrize("changes, message", [
    ({"num_elites": 12}, r"cem_rl\.num_elites: 12 elites need at least as many members"),
    ({"population_size": 5}, r"cem_rl\.population_size: must be even"),
    ({"num_elites": 0}, r"cem_rl\.num_elites: must be a positive integer"),
    ({"rl_fraction": 1.5}, r"cem_rl\.rl_fraction: must lie in \[0, 1\]"),
    ({"rl_fraction": 0.01}, r"cem_rl\.rl_fraction: 0\.01 of population_size 10 rounds to no"),
    ({"generations": 0}, r"cem_rl\.generations: must be a positive integer"),
    ({"gradient_steps": 3}, r"cem_rl\.gradient_steps: 3 is not a multiple of "
                            r"inner\.policy_delay = 2"),
    ({"collect_noise": -0.1}, r"cem_rl\.collect_noise: must be >= 0"),
    ({"init_std": float("nan")}, r"cem_rl\.init_std: must be a finite number"),
    ({"extra_noise_decay": 2.0}, r"cem_rl\.extra_noise_decay: must lie in \[0, 1\]"),
])
def test_bad_settings_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        CEMRLConfig(**changes)


def test_a_discrete_environment_names_the_field():
    config = CEMRLConfig(inner=TD3Config(env_id="CartPole-v1"))
    with pytest.raises(ValueError, match=r"cem_rl\.inner\.env_id: td3 needs continuous"):
        make_cem_rl(config)


def test_plain_cem_takes_no_gradient_step():
    config = TINY.replace(rl_fraction=0.0)
    assert config.num_rl_actors == 0
    run = make_cem_rl(config)
    state = jax.jit(run.init)(jax.random.PRNGKey(0))
    actors = jax.vmap(run.unravel)(cem.ask(jax.random.PRNGKey(1), state.cem, config.cem))
    critic, same, _, learning = run.train_rl_actors(state, actors, run.hyperparams(),
                                                    jax.random.PRNGKey(2))
    assert not bool(learning)
    assert critic is state.critic and same is actors
