"""Candidates stopped early (:mod:`metarl.evolve.rungs`): the schedule, the selection at
every rung, what the strategy is told, and ``eta = 1`` as today's generation bit for bit.

Most tests train a stand-in learner whose state is a step counter and whose episode return
at update ``t`` of ``U`` is ``scale[0] * (t + 1) / U``: the fitness so far then ranks
candidates by ``scale[0]`` at every rung, so which candidates survive is known exactly.
One test trains real PPO agents.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_evolution import TINY
from test_evolution import _evolution

from metarl.config import ConfigError
from metarl.evolve.config import FitnessConfig
from metarl.evolve.generation import Evolution
from metarl.evolve.rungs import (
    agent_steps,
    rank_below_survivors,
    rung_ends,
    survivors,
    train_in_rungs,
)
from metarl.kinds import load_experiment

UPDATES = 27


def test_the_schedule_of_successive_halving():
    assert survivors(9, 3, 3) == (9, 3, 1)
    assert survivors(8, 3, 2) == (8, 4, 2)
    assert survivors(5, 3, 2) == (5, 3, 2)  # ceil
    assert survivors(4, 3, 1) == (4, 4, 4)
    assert rung_ends(27, 3, 3) == (3, 9, 27)
    assert rung_ends(32, 2, 2) == (16, 32)
    assert rung_ends(12, 3, 1) == (4, 8, 12)  # eta 1: no one stops, even segments
    # 9 candidates, 1 seed, 27 updates of 10 steps: 9*3 + 3*6 + 1*18 updates
    assert agent_steps(9, 1, [27], [10], 3, 3) == (27 + 18 + 18) * 10
    assert agent_steps(9, 2, [27], [10], 1, 3) == 9 * 2 * 27 * 10


def test_a_rung_without_updates_is_refused_by_name():
    with pytest.raises(ConfigError, match="es.rungs: 4 rungs with eta 3 over 8 updates"):
        rung_ends(8, 4, 3)
    with pytest.raises(ConfigError, match="es.rungs: 5 rungs with eta 1 over 3 updates"):
        rung_ends(3, 5, 1)


def test_stopped_candidates_rank_below_every_one_that_trained_further():
    fitness = jnp.array([5.0, 1.0, 9.0, 2.0, 0.5, 7.0])
    reached = jnp.array([2, 2, 1, 1, 0, 0])
    told = np.asarray(rank_below_survivors(fitness, reached, 3))
    np.testing.assert_array_equal(told[:2], [5.0, 1.0])  # survivors keep their fitness
    # rung 1 (9, 2; spread 7) moves so that its best is 7 + 1 below the survivors' worst
    np.testing.assert_allclose(told[2:4], [1.0 - 8.0, 1.0 - 8.0 - 7.0])
    assert told[4:].max() < told[2:4].min()  # rung 0 below rung 1, in its own order
    assert told[5] > told[4]
    # already below: nothing moves
    np.testing.assert_array_equal(
        rank_below_survivors(jnp.array([3.0, -5.0]), jnp.array([1, 0]), 2), [3.0, -5.0])


def _counting_learner(learner):
    """``learner`` whose state counts updates: episode return ``scale[0] * (t + 1) / U``
    at update ``t``, finite, with the candidate's meta-parameters read at every update."""

    def init(key, meta_params, hypers):
        del meta_params, hypers
        return {"t": jnp.zeros((), jnp.int32), "key": key}

    def advance(state, meta_params, hypers, num_updates):
        del hypers
        t = state["t"] + jnp.arange(num_updates)
        curve = meta_params["policy"]["scale"][0] * (t + 1) / UPDATES
        metrics = {"episode_return": curve.astype(jnp.float32),
                   "finite": jnp.ones((num_updates,), bool)}
        return {**state, "t": state["t"] + num_updates}, metrics

    return dataclasses.replace(learner, num_updates=UPDATES, init_fn=init, advance_fn=advance)


def _scales(values):
    return {"policy": {"scale": jnp.stack([jnp.asarray(values, jnp.float32),
                                           jnp.zeros(len(values))], axis=1)}}


@pytest.mark.parametrize("metric", ["mean_return", "final_return"])
def test_each_evolution_keeps_its_best_and_scores_the_stopped_where_they_stopped(metric):
    """Two evolutions of 9 candidates, 3 rungs of eta 3 (updates 3, 9, 27): in each, the
    3 largest scales survive rung 0 and the largest rung 1; every candidate's return is
    its curve's score up to where it stopped."""
    learner = _counting_learner(_evolution().learners[0])
    first = [0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.7, 0.4, 0.6]
    second = [2.0, 1.0, 3.0, 9.0, 8.0, 7.0, 4.0, 5.0, 6.0]
    population = _scales(first + second)
    keys = jax.random.split(jax.random.PRNGKey(0), 18 * 2).reshape(1, 18, 2, 2)
    config = FitnessConfig(metric=metric, final_fraction=0.5)
    returns, valid, reached = jax.jit(lambda p, k: train_in_rungs(
        [learner], p, k, [learner.default_hypers], config, jnp.ones((2, 1)), 2, 3, 3,
        "auto"))(population, keys)
    expected_reached = [0, 2, 0, 0, 1, 0, 1, 0, 0] + [0, 0, 0, 2, 1, 1, 0, 0, 0]
    np.testing.assert_array_equal(reached, expected_reached)
    assert valid.all() and returns.shape == (18, 2, 1)
    ends = (3, 9, 27)
    for index, scale in enumerate(first + second):
        end = ends[expected_reached[index]]
        curve = scale * (np.arange(end) + 1) / UPDATES
        if metric == "final_return":
            curve = curve[end - max(1, round(0.5 * end)):]
        np.testing.assert_allclose(returns[index], curve.mean(), rtol=1e-6)


def test_a_generation_in_rungs_tells_the_ranking_and_counts_its_steps():
    evolution = _evolution(population=8)
    evolution.config = evolution.config.replace(es=dataclasses.replace(
        evolution.config.es, rungs=2, eta=2))
    evolution.learners = [_counting_learner(evolution.learners[0])]
    step = jax.jit(evolution.generation)
    state = evolution.init(jax.random.PRNGKey(4))
    population, _ = evolution.strategy.ask(jax.random.split(state.key, 3)[1], state.es_state,
                                           evolution.es_params)
    state, metrics = step(state)
    scales = np.asarray(population["policy"]["scale"][:, 0])
    reached = np.asarray(metrics["rung_reached"])
    assert sorted(np.flatnonzero(reached == 1)) == sorted(np.argsort(scales)[-4:])
    fitness = np.asarray(metrics["fitness"])
    assert fitness[reached == 0].max() < fitness[reached == 1].min()
    np.testing.assert_allclose(fitness[reached == 1],  # a full run's mean of its curve
                               scales[reached == 1] * (UPDATES + 1) / (2 * UPDATES),
                               rtol=1e-6)
    assert float(state.best_fitness) == pytest.approx(fitness.max())
    # 8 candidates x 2 seeds for 14 updates, then 4 x 2 for 13 more
    assert evolution.agent_steps_per_generation == (16 * 14 + 8 * 13) * (
        evolution.learners[0].steps_per_update)


def test_bad_rung_settings_name_the_field(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    config = load_experiment(path)
    for field, value in (("rungs", 0), ("eta", 1.5), ("rungs", True)):
        with pytest.raises(ConfigError, match=f"es.{field}: must be a positive integer"):
            dataclasses.replace(config.es, **{field: value})
    # TINY runs 32 updates: 6 rungs of eta 3 would end the first at update 0
    with pytest.raises(ConfigError, match="es.rungs: 6 rungs with eta 3 over 32 updates"):
        Evolution(config.replace(es=dataclasses.replace(config.es, rungs=6)))


def test_rungs_that_stop_no_one_give_todays_generation_bit_for_bit(tmp_path):
    """Real PPO agents (the tiny experiment, 32 updates): a generation in 3 rungs of
    ``eta = 1`` (updates 11, 21, 32; each rung's states gathered from the last) equals the
    generation trained in one call, bit for bit."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    config = load_experiment(path)
    # candidates far enough apart that their agents act differently within 32 updates
    config = config.replace(es=dataclasses.replace(config.es, sigma=1.0))
    in_rungs = config.replace(es=dataclasses.replace(config.es, rungs=3, eta=1))
    results = []
    for each in (config, in_rungs):
        evolution = Evolution(each)
        state, metrics = evolution.step(evolution.init(jax.random.PRNGKey(7)))
        results.append((state, metrics))
    (state, metrics), (state_r, metrics_r) = results
    np.testing.assert_array_equal(metrics_r["rung_reached"], [2, 2, 2, 2])
    for name in ("fitness", "returns", "valid"):
        np.testing.assert_array_equal(metrics_r[name], metrics[name], err_msg=name)
    assert np.ptp(np.asarray(metrics["fitness"])) > 0  # the candidates differ
    for a, b in zip(jax.tree.leaves(state_r), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_run_in_rungs_records_them_and_resumes(tmp_path):
    """A run directory of the tiny experiment in 2 rungs of eta 2: metrics.jsonl says
    which rung each candidate reached and keeps statistics of the full-budget ones, and a
    resumed run goes on from its checkpoint."""
    import json

    from metarl.kinds import resume, start

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    config = load_experiment(path)
    config = config.replace(es=dataclasses.replace(config.es, rungs=2, eta=2, generations=1))
    start(config, tmp_path / "run")
    resume(tmp_path / "run", 2)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [line["generation"] for line in lines] == [1, 2]
    for line in lines:
        assert sorted(line["rung_reached"]) == [0, 0, 1, 1]
        full = [f for f, r in zip(line["fitness"], line["rung_reached"], strict=True) if r]
        assert line["best_fitness"] == pytest.approx(max(full))
        assert line["mean_fitness"] == pytest.approx(np.mean(full))
