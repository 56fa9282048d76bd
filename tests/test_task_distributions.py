"""Task distributions as the training set: ``[fitness] tasks_per_generation`` (K of the E
``[[inner]]`` tasks drawn per generation), task labels, ``[[held_out]]`` tasks and their
evaluation.

The generation's logic is checked with stand-in learners (a known return per task and
candidate, and a host callback that counts which tasks' training ran), so nothing but the
ES compiles. One tiny run of real PPO on two CartPole tasks (gravity 9.8 and 15) with one
held out (pole length 1) is started, resumed and evaluated: a generation program of two
PPO learners, and one evaluation program per task.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _evaluation_run import TINY

from inner_loops.objective import LossTerm, Objective, clipped_l2, ppo_clip
from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.evaluate import format_report
from metarl.evolve.generation import TASK_STREAM, Evolution
from metarl.evolve.kind import EvolveProgram
from metarl.evolve.replicated import ReplicatedEvolution, seed_config
from metarl.kinds import evaluate, resume, start
from metarl.objectives import register_objective
from metarl.runs.layout import read_metrics
from metarl.runs.meta_params import BEST_FILE, MEAN_FILE, load_meta_params

UPDATES = 4
TASKS = 4  # stand-in tasks: CartPole at four gravities
TIMINGS = ("seconds", "agent_steps_per_second", "time")


def _scaled_clip(meta_params, inputs):
    return ppo_clip().loss({}, inputs) * meta_params["scale"][0]


@register_objective("test_task_scalar", slots=("policy", "value"))
def _task_scalar_objective() -> Objective:
    """Two meta-parameters; the stand-in trainers score a candidate by ``scale[0]``."""
    policy = LossTerm("scaled_clip", lambda key: {"scale": jnp.zeros(2)}, _scaled_clip)
    return Objective(policy=policy, value=clipped_l2())


def _stand_in(learner, task: int, calls: collections.Counter):
    """``learner`` whose training returns ``scale[0] + 10 * task`` every update and counts
    (in ``calls``, from the host) each time task ``task``'s training runs."""

    def advance(key, meta_params, hypers, num_updates):
        jax.debug.callback(lambda: calls.update([task]))
        score = meta_params["policy"]["scale"][0] + 10.0 * task
        return key, {"episode_return": jnp.full((UPDATES,), score),
                     "finite": jnp.ones((UPDATES,), bool)}

    return dataclasses.replace(learner, init_fn=lambda key, meta, hypers: key,
                               advance_fn=advance)


def _config(tasks=TASKS, held_out=(), **fitness):
    inner = {"env_id": "CartPole-v1", "num_envs": 2, "num_steps": 8,
             "total_timesteps": 16 * UPDATES}
    return config_from_dict({
        "objective": {"name": "test_task_scalar"},
        "inner": [{**inner, "env_params": {"gravity": 9.0 + task}} for task in range(tasks)],
        "held_out": [{**inner, **entry} for entry in held_out],
        "es": {"population_size": 4, "sigma": 0.3, "learning_rate": 0.1, "generations": 3},
        "fitness": {"seeds_per_candidate": 2, **fitness},
    })


def _evolution(config, calls):
    evolution = Evolution(config)
    evolution.learners = [_stand_in(learner, task, calls)
                          for task, learner in enumerate(evolution.learners)]
    evolution.step = jax.jit(evolution.generation)
    return evolution


def _generations(evolution, count, calls, seed=0):
    """``count`` generations from ``PRNGKey(seed)``: the final state, and per generation
    its metrics and the tasks whose training ran (from the callbacks)."""
    state = evolution.init(jax.random.PRNGKey(seed))
    metrics, ran = [], []
    for _ in range(count):
        calls.clear()
        state, generation = evolution.step(state)
        jax.effects_barrier()
        metrics.append(jax.device_get(generation))
        ran.append(sorted(calls))
    return state, metrics, ran


def _expected_tasks(task_seed: int, generation: int, tasks: int, drawn: int) -> list[int]:
    """The documented draw: the first K of a permutation of the E tasks, sorted."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(task_seed), TASK_STREAM),
                             generation)
    return sorted(int(t) for t in jax.random.permutation(key, tasks)[:drawn])


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("changes, message", [
    ({"fitness": {"tasks_per_generation": 0}}, "fitness.tasks_per_generation: must be a "
                                               "positive integer"),
    ({"fitness": {"tasks_per_generation": 3}}, "fitness.tasks_per_generation: 3 tasks per "
                                               "generation out of 2"),
    ({"fitness": {"tasks_per_generation": 1.5}}, "fitness.tasks_per_generation"),
    ({"fitness": {"task_seed": 3}}, "fitness.task_seed: .*only with"),
    ({"fitness": {"tasks_per_generation": 1, "task_seed": -1}}, "fitness.task_seed"),
    ({"fitness": {"tasks_per_generation": 1}, "es": {"rungs": 2, "eta": 1}},
     "fitness.tasks_per_generation: not combined with es.rungs"),
    ({"fitness": {"tasks_per_generation": 1}, "es": {"strategy": "PersistentES",
                                                     "truncations": 2}},
     "fitness.tasks_per_generation: not combined with es.truncations"),
    ({"held_out": [{"env_id": "CartPole-v1", "env_params": {"gravity": 12.0}}]},
     r"held_out: the same task as inner\[1\]"),
    ({"held_out": [{"env_id": "Acrobot-v1"}, {"env_id": "Acrobot-v1"}]},
     r"held_out\[1\]: the same task as held_out\[0\]"),
    ({"inner": [{"env_id": "CartPole-v1"}, {"env_id": "CartPole-v1"}]},
     r"inner\[1\]: the same task as inner\[0\]"),
    ({"held_out": [{"env_id": "CartPole-v1", "learning_rate": -1.0}]}, "held_out.learning_rate"),
    ({"held_out": [{"algorithm": "nope"}]}, "held_out.algorithm"),
])
def test_bad_task_settings_name_the_field(changes, message):
    data = {"inner": [{"env_id": "CartPole-v1"},
                      {"env_id": "CartPole-v1", "env_params": {"gravity": 12.0}}], **changes}
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_a_held_out_entry_is_checked_as_an_inner_one_when_built():
    config = _config(tasks=2, held_out=[{"env_id": "CartPole-v1",
                                         "env_params": {"no_such": 1.0}}])
    with pytest.raises(ConfigError, match="held_out.env_params.no_such"):
        Evolution(config)


def test_tasks_are_labelled_by_env_id_unless_it_is_shared():
    distinct = config_from_dict({"inner": [{"env_id": "CartPole-v1"}, {"env_id": "Acrobot-v1"}],
                                 "held_out": [{"env_id": "MountainCar-v0"}]})
    assert distinct.task_labels == ("CartPole-v1", "Acrobot-v1")
    assert distinct.held_out_labels == ("MountainCar-v0",)
    shared = config_from_dict({
        "inner": [{"env_id": "CartPole-v1"}, {"env_id": "Acrobot-v1"},
                  {"env_id": "CartPole-v1", "env_params": {"gravity": 12, "length": 0.25}}],
        "held_out": [{"env_id": "Acrobot-v1", "env_params": {"max_steps_in_episode": 100}}]})
    assert shared.task_labels == ("CartPole-v1[defaults]", "Acrobot-v1[defaults]",
                                  "CartPole-v1[gravity=12,length=0.25]")
    assert shared.held_out_labels == ("Acrobot-v1[max_steps_in_episode=100]",)
    # saved and read back; a config saved before held-out tasks existed has none
    assert config_from_dict(json.loads(json.dumps(shared.to_dict()))) == shared
    old = distinct.to_dict()
    del old["held_out"], old["fitness"]["tasks_per_generation"], old["fitness"]["task_seed"]
    assert config_from_dict(old).held_out == ()
    assert not config_from_dict(old).samples_tasks


def test_seeds_of_replicated_evolution_share_the_task_stream():
    config = _config(tasks=3, tasks_per_generation=2).replace(
        run=dataclasses.replace(_config().run, seed=7))
    seeds = [seed_config(config, index) for index in range(3)]
    assert [s.run.seed for s in seeds] == [7, 8, 9]
    assert {s.fitness.task_seed for s in seeds} == {7}
    assert seed_config(_config(tasks=3), 1).fitness.task_seed is None  # nothing sampled


# --------------------------------------------------------------------------- generation


def test_every_task_per_generation_is_the_generation_without_sampling():
    calls = collections.Counter()
    runs = [_generations(_evolution(_config(tasks=3, **fitness), calls), 2, calls)
            for fitness in ({}, {"tasks_per_generation": 3})]
    (state, metrics, ran), (state_k, metrics_k, ran_k) = runs
    assert ran == ran_k == [[0, 1, 2]] * 2
    for mine, theirs in zip(jax.tree.leaves((state_k, metrics_k)),
                            jax.tree.leaves((state, metrics)), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert "tasks" not in metrics_k[0]


def test_only_the_sampled_tasks_train_and_the_fitness_is_theirs():
    calls = collections.Counter()
    baselines = (1.0, 2.0, 4.0, -8.0)
    evolution = _evolution(_config(tasks_per_generation=2, baseline_returns=list(baselines)),
                           calls)
    state = evolution.init(jax.random.PRNGKey(0), baselines=baselines)
    seen = set()
    for generation in range(4):
        asked = evolution.ask(state)
        scale = np.asarray(asked.population["policy"]["scale"][:, 0])
        calls.clear()
        state, metrics = evolution.step(state)
        jax.effects_barrier()
        tasks = [int(t) for t in metrics["tasks"]]
        assert tasks == _expected_tasks(0, generation, TASKS, 2)
        assert sorted(calls) == tasks  # no other task's training ran
        seen.add(tuple(tasks))
        returns = scale[:, None] + 10.0 * np.asarray(tasks, np.float32)
        np.testing.assert_allclose(metrics["returns"], returns, rtol=1e-6)
        expected = (returns / np.abs(np.asarray(baselines)[tasks])).mean(axis=1)
        np.testing.assert_allclose(metrics["fitness"], expected, rtol=1e-5)
    assert len(seen) > 1  # generations draw different subsets
    assert evolution.step._cache_size() == 1


def test_the_task_sequence_depends_on_the_task_seed_alone():
    calls = collections.Counter()

    def sequence(config, seed):
        _, metrics, _ = _generations(_evolution(config, calls), 4, calls, seed)
        return [[int(t) for t in m["tasks"]] for m in metrics]

    sampled = _config(tasks_per_generation=2)
    first = sequence(sampled, 0)
    assert first == [_expected_tasks(0, g, TASKS, 2) for g in range(4)]
    # another evolution key, the same task seed (run.seed 0): the same tasks
    assert sequence(sampled, 5) == first
    other = _config(tasks_per_generation=2, task_seed=3)
    assert sequence(other, 0) == [_expected_tasks(3, g, TASKS, 2) for g in range(4)] != first


def test_evolutions_run_together_train_the_same_sampled_tasks():
    calls = collections.Counter()
    config = _config(tasks_per_generation=1)
    replicated = ReplicatedEvolution(config, 2)
    replicated.evolution.learners = [_stand_in(learner, task, calls) for task, learner
                                     in enumerate(replicated.evolution.learners)]
    step = jax.jit(replicated.generation)
    alone = [_generations(_evolution(seed_config(config, index), calls), 3, calls,
                          seed=index)[1] for index in range(2)]
    states = replicated.stack([replicated.evolution.init(jax.random.PRNGKey(index))
                               for index in range(2)])
    for generation in range(3):
        calls.clear()
        states, metrics = step(states)
        jax.effects_barrier()
        tasks = np.asarray(metrics["tasks"])
        assert tasks.shape == (2, 1) and (tasks == tasks[0]).all()
        assert sorted(calls) == [int(tasks[0, 0])]  # an unbatched switch: one task ran
        for index in range(2):
            np.testing.assert_array_equal(tasks[index], alone[index][generation]["tasks"])
            np.testing.assert_allclose(metrics["fitness"][index],
                                       alone[index][generation]["fitness"], rtol=1e-6)


def test_metrics_lines_name_the_sampled_tasks_by_label():
    calls = collections.Counter()
    config = _config(tasks=3, tasks_per_generation=2,
                     hyperparameter_ranges={"learning_rate": {"low": 1e-4, "high": 1e-3}})
    program = EvolveProgram(config)
    program.evolution = _evolution(config, calls)
    state = program.evolution.init(jax.random.PRNGKey(0))
    state, record = program.step(state)
    line = program.summary(1, record)
    tasks = [int(t) for t in record["metrics"]["tasks"]]
    labels = [f"CartPole-v1[gravity={9.0 + task}]" for task in tasks]
    assert line["tasks"] == tasks
    assert list(line["mean_return"]) == labels
    assert list(line["hyperparameters"]["learning_rate"]) == labels
    assert program.agent_steps_per_step == 4 * 2 * 2 * 16 * UPDATES  # C x S x K tasks
    everything = EvolveProgram(_config(tasks=3))
    everything.evolution = _evolution(everything.config, calls)
    line = everything.summary(1, everything.step(everything.evolution.init())[1])
    assert "tasks" not in line and len(line["mean_return"]) == 3


# --------------------------------------------------------------------------- a real run

HELD_OUT = "CartPole-v1[length=1.0]"
DISTRIBUTION = {
    "name": "tiny_tasks",
    "objective": TINY["objective"],
    "inner": [TINY["inner"], {**TINY["inner"], "env_params": {"gravity": 15.0}}],
    "held_out": [{**TINY["inner"], "env_params": {"length": 1.0}}],
    "es": {"population_size": 4, "generations": 3, "sigma": 0.05},
    "fitness": {"seeds_per_candidate": 2, "tasks_per_generation": 1},
    "run": {"progress": False},
}


@pytest.fixture(scope="module")
def task_run(tmp_path_factory):
    """An uninterrupted run of three generations of the two-task distribution."""
    run_dir = tmp_path_factory.mktemp("tasks") / "reference"
    start(config_from_dict(DISTRIBUTION), run_dir)
    return run_dir


def _lines(run_dir):
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in read_metrics(run_dir)]


def test_a_sampled_run_records_its_tasks_and_resumes_bit_for_bit(task_run, tmp_path):
    lines = _lines(task_run)
    # run.seed 0 draws task 0, then task 1 twice (checked against the documented draw)
    assert [line["tasks"] for line in lines] == [_expected_tasks(0, g, 2, 1)
                                                 for g in range(3)] == [[0], [1], [1]]
    labels = ["CartPole-v1[defaults]", "CartPole-v1[gravity=15.0]"]
    assert [list(line["mean_return"]) for line in lines] == [[labels[0]], [labels[1]],
                                                              [labels[1]]]
    split = tmp_path / "split"
    start(config_from_dict({**DISTRIBUTION, "es": {**DISTRIBUTION["es"], "generations": 2}}),
          split)
    resume(split, generations=3)
    assert _lines(split) == lines
    for name in (BEST_FILE, MEAN_FILE):
        for mine, theirs in zip(jax.tree.leaves(load_meta_params(split / name)),
                                jax.tree.leaves(load_meta_params(task_run / name)),
                                strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_evaluation_covers_the_held_out_task_and_labels_it(task_run):
    report = evaluate(task_run, seeds=2, baselines=[])
    labels = ["CartPole-v1[defaults]", "CartPole-v1[gravity=15.0]", HELD_OUT]
    assert report["spec"]["environments"] == labels
    assert report["held_out_tasks"] == report["spec"]["held_out_tasks"] == [HELD_OUT]
    assert [(r["env_id"], r["objective"]) for r in report["results"]] == [
        (label, "evolved") for label in labels]
    assert list(report["statistics"]["environments"]) == labels
    # the held-out task alone, by its label, against a baseline: the same evolved row
    alone = evaluate(task_run, seeds=2, baselines=["l2"], env_ids=[HELD_OUT],
                     eval_seed=report["eval_seed"])  # the same held-out seeds, on purpose
    assert [(r["env_id"], r["objective"]) for r in alone["results"]] == [
        (HELD_OUT, "evolved"), (HELD_OUT, "l2")]
    assert alone["results"][0]["returns"] == report["results"][2]["returns"]
    comparisons = alone["statistics"]["environments"][HELD_OUT]["comparisons"]
    assert [(c["evolved"], c["baseline"]) for c in comparisons] == [("evolved", "l2")]
    table = format_report(alone)
    assert table.count(f"{HELD_OUT} (held out)") == 3  # two rows and the comparison
    assert "(held out)" not in format_report(evaluate(task_run, seeds=2, baselines=[],
                                                      env_ids=["CartPole-v1[defaults]"]))
