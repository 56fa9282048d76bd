"""The plan of an evaluation (metarl.evolve.plan): what a tuned evaluation with its starting
point over two environments trains, in an order that puts every training after those it
needs, keyed in the store as evaluations always were, and trained once by a store however
often the plan is executed.

The run is the tiny one of tests/_evaluation_run.py with a held-out task (CartPole with a
longer pole), at 512 steps per training and a grid of one setting per objective: every
training of the plan is real, and cheap.
"""

from __future__ import annotations

import json
import threading
import time

import jax
import pytest
from _evaluation_run import TINY

from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.engines import engine_of
from metarl.evolve.evaluate import evaluation_tasks
from metarl.evolve.plan import (
    EQUAL_BUDGET,
    HELD_OUT,
    TUNED_HELD_OUT,
    TUNING,
    UNTRAINED_ROW,
    Training,
    plan_evaluation,
    train_plan,
    tuning_settings,
)
from metarl.evolve.rows import ObjectiveResult
from metarl.evolve.store import TrainingStore, key_of, params_digest
from metarl.evolve.suite_verdicts import UNTRAINED
from metarl.evolve.verdicts import verdicts

HELD_OUT_TASK = "CartPole-v1[length=1.0]"
TASKS = ["CartPole-v1[defaults]", HELD_OUT_TASK]  # the labels of a shared env_id
NAMES = ["evolved", "start", "l2"]
GRID = {"learning_rate": [1.0], "vf_coef": [1.0]}  # one setting: the run's own


class CountingStore(TrainingStore):
    """A store in memory that counts how often it trains each key."""

    def __init__(self):
        super().__init__()
        self.trained: dict[str, int] = {}

    def get(self, parts, compute, *codec):
        key = key_of(parts)[0]

        def counted():
            self.trained[key] = self.trained.get(key, 0) + 1
            return compute()

        return super().get(parts, counted, *codec)


def make_plan(suite=None, grid=GRID):
    config = config_from_dict({**TINY, "held_out": [{**TINY["inner"],
                                                      "env_params": {"length": 1.0}}]})
    tasks = {label: inner.replace(total_timesteps=512)
             for label, inner in evaluation_tasks(config).items()}
    objective = config.objective.build()
    evolved = objective.init(jax.random.PRNGKey(0))
    learned = {"evolved": evolved, "start": engine_of(config).search_start(objective, config)}
    settings = tuning_settings(True, 2, 7, grid, None, config, ["l2"], tasks, start=True,
                               tune_rounds=0)
    return plan_evaluation(config, tasks, objective, learned, ["l2"], 2, 11, tune=settings,
                           suite=suite)


@pytest.fixture(scope="module")
def plan():
    return make_plan()


@pytest.fixture(scope="module")
def one_at_a_time(plan):
    """Every training of ``plan``, one environment after the other."""
    return train_plan(plan, TrainingStore())


def test_a_tuned_start_plan_over_two_environments_lists_every_training(plan):
    expected = [(kind, name, task) for task in TASKS
                for kind in (HELD_OUT, TUNING, TUNED_HELD_OUT) for name in NAMES]
    assert [(t.kind, t.name, t.task) for t in plan.trainings] == expected
    assert list(plan.tasks) == list(plan.tuning.plans) == TASKS
    assert {t.inner.total_timesteps for t in plan.trainings} == {512}


def test_every_training_is_keyed_as_evaluations_key_it(plan):
    config = plan.config
    part = {"fitness": [config.fitness.metric, config.fitness.final_fraction],
            "chunk_size": config.run.chunk_size, "shard": config.run.shard}
    digest = params_digest(plan.trainings[0].meta_params)
    for t in plan.trainings:
        identity = (("learned", t.name, config.objective, params_digest(t.meta_params))
                    if t.name in ("evolved", "start") else ("baseline", t.name))
        settings = (2, 7, "iqm", 0)
        parts = {HELD_OUT: (t.inner, 2, 11),
                 TUNING: (t.search, t.inner, *settings),
                 TUNED_HELD_OUT: (t.search, t.inner, 2, 11, *settings, EQUAL_BUDGET)}[t.kind]
        assert t.key == (t.kind, identity, *parts, part)
    assert identity == ("baseline", "l2")
    assert plan.trainings[0].key[1] == ("learned", "evolved", config.objective, digest)


def test_a_tuned_row_comes_after_every_search_of_its_task_and_its_default_row(plan):
    order = {t: i for i, t in enumerate(plan.trainings)}
    for t in plan.of_kind(TUNED_HELD_OUT):
        needed = [Training(HELD_OUT, t.name, t.task), *plan.of_kind(TUNING, t.task)]
        assert all(order[need] < order[t] for need in needed)


def test_a_plan_executed_twice_with_one_store_trains_each_training_once(plan):
    store = CountingStore()
    first = train_plan(plan, store)
    assert len(store.trained) == len(plan.trainings) == 18
    assert set(store.trained.values()) == {1}
    again = train_plan(plan, store)
    assert set(store.trained.values()) == {1} and store.hits == 18
    assert json.dumps(verdicts(plan, again)) == json.dumps(verdicts(plan, first))
    row = again[Training(TUNED_HELD_OUT, "start", HELD_OUT_TASK)][1]
    assert isinstance(row, ObjectiveResult)
    assert (row.objective, row.env_id) == ("start (tuned)", HELD_OUT_TASK)
    report = verdicts(plan, first)
    assert [(r["env_id"], r["objective"]) for r in report["results"]] == [
        *[(task, name) for task in TASKS for name in NAMES],
        *[(task, f"{name} (tuned)") for task in TASKS for name in NAMES]]
    assert list(report["tuning"]["environments"]) == TASKS


def test_two_environments_trained_at_once_give_what_one_at_a_time_gives(plan, one_at_a_time):
    store = CountingStore()
    at_once = train_plan(plan, store, jobs=2)
    assert list(at_once) == list(plan.trainings) and set(store.trained.values()) == {1}
    assert _results(verdicts(plan, at_once)) == _results(verdicts(plan, one_at_a_time))
    with pytest.raises(ConfigError, match="jobs: expected a whole number"):
        train_plan(plan, store, jobs=0)


def test_a_failing_environment_stops_the_other_after_its_training_which_is_kept(plan):
    """The second task fails at its first training while the first is inside its own:
    the error reaches the caller, the first task stops when that training ends, and a
    later call trains only what is missing."""
    first_task, failing_task = TASKS
    failed, waited = threading.Event(), threading.Event()

    class FailingStore(CountingStore):
        def get(self, parts, compute, *codec):
            if plan.tasks[failing_task] in parts and not failed.is_set():
                failed.set()
                raise RuntimeError("this environment failed")

            def slow():  # the first: still training when the failure reaches the caller
                if not waited.is_set():
                    waited.set()
                    failed.wait(60)
                    time.sleep(2)
                return compute()

            return super().get(parts, slow, *codec)

    store = FailingStore()
    with pytest.raises(RuntimeError, match="this environment failed"):
        train_plan(plan, store, jobs=2)
    assert len(store.trained) == 1
    kept = dict(store.trained)
    train_plan(plan, store)
    assert len(store.trained) == len(plan.trainings) and kept.items() <= store.trained.items()


def _results(report):
    """``report`` without what it says of time (seconds compiling and training)."""
    if isinstance(report, dict):
        return {k: _results(v) for k, v in report.items() if not k.endswith("_seconds")}
    if isinstance(report, list):
        return [_results(v) for v in report]
    return report


def test_a_tuned_suite_trains_no_row_at_the_default_setting_it_never_judges(one_at_a_time):
    """Its verdicts are the tuned rows' alone; a tuned row that chose the default setting
    (every one here: the grids hold the run's own setting only, vf_coef 0.5 and the run's
    learning rate) trains that row itself, with the same returns the default row has."""
    suite = make_plan({"name": "two", "version": 1, "train": [TASKS[0]], "test": [TASKS[1]]},
                      grid={"learning_rate": [1.0], "vf_coef": [0.5]})
    assert [(t.kind, t.name, t.task) for t in suite.trainings] == [
        (kind, name, task) for task in TASKS
        for kind, names in ((UNTRAINED_ROW, [UNTRAINED]), (TUNING, NAMES),
                            (TUNED_HELD_OUT, NAMES)) for name in names]
    trained = train_plan(suite, TrainingStore())
    for task in TASKS:
        for name in NAMES:
            record, row = trained[Training(TUNED_HELD_OUT, name, task)]
            assert record["held_out_at_default"]
            assert row.returns == one_at_a_time[Training(HELD_OUT, name, task)].returns
            assert (row.objective, row.env_id) == (f"{name} (tuned)", task)
    section = verdicts(suite, trained)["suite"]
    assert {(r["evolved"], r["baseline"]) for r in section["environments"]} == {
        ("evolved (tuned)", "start (tuned)"), ("evolved (tuned)", "l2 (tuned)")}
