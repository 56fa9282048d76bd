"""Experiment configs: every shipped file loads, bad fields are named, overrides apply."""

import json
from pathlib import Path

import pytest

from inner_loops.ppo import PPOConfig
from metarl.config import ConfigError, apply_overrides
from metarl.evolve.config import ExperimentConfig, config_from_dict
from metarl.evolve.generation import build_learner
from metarl.kinds import load_experiment

EXPERIMENTS = sorted((Path(__file__).parents[1] / "experiments").glob("*.toml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_shipped_experiments_load_and_round_trip(path):
    """Every experiment file loads as its kind (evolution by default, ``kind = "pbt"``...)
    and survives the round trip through the plain data a run saves."""
    from metarl.kinds import experiment_from_dict, load_experiment

    config = load_experiment(path)
    assert config.name == path.stem or config.name
    assert experiment_from_dict(config.to_dict()) == config


def test_the_expected_experiments_ship():
    names = {p.stem for p in EXPERIMENTS}
    assert {"value_distance_cartpole", "lpo_minatar", "ta_lpo_minatar", "lpo_brax",
            "pbt_ppo_cartpole", "pbt_sac_pendulum", "cem_rl_pendulum", "dvd_td3_pendulum",
            "pbt_sac_halfcheetah_gpu", "cem_rl_hopper_gpu", "dvd_td3_humanoid_gpu"} <= names


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"es": {"populaton_size": 8}}, "es.populaton_size: unknown field"),
        ({"es": {"strategy": "Nope_ES"}}, "es.strategy: got 'Nope_ES'; allowed: Open_ES"),
        ({"es": {"population_size": 7}}, "es.population_size"),
        ({"es": {"population_size": "8"}}, "es.population_size: expected an integer"),
        ({"es": {"sigma": -1.0}}, "es.sigma: must be positive"),
        ({"fitness": {"metric": "max"}}, "fitness.metric: got 'max'; allowed"),
        ({"inner": {"env_id": "NoSuchEnv-v0"}}, "inner.env_id: unknown environment"),
        ({"inner": {"num_minibatches": 3}}, "inner.num_minibatches: 3 does not divide"),
        ({"inner": {"env_id": "Pendulum-v1", "policy": "categorical"}}, "inner.policy"),
        ({"inner": [{"env_id": "CartPole-v1"}, {"env_id": "CartPole-v1"}]},
         "inner[1]: the same task as inner[0]"),
        ({"objective": {"name": "nope"}}, "objective: unknown objective 'nope'"),
        ({"run": {"chunk_size": -1}}, "run.chunk_size"),
        ({"inner": {"vf_coef": -1.0}}, "inner.vf_coef: must be >= 0"),
        ({"inner": {"hidden_sizes": [64.5]}}, "inner.hidden_sizes[0]: expected an integer"),
        ({"colour": "blue"}, "colour: unknown field"),
        ({"fitness": {"baseline_returns": [1.0, 2.0]}}, "fitness.baseline_returns: 2 values"),
        ({"inner": {"env_params": {"gravty": 9.0}}},
         "inner.env_params.gravty: CartPole-v1 has no such scalar parameter; allowed:"),
        ({"inner": {"env_params": 3}}, "inner.env_params: expected a table, got 3"),
    ],
)
def test_bad_configs_name_the_field(data, message):
    """Loading checks the config's own values; building the learners checks what needs the
    environment (its name, parameters and action space). Both name the field."""
    with pytest.raises(ConfigError) as error:
        config = config_from_dict(data)
        objective = config.objective.build()
        for inner in config.inner:
            build_learner(inner, objective)
    assert message in str(error.value)


def test_overrides_parse_toml_values_and_reach_every_inner_entry():
    data = {"inner": [{"env_id": "CartPole-v1"}, {"env_id": "Acrobot-v1"}]}
    data = apply_overrides(
        data, ["es.generations=3", "inner.total_timesteps=1e4", "inner.1.num_envs=8",
               "objective.options.hidden_sizes=[8, 8]", "run.output_dir=/tmp/x"],
    )
    config = config_from_dict(data)
    assert config.es.generations == 3
    assert [c.total_timesteps for c in config.inner] == [10_000, 10_000]
    assert [c.num_envs for c in config.inner] == [4, 8]
    assert config.objective.options["hidden_sizes"] == [8, 8]
    assert config.run.output_dir == "/tmp/x"


def test_overrides_reach_held_out_tasks_like_inner_ones():
    data = {"inner": [{"env_id": "CartPole-v1"}],
            "held_out": [{"env_id": "Acrobot-v1"}, {"env_id": "MountainCar-v0"}],
            "fitness": {"tasks_per_generation": 1}}
    data = apply_overrides(data, ["held_out.learning_rate=9e-3", "held_out.1.num_envs=8",
                                  "inner.learning_rate=9e-3"])
    config = config_from_dict(data)
    assert [c.learning_rate for c in (*config.inner, *config.held_out)] == [9e-3] * 3
    assert [c.num_envs for c in config.held_out] == [4, 8]
    with pytest.raises(ConfigError, match="there are only 2 held_out entries"):
        apply_overrides(data, ["held_out.2.num_envs=8"])
    with pytest.raises(ConfigError, match=r"has no \[\[held_out\]\] tasks"):
        apply_overrides({"inner": [{"env_id": "CartPole-v1"}]}, ["held_out.num_envs=8"])


def test_env_params_table_round_trips_through_the_saved_json(tmp_path):
    path = tmp_path / "short_episodes.toml"
    path.write_text('[inner]\nenv_id = "CartPole-v1"\n'
                    'env_params = { max_steps_in_episode = 200, gravity = 12 }\n')
    config = load_experiment(path, ["inner.env_params.tau=0.01"])
    assert config.inner[0].env_params == (
        ("gravity", 12), ("max_steps_in_episode", 200), ("tau", 0.01))
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["inner"][0]["env_params"] == {
        "gravity": 12, "max_steps_in_episode": 200, "tau": 0.01}
    assert config_from_dict(saved) == config
    assert config_from_dict({}).inner[0].env_params == ()


def test_single_inner_table_becomes_a_tuple_and_defaults_are_pure_jax_rl():
    config = config_from_dict({"inner": {"env_id": "CartPole-v1"}})
    assert config.inner == (PPOConfig(),)
    assert ExperimentConfig().inner[0].learning_rate == 2.5e-4


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_experiment(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_experiment(bad)
