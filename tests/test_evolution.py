"""The ES driver: sign of fitness, NaN candidates, every strategy, one compilation.

Most tests replace the PPO trainer by a stand-in whose episode return is a known function
of the meta-parameters, so the ranking logic is checked exactly and without compiling PPO.
One test trains real PPO agents with a loss that turns NaN.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops.objective import LossTerm, Objective, clipped_l2, ppo_clip
from metarl.config import ConfigError
from metarl.evolve.config import FitnessConfig, config_from_dict
from metarl.evolve.fitness import combine_fitness, run_return
from metarl.evolve.generation import Evolution
from metarl.objectives import register_objective

UPDATES = 5


def _scalar_policy_loss(meta_params, inputs):
    return ppo_clip().loss({}, inputs) * meta_params["scale"][0]


@register_objective("test_scalar", slots=("policy", "value"))
def _test_scalar_objective() -> Objective:
    """Two meta-parameters; the stand-in trainer scores a candidate by ``scale[0]``."""
    policy = LossTerm("scaled_clip", lambda key: {"scale": jnp.zeros(2)}, _scalar_policy_loss)
    return Objective(policy=policy, value=clipped_l2())


def _score_is_first_meta_param(key, meta_params, hypers):
    """Stand-in trainer: return = scale[0]; NaN returns when scale[0] < -0.5."""
    del key, hypers
    score = meta_params["policy"]["scale"][0]
    curve = jnp.full((UPDATES,), score)
    return {"episode_return": jnp.where(score < -0.5, jnp.nan, curve),
            "finite": jnp.ones((UPDATES,), bool)}


def stand_in_learner(learner, trainer):
    """``learner`` whose whole training is ``trainer(key, meta_params, hypers)``: the state is
    the key, and one ``advance`` over the budget returns the stand-in's metrics."""

    def advance(key, meta_params, hypers, num_updates):
        return key, trainer(key, meta_params, hypers)

    return dataclasses.replace(learner, init_fn=lambda key, meta, hypers: key,
                               advance_fn=advance)


def _evolution(strategy="Open_ES", population=8, sigma=0.3, trainer=_score_is_first_meta_param,
               **fitness):
    config = config_from_dict({
        "objective": {"name": "test_scalar"},
        "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8,
                  "total_timesteps": 16 * UPDATES},
        "es": {"strategy": strategy, "population_size": population, "sigma": sigma,
               "learning_rate": 0.1, "generations": 3},
        "fitness": {"seeds_per_candidate": 2, **fitness},
    })
    evolution = Evolution(config)
    evolution.learners = [stand_in_learner(evolution.learners[0], trainer)]
    evolution.step = jax.jit(evolution.generation)
    return evolution


def test_higher_return_ranks_better_and_moves_the_mean_towards_it():
    evolution = _evolution()
    state = evolution.init(jax.random.PRNGKey(0))
    start = float(evolution.mean_meta_params(state)["policy"]["scale"][0])
    population, _ = evolution.strategy.ask(
        jax.random.split(state.key, 3)[1], state.es_state, evolution.es_params
    )
    state, metrics = evolution.step(state)
    scores = np.asarray(population["policy"]["scale"][:, 0])
    fitness = np.asarray(metrics["fitness"])
    np.testing.assert_allclose(fitness[metrics["valid"]], scores[metrics["valid"]], rtol=1e-6)
    assert float(evolution.mean_meta_params(state)["policy"]["scale"][0]) > start
    best = int(np.argmax(np.where(metrics["valid"], fitness, -np.inf)))
    np.testing.assert_allclose(state.best_meta_params["policy"]["scale"],
                               population["policy"]["scale"][best])
    assert float(state.best_fitness) == pytest.approx(scores[best])


def test_nan_candidates_rank_last_are_counted_and_the_run_goes_on():
    evolution = _evolution(sigma=2.0)  # wide enough that some candidates fall below -0.5
    state = evolution.init(jax.random.PRNGKey(1))
    seen_invalid = 0
    for _ in range(3):
        state, metrics = evolution.step(state)
        fitness, valid = np.asarray(metrics["fitness"]), np.asarray(metrics["valid"])
        assert np.all(np.isfinite(fitness))
        if (~valid).any() and valid.any():
            assert fitness[~valid].max() < fitness[valid].min()
        seen_invalid += int((~valid).sum())
        assert int(metrics["invalid_runs"]) == 2 * int((~valid).sum())
    assert seen_invalid > 0
    mean = jax.tree.leaves(evolution.mean_meta_params(state))
    assert all(np.all(np.isfinite(leaf)) for leaf in mean)


@pytest.mark.parametrize("strategy", ["Open_ES", "SNES", "CMA_ES", "Sep_CMA_ES", "PGPE"])
def test_every_strategy_improves_a_simple_fitness(strategy):
    evolution = _evolution(strategy=strategy, population=8, sigma=0.2)
    state = evolution.init(jax.random.PRNGKey(2))
    start = float(evolution.mean_meta_params(state)["policy"]["scale"][0])
    for _ in range(4):
        state, _ = evolution.step(state)
    assert float(evolution.mean_meta_params(state)["policy"]["scale"][0]) > start
    assert evolution.step._cache_size() == 1


def test_generation_compiles_once():
    evolution = _evolution()
    state = evolution.init(jax.random.PRNGKey(3))
    for _ in range(3):
        state, _ = evolution.step(state)
    assert evolution.step._cache_size() == 1
    assert int(state.generation) == 3


def test_run_return_skips_updates_before_the_first_episode():
    curve = jnp.array([[jnp.nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]])
    metrics = {"episode_return": curve}
    mean = run_return(metrics, FitnessConfig(metric="mean_return"))
    final = run_return(metrics, FitnessConfig(metric="final_return", final_fraction=0.2))
    assert float(mean[0]) == pytest.approx(5.0)  # mean of 1..9
    assert float(final[0]) == pytest.approx(8.5)  # mean of the last 2 updates
    never = run_return({"episode_return": jnp.full((1, 4), jnp.nan)}, FitnessConfig())
    assert np.isnan(never[0])


def test_fitness_normalises_each_environment_by_its_baseline():
    # returns [C=2, S=2, E=2]; baselines 100 (CartPole-like) and -50 (Pendulum-like)
    returns = jnp.array([[[100.0, -25.0], [200.0, -75.0]],
                         [[50.0, -50.0], [50.0, -50.0]]])
    valid = jnp.ones_like(returns, bool)
    fitness, ok = combine_fitness(returns, valid, jnp.array([100.0, -50.0]))
    # candidate 0: (1 + 2)/2 and (-0.5 - 1.5)/2 -> mean(1.5, -1.0) = 0.25
    # candidate 1: 0.5 and -1.0 -> -0.25
    np.testing.assert_allclose(fitness, [0.25, -0.25], rtol=1e-6)
    assert bool(ok.all())
    valid = valid.at[1, 0, 1].set(False)
    fitness, ok = combine_fitness(returns, valid, jnp.array([100.0, -50.0]))
    assert list(np.asarray(ok)) == [True, False]
    assert float(fitness[1]) < float(fitness[0])


def test_a_fixed_objective_cannot_be_evolved():
    config = config_from_dict({"objective": {"name": "ppo"}})
    with pytest.raises(ConfigError, match="no meta-parameters to evolve"):
        Evolution(config)


def _nan_policy_loss(meta_params, inputs):
    # log of a negative meta-parameter is NaN: such candidates must be caught, not crash.
    return ppo_clip().loss({}, inputs) + 0.0 * jnp.log(meta_params["w"][0])


@register_objective("test_nan_when_negative", slots=("policy", "value"))
def _nan_objective() -> Objective:
    policy = LossTerm("nan_when_negative", lambda key: {"w": jnp.zeros(2)}, _nan_policy_loss)
    return Objective(policy=policy, value=clipped_l2())


def test_real_training_that_turns_nan_is_invalid_not_fatal():
    config = config_from_dict({
        "objective": {"name": "test_nan_when_negative"},
        "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8,
                  "total_timesteps": 32, "hidden_sizes": [8], "update_epochs": 1,
                  "num_minibatches": 1},
        "es": {"population_size": 4, "sigma": 1.0, "generations": 1},
        "fitness": {"seeds_per_candidate": 1},
    })
    evolution = Evolution(config)
    state = evolution.init(jax.random.PRNGKey(0))
    state, metrics = evolution.step(state)
    valid = np.asarray(metrics["valid"])
    # antithetic pairs: exactly one of each pair has w[0] < 0 -> NaN loss -> invalid
    assert valid.sum() == 2, valid
    assert np.all(np.isfinite(np.asarray(metrics["fitness"])))
    assert np.all(np.isfinite(np.asarray(state.es_state.mean)))


def test_fitness_is_normalised_by_measured_ppo_baselines(tmp_path):
    from metarl.kinds import start

    config = config_from_dict({
        "objective": {"name": "value_distance", "options": {"hidden_sizes": [4]}},
        "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 16,
                  "total_timesteps": 128, "hidden_sizes": [8], "update_epochs": 1,
                  "num_minibatches": 1},
        "es": {"population_size": 2, "generations": 1},
        "fitness": {"seeds_per_candidate": 2, "normalize_by_baseline": True,
                    "baseline_seeds": 2},
        "run": {"progress": False},
    })
    result = start(config, tmp_path / "run")
    baseline = float(result.state.baselines[0])
    assert baseline > 5.0  # CartPole episodes last at least ~9 steps under any policy
    line = result.history[0]
    raw_return = line["mean_return"]["CartPole-v1"]
    # the value distance starts at L2, so candidates score about what PPO scores: ~1
    assert line["mean_fitness"] == pytest.approx(raw_return / baseline, rel=1e-5)
    assert 0.3 < line["mean_fitness"] < 3.0
