"""Robust fitness (``[fitness] hyperparameter_ranges``) and evaluation across a
hyperparameter (``metarl evaluate --across``).

Every run of a generation draws its hyperparameters from the declared ranges inside the one
jitted generation; without ranges the generation is today's, bit for bit. An evaluation
across a knob trains every objective at each value on the held-out seeds and saves the
per-value statistics and a figure.

Tiny shapes (CartPole PPO, 2048 steps, 2 candidates x 2 seeds); the evolutions and the
evaluation are built once per module, since compilation dominates on the CPU.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _evaluation_run import TINY as TINY_EVALUATION
from _evaluation_run import write_run

from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve.across import across_figure_path
from metarl.evolve.config import FitnessConfig, config_from_dict
from metarl.evolve.evaluate import evaluate_run
from metarl.evolve.fitness import (
    HYPERPARAMETER_STREAM,
    combine_fitness,
    draw_hyperparameters,
    evaluate_candidates,
)
from metarl.evolve.generation import Evolution
from metarl.figures.records import plot_across

TINY = {**TINY_EVALUATION, "name": "tiny_robust",
        "es": {"population_size": 2, "generations": 2, "sigma": 0.05},
        "fitness": {"seeds_per_candidate": 2}, "run": {"progress": False}}
# learning rates at which agents cannot learn in 16 updates: the planted check
FROZEN = {"learning_rate": {"low": 1e-9, "high": 2e-9, "log": True}}
RANGES = {"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
          "vf_coef": {"low": 0.1, "high": 1.0}}


def tiny(**fitness):
    return config_from_dict({**TINY, "fitness": {**TINY["fitness"], **fitness}})


# --------------------------------------------------------------------------------------
# the config


@pytest.mark.parametrize(("ranges", "message"), [
    ({"hidden_sizes": {"low": 8, "high": 16}},
     "fitness.hyperparameter_ranges.hidden_sizes: not a traced hyperparameter of ppo; "
     "allowed: learning_rate, gamma, gae_lambda, clip_eps, ent_coef, vf_coef, max_grad_norm"),
    ({"learning_rate": {"low": 1e-3, "high": 1e-4}},
     "fitness.hyperparameter_ranges.learning_rate.low: must be below high"),
    ({"learning_rate": {"low": 0.0, "high": 1e-3, "log": True}},
     "fitness.hyperparameter_ranges.learning_rate.low: a log-uniform prior needs low > 0"),
    ({"gamma": {"low": 0.9, "high": 1.5}},
     r"fitness.hyperparameter_ranges.gamma.high: 1.5 is not a valid gamma for ppo "
     r"\(gamma: must lie in \[0, 1\]"),
    ({"vf_coef": {"low": -1.0, "high": 1.0}},
     "fitness.hyperparameter_ranges.vf_coef.low: -1.0 is not a valid vf_coef"),
    ({"learning_rate": {"low": 1e-4, "high": 1e-3, "scale": "log"}},
     "fitness.hyperparameter_ranges.learning_rate.scale: unknown field; allowed: low, high, "
     "log"),
    ({"learning_rate": 3e-4}, "fitness.hyperparameter_ranges.learning_rate: expected a table"),
    ([1, 2], "fitness.hyperparameter_ranges: expected a table"),
])
def test_bad_ranges_are_named_on_load(ranges, message):
    with pytest.raises(ConfigError, match=message):
        tiny(hyperparameter_ranges=ranges)


def test_a_range_must_fit_every_inner_algorithm():
    data = {**TINY, "inner": [TINY["inner"], {"algorithm": "dqn", "env_id": "Acrobot-v1"}],
            "fitness": {"hyperparameter_ranges": {"vf_coef": {"low": 0.1, "high": 1.0}}}}
    with pytest.raises(ConfigError, match=r"hyperparameter_ranges.vf_coef: not a traced "
                                          r"hyperparameter of dqn \(inner\[1\]\); allowed: "
                                          "learning_rate, gamma"):
        config_from_dict(data)


def test_ranges_round_trip_and_default_to_none():
    config = tiny(hyperparameter_ranges=RANGES)
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["fitness"]["hyperparameter_ranges"]["learning_rate"] == {
        "low": 1e-4, "high": 1e-2, "log": True}
    assert config_from_dict(saved) == config
    assert FitnessConfig().hyperparameter_ranges == {}


# --------------------------------------------------------------------------------------
# the draws


def test_draws_lie_in_the_ranges_differ_per_seed_and_follow_the_keys():
    config = FitnessConfig(hyperparameter_ranges=RANGES)
    hypers = tiny().inner[0].hyperparams()
    seeds = jax.random.split(jax.random.PRNGKey(3), 8)
    common = jnp.broadcast_to(seeds, (3, *seeds.shape))  # common seeds: 3 candidates
    drawn = draw_hyperparameters(common, hypers, config)
    for name, spec in RANGES.items():
        values = np.asarray(getattr(drawn, name))
        assert values.shape == (3, 8)
        assert np.all(values >= np.float32(spec["low"]))
        assert np.all(values <= np.float32(spec["high"]))
        assert len(np.unique(values[0])) == 8  # a draw per seed
        np.testing.assert_array_equal(values, np.broadcast_to(values[0], values.shape))
    # fields without a range keep the config's value
    np.testing.assert_array_equal(np.asarray(drawn.gamma), np.float32(0.99))
    # own seeds per candidate: own draws
    own = jax.random.split(jax.random.PRNGKey(3), 24).reshape(3, 8, 2)
    values = np.asarray(draw_hyperparameters(own, hypers, config).learning_rate)
    assert len(np.unique(values)) == 24
    # log-uniform: about as many draws below the geometric middle as above it
    many = jax.random.split(jax.random.PRNGKey(0), 4000).reshape(1, 4000, 2)
    rates = np.asarray(draw_hyperparameters(many, hypers, config).learning_rate)
    assert 0.45 < np.mean(rates < 1e-3) < 0.55
    # the draws come from their own stream of each run's key
    assert HYPERPARAMETER_STREAM > 2**24
    # no ranges: the hyperparameters themselves, untouched
    assert draw_hyperparameters(common, hypers, FitnessConfig()) is hypers


# --------------------------------------------------------------------------------------
# the generation


def _reference_fitness(evolution, state):
    """The first generation's fitness as the generation computed it before ranges existed:
    the same keys, and the config's hyperparameters broadcast to every run."""
    cfg = evolution.config
    learner = evolution.learners[0]

    def fitness(state):
        _, ask_key, _, env_key = jax.random.split(state.key, 4)
        population, _ = evolution.strategy.ask(ask_key, state.es_state, evolution.es_params)
        seeds = jax.random.split(env_key, cfg.fitness.seeds_per_candidate)
        keys = jnp.broadcast_to(seeds, (cfg.es.population_size, *seeds.shape))
        returns, valid, _ = evaluate_candidates(learner.train, population, keys,
                                                learner.default_hypers, cfg.fitness)
        return combine_fitness(returns[..., None], valid[..., None], state.baselines)[0]

    return jax.jit(fitness)(state)


@pytest.fixture(scope="module")
def plain():
    """Two generations without ranges, and the first one's fitness by the old recipe."""
    evolution = Evolution(tiny())
    state = evolution.init()
    reference = _reference_fitness(evolution, state)
    lines = []
    for _ in range(2):
        state, metrics = evolution.step(state)
        lines.append(jax.device_get(metrics))
    return lines, np.asarray(reference)


@pytest.fixture(scope="module")
def ranged(compilations):
    """Two generations with learning rates at which agents cannot learn, counting the
    compilations of the generation."""
    evolution = Evolution(tiny(hyperparameter_ranges=FROZEN))
    state = evolution.init()
    before = len(compilations.events)
    lines = []
    for _ in range(2):
        state, metrics = evolution.step(state)
        lines.append(jax.device_get(metrics))
    compiled = [name for _, name, _ in compilations.events[before:]]
    return evolution, lines, compiled


def test_without_ranges_the_fitness_is_todays(plain):
    lines, reference = plain
    np.testing.assert_array_equal(lines[0]["fitness"], reference)
    assert "hyperparameters" not in lines[0]


def test_the_ranged_generation_compiles_once(ranged):
    _, lines, compiled = ranged
    assert compiled == ["jit(generation)"], compiled
    assert not any(np.array_equal(lines[0]["fitness"], line["fitness"]) for line in lines[1:])


def test_the_drawn_range_is_in_the_metrics(ranged):
    evolution, lines, _ = ranged
    for line in lines:
        low, high = np.asarray(line["hyperparameters"]["learning_rate"])[0]
        assert np.float32(1e-9) <= low < high <= np.float32(2e-9)
    summary = {"metrics": lines[0], "best_fitness_so_far": 0.0}
    from metarl.evolve.kind import EvolveProgram

    program = EvolveProgram.__new__(EvolveProgram)
    program.evolution, program.mesh = evolution, None
    line = program.summary(1, summary)
    assert list(line["hyperparameters"]["learning_rate"]) == ["CartPole-v1"]


def test_the_drawn_hyperparameters_reach_training(plain, ranged):
    """Planted: the same keys and candidates with learning rates near 1e-9 score like agents
    that never learn, well below the same generation at the config's 0.005."""
    learned = np.asarray(plain[0][0]["returns"])
    frozen = np.asarray(ranged[1][0]["returns"])
    assert np.all(np.isfinite(frozen))
    assert np.all(frozen < learned - 5.0), (frozen, learned)


def test_without_common_seeds_every_run_draws_its_own():
    config = FitnessConfig(hyperparameter_ranges=RANGES, common_seeds=False)
    keys = jax.random.split(jax.random.PRNGKey(1), 4).reshape(2, 2, 2)
    drawn = draw_hyperparameters(keys, tiny().inner[0].hyperparams(), config)
    assert len(np.unique(np.asarray(drawn.vf_coef))) == 4


# --------------------------------------------------------------------------------------
# evaluation across a hyperparameter


ACROSS = {"learning_rate": [1e-9, 0.005]}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("robust") / "run", TINY)


@pytest.fixture(scope="module")
def across(run_dir):
    return evaluate_run(run_dir, seeds=2, baselines=["l2"], across=ACROSS)


def test_the_evaluation_across_a_knob_keeps_each_value(across, run_dir):
    section = across["across"]
    assert section["knob"] == "learning_rate"
    assert section["values"] == [1e-9, 0.005]
    assert set(section["environments"]["CartPole-v1"]) == {"evolved", "l2"}
    for points in section["environments"]["CartPole-v1"].values():
        assert [p["value"] for p in points] == [1e-9, 0.005]
        for point in points:
            assert len(point["returns"]) == 2
            assert point["iqm"]["low"] <= point["iqm"]["value"] <= point["iqm"]["high"]
        assert points[0]["iqm"]["value"] < points[1]["iqm"]["value"]  # 1e-9 cannot learn
    saved = json.loads((run_dir / "evaluations" / f"{across['id']}.json").read_text())
    assert saved["across"] == section
    assert saved["spec"]["across"] == ACROSS


def test_the_value_of_the_run_matches_the_plain_evaluation(across):
    """At the run's own learning rate, the held-out seeds give the rows' scores."""
    rows = {r["objective"]: r["returns"] for r in across["results"]}
    for name, points in across["across"]["environments"]["CartPole-v1"].items():
        np.testing.assert_allclose(points[1]["returns"], rows[name], rtol=1e-5)


def test_the_figure_is_written_and_redrawn(across, run_dir):
    path = across_figure_path(run_dir, across["id"])
    assert across["across_figure"] == str(path)
    assert path.is_file() and path.stat().st_size > 0
    path.unlink()
    again = evaluate_run(run_dir, seeds=2, baselines=["l2"], across=ACROSS)
    assert again["reused"] and path.is_file()
    figure = plot_across(across["across"])
    assert figure.axes[0].get_xscale() == "log"
    assert len(figure.axes[0].lines) >= 2  # one line per objective


def test_an_evaluation_without_across_is_another_record(across, run_dir):
    from metarl.runs.evaluations import find_same

    spec = dict(across["spec"])
    spec.pop("across")
    assert find_same(run_dir, spec) is None


@pytest.mark.parametrize(("across", "message"), [
    ({"hidden_sizes": [8, 16]}, "across inner.hidden_sizes: sets array shapes"),
    ({"num_minibatches": [1, 2]}, "across inner.num_minibatches: sets array shapes"),
    ({"nonsense": [1, 2]}, "across inner.nonsense: PPOConfig has no such field"),
    ({"learning_rate": [-1.0, 1e-3]}, "across inner.learning_rate: must be positive"),
    ({"learning_rate": [1e-3]}, "across learning_rate: give at least 2 distinct values"),
    ({"learning_rate": [1e-3, 1e-3]}, "across learning_rate: give at least 2 distinct"),
    ({"learning_rate": ["a", 1e-3]}, "across learning_rate: expected finite numbers"),
    ({"learning_rate": [1e-3, 1e-2], "gamma": [0.9, 0.99]}, "across: expected one knob"),
])
def test_bad_across_options_are_named(run_dir, across, message):
    with pytest.raises(ConfigError, match=message):
        evaluate_run(run_dir, seeds=2, baselines=["l2"], across=across)


def test_the_command_line_parses_across_and_names_bad_values(run_dir, capsys):
    assert main(["evaluate", str(run_dir), "--seeds", "2", "--baselines", "l2",
                 "--across", "learning_rate=x,1e-3"]) == 2
    assert "--across learning_rate: 'x' is not a number" in capsys.readouterr().err
    assert main(["evaluate", str(run_dir), "--seeds", "2", "--baselines", "l2",
                 "--across", "inner.learning_rate=1e-9,0.005"]) == 0
    out = capsys.readouterr().out
    assert "reusing" in out and "across learning_rate" in out
