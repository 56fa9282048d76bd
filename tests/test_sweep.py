"""Sweeps of traced hyperparameters as one vmapped program: grid parsing, the errors for
what cannot be swept in one program, members equal to their settings trained alone, and the
command line's table, JSON and figures."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from metarl import cli
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import build_learner
from metarl.sweep import GridAxis, check_grid, parse_grid, run_sweep, sweep_population

TINY = {
    "name": "tiny_sweep",
    "objective": {"name": "ppo"},
    "inner": {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8, "total_timesteps": 64,
              "update_epochs": 1, "num_minibatches": 1, "hidden_sizes": [8]},
}


@pytest.fixture(scope="module")
def config():
    return config_from_dict(TINY)


def test_grid_values_parse_as_numbers():
    assert parse_grid("inner.learning_rate=1e-4, 3e-4,1e-3") == GridAxis(
        "learning_rate", (1e-4, 3e-4, 1e-3))
    assert parse_grid("gamma=0.9,1") == GridAxis("gamma", (0.9, 1.0))
    with pytest.raises(ConfigError, match="'fast' is not a number"):
        parse_grid("inner.learning_rate=fast")
    with pytest.raises(ConfigError, match="give distinct values"):
        parse_grid("inner.gamma=0.9,0.9")
    with pytest.raises(ConfigError, match="expected FIELD=VALUE"):
        parse_grid("inner.gamma")


@pytest.mark.parametrize(("axis", "message"), [
    (GridAxis("hidden_sizes", (8.0, 16.0)), "inner.hidden_sizes: sets array shapes"),
    (GridAxis("num_envs", (2.0, 4.0)), "inner.num_envs: sets array shapes"),
    (GridAxis("learning_rat", (1e-3,)), "inner.learning_rat: PPOConfig has no such field"),
    (GridAxis("gamma", (0.9, 1.5)), r"inner.gamma: must lie in \[0, 1\]"),
])
def test_what_one_program_cannot_sweep_is_named(config, axis, message):
    learner = build_learner(config.inner[0])
    with pytest.raises(ConfigError, match=message):
        check_grid(config.inner[0], learner, [axis])


def test_members_equal_their_setting_trained_alone(config):
    grid = [GridAxis("learning_rate", (1e-3, 1e-2)), GridAxis("gamma", (0.9, 0.99))]
    report = run_sweep(config, grid, seeds=2, seed=5, chunk_size=8)
    assert report["agents"] == 8 and len(report["results"]) == 4
    settings = [r["setting"] for r in report["results"]]
    assert settings == [{"learning_rate": lr, "gamma": g} for lr in (1e-3, 1e-2)
                        for g in (0.9, 0.99)]
    learner = build_learner(config.inner[0], config.objective.build())
    train = jax.jit(learner.train)
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    for result in (report["results"][0], report["results"][3]):
        hypers = learner.default_hypers._replace(**{
            k: np.float32(v) for k, v in result["setting"].items()})
        for seed, key in enumerate(keys):
            alone = np.asarray(train(key, None, hypers)["episode_return"], np.float64)
            swept = np.array([np.nan if v is None else v for v in result["curves"][seed]])
            np.testing.assert_allclose(swept, alone, rtol=1e-4)
    assert all(r["ci_low"] <= r["mean"] <= r["ci_high"] for r in report["results"]
               if r["invalid"] == 0)


def test_member_c_times_seeds_plus_s_trains_setting_c_with_seed_s(config):
    learner = build_learner(config.inner[0])
    grid = [GridAxis("learning_rate", (1e-3, 1e-2, 1e-1)), GridAxis("clip_eps", (0.1, 0.3))]
    settings, keys, hypers = sweep_population(learner, grid, seeds=3, seed=2)
    assert len(settings) == 6 and keys.shape == (18, 2)
    seed_keys = jax.random.split(jax.random.PRNGKey(2), 3)
    for member in range(18):
        combination, seed = divmod(member, 3)
        assert float(hypers.learning_rate[member]) == np.float32(
            settings[combination]["learning_rate"])
        assert float(hypers.clip_eps[member]) == np.float32(settings[combination]["clip_eps"])
        assert float(hypers.gamma[member]) == np.float32(config.inner[0].gamma)  # not swept
        np.testing.assert_array_equal(keys[member], seed_keys[seed])


def test_the_command_line_writes_a_table_json_curves_and_a_heatmap(tmp_path, capsys):
    config_file = tmp_path / "tiny.toml"
    config_file.write_text(
        'name = "tiny_sweep"\n[objective]\nname = "ppo"\n[inner]\nnum_envs = 2\nnum_steps = 8\n'
        "total_timesteps = 64\nupdate_epochs = 1\nnum_minibatches = 1\nhidden_sizes = [8]\n")
    out = tmp_path / "sweep"
    status = cli.main(["sweep", str(config_file), "--grid", "inner.learning_rate=1e-3,1e-2",
                       "--grid", "inner.ent_coef=0,0.01", "--seeds", "2", "--out", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "learning_rate  ent_coef" in printed and "95% CI" in printed
    report = json.loads((out / "sweep.json").read_text())
    assert report["grid"] == {"learning_rate": [1e-3, 1e-2], "ent_coef": [0.0, 0.01]}
    assert (out / "learning_curves.png").stat().st_size > 0
    assert (out / "heatmap.png").stat().st_size > 0
    assert cli.main(["sweep", str(config_file), "--grid", "inner.num_steps=8,16"]) == 2
    assert "sets array shapes" in capsys.readouterr().err
