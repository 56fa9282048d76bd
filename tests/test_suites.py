"""Suites, the store of trainings and cross-environment verdicts.

The end-to-end test trains a tiny run's objective on a tiny two-environment suite (a few
thousand steps each, nothing learns much): what it checks is the machinery, that a suite
evaluation writes per-environment and pooled verdicts and a figure, and that the second
evaluation reuses every baseline training from the store and gets exactly the same
verdicts as the first.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _tiny_evolution import TINY

from metarl.cli import main
from metarl.config import ConfigError
from metarl.evolve import store as store_module
from metarl.evolve.config import config_from_dict
from metarl.evolve.store import TrainingStore
from metarl.evolve.suite_verdicts import TRANSFERS, suite_section
from metarl.stats import stratified_probability_of_improvement
from metarl.suites import Suite, SuiteTask, available_suites, get_suite, register_suite

SMALL = {"num_envs": 4, "num_steps": 32, "total_timesteps": 2048, "hidden_sizes": [16],
         "update_epochs": 2, "num_minibatches": 2}
TINY_SUITE = register_suite(Suite(
    "tiny_test_suite", 1, "two environments at a few thousand steps, for tests",
    (SuiteTask("CartPole-v1", {"env_id": "CartPole-v1", **SMALL}, "tests"),),
    (SuiteTask("Catch-bsuite", {"env_id": "Catch-bsuite", **SMALL}, "tests"),)))


def test_shipped_suites_split_as_published_and_name_their_sources():
    assert {"classic", "minatar", "brax"} <= set(available_suites())
    minatar = get_suite("minatar")
    assert [t.label for t in minatar.train] == ["Breakout-MinAtar", "Freeway-MinAtar"]
    assert [t.label for t in minatar.test] == ["Asterix-MinAtar", "SpaceInvaders-MinAtar"]
    classic = get_suite("classic")
    beyond_cartpole = [t.label for t in classic.tasks if t.label != "CartPole-v1"]
    assert len(beyond_cartpole) >= 6
    assert any(label.endswith("-bsuite") for label in beyond_cartpole)
    assert any(label.endswith("-v1") for label in beyond_cartpole)
    assert [t.label for t in get_suite("brax").train] == ["brax/ant"]
    assert len(get_suite("brax").test) >= 3
    for name in available_suites():
        for task in get_suite(name).tasks:
            assert task.source and task.config().env_id == task.inner["env_id"]


def test_the_minatar_split_experiment_trains_on_one_side_and_holds_out_the_other():
    from metarl.kinds import load_experiment

    config = load_experiment("lpo_minatar_split", ["suite.settings.num_envs=4"])
    assert config.task_labels == ("Breakout-MinAtar", "Freeway-MinAtar")
    assert config.held_out_labels == ("Asterix-MinAtar", "SpaceInvaders-MinAtar")
    assert {inner.num_envs for inner in config.inner + config.held_out} == {4}
    with pytest.raises(ConfigError, match="use suite.settings"):
        load_experiment("lpo_minatar_split", ["inner.num_envs=4"])


def test_an_unknown_suite_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="unknown 'nope'.*classic"):
        get_suite("nope")


def test_an_experiment_takes_a_suites_sides_as_its_tasks():
    config = config_from_dict({"name": "x", "objective": {"name": "lpo"},
                               "suite": {"name": "minatar",
                                         "settings": {"total_timesteps": 100_000}}})
    assert [inner.env_id for inner in config.inner] == ["Breakout-MinAtar", "Freeway-MinAtar"]
    assert config.held_out_labels == ("Asterix-MinAtar", "SpaceInvaders-MinAtar")
    assert {inner.total_timesteps for inner in config.inner + config.held_out} == {100_000}
    with pytest.raises(ConfigError, match="suite: takes the place of"):
        config_from_dict({"name": "x", "objective": {"name": "lpo"}, "suite": "minatar",
                          "inner": {"env_id": "CartPole-v1"}})


def test_suite_train_keeps_part_of_the_meta_train_side_and_the_whole_meta_test_side():
    def config(train):
        return config_from_dict({"name": "x", "objective": {"name": "value_distance"},
                                 "suite": {"name": "classic", "train": train,
                                           "settings": {"num_envs": 4}}})

    whole = config_from_dict({"name": "x", "objective": {"name": "value_distance"},
                              "suite": {"name": "classic", "settings": {"num_envs": 4}}})
    one = config(["CartPole-v1"])
    assert one.task_labels == ("CartPole-v1",)
    assert one.inner == whole.inner[:1]  # the suite's settings, and suite.settings on top
    assert one.held_out == whole.held_out
    assert one.held_out_labels == tuple(task.label for task in get_suite("classic").test)
    # the suite's order, whatever the order given
    assert config(["UmbrellaChain-bsuite", "CartPole-v1"]).task_labels == (
        "CartPole-v1", "UmbrellaChain-bsuite")
    for train, message in (([], "non-empty list"), ("CartPole-v1", "non-empty list"),
                           ([3], "non-empty list"),
                           (["Acrobot-v1"], "'Acrobot-v1' not on suite 'classic'.s "
                                            "meta-train side"),
                           (["CartPole-v1", "CartPole-v1"], "named twice")):
        with pytest.raises(ConfigError, match=f"suite.train: .*{message}"):
            config(train)


def test_the_store_reuses_exactly_and_misses_on_any_change(tmp_path, monkeypatch):
    calls = []

    def compute(value):
        calls.append(value)
        return {"returns": [value, float("nan")], "setting": (1, 2)}

    store = TrainingStore(tmp_path)
    first = store.get(("held out", "l2", {"env_id": "CartPole-v1"}, 16, 10007),
                      lambda: compute(1.5))
    again = TrainingStore(tmp_path).get(("held out", "l2", {"env_id": "CartPole-v1"}, 16,
                                         10007), lambda: compute(9.0))
    assert calls == [1.5]
    assert json.dumps(first) == json.dumps(again) and again["setting"] == [1, 2]
    # any part of the key, and the code version, is another entry
    TrainingStore(tmp_path).get(("held out", "l2", {"env_id": "CartPole-v1"}, 16, 10008),
                                lambda: compute(2.0))
    TrainingStore(tmp_path).get(("held out", "huber", {"env_id": "CartPole-v1"}, 16, 10007),
                                lambda: compute(3.0))
    monkeypatch.setattr(store_module, "_CODE_VERSION", "another version")
    TrainingStore(tmp_path).get(("held out", "l2", {"env_id": "CartPole-v1"}, 16, 10007),
                                lambda: compute(4.0))
    assert calls == [1.5, 2.0, 3.0, 4.0]
    # a damaged entry is trained again, never trusted
    path = TrainingStore(tmp_path).path_of(store_module.key_of(
        ("held out", "l2", {"env_id": "CartPole-v1"}, 16, 10007))[0])
    entry = json.loads(path.read_text())
    entry["payload"]["returns"][0] = 400.0
    path.write_text(json.dumps(entry))
    damaged = TrainingStore(tmp_path)
    assert damaged.get(("held out", "l2", {"env_id": "CartPole-v1"}, 16, 10007),
                       lambda: compute(5.0))["returns"][0] == 5.0
    assert damaged.damaged == 1 and calls[-1] == 5.0
    path.write_text("{not json")
    assert TrainingStore(tmp_path).get(("held out", "l2", {"env_id": "CartPole-v1"}, 16,
                                        10007), lambda: compute(6.0))["returns"][0] == 6.0


def test_the_default_store_lives_in_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("METARL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert TrainingStore.default().directory == tmp_path / "metarl" / "trainings"
    monkeypatch.setenv("METARL_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert TrainingStore.default().directory == tmp_path / "elsewhere"


def test_pooled_probability_of_improvement_averages_the_tasks():
    x = np.array([[2.0, 0.0], [2.0, 0.0], [2.0, 1.0], [0.0, 1.0]])
    y = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    estimate = stratified_probability_of_improvement(x, y, resamples=500)
    # task 1: 3 wins of 4; task 2: no win, 2 ties of 4 -> 0.25
    assert estimate.value == pytest.approx((0.75 + 0.25) / 2)
    assert estimate.low <= estimate.value <= estimate.high


def _result(objective, env, returns):
    return {"objective": objective, "env_id": env, "returns": list(returns),
            "valid": [True] * len(returns)}


def test_pooled_scores_are_normalised_between_the_untrained_policy_and_the_baseline():
    suite = {"name": "s", "version": 1, "train": ["A"], "test": ["B", "C"]}
    seeds = 8
    results = [_result("evolved", "A", [5.0] * seeds), _result("l2", "A", [1.0] * seeds),
               _result("evolved", "B", [30.0] * seeds), _result("l2", "B", [20.0] * seeds),
               _result("evolved", "C", [-50.0] * seeds), _result("l2", "C", [-100.0] * seeds)]
    untrained = {"A": _result("untrained", "A", [0.0] * seeds),
                 "B": _result("untrained", "B", [10.0] * seeds),
                 "C": _result("untrained", "C", [-200.0] * seeds)}
    statistics = {"environments": {env: {"comparisons": [
        {"evolved": "evolved", "baseline": "l2", "probability_of_improvement": 1.0,
         "low": 1.0, "high": 1.0, "verdict": "better"}]} for env in "ABC"}}
    section = suite_section(suite, results, untrained, ["A"], statistics)
    assert section["pooled_over"] == ["B", "C"] and section["trained_on"] == ["A"]
    (pooled,) = section["pooled"]
    # B: (30 - 10) / (20 - 10) = 2; C: (-50 + 200) / (-100 + 200) = 1.5
    assert pooled["normalised_iqm"]["evolved"]["value"] == pytest.approx(1.75)
    assert pooled["normalised_iqm"]["l2"]["value"] == pytest.approx(1.0)
    assert pooled["probability_of_improvement"]["value"] == 1.0
    assert pooled["verdict"] == TRANSFERS
    assert [row["environment"] for row in section["environments"]] == ["A", "B", "C"]


@pytest.fixture(scope="module")
def tiny_run(tiny_config_file, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("suite") / "run"
    config = tiny_config_file.parent / "one_generation.toml"
    config.write_text(TINY.replace("generations = 5", "generations = 1"))
    assert main(["run", str(config), "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_a_suite_evaluation_reuses_the_stored_baselines_exactly(tiny_run, tmp_path, capsys):
    from metarl.evolve.evaluate import evaluate_run

    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    shutil.copytree(tiny_run, first_dir)
    shutil.copytree(tiny_run, second_dir)
    store = TrainingStore(tmp_path / "store")
    fresh = evaluate_run(first_dir, seeds=4, baselines=["l2"], suite="tiny_test_suite",
                         store=store)
    # per environment: the evolved row, l2's and the untrained policy's
    assert store.hits == 0 and store.misses == 6
    assert fresh["spec"]["suite"]["name"] == "tiny_test_suite"
    section = fresh["suite"]
    assert section["pooled_over"] == ["Catch-bsuite"]
    assert section["trained_on"] == ["CartPole-v1"]
    assert {row["environment"] for row in section["environments"]} == {"CartPole-v1",
                                                                       "Catch-bsuite"}
    assert (tmp_path / "first" / "plots" / f"suite_{fresh['id']}.png").is_file()
    # another process, another directory of the same run (as an evaluation stopped half way
    # and asked again would be): every training comes from the store
    reused_store = TrainingStore(tmp_path / "store")
    cached = evaluate_run(second_dir, seeds=4, baselines=["l2"], suite="tiny_test_suite",
                          store=reused_store)
    assert reused_store.misses == 0 and reused_store.hits == 6
    for part in ("results", "statistics", "suite"):
        assert json.dumps(cached[part], sort_keys=True) == json.dumps(fresh[part],
                                                                      sort_keys=True)
    # and the command line says so, with --no-cache training afresh
    assert main(["evaluate", str(second_dir), "--seeds", "4", "--baselines", "l2",
                 "--suite", "tiny_test_suite", "--no-cache", "--rerun"]) == 0
    out = capsys.readouterr().out
    assert "pooled (1 environments)" in out and "training store in memory: 0 reused" in out


def test_suite_evaluation_refuses_env_and_budget_overrides(tiny_run):
    from metarl.evolve.evaluate import evaluate_run

    with pytest.raises(ConfigError, match="suite: sets the environments"):
        evaluate_run(tiny_run, suite="tiny_test_suite", env_ids=["Acrobot-v1"])
    with pytest.raises(ConfigError, match="unknown 'nope'"):
        evaluate_run(tiny_run, suite="nope")


def test_metarl_suites_lists_every_suite(capsys):
    assert main(["suites"]) == 0
    out = capsys.readouterr().out
    for name in ("classic", "minatar", "brax"):
        assert f"{name} (v" in out
    assert "meta-test  Asterix-MinAtar" in out


def test_calibration_places_tuned_ppo_between_the_untrained_policy_and_the_ceiling():
    from metarl.evolve.calibrate import calibrate_suite

    ceiling = Suite("tiny_ceiling", 1, "one environment with a ceiling", (SuiteTask(
        "CartPole-v1", {"env_id": "CartPole-v1", **SMALL}, "tests", ceiling=500.0),), ())
    lines = []
    record = calibrate_suite(ceiling, [2048], seeds=2, progress=lines.append)
    (entry,) = record["environments"]["CartPole-v1"]["budgets"]
    floor, tuned = entry["untrained_iqm"], entry["tuned_iqm"]["value"]
    assert entry["total_timesteps"] == 2048 and record["seeds"] == 2
    assert entry["ceiling_fraction"] == pytest.approx((tuned - floor) / (500.0 - floor))
    assert 0 < floor < 100  # CartPole's random policy falls within tens of steps
    assert entry["chosen"]  # PPO's grid was searched
    assert lines and "CartPole-v1 at 2048 steps" in lines[0]
