"""Truncated evolution (:mod:`metarl.evolve.truncation`): PersistentES and NoiseReuseES
update the meta-parameters after every truncation of the inner loop, carry the agents
between truncations, and credit a truncation's return to the perturbations of the
truncations before it.

The planted problem: a stand-in learner whose state ``s`` grows by the candidate's
``a = scale[0]`` at every update, and whose return at update ``u`` is ``s_u - LAMBDA * a``
(``s_u = u * a`` within an unroll). Over an unroll of ``U`` updates the return sums to
``a * (U (U - 1) / 2 - LAMBDA * U)``: with ``U = 8`` and ``LAMBDA = 1`` its gradient in
``a`` is ``+20``. Scored one update at a time, a truncation sees only ``-LAMBDA * a``: a
greedy (plain truncated) estimate points the other way. PES and NRES must move ``a`` up,
and plain truncated ES (PES with its accumulated perturbations dropped at every
truncation) moves it down.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiny_evolution import TINY
from test_evolution import _test_scalar_objective  # noqa: F401  (registers test_scalar)

from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import Evolution
from metarl.kinds import load_experiment, resume, start

UPDATES = 8
LAMBDA = 1.0


def _growing_learner(learner):
    """``learner`` with the planted dynamics of the module docstring."""

    def init(key, meta_params, hypers):
        del meta_params, hypers
        return {"s": jnp.zeros((), jnp.float32), "key": key}

    def advance(state, meta_params, hypers, num_updates):
        del hypers
        a = meta_params["policy"]["scale"][0]
        s = state["s"] + a * jnp.arange(num_updates, dtype=jnp.float32)
        metrics = {"episode_return": s - LAMBDA * a, "finite": jnp.ones((num_updates,), bool)}
        return {**state, "s": state["s"] + a * num_updates}, metrics

    return dataclasses.replace(learner, init_fn=init, advance_fn=advance)


def _planted(strategy, truncations=UPDATES, **es):
    config = config_from_dict({
        "objective": {"name": "test_scalar"},
        "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8,
                  "total_timesteps": 16 * UPDATES},
        "es": {"strategy": strategy, "population_size": 64, "sigma": 0.1,
               "learning_rate": 0.02, "learning_rate_decay": 1.0, "sigma_decay": 1.0,
               "fitness_shaping": "raw", "generations": UPDATES,
               "truncations": truncations, **es},
        "fitness": {"seeds_per_candidate": 1},
    })
    evolution = Evolution(config)
    evolution.learners = [_growing_learner(evolution.learners[0])]
    evolution.step = jax.jit(evolution.generation)
    return evolution


@pytest.mark.parametrize("strategy", ["PersistentES", "NoiseReuseES"])
def test_an_unroll_moves_the_mean_along_the_whole_runs_gradient(strategy):
    """Over one unroll of 8 one-update truncations the mean of ``a`` rises (the whole
    run's gradient, +20), although every truncation's own return falls with ``a``: the
    first truncation, which sees nothing else, moves the mean down (measured: to -0.02,
    then up to +0.041 for PES, +0.044 for NRES). Plain truncated ES, the same strategy
    told to forget its perturbations after each truncation, falls all the way."""
    evolution = _planted(strategy)
    state = evolution.init(jax.random.PRNGKey(0))

    def a(state):
        return float(evolution.mean_meta_params(state)["policy"]["scale"][0])

    path = [a(state)]
    for truncation in range(UPDATES):
        state, metrics = evolution.step(state)
        assert int(metrics["truncation"]) == truncation
        path.append(a(state))
    assert path[1] < path[0]  # the greedy signal, alone at the first truncation
    assert path[-1] > path[0] + 0.02  # the unroll's: more than one Adam step up
    assert int(state.truncation.truncation) == 0  # the next generation starts new agents
    assert np.isfinite(float(metrics["unroll_fitness"]))
    # the best unroll's score is the population's mean fitness per truncation
    assert float(state.best_fitness) == pytest.approx(float(metrics["unroll_fitness"]))
    np.testing.assert_allclose(state.best_meta_params["policy"]["scale"][0], path[-1])
    assert evolution.step._cache_size() == 1
    if strategy == "PersistentES":  # the control: evosax's T = 1 resets after every tell
        greedy = _planted(strategy)
        greedy.es_params = greedy.es_params.replace(T=1)
        state = greedy.init(jax.random.PRNGKey(0))
        for _ in range(UPDATES):
            state, _ = greedy.step(state)
        assert float(greedy.mean_meta_params(state)["policy"]["scale"][0]) < path[0] - 0.05


def test_agents_carry_over_between_truncations_and_start_again_after_an_unroll():
    """Two truncations of 4 updates: the second continues the first's agents (its returns
    start from ``s = 4 a`` of the first's candidate), the third starts new agents (``s =
    0``). NRES perturbs the moved mean by the unroll's first perturbation again."""
    evolution = _planted("NoiseReuseES", truncations=2, population_size=4)
    state = evolution.init(jax.random.PRNGKey(1))
    carried = np.zeros(4)
    perturbations = []
    for truncation in range(3):
        mean = float(evolution.mean_meta_params(state)["policy"]["scale"][0])
        a = np.asarray(evolution.ask(state).population["policy"]["scale"][:, 0])
        state, metrics = evolution.step(state)
        start = carried if truncation == 1 else 0.0
        expected = start + a * np.arange(4).mean() - LAMBDA * a
        np.testing.assert_allclose(metrics["fitness"], expected, rtol=1e-5, atol=1e-6)
        carried = 4 * a
        perturbations.append(a - mean)
    np.testing.assert_allclose(perturbations[1], perturbations[0], rtol=1e-4, atol=1e-7)
    assert np.abs(perturbations[2] - perturbations[0]).min() > 1e-3  # a new unroll: new noise
    assert evolution.agent_steps_per_generation == 4 * 4 * evolution.learners[0].steps_per_update


def test_truncated_evolution_refuses_settings_it_does_not_fit(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    config = load_experiment(path)
    with pytest.raises(ConfigError, match="es.truncations: Open_ES scores whole training runs"
                                          ".*PersistentES, NoiseReuseES"):
        dataclasses.replace(config.es, truncations=4)
    pes = dataclasses.replace(config.es, strategy="PersistentES")
    with pytest.raises(ConfigError, match="es.truncations: not combined with es.rungs"):
        dataclasses.replace(pes, truncations=4, rungs=2)
    with pytest.raises(ConfigError, match="es.truncations: must be a positive integer"):
        dataclasses.replace(pes, truncations=0)
    truncated = dataclasses.replace(pes, truncations=4)
    with pytest.raises(ConfigError, match="fitness.metric: truncated evolution"):
        config.replace(es=truncated, fitness=dataclasses.replace(config.fitness,
                                                                 metric="final_return"))
    # TINY runs 32 updates
    with pytest.raises(ConfigError, match="es.truncations: 5 truncations do not split the 32"):
        Evolution(config.replace(es=dataclasses.replace(pes, truncations=5)))


def test_a_truncated_run_resumed_mid_unroll_equals_the_run_uninterrupted(tmp_path):
    """Real PPO agents (the tiny experiment, 32 updates in 4 truncations of 8): a run of 3
    truncations, and one stopped after 2 and resumed for the third from its checkpoint
    (the carried agents in it), write the same metrics and the same search state."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    config = load_experiment(path)
    config = config.replace(es=dataclasses.replace(
        config.es, strategy="PersistentES", truncations=4, generations=3, sigma=0.5))
    start(config, tmp_path / "whole")
    start(config.replace(es=dataclasses.replace(config.es, generations=2)), tmp_path / "cut")
    resume(tmp_path / "cut", 3)
    lines = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
             for name in ("whole", "cut")}
    keys = ("fitness", "mean_return", "truncation")
    assert [[line[k] for k in keys] for line in lines["cut"]] == [
        [line[k] for k in keys] for line in lines["whole"]]
    assert [line["truncation"] for line in lines["whole"]] == [0, 1, 2]
    assert np.ptp(lines["whole"][2]["fitness"]) > 0  # the candidates differ
    for name in ("best_meta_params.msgpack", "mean_meta_params.msgpack"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes()


def test_evolutions_trained_together_each_equal_their_run_alone():
    """Two evolutions of the planted problem (2 truncations of 4 updates) as one joint
    program, seed 1 one truncation ahead of seed 0 (as after resuming seeds that stopped at
    different points): each keeps its own schedule, starting new agents when its own unroll
    ends, and equals its run alone after every generation."""
    from metarl.evolve.replicated import ReplicatedEvolution, seed_config

    config = _planted("NoiseReuseES", truncations=2, population_size=4).config
    joint = ReplicatedEvolution(config, 2)
    joint.evolution.learners = [_growing_learner(joint.evolution.learners[0])]
    step = jax.jit(joint.generation)
    alone = []
    for index in range(2):
        evolution = Evolution(seed_config(config, index))
        evolution.learners = [_growing_learner(evolution.learners[0])]
        evolution.step = jax.jit(evolution.generation)
        alone.append((evolution, evolution.init()))
    evolution, ahead = alone[1]
    alone[1] = (evolution, evolution.step(ahead)[0])
    states = joint.stack([state for _, state in alone])
    for _ in range(4):
        states, metrics = step(states)
        alone = [(evolution, evolution.step(state)[0]) for evolution, state in alone]
        assert [int(t) for t in metrics["truncation"]] == [
            int(state.truncation.truncation) - 1 if int(state.truncation.truncation) else 1
            for _, state in alone]
        for together, (_, state) in zip(joint.split(states), alone, strict=True):
            for a, b in zip(jax.tree.leaves(together), jax.tree.leaves(state), strict=True):
                np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                           rtol=1e-6, atol=1e-7)


def test_a_truncated_runs_fitness_is_drawn_per_unroll():
    """Two unrolls of two truncations: one line per truncation position over the unrolls,
    the unrolls' own fitness, and the best so far once an unroll has ended."""
    from metarl.figures.records import plot_truncated_fitness

    history = [
        {"generation": 1, "truncation": 0, "fitness": [1.0, 3.0], "valid": [True, True],
         "unroll_fitness": None, "best_fitness_so_far": float("-inf")},
        {"generation": 2, "truncation": 1, "fitness": [5.0, 7.0], "valid": [True, True],
         "unroll_fitness": 4.0, "best_fitness_so_far": 4.0},
        {"generation": 3, "truncation": 0, "fitness": [2.0, 9.0], "valid": [True, False],
         "unroll_fitness": None, "best_fitness_so_far": 4.0},
        {"generation": 4, "truncation": 1, "fitness": [8.0, 8.0], "valid": [True, True],
         "unroll_fitness": 5.0, "best_fitness_so_far": 5.0},
    ]
    figure = plot_truncated_fitness(history)
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
             for line in figure.axes[0].get_lines()}
    assert lines["truncation 1: mean"] == ([1.0, 2.0], [2.0, 2.0])  # the invalid 9 left out
    assert lines["truncation 2: mean"] == ([1.0, 2.0], [6.0, 8.0])
    assert lines["unroll: mean over its truncations"] == ([1.0, 2.0], [4.0, 5.0])
    assert lines["best unroll so far"] == ([1.0, 2.0], [4.0, 5.0])
